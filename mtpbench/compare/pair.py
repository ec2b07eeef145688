"""Pure pairing of two sweeps' points, rows and requests, one compared metric's row with its interval and verdict,
and --fail-if-worse's gate over the whole comparison (no I/O)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from mtpbench import stats
from mtpbench.errors import MtpBenchError
from mtpbench.stats import judge
from mtpbench.stats.noise import last_round, tokps, until_round
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
    # made of the same prompts, pooled; "repeats (geometric means)": a timing's geometric mean of each side's
    # timed runs, a speedup's ratio of geometric means of both points' timed runs), or, with no
    # interval, "each run's table" (engine counters, which a server's foreign traffic also feeds)
    values_from: str = ""
    # the level of the interval (1 - 0.05 / the rows judged together: stats.judge), and the p-value adjusted for
    # them where the method has one (speedup's t test; none for a bootstrap)
    level: float | None = None
    p_value: float | None = None

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
            raise MtpBenchError(f"{out}: its points {keyed[key][0].name} and {point.name} differ only in drafting "
                                f"mode, so neither pairs with one point of the other run: compare runs with one "
                                f"drafting mode each, or the same modes on both sides")
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


@dataclass
class Pending:
    """A row waiting for its judgement: its values, and ``judge(family)`` -> the stats.judge.Comparison of B - A
    at the level of a family of that size (None: no interval can be had)."""

    point: str
    k: int
    category: str
    metric: str
    a: float | None
    b: float | None
    higher_is_better: bool
    paired: int | None
    values_from: str
    judge: object = None


def _verdict(c: judge.Comparison | None, higher_is_better: bool) -> str:
    """B - A is ``better`` / ``worse`` where its comparison is decided (its interval, at the family's level and never
    narrower than the machines' noise, excludes 0 on the side of B - A itself) in the metric's good / bad direction;
    ``within noise`` where it is open, and for B - A = 0 with or without an interval; ``no interval`` when B - A or
    the interval is unknown."""
    if c is not None and c.estimate == 0:
        return "within noise"  # no difference is within any noise, interval or not
    if c is None or c.low is None:
        return "no interval"
    if c.decision == judge.OPEN:
        return "within noise"
    return "better" if (c.decision == judge.ABOVE) == higher_is_better else "worse"


def finish(pending: list[Pending]) -> list[CompareRow]:
    """The rows judged, each at the level of its family: the rows over all prompts (what --fail-if-worse reads) one
    family, the per-category rows another (stats.judge: the chance of any false better or worse among either is at
    most 0.05). A row without an interval makes no claim and is no member (whether it has one depends on the runs'
    repeats and prompts, fixed before the data)."""
    sizes = {True: sum(p.category == "all" and p.judge is not None for p in pending),
             False: sum(p.category != "all" and p.judge is not None for p in pending)}
    out = []
    for p in pending:
        c = p.judge(sizes[p.category == "all"]) if p.judge else None
        if c is not None and c.low is None:
            c = None
        diff = None if p.a is None or p.b is None else p.b - p.a
        rel = diff / p.a if diff is not None and p.a else (0.0 if diff == 0 else None)
        verdict = "within noise" if diff == 0 else _verdict(c, p.higher_is_better)
        low, high = judge.outward(c, 6) if c is not None else (None, None)
        out.append(CompareRow(p.point, p.k, p.category, p.metric, _r6(p.a), _r6(p.b), _r6(diff), _r6(rel), low, high,
                              verdict, p.higher_is_better, p.paired, p.values_from,
                              c.level if c is not None else None, judge.p_shown(c.p_value) if c is not None else None))
    return out


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)

TABLE = "each run's table"

GEOMETRIC = "repeats (geometric means)"  # timings and speedup: each run's geometric means over its repeats


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
                   base: tuple[PointRun, PointRun] | None = None,
                   floors: tuple[float | None, float | None] = (None, None)) -> list[Pending]:
    """Rows for one pair of points, to be judged together (``finish``); ``base``: both runs' k = 0 points of the
    same load (for speedup); ``floors``: each run's A/A noise floor (log ratio; None: it timed none), which no
    timing's interval is shown narrower than."""
    (ga, ra), (_, rb) = pa, pb
    out = []

    def row(cat, metric, a, b, hib, paired, values_from, judged=None):
        out.append(Pending(name, ga.k, cat, metric, a, b, hib, paired, values_from, judged))

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
            specs += [(f"acceptance_rate_per_pos[{i}]", True, _at_position(qa, i), [r.num_drafts for r in qa],
                       _at_position(qb, i), [r.num_drafts for r in qb]) for i in range(ga.k)]
            for metric, hib, na, da, nb, db in specs:
                if n and na is not None and nb is not None and stats.paired_ratio_diff_ci(na, da, nb, db) is not None:
                    # A, B and B - A from the very requests the interval resamples
                    a, b = _pooled(metric, na, da), _pooled(metric, nb, db)
                    row(cat, metric, a, b, hib, n, "paired prompts",
                        _paired(a, b, na, da, nb, db, n))
                else:
                    row(cat, metric, _metric(row_a, metric), _metric(row_b, metric), hib, n, TABLE)
        if cat == "all":
            timing_floor = judge.combined_floor(*floors, per_measure=True)
            for metric, hib in TIMINGS:
                ta, tb = [r.get(metric) for r in ra.repeats], [r.get(metric) for r in rb.repeats]
                a, b, _ = judge.timing_difference(ta, tb)
                if a is not None:  # A, B and B - A: the geometric means the interval is centred on
                    row(cat, metric, a, b, hib, None, GEOMETRIC, _timings(ta, tb, timing_floor))
                else:
                    row(cat, metric, getattr(row_a, metric), getattr(row_b, metric), hib, None, TABLE)
            if ga.k > 0 and base is not None:
                # each side's speedup as its sweep's row has it: its point against its k = 0 over the rounds the
                # point was timed in (noise.until_round)
                reps = [tokps(x) for x in (ra.repeats, until_round(base[0].repeats, last_round(ra.repeats)),
                                           rb.repeats, until_round(base[1].repeats, last_round(rb.repeats)))]
                sa, sb, _ = judge.speedup_difference(*reps)
                if sa is not None:  # A, B and B - A: the ratios of geometric means the interval is centred on
                    floor = judge.combined_floor(*floors)
                    row(cat, "speedup", sa, sb, True, None, GEOMETRIC,
                        lambda m: judge.speedup_difference(*reps, floor=floor, family=m)[2])
                else:
                    row(cat, "speedup", row_a.speedup, row_b.speedup, True, None, TABLE)
    return out


def _at_position(requests: list, i: int) -> list[int] | None:
    """Each request's accepted tokens at draft position ``i``; None where some request has no count there (a
    per-position list shorter than k: the pair is then compared from the sweeps' tables, not paired)."""
    counts = [r.num_accepted_tokens_per_pos for r in requests]
    return None if any(c is None or i >= len(c) for c in counts) else [c[i] for c in counts]


def _paired(a, b, na, da, nb, db, n):
    return lambda m: judge.difference(a, b, lambda lvl: stats.paired_ratio_diff_ci(na, da, nb, db, level=lvl),
                                      family=m, n=n)


def _timings(ta, tb, floor):
    return lambda m: judge.timing_difference(ta, tb, floor=floor, family=m)[2]


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
