"""One judgement of noise: whether A differs from B beyond noise, decided here and nowhere else (numpy only, no I/O).

Every answer that says "beyond noise" reads a ``Comparison`` made here: a sweep row's speedup and its ``decided``
column, the sweep's headline and the rounds' stopping (``sweep.rounds``), tune's choice, its reliability flags and
its choice by goodput, compare's verdicts and --fail-if-worse, and the A/A drift flag. A comparison holds the
estimate, the interval shown, the family-adjusted p-value and the decision; pages, tables, CSV and JSON print those
fields and compute none of their own.

The rule. An answer makes a *family* of ``m`` comparisons (a sweep: each k > 0 point against its k = 0; a tune:
every comparison its rule makes; compare: its rows over all prompts), each looked at up to ``L`` times (sequential
rounds stop on the data). Each comparison's interval has level 1 - alpha / (m L) (Bonferroni), and is never
narrower than the machine's A/A noise floor (``floor``, in log ratio: two identical timings differ by that much);
the decision is the side of the null (1 for a ratio, 0 for a difference) the whole interval lies on, ``above`` or
``below``, else ``open``. By the union bound the chance that any interval of the answer misses its truth at any
look is at most alpha, so a decided comparison names the wrong side with probability at most alpha, whichever
look the data stopped at, and whichever of the family's comparisons an answer then reads.

The p-value shown is the same test's two-sided p times m L (capped at 1), and 1 where the estimate lies within the
floor: a comparison is decided exactly where that p is below alpha (the interval's t point is the exact inverse of
the p-value's tail, ``t_isf``). Holm's step-down rejects a little more than Bonferroni, but has no interval dual to
it: a choice read from Holm's p beside an interval at another level could show a chosen k whose interval holds 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from mtpbench.stats.intervals import LEVEL, MIN_REPEATS_RATIO, t_quantile, t_sf

ROUNDOFF = 1e-12  # a log ratio or a difference of speedups this close to 0 with no spread is 0 (float round-off)
ALPHA = 0.05  # family-wise: the chance that any decision of one answer names the wrong side
ABOVE, BELOW, OPEN = "above", "below", "open"


@dataclass(frozen=True)
class Comparison:
    """One comparison as every artifact shows it. ``estimate``: B / A (a ratio) or B - A (a difference), None where
    the data give none; ``low``/``high``: its interval at ``level``, never narrower than ``floor``; ``p_value``: the
    two-sided p-value adjusted for the family and the looks (None where the method has none, e.g. a bootstrap);
    ``decision``: ABOVE / BELOW the null, or OPEN."""

    estimate: float | None
    low: float | None
    high: float | None
    p_value: float | None
    level: float
    decision: str
    family: int = 1
    looks: int = 1
    floor: float = 0.0  # log ratio
    n: int = 0  # the fewer repeats (or paired items) of the two sides
    null: float = 1.0  # no difference: 1 for a ratio, 0 for a difference

    @property
    def decided(self) -> bool:
        return self.decision != OPEN

    def to_json(self, nd: int = 5) -> dict:
        low, high = outward(self, nd)
        return {"estimate": None if self.estimate is None else round(self.estimate, nd), "low": low, "high": high,
                "p_value": p_shown(self.p_value), "level": self.level, "decision": self.decision,
                "family": self.family, "looks": self.looks, "floor": round(self.floor, 5), "n": self.n}


def outward(c: Comparison, nd: int = 4) -> tuple[float | None, float | None]:
    """The interval's ends rounded outward to ``nd`` decimals (the low end down, the high end up), so the rounded
    interval holds the exact one; an end that rounding would carry onto the null of a decided comparison keeps
    every digit (a decided interval never reads as touching the null)."""
    if c.low is None or c.high is None:
        return None, None
    q = 10 ** nd
    low, high = math.floor(c.low * q) / q, math.ceil(c.high * q) / q
    if c.decision == ABOVE and low <= c.null:
        low = c.low
    if c.decision == BELOW and high >= c.null:
        high = c.high
    return low, high


def p_shown(p: float | None, alpha: float = ALPHA) -> float | None:
    """A p-value to 3 significant digits, or more where 3 would carry it across ``alpha`` (0.04996 is not 0.05)."""
    if p is None:
        return None
    for digits in (3, 6, 17):
        shown = float(f"{p:.{digits}g}")
        if (shown < alpha) == (p < alpha):
            return shown
    return p


def level(family: int = 1, looks: int = 1, alpha: float = ALPHA) -> float:
    """Each comparison's two-sided level in a family of ``family`` comparisons looked at ``looks`` times."""
    return 1.0 - alpha / (max(1, family) * max(1, looks))


def decide(low: float | None, high: float | None, null: float) -> str:
    """ABOVE where the whole interval lies above ``null``, BELOW where below it, else OPEN (also with no interval:
    an end exactly at the null is not beyond it)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return OPEN
    return ABOVE if low > null else BELOW if high < null else OPEN


def _t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(t * t / df))


def t_isf(a: float, df: float) -> float:
    """The t with P(T > t) = ``a`` (0 < a < 0.5) for Student's t with ``df`` > 0 degrees of freedom: the exact
    inverse of ``intervals.t_sf`` (Newton's method kept inside a shrinking bracket, from the Cornish-Fisher
    value), so an interval at a level excludes the null exactly where the same test's p-value is below it."""
    if math.isinf(df):
        return NormalDist().inv_cdf(1 - a)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > a:  # P(T > t) falls to 0: a bracket [lo, hi] with sf(lo) >= a > sf(hi)
        lo, hi = hi, 2 * hi
    t = min(max(t_quantile(1 - a, max(df, 1.0)), lo), hi)
    for _ in range(200):
        f = t_sf(t, df) - a
        if f > 0:
            lo = t
        else:
            hi = t
        step = f / _t_pdf(t, df)
        nxt = t + step
        if not lo < nxt < hi:  # Newton left the bracket: bisect
            nxt = (lo + hi) / 2
        if abs(nxt - t) <= 1e-14 * max(1.0, abs(t)) or hi - lo <= 1e-14 * max(1.0, hi):
            return nxt
        t = nxt
    return t


def _logs(values) -> np.ndarray:
    return np.log(np.asarray([v for v in values if v is not None and v > 0], float))


def _welch(parts: list[tuple[float, np.ndarray]]) -> tuple[float, float]:
    """Standard error and Welch-Satterthwaite df of sum(w * mean(x)) over independent groups (w, x), each >= 2."""
    c = [float(w * w * x.var(ddof=1) / x.size) for w, x in parts]
    if sum(c) == 0:
        return 0.0, math.inf
    return math.sqrt(sum(c)), sum(c) ** 2 / sum(ci * ci / (x.size - 1) for ci, (_, x) in zip(c, parts))


def _t_test(est: float, se: float, df: float, lvl: float, floor_half: float, scale, null: float,
            adjust: int) -> tuple[float, float, float, str]:
    """Interval, adjusted p-value and decision of a t statistic ``est`` / ``se`` on the scale where the interval is
    symmetric (log ratio, or a difference); ``floor_half``: the narrowest half-width on that scale; ``scale``: back to
    the shown scale (exp, or identity); ``adjust``: family x looks."""
    if abs(est) <= ROUNDOFF:
        # no difference within float round-off (two equal speedups computed from different timings, e.g. both runs'
        # repeats scaled alike): no evidence, whatever spread the round-off left (an interval [1.1e-16, 1e-06] of
        # two speedups of 0.7 read "better")
        est = 0.0
    if se == 0:  # no spread: the sign alone decides
        half, p = 0.0, (1.0 if est == 0 else 0.0)
    elif est == 0:
        half, p = t_isf((1 - lvl) / 2, df) * se, 1.0
    else:
        half = t_isf((1 - lvl) / 2, df) * se
        p = min(1.0, 2 * float(t_sf(abs(est) / se, df)))
    if abs(est) <= floor_half:
        p = 1.0  # within the machine's noise: no interval at any level excludes the null
    half = max(half, floor_half)
    low, high = scale(est - half), scale(est + half)
    return low, high, min(1.0, p * adjust), decide(low, high, null)


def ratio(num, den, floor: float = 0.0, family: int = 1, looks: int = 1, alpha: float = ALPHA) -> Comparison:
    """``num``'s typical timing over ``den``'s (tokens/s at k over k = 0, goodput, an A/A copy over its original):
    the ratio of geometric means of the repeats, Welch's t on their logs (timing noise is multiplicative), the
    interval at ``level(family, looks)`` widened to ``floor`` each side (log ratio). From MIN_REPEATS_RATIO positive
    repeats a side; fewer: no estimate, OPEN."""
    ln, ld = _logs(num), _logs(den)
    n, lvl = min(ln.size, ld.size), level(family, looks, alpha)
    if n < MIN_REPEATS_RATIO:
        return Comparison(None, None, None, None, lvl, OPEN, family, looks, floor, n)
    d = float(ln.mean() - ld.mean())
    se, df = _welch([(1.0, ln), (1.0, ld)])
    low, high, p, decision = _t_test(d, se, df, lvl, floor, math.exp, 1.0, max(1, family) * max(1, looks))
    return Comparison(math.exp(d), low, high, p, lvl, decision, family, looks, floor, n)


def speedup_difference(a_k, a_0, b_k, b_0, floor: float = 0.0, family: int = 1,
                       alpha: float = ALPHA) -> tuple[float | None, float | None, Comparison]:
    """B's speedup minus A's, each a point's tokens/s over its own run's k = 0 (ratios of geometric means, as
    ``ratio`` gives them), so drift between the runs cancels: the delta method on the logs with Welch-Satterthwaite
    df over the four sets of repeats. ``floor``: the narrowest half-width of log(B's speedup / A's) (both runs' A/A
    floors combined, ``combined_floor``); the difference's interval is never narrower than B's speedup moved by it.
    From MIN_REPEATS_RATIO repeats each. Returns A's speedup, B's (None below that) and the comparison of B - A."""
    logs = [_logs(v) for v in (a_k, a_0, b_k, b_0)]
    if min(x.size for x in logs) < MIN_REPEATS_RATIO:
        return _none_between(floor, family, alpha, min(x.size for x in logs))
    sa = math.exp(logs[0].mean() - logs[1].mean())
    sb = math.exp(logs[2].mean() - logs[3].mean())
    parts = [(sa, logs[0]), (sa, logs[1]), (sb, logs[2]), (sb, logs[3])]
    return sa, sb, _between(sa, sb, parts, floor, family, alpha, min(x.size for x in logs))


def timing_difference(a, b, floor: float = 0.0, family: int = 1,
                      alpha: float = ALPHA) -> tuple[float | None, float | None, Comparison]:
    """One timing of two runs (tokens/s, TTFT, TPOT of a point), B's minus A's: each run's geometric mean of its
    repeats, the delta method on the logs with Welch-Satterthwaite df (timing noise is multiplicative: a t interval
    holds its level at any family, where a bootstrap of 6 medians cannot reach 1 - 0.05 / 45). ``floor``: the
    narrowest half-width of log(B / A) (``combined_floor(..., per_measure=True)``). From MIN_REPEATS_RATIO repeats
    each. Returns A's geometric mean, B's (None below that) and the comparison of B - A."""
    la, lb = _logs(a), _logs(b)
    if min(la.size, lb.size) < MIN_REPEATS_RATIO:
        return _none_between(floor, family, alpha, min(la.size, lb.size))
    ga, gb = math.exp(la.mean()), math.exp(lb.mean())
    return ga, gb, _between(ga, gb, [(ga, la), (gb, lb)], floor, family, alpha, min(la.size, lb.size))


def gmean_ci(values, level: float = LEVEL) -> tuple[float, float] | None:
    """The t interval of a geometric mean: exp(mean log -+ t_{n-1} s / sqrt(n)) over the runs' logs (exact where
    the noise is log-normal, as ``stats.judge`` assumes); None below ``MIN_REPEATS_RATIO`` runs or where a run's
    figure is 0."""
    x = [float(v) for v in values if v is not None]
    if len(x) < MIN_REPEATS_RATIO or min(x) <= 0:
        return None
    logs = np.log(np.asarray(x))
    half = t_isf((1 - level) / 2, logs.size - 1) * float(logs.std(ddof=1)) / math.sqrt(logs.size)
    return math.exp(float(logs.mean()) - half), math.exp(float(logs.mean()) + half)


def _none_between(floor: float, family: int, alpha: float, n: int) -> tuple[None, None, Comparison]:
    return None, None, Comparison(None, None, None, None, level(family, 1, alpha), OPEN, family, 1, floor, n, 0.0)


def _between(a: float, b: float, parts: list[tuple[float, np.ndarray]], floor: float, family: int, alpha: float,
             n: int) -> Comparison:
    """B - A of two positive estimates, each exp of a sum of mean logs (``parts``: its weight and the logs of each
    set of repeats, for the delta method): the t interval at ``level(family)``, widened to B moved by ``floor``."""
    lvl = level(family, 1, alpha)
    se, df = _welch(parts)
    diff = b - a
    low, high, p, _ = _t_test(diff, se, df, lvl, 0.0, lambda x: x, 0.0, max(1, family))
    low, high = widen_difference(low, high, a, b, floor)
    if floor and abs(math.log(b / a)) <= floor:
        p = 1.0
    return Comparison(diff, low, high, p, lvl, decide(low, high, 0.0), family, 1, floor, n, 0.0)


def widen_difference(low: float, high: float, a: float, b: float, floor: float) -> tuple[float, float]:
    """An interval of B - A made no narrower than B moved by the floor (log ratio) each way: [B e^-floor - A,
    B e^floor - A]."""
    if not floor:
        return low, high
    return min(low, b * math.exp(-floor) - a), max(high, b * math.exp(floor) - a)


def difference(a: float | None, b: float | None, interval_at, family: int = 1, floor: float = 0.0,
               alpha: float = ALPHA, n: int = 0) -> Comparison:
    """B - A from an interval method without a p-value (a bootstrap): ``interval_at(level)`` -> (low, high) of B - A
    or None. The interval at ``level(family)``, never narrower than B moved by ``floor`` (log ratio; timings only);
    decided where it excludes 0 on the side of B - A itself (a skewed bootstrap beyond 0 on the other side is no
    evidence)."""
    lvl = level(family, 1, alpha)
    diff = None if a is None or b is None else b - a
    ci = interval_at(lvl) if diff is not None else None
    if diff is None or ci is None or not all(math.isfinite(x) for x in (diff, *ci)):
        return Comparison(diff, None, None, None, lvl, OPEN, family, 1, floor, n, 0.0)
    low, high = widen_difference(ci[0], ci[1], a, b, floor)
    decision = decide(low, high, 0.0)
    if (decision == ABOVE and diff <= 0) or (decision == BELOW and diff >= 0):
        decision = OPEN
    return Comparison(diff, low, high, None, lvl, decision, family, 1, floor, n, 0.0)


def combined_floor(*floors: float | None, per_measure: bool = False) -> float:
    """The floor of a comparison across runs, from each run's A/A floor (log ratio; None: that run timed none).
    An A/A floor bounds the ratio of two timings of one run; a ratio of two speedups (four timings, two a run)
    carries both runs' floors, sqrt(fa^2 + fb^2); a ratio of one timing of each run (``per_measure``) half of each
    one's variance, sqrt((fa^2 + fb^2) / 2)."""
    squares = sum(f * f for f in floors if f)
    return math.sqrt(squares / 2 if per_measure else squares)


def end_text(x: float, null: float, digits: int = 3, style: str = "g") -> str:
    """An interval's end as text, to ``digits`` (significant for style "g", decimals for "f"), with more digits where
    fewer would print it on the null or across it while it lies off it: an interval that excludes the null never
    reads as touching it."""
    for d in range(digits, 18):
        text = f"{x:.{d}{style}}"
        if x == null or (float(text) != null and (float(text) > null) == (x > null)):
            return text
    return repr(x)


def interval_text(low: float, high: float, null: float, digits: int = 3, style: str = "g") -> str:
    """"[low, high]" with ``end_text``'s ends."""
    return f"[{end_text(low, null, digits, style)}, {end_text(high, null, digits, style)}]"


def level_text(lvl: float) -> str:
    """A level as a percentage to at most two decimals: 95 %, 99.9 %, 99.17 % (1 - 0.05 / 6)."""
    return f"{100 * lvl:.2f}".rstrip("0").rstrip(".") + " %"


def law_levels(alpha: float = ALPHA, family: int | None = None) -> dict:
    """The acceptance law's share of an answer that reads it on its own (trace-layers, a sweep's --law): two-sided,
    alpha / 2 a side (over-acceptance, under-acceptance), Bonferroni over ``family`` tests (a sweep: every k > 0
    point's positions and joint test; None: the block's own). ``stats.acceptance.law_test``'s keywords."""
    return {"over": alpha / 2, "under": alpha / 2, **({"family": family} if family else {})}


def law_family(ks) -> int:
    """The law tests of a sweep's --law answer: each k > 0 point's k positions and its joint test (an upper bound:
    a position no draft reached is not tested)."""
    return sum(k + 1 for k in ks if k > 0)


# check-lossless's budget (its rule and the union bounds: stats/verdict.py's docstring; simulated: docs/judgement.md),
# every share of it here, beside the other answers' levels
ALARM_EXCESS = 0.3  # stage 1: the excess test's two-sided p below this raises an alarm
CONFIRM_EXCESS = 0.05  # stage 2 on its own: two-sided, and the same way as stage 1's z (so 0.025 of a null's draws)
ALARM_AB, CONFIRM_AB = 0.05, 0.01  # the two-sample test beside the excess test: stage 1, stage 2 on its own
ALARM_AB_ALONE, CONFIRM_AB_ALONE = 0.3, 0.05  # the two-sample test alone (no target entropies)
COMBINE = 0.005  # both stages combined (Stouffer, weighted by sqrt(continuations)): two-sided, both the same way
FALSE_LOSSY_BOUND, FALSE_LOSSY_BOUND_ALONE = 0.0158, 0.0159  # the union bounds of stats/verdict.py's docstring
# the third test, acceptance against its exact law (``LawEvidence``), where the drafting arm's verify steps were
# read: one-sided (over-acceptance only), family-wise over the positions and the joint test (Bonferroni). Its
# shares come out of the same budgets: beside it the excess test alarms at ALARM_EXCESS_LAW, the two-sample test
# alone at ALARM_AB_ALONE_LAW (stats/verdict.py's docstring re-derives the bounds)
ALARM_LAW, CONFIRM_LAW, COMBINE_LAW = 0.015, 0.001, 0.0005
ALARM_EXCESS_LAW, ALARM_AB_ALONE_LAW = 0.26, 0.265
ALPHA_AA = 0.01  # each stage's A/A control (off against off again): it checks the engine, not a second coin toss


# the words each answer uses for a decision
def speed(c: Comparison) -> str:
    """A timing ratio's decision: faster, slower or open."""
    return {ABOVE: "faster", BELOW: "slower"}.get(c.decision, OPEN)
