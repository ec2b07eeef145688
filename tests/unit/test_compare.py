"""mtpbench compare on real sweeps of the built-in model."""

import json

import pytest
from scipy.special import stdtrit
from typer.testing import CliRunner

from mtpbench.cli import app

runner = CliRunner()
# every built-in prompt, long enough for the chain's edge at position 2 to stand out of the noise
COMMON = ["--k", "3", "--num-prompts", "64", "--max-tokens", "96", "--repeats", "1"]  # acceptance is compared




# ---- compare on hand-made runs: known answers, in milliseconds ------------------------------------

import math  # noqa: E402
from dataclasses import asdict  # noqa: E402

import numpy as np  # noqa: E402

from mtpbench import compare as cmp  # noqa: E402
from mtpbench import stats  # noqa: E402
from mtpbench.config import SweepConfig, fingerprint  # noqa: E402
from mtpbench.metrics import BatchRecord, GridPoint, RequestRecord, request_acceptance  # noqa: E402

K = 2
VERSIONS = {"vllm": "0.32.0", "torch": "2.13.0", "mtpbench_code": "c0de"}


def request(pid: str, accepted: int, steps: int = 20, category: str = "c") -> RequestRecord:
    """A request of ``steps`` verify steps at k = 2 that accepted ``accepted`` drafts in all."""
    per_step = [2] * (accepted // 2) + [1] * (accepted % 2)
    per_step += [0] * (steps - len(per_step))
    counts = request_acceptance(K, per_step)
    return RequestRecord(category, 10, [1] * (accepted + steps), 0.01, 0.1, prompt_id=pid, **counts)


def plain(pid: str) -> RequestRecord:
    return RequestRecord("c", 10, [1] * 40, 0.01, 0.1, prompt_id=pid)


def repeats(tokps: list[float]) -> list[dict]:
    return [{"output_tokens_per_sec": x, "ttft_ms_p50": 10.0, "tpot_ms_p50": 1000 / x} for x in tokps]


def point_file(point: GridPoint, requests: list[RequestRecord], tokps: list[float], backend: str,
               foreign: RequestRecord | None = None) -> dict:
    """A point's JSON; ``foreign``: a request the engine's counters also counted (a server's other traffic)."""
    counted = requests + ([foreign] if foreign else [])
    wall = sum(len(r.output_token_ids) for r in requests) / tokps[0]
    if point.k:
        batch = BatchRecord("c", wall, *(sum(getattr(r, n) for r in counted)
                                        for n in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")),
                            [sum(r.num_accepted_tokens_per_pos[i] for r in counted) for i in range(point.k)])
    else:
        batch = BatchRecord("c", wall)
    return {"point": point.to_json(backend), "requests": [asdict(r) for r in requests],
            "batches": [asdict(batch)], "repeats": repeats(tokps), "notes": []}


def make_run(d, k0: list[float], k2: list[float] | None, accepted: dict[str, int] | list[tuple[str, int]],
             foreign: RequestRecord | None = None, **config):
    """A sweep directory with a k = 0 point timed at ``k0`` tokens/s per repeat and a k = 2 point timed at
    ``k2`` whose requests accepted ``accepted`` (prompt id -> drafts accepted of 40 proposed)."""
    d.mkdir(parents=True)
    cfg = {**SweepConfig(backend="vllm", k=(0, K)).to_json(), **config}
    fp = fingerprint(cfg, VERSIONS)
    items = list(accepted.items()) if isinstance(accepted, dict) else accepted
    (d / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": VERSIONS}, "engine": {},
                                            "fingerprint": fp}))
    pts = [(GridPoint("plain", 0, 0), [plain(p) for p, _ in items], k0, None)]
    if k2 is not None:
        pts.append((GridPoint("vllm", K, 1), [request(p, a) for p, a in items], k2, foreign))
    for point, reqs, tokps, extra in pts:
        data = {**point_file(point, reqs, tokps, cfg["backend"], extra), "fingerprint": fp}
        (d / f"{point.name}.json").write_text(json.dumps(data))
    return d


def row(result: dict, metric: str, point: str = "vllm-L1-k2", category: str = "all") -> dict:
    return next(r for r in result["rows"] if r["metric"] == metric and r["point"] == point
                and r["category"] == category)


STEADY = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]  # six repeats: timings get an interval
# prompts of very different difficulty (drafts accepted of 40), so an unpaired interval would be wide
HARD_AND_EASY = {f"p{i}": a for i, a in enumerate([4, 36, 10, 30, 16, 24, 6, 34, 12, 28, 18, 22])}


def test_the_interval_of_a_known_acceptance_gain_covers_it_and_excludes_zero(tmp_path):
    """B accepts 1 or 3 more drafts per prompt (alternating) of 20 verify steps: the true AL gain is
    2 / 20 = 0.1. The paired interval must cover 0.1 and exclude 0; an unpaired one (prompt difficulty
    spans AL 1.2 to 2.8) or one with A and B swapped would not."""
    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    b = make_run(tmp_path / "b", STEADY, STEADY, {p: x + (1 if i % 2 else 3) for i, (p, x) in
                                                  enumerate(HARD_AND_EASY.items())})
    result = cmp.compare(a, b)
    al = row(result, "acceptance_length")
    assert al["diff"] == pytest.approx(0.1) and al["paired_prompts"] == 12 and al["values_from"] == "paired prompts"
    # the draft acceptance rate pools the same requests' accepted over proposed drafts (2 each of 20 steps), with no 1 +
    dar = row(result, "draft_acceptance_rate")
    assert dar["a"] == pytest.approx(sum(HARD_AND_EASY.values()) / 480, abs=1e-6)
    assert dar["b"] == pytest.approx((sum(HARD_AND_EASY.values()) + 24) / 480, abs=1e-6)
    assert 0 < al["ci_low"] <= 0.1 <= al["ci_high"] < 0.2 and al["ci_high"] - al["ci_low"] > 0.01
    assert al["verdict"] == "better"
    # judged in the family of every row over all prompts with an interval, at its level: the bootstrap's interval
    # of the same requests (paired by prompt id, in order of id) rounded outward
    family = sum(r["category"] == "all" and r["ci_low"] is not None for r in result["rows"])
    assert family > 1 and al["level"] == pytest.approx(1 - 0.05 / family)
    ids = sorted(HARD_AND_EASY)
    bx = {p: x + (1 if i % 2 else 3) for i, (p, x) in enumerate(HARD_AND_EASY.items())}
    ci = stats.paired_ratio_diff_ci([HARD_AND_EASY[p] for p in ids], [20] * 12, [bx[p] for p in ids], [20] * 12,
                                    level=al["level"])
    assert (al["ci_low"], al["ci_high"]) == (math.floor(ci[0] * 1e6) / 1e6, math.ceil(ci[1] * 1e6) / 1e6)
    back = row(cmp.compare(b, a), "acceptance_length")
    assert back["verdict"] == "worse" and back["ci_low"] == pytest.approx(-al["ci_high"])
    # the same spread with no gain (+1 / -1): within noise, and the interval is not a point
    c = make_run(tmp_path / "c", STEADY, STEADY, {p: x + (1 if i % 2 else -1) for i, (p, x) in
                                                  enumerate(HARD_AND_EASY.items())})
    null = row(cmp.compare(a, c), "acceptance_length")
    assert null["diff"] == 0 and null["ci_low"] < 0 < null["ci_high"]


def test_the_interval_of_a_known_timing_loss_covers_it_and_excludes_zero(tmp_path):
    a = make_run(tmp_path / "a", STEADY, [150 + x - 100 for x in STEADY], HARD_AND_EASY)
    b = make_run(tmp_path / "b", STEADY, [135 + x - 100 for x in STEADY], HARD_AND_EASY)
    result = cmp.compare(a, b)
    tokps = row(result, "output_tokens_per_sec")
    assert tokps["diff"] == pytest.approx(-15, abs=1e-3) and tokps["ci_low"] <= -15 <= tokps["ci_high"] < 0
    assert tokps["verdict"] == "worse" and tokps["values_from"] == "repeats (geometric means)"
    # at the level of its family (every row over all prompts with an interval), no floor (no A/A control): the
    # difference of the runs' geometric means, its t interval by the delta method on the logs (Welch's df) at that
    # level, rounded outward (issue 44: a bootstrap of 6 medians cannot reach such a level)
    family = sum(r["category"] == "all" and r["ci_low"] is not None for r in result["rows"])
    assert family > 1 and tokps["level"] == pytest.approx(1 - 0.05 / family)
    la, lb = (np.log([v + x - 100 for x in STEADY]) for v in (150, 135))
    ga, gb = math.exp(la.mean()), math.exp(lb.mean())
    va, vb = ga * ga * la.var(ddof=1) / la.size, gb * gb * lb.var(ddof=1) / lb.size
    df = (va + vb) ** 2 / (va * va / (la.size - 1) + vb * vb / (lb.size - 1))
    half = float(stdtrit(df, 1 - (1 - tokps["level"]) / 2)) * math.sqrt(va + vb)
    assert (tokps["a"], tokps["b"]) == (pytest.approx(ga, abs=1e-4), pytest.approx(gb, abs=1e-4))
    lo, hi = gb - ga - half, gb - ga + half
    assert tokps["ci_low"] == pytest.approx(math.floor(lo * 1e6) / 1e6, abs=2e-6)
    assert tokps["ci_high"] == pytest.approx(math.ceil(hi * 1e6) / 1e6, abs=2e-6)
    speedup = row(result, "speedup")
    # ratios of geometric means: STEADY's geometric mean is not its median, 100, so B - A is -0.150005
    assert speedup["diff"] == pytest.approx(-0.15, abs=1e-5) and speedup["ci_low"] <= -0.15 <= speedup["ci_high"] < 0
    assert speedup["verdict"] == "worse"
    assert row(result, "output_tokens_per_sec", point="k0")["verdict"] == "within noise"
    assert not result["notes"] and not result["timings_drifted"]
    assert cmp.worse_beyond(result, 5) == ["vllm-L1-k2 output_tokens_per_sec -10.0 %",
                                           "vllm-L1-k2 tpot_ms_p50 +11.1 %", "vllm-L1-k2 speedup -10.0 %"]


def _signs_agree(result: dict) -> None:
    for r in result["rows"]:
        if r["verdict"] in ("better", "worse"):
            assert r["diff"] and r["ci_low"] <= r["diff"] <= r["ci_high"], r
            good = (r["diff"] > 0) == r["higher_is_better"]
            assert r["verdict"] == ("better" if good else "worse"), r


def test_a_verdict_agrees_with_its_difference_under_foreign_traffic(tmp_path):
    """B's server also finished someone else's request that accepted every draft: its counters' AL is
    higher than A's, while on the prompts both runs measured B is worse. A, B and B - A come from the
    same paired requests as the interval."""
    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    worse = {p: x - 2 for p, x in HARD_AND_EASY.items()}
    b = make_run(tmp_path / "b", STEADY, STEADY, worse, foreign=request("other", 40 * 12, steps=20 * 12))
    result = cmp.compare(a, b)
    al = row(result, "acceptance_length")
    assert al["verdict"] == "worse" and al["diff"] == pytest.approx(-0.1) and al["values_from"] == "paired prompts"
    assert al["a"] == pytest.approx(1 + sum(HARD_AND_EASY.values()) / 240)
    _signs_agree(result)


def test_a_verdict_agrees_with_its_difference_on_other_prompt_sets(tmp_path):
    """--force on prompt sets that overlap in half their prompts: B's own prompts are easy, so its table's
    AL is higher, but on the shared prompts it is lower."""
    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    shared = {p: x - 2 for p, x in list(HARD_AND_EASY.items())[6:]}
    b = make_run(tmp_path / "b", STEADY, STEADY, {**shared, **{f"q{i}": 40 for i in range(6)}}, num_prompts=12,
                 prompts="other.jsonl")
    result = cmp.compare(a, b, force=True)
    al = row(result, "acceptance_length")
    assert al["paired_prompts"] == 6 and al["verdict"] == "worse" and al["diff"] < 0
    _signs_agree(result)


def test_drift_notes_and_their_effect_on_fail_if_worse(tmp_path):
    """Same settings, and B's k = 0 control is 10 % slower beyond noise: the machine drifted. Raw
    timings then fail nothing; the speedup (each run against its own baseline) still does."""
    a = make_run(tmp_path / "a", STEADY, [150 + x - 100 for x in STEADY], HARD_AND_EASY)
    b = make_run(tmp_path / "b", [x * 0.9 for x in STEADY], [105 + x - 100 for x in STEADY], HARD_AND_EASY)
    result = cmp.compare(a, b)
    assert result["differences"] == [] and result["timings_drifted"]
    assert result["notes"] == [
        "the k = 0 baseline k0, made the same way in both runs, moved -10.0 % beyond its interval: timings "
        "drifted between the runs; read tokens/s, TTFT and TPOT through 'speedup' (each run against its own "
        "baseline) or rerun"]
    assert cmp.worse_beyond(result, 5) == ["vllm-L1-k2 speedup -22.2 %"]
    # no drift note where the baselines were made differently (another vLLM build)
    c = make_run(tmp_path / "c", [x * 0.9 for x in STEADY], STEADY, HARD_AND_EASY)
    run_c = json.loads((c / "run.json").read_text())
    run_c["provenance"]["versions"] = {**VERSIONS, "vllm": "0.31.0"}
    (c / "run.json").write_text(json.dumps(run_c))
    rows = [cmp.CompareRow(**r) for r in cmp.compare(a, b)["rows"]]
    assert cmp.drift_notes(rows, json.loads((a / "run.json").read_text()), run_c) == []


def test_eager_against_compiled_is_a_difference_of_the_runs_not_drift(tmp_path):
    """vLLM with --force-spec-step-idx runs k = 0 eagerly too: its slower k = 0 is the flag's doing. compare
    says so, emits no drift note, and the raw timing regressions still fail --fail-if-worse."""
    a = make_run(tmp_path / "a", STEADY, [150 + x - 100 for x in STEADY], HARD_AND_EASY)
    b = make_run(tmp_path / "b", [x * 0.9 for x in STEADY], [120 + x - 100 for x in STEADY], HARD_AND_EASY,
                 force_spec_step_idx=True)
    result = cmp.compare(a, b)
    assert result["differences"] == ["force_spec_step_idx: False vs True", "execution: compiled vs eager"]
    assert not result["timings_drifted"] and not any("drifted" in n for n in result["notes"])
    assert result["notes"][0].startswith("A ran compiled, B eager, every point alike, k = 0 included")
    bad = cmp.worse_beyond(result, 5)
    assert "k0 output_tokens_per_sec -10.0 %" in bad and "vllm-L1-k2 output_tokens_per_sec -20.0 %" in bad
    # the same without the flag, but with enforce_eager asked for: also eager
    c = make_run(tmp_path / "c", STEADY, STEADY, HARD_AND_EASY, engine_args={"enforce_eager": True})
    assert "execution: compiled vs eager" in cmp.compare(a, c)["differences"]
    # a run that recorded its execution (e.g. the model runner) is read as recorded
    run_c = json.loads((c / "run.json").read_text())
    run_c["execution"] = {"graphs": "eager", "runner": "v2"}
    (c / "run.json").write_text(json.dumps(run_c))
    assert "execution: compiled vs eager, runner v2" in cmp.compare(a, c)["differences"]


def test_fail_if_worse_fails_when_b_lacks_a_point_of_a(tmp_path):
    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    b = make_run(tmp_path / "b", STEADY, None, HARD_AND_EASY)  # stopped after k = 0
    result = cmp.compare(a, b)
    assert result["missing_in_b"] == ["vllm-L1-k2"] and cmp.worse_beyond(result, 5) == ["vllm-L1-k2 missing in B"]
    r = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "c"), "--fail-if-worse", "5"])
    assert r.exit_code == 1 and "vllm-L1-k2 missing in B" in r.output, r.output
    # the page and compare.md say so too, in red (they said "0 better, 0 worse, 3 within noise" and nothing more)
    page = (tmp_path / "c" / "report.html").read_text()
    said = "B against A: 0 better, 0 worse, 3 within noise (of 3 rows); 1 point of A missing in B."
    assert f'<p class="answer bad" id="answer">{said}</p>' in page
    assert said in (tmp_path / "c" / "compare.md").read_text()
    # the other way round B has more points than A: nothing is missing
    r = runner.invoke(app, ["compare", str(b), str(a), "--out", str(tmp_path / "d"), "--fail-if-worse", "5"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("pct", ["-1", "nan", "inf"])
def test_a_fail_if_worse_that_is_no_percentage_is_refused_before_anything_is_written(tmp_path, pct):
    """A negative threshold failed every worse metric by accident of the sign, NaN none (every comparison with
    NaN is false): both are refused, one line, exit 2."""
    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    r = runner.invoke(app, ["compare", str(a), str(a), "--out", str(tmp_path / "c"), f"--fail-if-worse={pct}"])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "--fail-if-worse takes a percentage of 0 or more" in r.output and not (tmp_path / "c").exists()


def test_a_repeated_prompt_id_pairs_by_order_and_says_so(tmp_path):
    """A prompt file that holds one id twice: both requests pair (the n-th with the n-th), not one."""
    items = list(HARD_AND_EASY.items()) + [("p0", 38)]
    a = make_run(tmp_path / "a", STEADY, STEADY, items)
    b = make_run(tmp_path / "b", STEADY, STEADY, [(p, x + 2) for p, x in items])
    result = cmp.compare(a, b)
    al = row(result, "acceptance_length")
    assert al["paired_prompts"] == 13 and al["diff"] == pytest.approx(0.1)
    assert ("vllm-L1-k2: prompt id 'p0' occurs more than once in A: paired by order of appearance (the n-th "
            "with the n-th)") in result["notes"]


def test_a_speedup_difference_lies_inside_its_interval_where_medians_and_geometric_means_part(tmp_path):
    """Three of A's eight k = 0 runs and three of B's eight k = 2 runs were slow (60 and 120 tok/s): the
    ratios of medians (A 1.51, B 1.99, B - A +0.48) and of geometric means (A 1.82, B 1.65) part. The
    interval is built around the geometric means: B - A shown beside it must be their difference, inside it
    (the ratio-of-medians difference lay above it, as +0.394 beside [-0.137, +0.392] was seen)."""
    a_k0 = [100.0, 101.0, 99.0, 100.5, 99.5, 60.0, 60.0, 60.0]
    b_k2 = [200.0, 201.0, 199.0, 200.5, 199.5, 120.0, 120.0, 120.0]
    steady8 = STEADY + [100.0, 100.0]
    k2 = [150.0, 151.0, 149.0, 150.5, 149.5, 150.0, 150.0, 150.0]
    a = make_run(tmp_path / "a", a_k0, k2, HARD_AND_EASY)
    b = make_run(tmp_path / "b", steady8, b_k2, HARD_AND_EASY)
    result = cmp.compare(a, b, out=tmp_path / "c")
    s = row(result, "speedup")
    assert s["ci_low"] <= s["diff"] <= s["ci_high"] and s["verdict"] == "within noise"
    assert s["diff"] == pytest.approx(s["b"] - s["a"], abs=2e-6) and s["values_from"] == cmp.GEOMETRIC
    geo = lambda x: float(np.exp(np.mean(np.log(x))))  # noqa: E731
    assert s["a"] == pytest.approx(geo(k2) / geo(a_k0), abs=1e-6)
    assert s["b"] == pytest.approx(geo(b_k2) / geo(steady8), abs=1e-6)
    # the interval: the delta method on the four sets' logs, Welch's df, at 1 - 0.05 / the rows over all prompts
    logs = [np.log(x) for x in (k2, a_k0, b_k2, steady8)]
    parts = [w * w * x.var(ddof=1) / x.size for w, x in zip((s["a"], s["a"], s["b"], s["b"]), logs)]
    se = math.sqrt(sum(parts))
    df = sum(parts) ** 2 / sum(c * c / (x.size - 1) for c, x in zip(parts, logs))
    m = sum(r["category"] == "all" for r in result["rows"])
    half = stdtrit(df, 1 - 0.05 / (2 * m)) * se
    assert s["level"] == 1 - 0.05 / m
    assert (s["ci_low"], s["ci_high"]) == pytest.approx((s["diff"] - half, s["diff"] + half), abs=2e-6)
    # the table and its markdown show the same numbers
    line = next(x for x in cmp.table_lines(result) if x[1] == "speedup")
    assert line[2:5] == [f"{s['a']:.4g}", f"{s['b']:.4g}", f"{s['diff']:+.4g}"] and line[8] == cmp.GEOMETRIC
    assert "| vllm-L1-k2 | speedup | " + " | ".join(line[2:]) + " |" in (tmp_path / "c" / "compare.md").read_text()
    _signs_agree(result)


def rank_interval(num: list[float], den: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free interval of a ratio from the pairwise ratios, written out from its definition:
    [r_(j), r_(nm+1-j)] with the largest j whose coverage 1 - 2 P(U <= j - 1) under the exact null law of the
    Mann-Whitney count U is >= level; that law counted here as rank sums W of n-subsets of 1..n+m (U = W -
    n(n+1)/2), not as the code under test counts it."""
    n, m = len(num), len(den)
    top = sum(range(m + 1, n + m + 1))
    ways = [[0] * (top + 1) for _ in range(n + 1)]
    ways[0][0] = 1
    for x in range(1, n + m + 1):
        for c in range(min(x, n), 0, -1):
            for w in range(top, x - 1, -1):
                ways[c][w] += ways[c - 1][w - x]
    law = ways[n][n * (n + 1) // 2:]
    total, j = sum(law), 0
    while 1 - 2 * sum(law[:j + 1]) / total >= level:
        j += 1
    if j == 0:  # no j reaches the level
        return None
    r = sorted(math.log(a) - math.log(b) for a in num for b in den)
    return math.exp(r[j - 1]), math.exp(r[n * m - j])


def test_rank_interval_oracle_matches_the_documented_coverages():
    # the exact coverages docs/stats state: 4 + 4 repeats reach 97.1 % with j = 1, and 3 + 3 none (90 %)
    assert rank_interval([1.0, 2, 3, 4], [1.0, 1, 1, 1]) == (1.0, 4.0)
    assert rank_interval([1.0, 2, 3], [1.0, 1, 1]) is None


def test_one_estimator_of_a_speedup_the_sweep_and_compare_print_the_same(tmp_path):
    """Issue 44, case 12: `compare s1 s1` printed chain k = 3 at x1.215 where the sweep said x1.08 (the sweep a
    ratio of medians, compare a ratio of geometric means). 16 repeats a point, each run fast (~100 tok/s) or slow
    (~75): at k = 2 half the runs were slow, at k = 0 nine of 16, so the two estimators part (1.16 against
    1.04). Both print the ratio of geometric means, the estimate the decision's t test is centred on."""
    from mtpbench.sweep.load import load_run, rows_from_points

    k2 = [75.0 + 0.1 * i for i in range(8)] + [100.0 + 0.1 * i for i in range(8)]
    k0 = [75.0 + 0.1 * i for i in range(9)] + [100.0 + 0.1 * i for i in range(7)]
    d = make_run(tmp_path / "a", k0, k2, HARD_AND_EASY)
    _, points, failures = load_run(d)
    r = next(x for x in rows_from_points(points, failures) if x.k == K and x.category == "all")
    geometric = math.exp(np.mean(np.log(k2)) - np.mean(np.log(k0)))
    assert abs(geometric - np.median(k2) / np.median(k0)) > 0.1  # the case where the two estimators part
    assert r.speedup == round(geometric, 4)
    assert r.speedup_ci_low <= r.speedup <= r.speedup_ci_high
    sp = row(cmp.compare(d, d), "speedup")
    assert sp["a"] == sp["b"] == pytest.approx(r.speedup, abs=1e-4)


def test_one_statistic_for_tokens_s_a_row_its_speedup_and_compare_agree_issue_55_case_7(tmp_path):
    """Issue 55, case 7: a row showed k = 1 at 102.7 tok/s over k = 0's 100.0 and was decided slower, x0.822 (tok/s
    the median of the runs, the speedup a ratio of geometric means); compare printed k = 0 at 417.9 tok/s where the
    sweep's table said 1210.3 for the same files. Here nine of k = 2's 16 runs ran at 102.7 tok/s and seven at 60
    (median 102.7, geometric mean 81.2) beside k = 0 steady at 100: the row's tok/s is the geometric mean, below k =
    0's, its ratio to k = 0's is the speedup, decided slower; and compare's tok/s of each point is the table's."""
    from mtpbench.sweep.load import load_run, rows_from_points

    k2 = [102.7] * 9 + [60.0] * 7
    k0 = [100.0 + 0.1 * (i % 3 - 1) for i in range(16)]
    geo = lambda x: math.exp(math.fsum(math.log(v) for v in x) / len(x))  # noqa: E731
    assert np.median(k2) > np.median(k0) and geo(k2) < geo(k0)  # the two estimators part across k = 0
    d = make_run(tmp_path / "a", k0, k2, HARD_AND_EASY)
    _, points, failures = load_run(d)
    rows = {x.k: x for x in rows_from_points(points, failures) if x.category == "all"}
    assert rows[K].output_tokens_per_sec == pytest.approx(geo(k2), abs=0.005)
    assert rows[0].output_tokens_per_sec == pytest.approx(geo(k0), abs=0.005)
    assert rows[K].speedup_decision == "slower" and rows[K].output_tokens_per_sec < rows[0].output_tokens_per_sec
    assert rows[K].speedup == pytest.approx(rows[K].output_tokens_per_sec / rows[0].output_tokens_per_sec, abs=1e-4)
    result = cmp.compare(d, d)
    for point, k in (("k0", 0), ("vllm-L1-k2", K)):
        t = row(result, "output_tokens_per_sec", point)
        assert t["a"] == t["b"] == pytest.approx(rows[k].output_tokens_per_sec, abs=0.005), point


def with_aa(d, copy: list[float]) -> None:
    """The A/A control beside a sweep's k = 0 point: a copy of it timed at ``copy`` tokens/s per repeat."""
    k0 = json.loads((d / "k0.json").read_text())
    (d / "aa-k0.json").write_text(json.dumps({**k0, "point": {**k0["point"], "mode": "aa"},
                                               "repeats": repeats(copy)}))


def test_the_gate_reads_the_floors_its_notes_state_issue_44_case_6(tmp_path):
    """Two sweeps whose A/A controls differ by about 35 %, A's k = 2 at x1.20 and B's at x1.10, each timed tightly:
    B - A = -0.10 had an interval of [-0.107, -0.093] and --fail-if-worse exited 1, while compare's notes said no
    speedup interval is narrower than the floor. The speedup's and the timings' intervals now are."""
    from mtpbench.compare.pair import exit_code

    tight = [100.0, 100.4, 99.6, 100.2, 99.8, 100.0]
    a = make_run(tmp_path / "a", tight, [x * 1.2 for x in tight], HARD_AND_EASY)
    b = make_run(tmp_path / "b", tight, [x * 1.1 for x in tight], HARD_AND_EASY)
    for d in (a, b):
        with_aa(d, [x * 1.35 for x in tight])
    result = cmp.compare(a, b)
    floors = [result["noise"][side]["floor"] for side in ("a", "b")]
    assert all(f > 0.3 for f in floors)
    s = row(result, "speedup")
    assert s["diff"] == pytest.approx(-0.1, abs=1e-3) and s["verdict"] == "within noise"
    g = math.sqrt(floors[0] ** 2 + floors[1] ** 2)  # the two runs' floors on B's speedup over A's
    assert s["ci_low"] <= s["b"] * math.exp(-g) - s["a"] + 1e-6 and s["ci_high"] >= s["b"] * math.exp(g) - s["a"] - 1e-6
    t = row(result, "output_tokens_per_sec")
    assert t["rel_diff"] == pytest.approx(-1 / 12, abs=1e-3) and t["verdict"] == "within noise"
    # a timing of each run carries half of each floor's variance: sqrt((fa^2 + fb^2) / 2) on B, each way
    h = math.sqrt((floors[0] ** 2 + floors[1] ** 2) / 2)
    assert t["ci_low"] == pytest.approx(t["b"] * math.exp(-h) - t["a"], abs=1e-3)
    assert t["ci_high"] == pytest.approx(t["b"] * math.exp(h) - t["a"], abs=1e-3)
    assert [(row(result, m)["higher_is_better"], row(result, m)["values_from"]) for m in
            ("output_tokens_per_sec", "ttft_ms_p50", "tpot_ms_p50", "speedup")] == [
        (True, "repeats (geometric means)"), (False, "repeats (geometric means)"), (False, "repeats (geometric means)"),
        (True, "repeats (geometric means)")]
    assert cmp.worse_beyond(result, 0.0) == [] and exit_code(result, 0.0) == 0
    # without the controls the same timings are told apart: the floors, not the data, make the difference
    for d in (a, b):
        (d / "aa-k0.json").unlink()
    result = cmp.compare(a, b)
    assert row(result, "speedup")["verdict"] == "worse" and exit_code(result, 0.0) == 1


# ---- rows without an interval: each side's table, every field (pair.compare_points) ---------------------------

def k1_request(pid: str, accepted: int, category: str, steps: int = 20) -> RequestRecord:
    """A request of ``steps`` verify steps at k = 1 that accepted ``accepted`` of them."""
    counts = request_acceptance(1, [1] * accepted + [0] * (steps - accepted))
    return RequestRecord(category, 10, [1] * (accepted + steps), 0.01, 0.1, prompt_id=pid, **counts)


def k1_run(d, k0: list[float], k1: list[float], accepted: list[tuple[str, int, str]], mode: str = "vllm"):
    """A sweep at k = 1 (the smallest k that drafts): a k = 0 point timed at ``k0`` tokens/s per repeat, a k = 1
    point at ``k1`` whose requests accepted (prompt id, drafts accepted of 20, category)."""
    d.mkdir(parents=True)
    cfg = {**SweepConfig(backend="vllm", k=(0, 1)).to_json()}
    fp = fingerprint(cfg, VERSIONS)
    (d / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": VERSIONS}, "engine": {},
                                            "fingerprint": fp}))
    for point, reqs, tokps in [(GridPoint("plain", 0, 0), [plain(p) for p, _, _ in accepted], k0),
                               (GridPoint(mode, 1, 1), [k1_request(*x) for x in accepted], k1)]:
        data = {**point_file(point, reqs, tokps, cfg["backend"]), "fingerprint": fp}
        (d / f"{point.name}.json").write_text(json.dumps(data))
    return d


def _one_repeat_runs(tmp_path):
    # three prompts both ran (too few for a bootstrap, MIN_PROMPTS), one of category "b" only A ran; A timed twice,
    # B once (too few for an interval of medians or of speedups)
    both = [("p0", 4, "c"), ("p1", 6, "c"), ("p2", 10, "c")]
    a = k1_run(tmp_path / "a", [50.0, 50.0], [100.0, 100.0], [("q", 2, "b")] + both)
    b = k1_run(tmp_path / "b", [50.0], [110.0], [(p, x + 4, c) for p, x, c in both] + [("r", 8, "d")])
    return a, b


def test_rows_without_an_interval_carry_each_runs_table_field_by_field(tmp_path):
    """At k = 1 with 3 paired prompts and 1 or 2 repeats nothing has an interval: every row's A and B are its run's
    own sweep row, the acceptance rows say how many prompts paired (3), a category only one run has gives no row and
    stops no other, and each metric keeps its direction."""
    from mtpbench.sweep.load import load_run, rows_from_points

    a, b = _one_repeat_runs(tmp_path)
    result = cmp.compare(a, b)
    table = {side: {(r.k, r.category): r for r in rows_from_points(*load_run(d)[1:])}
             for side, d in (("a", a), ("b", b))}
    acceptance = [("acceptance_length", True), ("draft_acceptance_rate", True), ("acceptance_rate_per_pos[0]", True)]
    timings = [("output_tokens_per_sec", True), ("ttft_ms_p50", False), ("tpot_ms_p50", False)]
    expected = ([("k0", 0, "all", m, hib, None) for m, hib in timings]
                + [("vllm-L1-k1", 1, "all", m, hib, 3) for m, hib in acceptance]
                + [("vllm-L1-k1", 1, "all", m, hib, None) for m, hib in timings + [("speedup", True)]]
                + [("vllm-L1-k1", 1, "c", m, hib, 3) for m, hib in acceptance])
    got = [(r["point"], r["k"], r["category"], r["metric"], r["higher_is_better"], r["paired_prompts"])
           for r in result["rows"]]
    assert sorted(got, key=str) == sorted(expected, key=str)
    for r in result["rows"]:
        assert r["values_from"] == "each run's table" and r["level"] is None and r["ci_low"] is None
        for side in ("a", "b"):
            t = table[side][(r["k"], r["category"])]
            want = t.acceptance_rate_per_pos[0] if r["metric"].endswith("[0]") else getattr(t, r["metric"])
            assert r[side] == pytest.approx(want, abs=1e-6), (r, side)
    # known answers: A accepted 22 of 80 drafts over all prompts, B 40 of 80
    assert row(result, "acceptance_length", "vllm-L1-k1")["a"] == pytest.approx(1.275)
    assert row(result, "acceptance_length", "vllm-L1-k1")["b"] == pytest.approx(1.5)
    assert [row(result, "speedup", "vllm-L1-k1")[s] for s in "ab"] == [pytest.approx(2.0), pytest.approx(2.2)]


def test_a_point_failed_in_b_is_named_with_its_error_and_two_points_that_pair_alike_are_refused(tmp_path):
    """A failed point pairs with A's by its load (the same key as a point that ran) and is listed with B's error;
    a run whose two points pair as one is refused with the way out."""
    from mtpbench.errors import MtpBenchError

    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    b = make_run(tmp_path / "b", STEADY, STEADY, HARD_AND_EASY)
    k2 = json.loads((b / "vllm-L1-k2.json").read_text())
    (b / "vllm-L1-k2.json").unlink()
    (b / "vllm-L1-k2.failure.json").write_text(json.dumps({"point": k2["point"], "error": "CUDA out of memory",
                                                          "fingerprint": k2["fingerprint"]}))
    result = cmp.compare(a, b)
    assert result["failed"] == [{"point": "vllm-L1-k2", "failed_in": "B", "error": "CUDA out of memory"}]
    assert result.get("missing_in_b", []) == []
    # A's k = 2 point again under another drafting mode: A has two modes, B one, so modes are left out of the key
    c = make_run(tmp_path / "c", STEADY, STEADY, HARD_AND_EASY)
    other = json.loads((c / "vllm-L1-k2.json").read_text())
    (c / "other.json").write_text(json.dumps({**other, "point": {**other["point"], "mode": "other"}}))
    with pytest.raises(MtpBenchError, match="its points (vllm-L1-k2 and other-L1-k2|other-L1-k2 and vllm-L1-k2) "
                                            "differ only in drafting mode, so neither pairs with one point of the "
                                            "other run: compare runs with one drafting mode each, or the same modes "
                                            "on both sides"):
        cmp.compare(c, a)


def test_runs_of_one_prompt_set_with_other_texts_are_named_so(tmp_path):
    """Issue 45 item 8: "prompts ('builtin' vs 'builtin': other prompt texts)" read as a contradiction; the same set
    with other texts says what could make them differ."""
    from mtpbench.errors import MtpBenchError

    a = make_run(tmp_path / "a", STEADY, STEADY, HARD_AND_EASY)
    b = make_run(tmp_path / "b", STEADY, STEADY, HARD_AND_EASY)
    for d, sha in ((a, "1"), (b, "2")):
        run = json.loads((d / "run.json").read_text())
        (d / "run.json").write_text(json.dumps({**run, "prompts": {"sha256": sha}}))
    with pytest.raises(MtpBenchError, match=r"A and B differ in prompt texts \(both from 'builtin', but other texts: "
                                            r"another --num-prompts, --chat-template, --context-tokens or version of "
                                            r"the set\): their numbers do not pair"):
        cmp.compare(a, b)


def test_one_drafting_mode_a_side_pairs_across_modes_and_two_a_side_pair_by_mode(tmp_path):
    """B's k = 1 point drafts another way than A's: the two pair by their load, named after both; runs with the
    same two modes pair mode with mode."""
    both = [("p0", 4, "c"), ("p1", 6, "c")]
    a = k1_run(tmp_path / "a", [50.0], [100.0], both)
    b = k1_run(tmp_path / "b", [50.0], [110.0], both, mode="chain")
    result = cmp.compare(a, b)
    assert {r["point"] for r in result["rows"]} == {"k0", "vllm-L1-k1 vs chain-L1-k1"}
    # 2 prompts paired (too few for an interval): said; 1 is no pairing
    assert {r["paired_prompts"] for r in result["rows"] if r["k"] == 1 and r["metric"].startswith("acc")} == {2}
    one = k1_run(tmp_path / "one", [50.0], [110.0], both[:1], mode="chain")
    assert {r["paired_prompts"] for r in cmp.compare(a, one)["rows"]} == {None}
    c = make_run(tmp_path / "c", STEADY, STEADY, HARD_AND_EASY)
    other = json.loads((c / "vllm-L1-k2.json").read_text())
    (c / "other.json").write_text(json.dumps({**other, "point": {**other["point"], "mode": "other"}}))
    result = cmp.compare(c, c)
    assert {r["point"] for r in result["rows"]} == {"k0", "vllm-L1-k2", "other-L1-k2"}
    assert result["unpaired"] == [] and result["failed"] == []


def test_a_rows_csv_cells():
    """compare.csv's cells: unknown is empty, a float to 6 significant digits, the rest as it is."""
    from mtpbench.compare.pair import CompareRow

    r = CompareRow("x", 2, "all", "ttft_ms_p50", 1.23456789, None, None, None, None, None, "no interval", False, None,
                   "each run's table", None, None)
    assert r.to_csv() == {"point": "x", "k": 2, "category": "all", "metric": "ttft_ms_p50", "a": "1.23457", "b": "",
                          "diff": "", "rel_diff": "", "ci_low": "", "ci_high": "", "verdict": "no interval",
                          "higher_is_better": False, "paired_prompts": "", "values_from": "each run's table",
                          "level": "", "p_value": ""}


def test_prompts_pair_by_id_and_occurrence_within_their_category(tmp_path):
    """Six prompts of "c" (one of them three times) and six of "d" ran on both sides, with a request without a
    prompt id and one without per-request counts: the rows over all prompts pair 14 requests, "c"'s 8 (the n-th
    occurrence of an id with the n-th), "d"'s 6; the request without an id or counts pairs with nothing."""
    runs = []
    for side, extra in (("a", 0), ("b", 3)):
        prompts = ([(f"c{i}", 2 + i + extra, "c") for i in range(6)] + [("c0", 9 + extra, "c"), ("c0", 1, "c")]
                   + [(f"d{i}", 12 - i + extra, "d") for i in range(6)])
        d = k1_run(tmp_path / side, STEADY, STEADY, prompts)
        k1 = json.loads((d / "vllm-L1-k1.json").read_text())
        k1["requests"] += [asdict(k1_request("", 7, "c")), asdict(RequestRecord("d", 10, [1] * 40, 0.01, 0.1,
                                                                                 prompt_id="n0"))]
        (d / "vllm-L1-k1.json").write_text(json.dumps(k1))
        runs.append(d)
    result = cmp.compare(*runs)
    paired = {r["category"]: r["paired_prompts"] for r in result["rows"]
              if r["metric"] == "acceptance_length" and r["point"] == "vllm-L1-k1"}
    assert paired == {"all": 14, "c": 8, "d": 6}
    assert all(r["values_from"] == "paired prompts" for r in result["rows"] if r["metric"] == "acceptance_length")


def test_a_speedup_reads_its_k0_only_up_to_the_last_round_its_point_was_timed_in(tmp_path):
    """Rounds (sweep.rounds): k = 0 timed in rounds 0-11 (at 100 tokens/s, then 200), the k = 2 point only in 0-5:
    each side's speedup is over k = 0's runs of rounds 0-5 (x1.5 and x1.4), not over all twelve."""
    runs = []
    for side, x in (("a", 150.0), ("b", 140.0)):
        d = make_run(tmp_path / side, [100.0] * 6 + [200.0] * 6, [x, x * 1.01, x * 0.99] * 2, HARD_AND_EASY)
        for name in ("k0", "vllm-L1-k2"):
            data = json.loads((d / f"{name}.json").read_text())
            data["repeats"] = [{**r, "round": i} for i, r in enumerate(data["repeats"])]
            (d / f"{name}.json").write_text(json.dumps(data))
        runs.append(d)
    s = row(cmp.compare(*runs), "speedup")
    assert s["values_from"] == "repeats (geometric means)"
    assert (s["a"], s["b"]) == (pytest.approx(1.5, rel=1e-3), pytest.approx(1.4, rel=1e-3))


def test_a_per_position_rate_the_counters_lack_is_unknown(tmp_path):
    """B's engine counters without per-position counts (2 prompts: the table's numbers): B's rate at position 0 is
    unknown, not an error, and the row makes no claim."""
    both = [("p0", 4, "c"), ("p1", 6, "c")]
    a = k1_run(tmp_path / "a", [50.0], [100.0], both)
    b = k1_run(tmp_path / "b", [50.0], [110.0], both)
    k1 = json.loads((b / "vllm-L1-k1.json").read_text())
    for batch in k1["batches"]:
        batch["num_accepted_tokens_per_pos"] = []
    (b / "vllm-L1-k1.json").write_text(json.dumps(k1))
    r = row(cmp.compare(a, b), "acceptance_rate_per_pos[0]", "vllm-L1-k1")
    assert (r["a"], r["b"], r["verdict"]) == (0.25, None, "no interval")


def test_a_request_whose_per_position_counts_stop_short_of_k_is_compared_from_the_tables(tmp_path):
    """B's requests count acceptance at position 0 only (a list shorter than k = 2; mtpbench's writers never write
    one, another tool might): position 0 is still paired by prompt, position 1 comes from each run's table, and
    nothing raises."""
    prompts = {f"p{i}": 10 + i for i in range(6)}
    a = make_run(tmp_path / "a", [50.0] * 3, [60.0] * 3, prompts)
    b = make_run(tmp_path / "b", [50.0] * 3, [60.0] * 3, prompts)
    k2 = json.loads((b / "vllm-L1-k2.json").read_text())
    for r in k2["requests"]:
        r["num_accepted_tokens_per_pos"] = r["num_accepted_tokens_per_pos"][:1]
    (b / "vllm-L1-k2.json").write_text(json.dumps(k2))
    result = cmp.compare(a, b)
    assert row(result, "acceptance_rate_per_pos[0]")["values_from"] == "paired prompts"
    assert row(result, "acceptance_rate_per_pos[1]")["values_from"] == "each run's table"
    assert row(result, "acceptance_length")["values_from"] == "paired prompts"
