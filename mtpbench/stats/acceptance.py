"""Acceptance against its exact law, position by position (issue 46; numpy only, no I/O).

At a draft position the verifier accepts the draft d with a probability the two laws fix: standard rejection
sampling accepts with min(1, p(d) / q(d)) given d (over d ~ q: sum_x min(p(x), q(x))), greedy drafting (q one-hot
at d) with p(d), and at temperature 0 with 1 exactly when d is the target's argmax. Each verify step that reached
position i (its earlier drafts accepted) gives an accept indicator x and its probability a given everything before
it, so x - a is a martingale difference with variance a (1 - a): over a position's steps,
z = sum(x - a) / sqrt(sum a (1 - a)) is about standard normal while the engine follows the law, whatever the drafter
(a martingale central limit theorem; low acceptance that follows the law is the drafter's, not the engine's).

The test. The family is every position plus the joint test over all of them (K + 1 tests), each two-sided at
alpha / (K + 1) (Bonferroni), so the chance that a correct engine is called out anywhere is at most about alpha.
z above the point: the engine over-accepts there (lossy: it keeps drafts the law would reject); below: it
under-accepts (lossless but slow: drafts wasted). Steps whose a is 0 or 1 (greedy) carry no variance: one of them
with x != a is a certain departure (z infinite); with none such and no variance left, z is 0. The count is
continuity-corrected (|sum(x - a)| less half a step, the interval half a step wider): where acceptance is nearly
always 1 the few rejections are far from normal, and one rejection where 0.05 were expected is no alarm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONTINUITY = 0.5  # a count against its expectation: half a step either way (rare rejections are not normal)
ALPHA = 0.05  # the chance that an engine that follows the law is called out at any position or jointly
FOLLOWS, OVER, UNDER, NONE = "follows the law", "over-accepts", "under-accepts", "no draft steps"


@dataclass(frozen=True)
class PositionTest:
    """One position's (or the joint) test. ``observed`` / ``expected``: the accepted share and the mean acceptance
    probability of its ``steps``; ``low`` / ``high``: the interval of observed - expected at the family's level;
    ``z``; ``p_value``: two-sided, times the family (capped at 1); ``decision``: OVER, UNDER or FOLLOWS."""

    position: int | None  # None: the joint test over every position
    steps: int
    observed: float
    expected: float
    z: float
    low: float
    high: float
    p_value: float
    decision: str


def position_test(accepted, probability, position: int | None, family: int, alpha: float = ALPHA) -> PositionTest:
    """The test of one position's steps: ``accepted`` (0/1) and ``probability`` (each step's a), same length > 0."""
    x, a = np.asarray(accepted, dtype=float), np.clip(np.asarray(probability, dtype=float), 0.0, 1.0)
    n, diff, var = x.size, float((x - a).sum()), float((a * (1.0 - a)).sum())
    point = NormalDist().inv_cdf(1.0 - alpha / (2 * family))
    reach = max(0.0, abs(diff) - CONTINUITY)
    if var > 0:
        z = math.copysign(reach / math.sqrt(var), diff)
        p = min(1.0, 2.0 * NormalDist().cdf(-abs(z)) * family)
    else:  # every step certain: any departure is one for sure
        z = 0.0 if reach == 0 else math.copysign(math.inf, diff)
        p = 1.0 if reach == 0 else 0.0
    half = (point * math.sqrt(var) + CONTINUITY) / n
    decision = OVER if z > point else UNDER if z < -point else FOLLOWS
    return PositionTest(position, n, float(x.mean()), float(a.mean()), z, diff / n - half, diff / n + half, p,
                        decision)


def law_test(steps: list[tuple[int, int, float]], alpha: float = ALPHA) -> tuple[str, list[PositionTest]]:
    """Every position's test and the joint one from (position, accepted 0/1, acceptance probability) steps; the
    verdict: FOLLOWS, "over-accepts at position i[, j]" (lossy), "under-accepts at position i" (drafts wasted),
    both where positions depart both ways, or NONE without steps. The joint test last; the positions' tests
    decide where, the joint one alone says the whole departs (e.g. "over-accepts (all positions together)")."""
    if not steps:
        return NONE, []
    positions = sorted({s[0] for s in steps})
    family = len(positions) + 1
    tests = [position_test([s[1] for s in steps if s[0] == i], [s[2] for s in steps if s[0] == i], i, family, alpha)
             for i in positions]
    joint = position_test([s[1] for s in steps], [s[2] for s in steps], None, family, alpha)
    said = [f"{d} at position{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}"
            for d in (OVER, UNDER) if (at := [t.position for t in tests if t.decision == d])]
    if not said and joint.decision != FOLLOWS:
        said = [f"{joint.decision} (all positions together)"]
    return ("; ".join(said) or FOLLOWS), tests + [joint]
