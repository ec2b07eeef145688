"""Pure pairing of two sweeps' points, rows and requests, one compared metric's row with its interval and verdict,
and --fail-if-worse's gate over the whole comparison (no I/O)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from mtpbench import stats
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult, PointRun
from mtpbench.sweep.load import rows_from_points

# metric, higher is better
ACCEPTANCE = (("acceptance_length", True), ("draft_acceptance_rate", True))

TIMINGS = (("output_tokens_per_sec", True), ("ttft_ms_p50", False), ("tpot_ms_p50", False))


@dataclass(frozen=True)
class CompareRow:
    point: str  # the paired point, A's name (B's when it differs: "chain-L3-k3 vs reuse-L3-k3")
    k: int
    category: str
    metric: str
    a: float | None
    b: float | None
    diff: float | None
    rel_diff: float | None
    ci_low: float | None  # 95 % interval of B - A
    ci_high: float | None
    verdict: str
    higher_is_better: bool
    paired_prompts: int | None  # prompts paired for acceptance; None for timings
    # where A, B and B - A come from: the data of the interval ("paired prompts": the requests both runs
    # made of the same prompts, pooled; "repeats": medians of each side's timed runs; "repeats (geometric
    # means)": a speedup's ratio of geometric means of both points' timed runs), or, with no
    # interval, "each run's table" (engine counters, which a server's foreign traffic also feeds)
    values_from: str = ""

    def to_csv(self) -> dict:
        return {k: "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Side:
    run: dict
    rows: list[PointResult]
    points: dict[tuple, tuple[GridPoint, PointRun]]  # pairing key -> point
    failures: dict[tuple, str]


def _side(loaded: tuple[dict, list[dict], list[dict]], out: Path, with_mode: bool) -> Side:
    run, points, failures = loaded
    rows = rows_from_points(points, failures)
    keyed = {}
    for d in points:
        point = GridPoint.from_json(d["point"])
        key = _key(point, with_mode)
        if key in keyed:
            raise MtpBenchError(f"{out}: two points pair as {key}: compare runs with one drafting mode each, "
                                "or the same modes on both sides")
        keyed[key] = (point, PointRun.from_json(d))
    fails = {_key(GridPoint.from_json(f["point"]), with_mode): (GridPoint.from_json(f["point"]).name, f["error"])
             for f in failures}
    return Side(run, rows, keyed, fails)


def _key(point: GridPoint, with_mode: bool) -> tuple:
    mode = point.mode if with_mode or point.k == 0 else None
    return (mode, point.k, point.mtp_layers, point.concurrency, point.request_rate, point.context_tokens)


def _modes(loaded: tuple[dict, list[dict], list[dict]]) -> set[str]:
    _, points, failures = loaded
    return {d["point"]["mode"] for d in points + failures if d["point"]["k"] > 0}


def _verdict(diff: float | None, ci: tuple[float, float] | None, higher_is_better: bool) -> str:
    """B - A is ``better`` / ``worse`` when its interval excludes 0 on the side of B - A itself, in the metric's
    good / bad direction; ``within noise`` when it does not (an end exactly at 0 included), and for B - A = 0
    with or without an interval; ``no interval`` when B - A or the interval is unknown or not finite."""
    if diff == 0:
        return "within noise"  # no difference is within any noise, interval or not
    if ci is None or diff is None or not all(math.isfinite(x) for x in (diff, *ci)):
        return "no interval"
    lo, hi = ci
    # an interval beyond 0 on the side opposite to B - A (a skewed bootstrap can do that) is no evidence
    if lo > 0 and diff > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0 and diff < 0:
        return "worse" if higher_is_better else "better"
    return "within noise"


def _row(point: str, k: int, cat: str, metric: str, a, b, ci, higher: bool, paired: int | None,
         values_from: str) -> CompareRow:
    diff = None if a is None or b is None else b - a
    rel = diff / a if diff is not None and a else (0.0 if diff == 0 else None)
    return CompareRow(point, k, cat, metric, _r6(a), _r6(b), _r6(diff), _r6(rel), None if ci is None else _r6(ci[0]),
                      None if ci is None else _r6(ci[1]), _verdict(diff, ci, higher), higher, paired, values_from)


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)

TABLE = "each run's table"

GEOMETRIC = "repeats (geometric means)"  # speedup: each run's ratio of geometric means over its repeats


def _by_prompt(requests, category: str) -> dict[tuple[str, int], object]:
    """A run's requests with per-request counts, keyed by (prompt id, occurrence): a prompt id that a set
    holds twice (a JSONL file with a repeated id) pairs its n-th request in A with its n-th in B."""
    out, seen = {}, Counter()
    for r in requests:
        if r.prompt_id and r.num_drafts is not None and (category == "all" or r.category == category):
            out[(r.prompt_id, seen[r.prompt_id])] = r
            seen[r.prompt_id] += 1
    return out


def duplicate_ids(requests) -> list[str]:
    counts = Counter(r.prompt_id for r in requests if r.prompt_id)
    return sorted(i for i, n in counts.items() if n > 1)


def _paired_requests(ra, rb, category: str):
    """Requests of both runs on the same prompts (by prompt id), with per-request counts on both sides."""
    a, b = _by_prompt(ra.requests, category), _by_prompt(rb.requests, category)
    ids = sorted(set(a) & set(b))
    return [a[i] for i in ids], [b[i] for i in ids]


def _pooled(metric: str, num: list[int], den: list[int]) -> float | None:
    """The metric over a set of requests, pooled as the sweep's table pools it (a ratio of sums)."""
    if not sum(den):
        return None
    return (1 if metric == "acceptance_length" else 0) + sum(num) / sum(den)


def compare_points(name: str, pa: tuple[GridPoint, PointRun], pb: tuple[GridPoint, PointRun],
                   rows_a: list[PointResult], rows_b: list[PointResult],
                   base: tuple[PointRun, PointRun] | None = None) -> list[CompareRow]:
    """Rows for one pair of points; ``base``: both runs' k = 0 points of the same load (for speedup)."""
    (ga, ra), (_, rb) = pa, pb
    out = []
    for row_a in rows_a:
        row_b = next((r for r in rows_b if r.category == row_a.category), None)
        if row_b is None:
            continue
        cat = row_a.category
        if ga.k > 0:
            qa, qb = _paired_requests(ra, rb, cat)
            n = len(qa) if len(qa) >= 2 else None
            specs = [(m, hib, [r.num_accepted_tokens for r in qa], [r.num_drafts if m == "acceptance_length"
                                                                    else r.num_draft_tokens for r in qa],
                      [r.num_accepted_tokens for r in qb], [r.num_drafts if m == "acceptance_length"
                                                            else r.num_draft_tokens for r in qb])
                     for m, hib in ACCEPTANCE]
            specs += [(f"acceptance_rate_per_pos[{i}]", True, [r.num_accepted_tokens_per_pos[i] for r in qa],
                       [r.num_drafts for r in qa], [r.num_accepted_tokens_per_pos[i] for r in qb],
                       [r.num_drafts for r in qb]) for i in range(ga.k)]
            for metric, hib, na, da, nb, db in specs:
                ci = stats.paired_ratio_diff_ci(na, da, nb, db) if n else None
                if ci is not None:  # A, B and B - A from the very requests the interval resamples
                    out.append(_row(name, ga.k, cat, metric, _pooled(metric, na, da), _pooled(metric, nb, db), ci,
                                    hib, n, "paired prompts"))
                else:
                    out.append(_row(name, ga.k, cat, metric, _metric(row_a, metric), _metric(row_b, metric), None,
                                    hib, n, TABLE))
        if cat == "all":
            for metric, hib in TIMINGS:
                ta, tb = [r.get(metric) for r in ra.repeats], [r.get(metric) for r in rb.repeats]
                ci = stats.median_diff_ci(ta, tb) if len(ta) > 1 and len(tb) > 1 else None
                if ci is not None:
                    out.append(_row(name, ga.k, cat, metric, stats.median(ta), stats.median(tb), ci, hib, None,
                                    "repeats"))
                else:
                    out.append(_row(name, ga.k, cat, metric, getattr(row_a, metric), getattr(row_b, metric), None,
                                    hib, None, TABLE))
            if ga.k > 0 and base is not None:
                reps = [[r.get("output_tokens_per_sec") for r in x.repeats] for x in (ra, base[0], rb, base[1])]
                est = stats.speedup_diff(*reps)
                if est is not None:  # A, B and B - A: the ratios of geometric means the interval is centred on
                    sa, sb, ci = est
                    out.append(_row(name, ga.k, cat, "speedup", sa, sb, ci, True, None, GEOMETRIC))
                else:
                    out.append(_row(name, ga.k, cat, "speedup", row_a.speedup, row_b.speedup, None, True, None, TABLE))
    return out


def _metric(row: PointResult, metric: str):
    if metric.startswith("acceptance_rate_per_pos["):
        i = int(metric[len("acceptance_rate_per_pos["):-1])
        return row.acceptance_rate_per_pos[i] if i < len(row.acceptance_rate_per_pos) else None
    return getattr(row, metric)


# ---- --fail-if-worse: the gate over a whole comparison (compare.json's dict), which the page's headline follows

def worse_beyond(result: dict, pct: float) -> list[str]:
    """What fails --fail-if-worse PCT (``pct``: 0 or more, else MtpBenchError): a point that ran in A and failed in
    B or is missing from B (a B sweep stopped halfway), and every metric over all prompts that is worse beyond
    noise by more than ``pct`` percent (per-category rows are left out: with 13 categories some would cross by
    chance); a metric worse from A = 0 has no relative change and counts at every ``pct``. When the k = 0
    control shows machine drift between the runs, raw timings are not evidence (``speedup`` still is); a
    difference in execution is no drift, and raw timings then count. Widening ``pct`` only drops entries, so
    what fails at some ``pct`` fails at 0: the page's headline is red exactly when this lists anything at 0."""
    check_pct(pct)
    drifted = {m for m, _ in TIMINGS} if result.get("timings_drifted") else set()
    out = [f"{f['point']} failed in B" for f in result["failed"] if f["failed_in"] == "B"]
    out += [f"{name} missing in B" for name in result.get("missing_in_b", [])]
    for r in result["rows"]:
        if r["category"] != "all" or r["verdict"] != "worse" or r["metric"] in drifted:
            continue
        if r["rel_diff"] is None:
            out.append(f"{r['point']} {r['metric']} from 0 to {r['b']:.4g}")
        elif abs(r["rel_diff"]) * 100 > pct:
            out.append(f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %")
    return out


def check_pct(pct: float) -> float:
    """--fail-if-worse's threshold: a finite percentage of 0 or more (a negative one or NaN would fail nothing
    or everything by accident of a comparison)."""
    if not (isinstance(pct, (int, float)) and math.isfinite(pct) and pct >= 0):
        raise MtpBenchError(f"--fail-if-worse takes a percentage of 0 or more, got {pct}")
    return pct


def exit_code(result: dict, pct: float) -> int:
    """--fail-if-worse's exit code: 1 when ``worse_beyond`` lists anything at ``pct``, else 0."""
    return 1 if worse_beyond(result, pct) else 0


def unjudged_beyond(result: dict, pct: float) -> list[str]:
    """Metrics over all prompts that moved by more than ``pct`` percent but carry no interval."""
    return [f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %" for r in result["rows"]
            if r["category"] == "all" and r["verdict"] == "no interval" and r["rel_diff"] is not None
            and abs(r["rel_diff"]) * 100 > pct]
