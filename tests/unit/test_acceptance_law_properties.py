"""Acceptance against its exact law (issues 46, 55): each position's and the joint test, their tails, certain
departures and the verdict, against an oracle written here from the rule in mtpbench/stats/acceptance.py's
docstring (the count's law by enumerating every outcome of the steps, never the code's recursion); and the stated
error rate by simulation through the code in the regimes where a normal z failed (near-certain steps, few steps,
greedy and sampled steps at one position, probabilities that depend on earlier verdicts). No model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.stats.acceptance import CERTAIN_WORDS, FOLLOWS, NONE, OVER, UNDER, follows, law_test, tails

ALPHA = 0.05

# a probability a hair outside [0, 1] (float round-off in an engine's min(1, p / q)) counts as its nearest end
step = st.tuples(st.integers(0, 2), st.integers(0, 1),
                 st.one_of(st.sampled_from([0.0, 1.0, -1e-9, 1 + 1e-9, 0.999, 0.001]),
                           st.floats(0.0, 1.0, allow_nan=False), st.floats(-0.2, 1.2, allow_nan=False)))


def enumerated(a: list[float], s: int) -> tuple[float, float]:
    """P(S >= s), P(S <= s) for S the number of successes of independent Bernoulli(a): every outcome enumerated."""
    up = down = 0.0
    for xs in itertools.product((0, 1), repeat=len(a)):
        pr = math.prod(ai if x else 1 - ai for ai, x in zip(a, xs))
        up += pr if sum(xs) >= s else 0.0
        down += pr if sum(xs) <= s else 0.0
    return up, down


def region(a: list[float], over_level: float, under_level: float) -> tuple[int, int]:
    """The counts the law accepts at these levels, from the enumerated law: [the smallest count whose lower tail
    exceeds ``under_level``, the largest whose upper tail exceeds ``over_level``]."""
    n = len(a)
    tails_at = [enumerated(a, s) for s in range(n + 1)]
    return (min(s for s in range(n + 1) if tails_at[s][1] > under_level),
            max(s for s in range(n + 1) if tails_at[s][0] > over_level))


def oracle(steps, over, under):
    """(verdict, [(position, steps, decision, p_over, p_under, certain_over, certain_under) ..., joint last])."""
    steps = [(i, x, min(1.0, max(0.0, a))) for i, x, a in steps]
    positions = sorted({s[0] for s in steps})
    m = len(positions) + 1

    def one(sel):
        sure_over = sum(1 for _, x, a in sel if a == 0.0 and x == 1)
        sure_under = sum(1 for _, x, a in sel if a == 1.0 and x == 0)
        vary = [(x, a) for _, x, a in sel if 0.0 < a < 1.0]
        up, down = enumerated([a for _, a in vary], sum(x for x, _ in vary))
        # over-acceptance (lossy) first: certain, or by its tail; then under-acceptance, certain or by its tail
        if sure_over or up <= over / m:
            decision = OVER
        elif sure_under or down <= under / m:
            decision = UNDER
        else:
            decision = FOLLOWS
        return len(sel), decision, up, down, sure_over, sure_under, not vary, bool(sure_under) or down <= under / m

    rows = [(i, *one([s for s in steps if s[0] == i])) for i in positions] + [(None, *one(steps))]
    said = []
    for d, k in ((OVER, 5), (UNDER, 6)):  # a position departing both ways (over decides it): named on both sides
        at = [r for r in rows[:-1] if r[2] == d or (d == UNDER and r[8])]
        if at:
            sure = " certainly" if all(r[k] for r in at) else ""
            said.append(f"{d}{sure} at position" + ("s " if len(at) > 1 else " ") + ", ".join(str(r[0]) for r in at))
    if not said and rows[-1][2] != FOLLOWS:
        said = [rows[-1][2] + " (all positions together)"]
    if not said:
        said = [f"{FOLLOWS} ({CERTAIN_WORDS})" if rows[-1][7] else FOLLOWS]
    return "; ".join(said), rows


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=12), st.sampled_from([(0.025, 0.025), (0.015, 0.025), (0.1, 0.1), (0.3, 0.001)]))
def test_each_position_and_the_joint_test_follow_the_rule(steps, levels):
    """The count's exact tails over the steps that can vary; a certain departure decides its position whatever
    shares it; each side at its level over the positions + 1; the verdict names the positions in order
    ("certainly" where certain departures decided them all), the joint test only where none departs, and says
    "certain" where nothing could vary."""
    over, under = levels
    verdict, tests = law_test(steps, over, under)
    if not steps:
        assert (verdict, tests) == (NONE, [])
        return
    want, rows = oracle(steps, over, under)
    assert verdict == want
    assert [t.position for t in tests] == [r[0] for r in rows]
    for t, (_, n, decision, up, down, sure_over, sure_under, certain, _) in zip(tests, rows):
        assert (t.steps, t.decision, t.certain_over, t.certain_under) == (n, decision, sure_over, sure_under)
        assert (t.p_over, t.p_under) == (pytest.approx(up, abs=1e-12), pytest.approx(down, abs=1e-12))
        assert (t.z is None) == (certain and not sure_over and not sure_under)
        by_tail = not sure_over and (decision == OVER or not sure_under)  # no certain departure decided it
        m = len(rows)
        assert (t.over_level, t.under_level) == (over / m, under / m)
        if by_tail:
            sel = [(x, min(1.0, max(0.0, a))) for i, x, a in steps if t.position is None or i == t.position]
            vary = [(x, a) for x, a in sel if 0.0 < a < 1.0]
            lo, hi = region([a for _, a in vary], over / m, under / m)
            s = sum(x for x, _ in vary)
            assert (t.low, t.high) == (pytest.approx((s - hi) / n), pytest.approx((s - lo) / n)), t
            # the interval and the decision agree: it excludes 0 exactly where the position departs
            assert (t.low > 0) == (decision == OVER) and (t.high < 0) == (decision == UNDER), t
            if not sure_under:
                assert (t.p_value <= ALPHA) == (decision != FOLLOWS), t
            if t.z is not None:  # z is the smaller tail as a normal deviate, signed by its side
                assert (t.z > 0) <= (up < 0.5) and (t.z < 0) <= (down < 0.5), t
        else:  # the interval: the signed share of steps that cannot happen under the law
            assert t.p_value == 0.0 and t.z == (math.inf if sure_over else -math.inf)
            assert t.low == t.high == (sure_over / n if sure_over else -sure_under / n)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 1 - 1e-6), min_size=1, max_size=14), st.data())
def test_the_tails_are_the_enumerated_law_of_the_count(a, data):
    s = data.draw(st.integers(0, len(a)))
    up, down = enumerated(a, s)
    assert tails(a, s) == (pytest.approx(up, abs=1e-12), pytest.approx(down, abs=1e-12))


def test_a_tail_exactly_at_its_level_departs_and_a_family_of_one_is_one_test():
    """The rule's edges with exact binary fractions: a tail at its level departs (p <= level), the region's end is
    the last count whose tail exceeds it; one test alone (family 1) reads the whole side's level."""
    from mtpbench.stats.acceptance import position_test

    up = position_test([1, 1], [0.5, 0.5], 0, family=1, over=0.25, under=0.25)  # P(S >= 2) = 0.25
    assert (up.p_over, up.decision, up.over_level) == (0.25, OVER, 0.25) and up.low == up.high == 0.5
    down = position_test([0, 0], [0.5, 0.5], 0, family=1, over=0.25, under=0.25)  # P(S <= 0) = 0.25
    assert (down.p_under, down.decision, down.under_level) == (0.25, UNDER, 0.25) and down.high == -0.5
    mid = position_test([1, 0], [0.5, 0.5], 0, family=1, over=0.25, under=0.25)
    assert mid.decision == FOLLOWS and (mid.low, mid.high) == (0.0, 0.0)  # the region is [1, 1]: it holds s = 1


def test_the_tails_of_many_steps_are_the_binomial_law_where_every_probability_is_one():
    """Thousands of steps (the product up a tree of FFTs) against the binomial law, summed by hand in logs."""
    n, a, s = 5000, 0.999, 4988

    def pmf(j):
        return math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(a)
                        + (n - j) * math.log1p(-a))

    up, down = tails([a] * n, s)
    assert up == pytest.approx(sum(pmf(j) for j in range(s, n + 1)), rel=1e-9)
    assert down == pytest.approx(sum(pmf(j) for j in range(0, s + 1)), rel=1e-9)


def test_a_greedy_engine_that_accepts_a_draft_the_target_never_argmaxed_over_accepts_for_sure():
    steps = [(0, 1, 1.0)] * 50 + [(0, 1, 0.0)] + [(1, 0, 0.0)] * 20
    verdict, tests = law_test(steps)
    assert verdict == "over-accepts certainly at position 0" and tests[0].z == math.inf and tests[0].p_value == 0.0


def test_a_certain_departure_is_not_diluted_by_sampled_steps_beside_it():
    """Issue 55 case 2: five drafts accepted with probability 0 are proof, alone or beside 100 sampled steps at
    their position (a normal z over the position read +0.92 there)."""
    alone = [(0, 1, 0.0)] * 5
    rng = np.random.default_rng(0)
    beside = alone + [(0, int(rng.uniform() < 0.6), 0.6) for _ in range(100)]
    for steps in (alone, beside):
        verdict, tests = law_test(steps)
        assert verdict == "over-accepts certainly at position 0", verdict
        assert tests[0].certain_over == 5 and tests[-1].decision == OVER
    rejected = [(1, 0, 1.0)] + [(1, int(rng.uniform() < 0.6), 0.6) for _ in range(100)]
    assert law_test(rejected)[0] == "under-accepts certainly at position 1"
    both = [(0, 1, 0.0), (0, 0, 1.0)] + [(0, int(rng.uniform() < 0.6), 0.6) for _ in range(50)]
    verdict, tests = law_test(both)
    assert verdict == "over-accepts certainly at position 0; under-accepts certainly at position 0", verdict
    assert tests[0].decision == OVER and tests[0].low == tests[0].high == 1 / 52
    # vLLM #55005's garbage as CI saw it: sampled drafts over-accepted, certain ones rejected at one position: the
    # over-acceptance (lossy) decides, by its tail, and the certain rejections are named beside it
    broken = [(0, 1, 0.3)] * 40 + [(0, 0, 0.3)] * 10 + [(0, 0, 1.0)] * 3 + [(0, 1, 1.0)] * 20
    verdict, tests = law_test(broken)
    assert verdict == "over-accepts at position 0; under-accepts certainly at position 0", verdict
    assert tests[0].decision == OVER and tests[0].z > 0 and tests[0].low > 0


def test_at_temperature_0_the_law_is_argmax_agreement_and_no_z_is_shown():
    """Issue 55 case 11: every step certain, none departs: no test was run, and the verdict says what the law is."""
    verdict, tests = law_test([(0, 1, 1.0)] * 30 + [(0, 0, 0.0)] * 5 + [(1, 1, 1.0)] * 20)
    assert verdict == f"{FOLLOWS} ({CERTAIN_WORDS})" and follows(verdict)
    assert all(t.z is None and t.certain and t.decision == FOLLOWS for t in tests)
    assert not follows("over-accepts at position 0") and not follows(None)


# --- the stated rate, by simulation through the code ------------------------------------------------------------------

def chains(rng, n, k, law, bump=0.0, at=None):
    """A simulated verifier: each of ``n`` chains drafts up to ``k`` positions, each step's probability drawn by ``law``
    (which may read the chain's earlier verdicts), accepted with it (plus ``bump`` at position ``at``); a chain
    stops at its first rejection, as drafting does."""
    steps = []
    for _ in range(n):
        last = 1
        for i in range(k):
            a = float(law(rng, i, last))
            x = int(rng.uniform() < min(1.0, a + (bump if i == at else 0.0)))
            steps.append((i, x, a))
            last = x
            if not x:
                break
    return steps


# (chains, positions, the law of a step's probability from (rng, position, the last verdict)): the regimes of issue
# 55's case 1, and more (benchmarks/law_error_rates.py reads them too)
REGIMES = {
    "a = 0.999, k = 5, 31 chains": (31, 5, lambda r, i, last: 0.999),
    "a = 0.99, k = 3, 3 chains": (3, 3, lambda r, i, last: 0.99),
    "low temperature, a in {0.9995, 0.0005}": (40, 3, lambda r, i, last: r.choice([0.9995, 0.0005])),
    "a = 0.7, k = 3, 100 chains": (100, 3, lambda r, i, last: 0.7),
    "sampled, beta(2, 1.5)": (200, 3, lambda r, i, last: r.beta(2, 1.5)),
    "near 1, 1 - beta(1, 200)": (200, 3, lambda r, i, last: 1 - r.beta(1, 200)),
    "greedy and sampled requests mixed": (200, 3, lambda r, i, last: r.choice([0.0, 1.0, r.uniform()],
                                                                                p=[0.3, 0.5, 0.2])),
    "one step": (1, 1, lambda r, i, last: r.uniform()),
    "the probability reads the last verdict": (150, 4, lambda r, i, last: 0.95 if last else 0.05),
}


@pytest.mark.slow  # a simulation (about 20 s): in the fast tier, left out of mutation runs
@pytest.mark.parametrize("regime", list(REGIMES))
def test_an_engine_that_follows_the_law_is_called_out_at_most_alpha_of_the_time(regime):
    """The stated rate (alpha = 0.05 over the positions and the joint test), simulated through the code: 1500
    correct engines a regime; called out anywhere at most alpha plus 3 standard errors (docs/judgement.md has the
    measured rates: the old normal z read 14.4 % at a = 0.999)."""
    n, k, law = REGIMES[regime]
    rng = np.random.default_rng(55)
    runs = 1500
    alarms = sum(not follows(law_test(chains(rng, n, k, law))[0]) for _ in range(runs))
    assert alarms / runs <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs), (regime, alarms)


@pytest.mark.slow  # a simulation: in the fast tier, left out of mutation runs
def test_an_over_acceptance_at_one_position_is_named_there():
    """A planted over-acceptance of +0.1 at position 1 only, 2000 proposals: named at position 1 in at least 9 of
    10 simulated runs (measured: 1.0 at this size)."""
    rng = np.random.default_rng(7)
    hits = sum(law_test(chains(rng, 2000, 3, lambda r, i, last: r.beta(2, 1.5), bump=0.1, at=1))[0]
               == "over-accepts at position 1" for _ in range(40))
    assert hits >= 36, hits


@pytest.mark.slow  # a simulation: in the fast tier, left out of mutation runs
def test_a_sweeps_law_tests_are_one_family_across_its_points():
    """Issue 55 case 6: a sweep of 6 correct drafting points (k = 1, 2, 3 twice) was called out somewhere in 15.2 % of
    sweeps, each point judged alone at 5 %. One family: each point's tests at 5 % over every point's positions and
    joint test (3 + 2 + 4 per three points: 18), simulated through the code: at most 5 % plus 3 standard errors."""
    from mtpbench.stats.judge import law_family, law_levels

    ks = [0, 1, 2, 3, 0, 1, 2, 3]
    assert law_family(ks) == 18 and law_levels(family=18) == {"over": 0.025, "under": 0.025, "family": 18}
    assert law_levels() == {"over": 0.025, "under": 0.025}
    _, tests = law_test(chains(np.random.default_rng(1), 50, 2, lambda r, i, last: 0.6), **law_levels(family=18))
    assert {(t.over_level, t.under_level) for t in tests} == {(0.025 / 18, 0.025 / 18)}
    rng = np.random.default_rng(6)
    runs = 600
    law = REGIMES["sampled, beta(2, 1.5)"][2]
    alarms = sum(any(not follows(law_test(chains(rng, 60, k, law), **law_levels(family=18))[0]) for k in ks if k)
                 for _ in range(runs))
    assert alarms / runs <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs), alarms
