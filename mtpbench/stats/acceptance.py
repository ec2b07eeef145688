"""Acceptance against its exact law, position by position (issues 46, 55; numpy only, no I/O).

At a draft position the verifier accepts the draft d with a probability the two laws fix: standard rejection
sampling accepts with min(1, p(d) / q(d)) given d (over d ~ q: sum_x min(p(x), q(x))), greedy drafting (q one-hot
at d) with p(d), and at temperature 0 with 1 exactly when d is the target's argmax. Each verify step that reached
position i (its earlier drafts accepted) gives an accept indicator x and its probability a given everything before
it; a low acceptance that follows the law is the drafter's, not the engine's.

The test (exact; issue 55). Over a position's steps the count of accepted drafts S = sum(x) is, for an engine that
follows the law, a sum of independent Bernoulli(a) given the probabilities: Poisson-binomial. Its two tails are
computed exactly (the product of the steps' generating polynomials (1 - a + a t), by FFT over a binary tree), so
``p_over`` = P(S >= s) and ``p_under`` = P(S <= s) hold their level whatever the counts: where nearly every step is
certain (a near 0 or 1), where there are three steps, and where greedy and sampled requests share a position. (A
normal z, continuity-corrected, called a correct engine out in 14 % of runs where every a was 0.999.) The tails are
exact given the probabilities; where a step's probability depends on earlier verdicts (the text the engine kept) the
simulations in docs/judgement.md measure the rate.

Certain steps. A step whose law probability is exactly 0 or 1 (clipped into [0, 1]: round-off outside counts as the
nearest end; nothing else is rounded) has no chance to vary: a draft accepted with probability 0 (``certain_over``)
or rejected with probability 1 (``certain_under``) is a *certain departure*, named as such whatever else shares its
position (one such step is proof; 100 sampled steps beside it do not dilute it). A position whose every step is
certain (temperature 0: the law is argmax agreement) has nothing to test: it ``follows`` exactly where no step
departed, and says so ("certain") instead of a z.

Levels. ``law_test(steps, over, under)``: the family is every position plus the joint test over all of them (K + 1
tests); each test reads over-acceptance at ``over`` / (K + 1) and under-acceptance at ``under`` / (K + 1) (one-sided
shares of the answer's budget, ``stats.judge.law_levels``; two-sided at ALPHA by default). Over-acceptance is lossy
(the engine keeps drafts its law rejects); under-acceptance wastes drafts. ``z`` is the exact one-sided tail shown as
a normal deviate (the smaller tail's Phi^-1(1 - p), signed: + over, - under; +-inf a certain departure; None where
every step is certain), for pages and for combining stages; the decision reads the tails, never z.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

ALPHA = 0.05  # the chance that an engine that follows the law is called out at any position or jointly
FOLLOWS, OVER, UNDER, NONE = "follows the law", "over-accepts", "under-accepts", "no draft steps"
# the verdict's words where every step's law was 0 or 1 (temperature 0: the law is argmax agreement)
CERTAIN_WORDS = "certain: each draft accepted exactly at the target's argmax"


@dataclass(frozen=True)
class PositionTest:
    """One position's (or the joint) test. ``observed`` / ``expected``: the accepted share and the mean acceptance
    probability of its ``steps``; ``p_over`` / ``p_under``: the exact one-sided tails of the accepted count over the
    steps that could vary (1 where none could); ``certain_over`` / ``certain_under``: certain departures (a draft
    accepted with probability 0, rejected with probability 1); ``over_level`` / ``under_level``: this test's
    one-sided levels; ``low`` / ``high``: observed - expected less the law's acceptance region at those levels (it
    excludes 0 exactly where the test departs; a certain departure: both the signed share of steps that cannot
    happen); ``z``: the smaller tail as a signed normal deviate (+-inf: a certain
    departure; None: every step certain); ``decision``: OVER, UNDER or FOLLOWS."""

    position: int | None  # None: the joint test over every position
    steps: int
    observed: float
    expected: float
    z: float | None
    low: float
    high: float
    p_over: float
    p_under: float
    decision: str
    certain_over: int = 0
    certain_under: int = 0
    over_level: float = ALPHA / 2
    under_level: float = ALPHA / 2

    @property
    def certain(self) -> bool:
        """Every step's law was 0 or 1: nothing could vary (z None)."""
        return self.z is None

    @property
    def under(self) -> bool:
        """It under-accepts, whether or not over-acceptance decided it: a certain rejection, or the lower tail."""
        return bool(self.certain_under) or self.p_under <= self.under_level

    @property
    def p_value(self) -> float:
        """One p for pages that print one: the smaller tail over its level, times ALPHA (so below ALPHA exactly where
        the test departs), capped at 1; 0 for a certain departure."""
        if self.certain_over or self.certain_under:
            return 0.0
        return min(1.0, min(self.p_over / self.over_level, self.p_under / self.under_level) * ALPHA)


DIRECT = 2000  # up to this many steps the count's law by the direct recursion (exact to round-off in every tail)


def _products(a: np.ndarray) -> np.ndarray:
    """The Poisson-binomial law of the sum of independent Bernoulli(a_i): the coefficients of prod (1 - a_i + a_i t).
    Up to DIRECT steps by the recursion P_j(s) = P_{j-1}(s) (1 - a_j) + P_{j-1}(s - 1) a_j (relative precision in
    every tail); beyond, multiplied pairwise up a binary tree (FFT at each level, all pairs at once; its error is
    about 1e-15 of the largest mass, far below any level read), clipped at 0 and normalised."""
    if a.size <= DIRECT:
        pmf = np.zeros(a.size + 1)
        pmf[0] = 1.0
        for j, aj in enumerate(a, 1):
            pmf[1 : j + 1] = pmf[1 : j + 1] * (1.0 - aj) + pmf[:j] * aj
            pmf[0] *= 1.0 - aj
        return pmf
    m = 1 << (a.size - 1).bit_length()
    polys = np.zeros((m, 2))
    polys[:, 0] = 1.0
    polys[: a.size, 0], polys[: a.size, 1] = 1.0 - a, a
    while polys.shape[0] > 1:
        length = 2 * polys.shape[1] - 1
        size = 1 << (length - 1).bit_length()
        f = np.fft.rfft(polys, size, axis=1)
        polys = np.fft.irfft(f[0::2] * f[1::2], size, axis=1)[:, :length]
        np.clip(polys, 0.0, None, out=polys)
    pmf = polys[0, : a.size + 1]
    return pmf / pmf.sum()


def tails(probability, accepted_count: int) -> tuple[float, float]:
    """(P(S >= s), P(S <= s)) for S Poisson-binomial over ``probability`` (each in (0, 1)), s = ``accepted_count``."""
    pmf = _products(np.asarray(probability, dtype=float))
    s = int(accepted_count)
    return min(1.0, float(pmf[s:].sum())), min(1.0, float(pmf[: s + 1].sum()))


def _deviate(p_over: float, p_under: float) -> float:
    """The smaller one-sided tail as a signed normal deviate (0 where neither is below one half); finite (only a
    certain departure is infinite)."""
    if p_over < p_under and p_over < 0.5:  # a tail that underflows is shown as 1e-300's deviate, never infinite
        return -NormalDist().inv_cdf(max(p_over, 1e-300))
    if p_under < p_over and p_under < 0.5:
        return NormalDist().inv_cdf(max(p_under, 1e-300))
    return 0.0


def _region(pmf: np.ndarray, over_level: float, under_level: float) -> tuple[int, int]:
    """The law's acceptance region of the count [lo, hi]: the counts whose upper tail exceeds ``over_level`` and whose
    lower tail exceeds ``under_level``."""
    upper = np.cumsum(pmf[::-1])[::-1]  # P(S >= s)
    lower = np.cumsum(pmf)  # P(S <= s)
    hi = int(np.nonzero(upper > over_level)[0].max())
    lo = int(np.nonzero(lower > under_level)[0].min())
    return lo, hi


def position_test(accepted, probability, position: int | None, family: int, over: float = ALPHA / 2,
                  under: float = ALPHA / 2) -> PositionTest:
    """The test of one position's steps: ``accepted`` (0/1) and ``probability`` (each step's a), same length > 0; each
    side at its family-wise level over ``family`` tests."""
    x, a = np.asarray(accepted, dtype=float), np.clip(np.asarray(probability, dtype=float), 0.0, 1.0)
    n = x.size
    over_level, under_level = over / max(1, family), under / max(1, family)
    sure = (a == 0.0) | (a == 1.0)
    certain_over = int(((a == 0.0) & (x > 0)).sum())
    certain_under = int(((a == 1.0) & (x == 0)).sum())
    xs, av = x[~sure], a[~sure]
    s = int(xs.sum())
    pmf = _products(av)
    p_over, p_under = min(1.0, float(pmf[s:].sum())), min(1.0, float(pmf[: s + 1].sum()))
    # over-acceptance (lossy) decides where both sides depart (a broken verifier can do both at one position: vLLM
    # #55005's garbage over-accepts sampled drafts and rejects certain ones); the verdict names both sides
    z: float | None = None if not av.size else _deviate(p_over, p_under)
    lo, hi = _region(pmf, over_level, under_level)
    low, high = (s - hi) / n, (s - lo) / n  # the observed count less the region's ends, a share of the steps
    if certain_over:
        z, decision, low, high = math.inf, OVER, certain_over / n, certain_over / n  # the share that cannot happen
    elif p_over <= over_level:
        decision = OVER
    elif certain_under:
        z, decision, low, high = -math.inf, UNDER, -certain_under / n, -certain_under / n
    else:
        decision = UNDER if p_under <= under_level else FOLLOWS
    return PositionTest(position, n, float(x.mean()), float(a.mean()), z, low, high, p_over, p_under, decision,
                        certain_over, certain_under, over_level, under_level)


def law_test(steps: list[tuple[int, int, float]], over: float = ALPHA / 2, under: float = ALPHA / 2,
             family: int | None = None) -> tuple[str, list[PositionTest]]:
    """Every position's test and the joint one from (position, accepted 0/1, acceptance probability) steps, each
    side at ``over`` / ``under`` over the family (its positions and the joint test; ``family``: more, where the
    answer holds other tests too, as a sweep's points do); the verdict: FOLLOWS (with CERTAIN_WORDS where every
    step was certain), "over-accepts at position i[, j]" (lossy; "certainly" where a certain departure decided every
    one named), "under-accepts at position i" (drafts wasted), both where positions depart both ways, or NONE
    without steps. The joint test last; the positions' tests decide
    where, the joint one alone says the whole departs (e.g. "over-accepts (all positions together)")."""
    if not steps:
        return NONE, []
    positions = sorted({s[0] for s in steps})
    family = max(family or 0, len(positions) + 1)
    tests = [position_test([s[1] for s in steps if s[0] == i], [s[2] for s in steps if s[0] == i], i, family, over,
                           under) for i in positions]
    joint = position_test([s[1] for s in steps], [s[2] for s in steps], None, family, over, under)
    return verdict_of(tests + [joint]), tests + [joint]


def verdict_of(tests: list) -> str:
    """The verdict in words from a family's tests (the joint one last): the departing positions in order, each side
    "certainly" where certain departures decided all of its positions; the joint test only where no position
    departs; FOLLOWS, with CERTAIN_WORDS where no test had a step that could vary."""
    positions, joint = tests[:-1], tests[-1]
    said = []
    for d, count in ((OVER, "certain_over"), (UNDER, "certain_under")):
        # a position that departs both ways (over-acceptance decides it) is named on both sides
        at = [t for t in positions if t.decision == d or (d == UNDER and t.under)]
        if at:
            sure = " certainly" if all(getattr(t, count) for t in at) else ""
            said.append(f"{d}{sure} at position{'s' if len(at) > 1 else ''} {', '.join(str(t.position) for t in at)}")
    if not said and joint.decision != FOLLOWS:
        said = [f"{joint.decision} (all positions together)"]
    if said:
        return "; ".join(said)
    return f"{FOLLOWS} ({CERTAIN_WORDS})" if joint.certain else FOLLOWS


def follows(verdict: str | None) -> bool:
    """A verdict that the engine follows its law (tested, or certain at every step)."""
    return bool(verdict) and verdict.startswith(FOLLOWS)
