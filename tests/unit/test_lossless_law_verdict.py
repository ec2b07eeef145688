"""The third test of check-lossless's verdict, acceptance against its exact law (issue 46 item 2): the rule's levels
and its union bound written here from the rule; alarm, confirmation and combination of the law test against an
oracle of the rule (hypothesis); and whole checks simulated through ``stats.lossless_verdict`` on the Markov chain
of test_lossless_stats.py, with the drafting arm drawn by speculative sampling (a draft law q, the verifier
accepting with min(1, p / q), a rejection resampled from the residual), its verify steps fed to the law test: a
correct engine is lossy no more often than the stated bound, and planted verifier faults are found."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench import stats
from mtpbench.stats.acceptance import FOLLOWS, OVER, UNDER, PositionTest
from tests.unit.test_lossless_stats import (
    L,
    PER_ARM,
    PROMPTS,
    V,
    arm_with_moments,
    binomial_upper_tail,
    draw,
    moments,
    noisy_draft,
    null_only_combined,
    target_chain,
    trial_tests,
    two_sample,
)

PHI = NormalDist()


# --- the budget, from the rule -----------------------------------------------------------------------------------------

def test_the_law_tests_shares_keep_the_stated_false_lossy_bounds():
    """Written from the rule: beside the law test the excess test alarms at 26 % (not 30 %), the two-sample test
    alone at 26.5 % (not 30 %); the law test alarms at 1.5 %, confirms at 0.1 % and combines at 0.05 % (bounded by
    its level). Union bound: an alarm of any test confirmed on its own by any, plus each test's combination share."""
    ex, ab = null_only_combined(0.005, 0.05), null_only_combined(0.005, 0.01)
    beside = (0.26 + 0.05 + 0.015) * (0.05 / 2 + 0.01 + 0.001) + ex + ab + 0.0005
    alone = (0.265 + 0.015) * (0.05 + 0.001) + ex + 0.0005
    assert beside <= stats.FALSE_LOSSY_BOUND and alone <= stats.FALSE_LOSSY_BOUND_ALONE, (beside, alone)
    assert (stats.ALARM_LAW, stats.CONFIRM_LAW, stats.COMBINE_LAW) == (0.015, 0.001, 0.0005)
    assert (stats.ALARM_EXCESS_LAW, stats.ALARM_AB_ALONE_LAW) == (0.26, 0.265)
    ok = two_sample(0.5)
    law = stats.LawEvidence((made(None, 10, 0.5),))
    with_law = stats.verdict.levels(stats.Stage(ok, ok, None, law))
    assert with_law["alarm_two_sample"] == 0.265 and with_law["alarm_law"] == 0.015
    assert stats.verdict.levels(stats.Stage(ok, ok, None))["alarm_two_sample"] == 0.3  # without it, as before


# --- the rule against an oracle -------------------------------------------------------------------------------------

def made(position, steps, p_over, certain_over=0, decision=FOLLOWS, observed=0.5, expected=0.5, certain_under=0,
         p_under=None):
    """A law test as ``stats.acceptance`` writes one: z the smaller tail's normal deviate (infinite for a certain
    departure, None where every step was certain: here where ``p_over`` is None)."""
    p_under = (1.0 if p_over is None else min(1.0, 1.0 - p_over + 1e-9)) if p_under is None else p_under
    if certain_over or certain_under:
        z = math.inf if certain_over else -math.inf
    elif p_over is None:
        z, p_over = None, 1.0
    else:
        z = -PHI.inv_cdf(max(p_over, 1e-300)) if p_over < min(0.5, p_under) else \
            PHI.inv_cdf(max(p_under, 1e-300)) if p_under < min(0.5, p_over) else 0.0
    return PositionTest(position, steps, observed, expected, z, 0.0, 0.0, p_over, p_under, decision, certain_over,
                        certain_under)


tail = st.one_of(st.floats(1e-12, 1.0), st.sampled_from([1e-5, 1e-4, 0.001 / 3, 0.015 / 4, 0.5, 1.0]), st.none())


@st.composite
def evidence(draw_, positions=None):
    n = positions if positions is not None else draw_(st.integers(1, 4))
    tests = [made(i if i < n else None, draw_(st.integers(1, 5000)), draw_(tail), draw_(st.sampled_from([0, 0, 0, 1])))
             for i in range(n + 1)]
    return stats.LawEvidence(tuple(tests))


def oracle_over(law, alpha):
    """One-sided: a certain departure, or the exact upper tail at or below alpha / (the number of tests)."""
    return [t for t in law.tests if t.certain_over or t.p_over <= alpha / len(law.tests)]


@settings(max_examples=300)
@given(evidence(), evidence())
def test_the_law_alarms_confirms_and_combines_as_the_rule_says(first, second):
    ok = two_sample(0.5)
    s1, s2 = stats.Stage(ok, ok, None, first), stats.Stage(ok, ok, None, second)
    raised = stats.alarm(s1)
    assert (raised is not None and "over-accepts" in raised) == bool(oracle_over(first, 0.015))
    confirmed = stats.confirmation(s1, s2)
    assert (confirmed is not None and "over-accepts again" in confirmed) == bool(oracle_over(second, 0.001))
    # combined: per position in both stages, both z above 0, Stouffer's Z weighted by sqrt(steps) beyond 0.0005 / the
    # larger family, one-sided
    later = {t.position: t for t in second.tests}
    point = PHI.inv_cdf(1 - 0.0005 / max(len(first.tests), len(second.tests)))
    want = []
    for t1 in first.tests:
        t2 = later.get(t1.position)
        if t2 is None or t1.z is None or t2.z is None or not (t1.z > 0 and t2.z > 0):
            continue
        z = math.inf if math.inf in (t1.z, t2.z) else \
            (math.sqrt(t1.steps) * t1.z + math.sqrt(t2.steps) * t2.z) / math.sqrt(t1.steps + t2.steps)
        if z > point:
            want.append(t1.position)
    assert [t1.position for t1, _, _ in stats.law_combined(s1, s2)] == want
    assert ("over-accepts in both stages" in (stats.combination(s1, s2) or "")) == bool(want)


def test_an_under_accepting_verifier_is_said_beside_a_lossless_verdict_never_lossy():
    ok = two_sample(0.5)
    under = made(0, 400, 1.0, decision=UNDER, observed=0.4, expected=0.6, p_under=1e-15)
    law = stats.LawEvidence((under, made(None, 400, 1.0, decision=UNDER, observed=0.4, expected=0.6, p_under=1e-15)))
    verdict, why = stats.lossless_verdict([stats.Stage(ok, ok, None, law)])
    assert verdict == stats.LOSSLESS and why.endswith(
        "; the verifier under-accepts at position 0 (observed 0.4, expected 0.6, z -7.94, p 1e-15), all positions "
        "together (observed 0.4, expected 0.6, z -7.94, p 1e-15): drafts wasted, not lossy"), why
    over = stats.LawEvidence((made(0, 400, 3e-5, decision=OVER, observed=0.7, expected=0.6),))
    verdict, why = stats.lossless_verdict([stats.Stage(ok, ok, None, over)])
    assert verdict == stats.INCONCLUSIVE and why.startswith(f"{stats.UNCONFIRMED}: over-accepts at position 0")
    verdict, why = stats.lossless_verdict([stats.Stage(ok, ok, None, over), stats.Stage(ok, ok, None, over)])
    assert verdict == stats.LOSSY and "the verifier over-accepts again on fresh draws at position 0" in why


# --- whole checks, simulated through the verdict --------------------------------------------------------------------

def residual(p, q):
    r = np.maximum(p - q, 0)
    total = r.sum(1, keepdims=True)
    return np.divide(r, total, out=np.full_like(r, 1 / V), where=total > 0)


def spec_sample(rng, p, q, start, accept=None, k=2):
    """The drafting arm by speculative sampling, token by token: at each of k positions a draft d ~ q, accepted with
    ``accept(states, d, a, position)`` (default: the law's a = min(1, p(d) / q(d))), a rejection replaced from the residual
    max(p - q, 0) and the step ended; after k accepted drafts the target's bonus token. Returns the tokens, their
    target log-probs, the target's H and Var at each, and per token the law step it came from: its position (-1:
    not a draft), accepted, and the law's probability a."""
    res = residual(p, q)
    state, pos = start.copy(), np.zeros(start.shape, int)
    toks, lps, hs, vs, at, acc, prob = [], [], [], [], [], [], []
    h, v = moments(p)
    for _ in range(L):
        drafting = pos < k
        d = draw(rng, q[state])
        a = np.minimum(1.0, p[state, d] / q[state, d])
        kept = rng.random(state.shape) < (a if accept is None else accept(state, d, a, pos))
        tok = np.where(drafting, np.where(kept, d, draw(rng, res[state])), draw(rng, p[state]))
        toks.append(tok)
        lps.append(np.log(p[state, tok]))
        hs.append(h[state])
        vs.append(v[state])
        at.append(np.where(drafting, pos, -1))
        acc.append(kept)
        prob.append(a)
        pos = np.where(drafting & kept, pos + 1, 0)
        state = tok
    return tuple(np.stack(x, -1) for x in (toks, lps, hs, vs, at, acc, prob))


def law_stage(rng, p, q, trials, accept=None, per_arm=PER_ARM):
    """``trials`` stages as check-lossless draws them: off, on (speculative sampling, its law steps read), off again;
    every test of stats.Stage, the law's from the drafting arm's steps."""
    start = np.repeat(rng.integers(0, V, (trials, PROMPTS)), per_arm, axis=1)
    off, aa = arm_with_moments(rng, p, start), arm_with_moments(rng, p, start)
    on = spec_sample(rng, p, q, start, accept)
    out = []
    for t in range(trials):
        ab, aa_test, ex = trial_tests((off, on, aa), t, per_arm)
        drafted = on[4][t] >= 0
        law = stats.law_evidence(zip(on[4][t][drafted].tolist(), on[5][t][drafted].astype(int).tolist(),
                                     on[6][t][drafted].tolist()))
        out.append(stats.Stage(ab, aa_test, ex, law))
    return out


def law_checks(seed, trials, accept=None):
    """Whole checks with the law, and the same draws with the law's steps left unread (as an attached server without
    the plugin): a first stage, a second at fresh draws and twice the continuations where it alarmed (under either
    reading); per reading, (verdict, why, first stage) each."""
    p = target_chain(np.random.default_rng(0))
    q = noisy_draft(p, np.random.default_rng(1))
    rng = np.random.default_rng(seed)
    rule = accept(p, q) if accept else None
    first = law_stage(rng, p, q, trials, rule)
    bare = [replace(s, law=None) for s in first]
    need = [i for i in range(trials) if stats.alarm(first[i]) or stats.alarm(bare[i])]
    second = dict(zip(need, law_stage(rng, p, q, len(need), rule, per_arm=2 * PER_ARM)))

    def verdicts(stages, read):
        return [(*stats.lossless_verdict([s] + ([second[i] if read else replace(second[i], law=None)]
                                                if stats.alarm(s) else [])), s) for i, s in enumerate(stages)]
    return verdicts(first, True), verdicts(bare, False)


def test_speculative_sampling_here_is_exact_and_its_steps_follow_the_law():
    """The simulation's drafting arm (q != p) emits the target's law: the tokens' empirical law from one state
    matches p's row within sampling error, and its law steps' z is small."""
    p = target_chain(np.random.default_rng(0))
    q = noisy_draft(p, np.random.default_rng(1))
    rng = np.random.default_rng(3)
    start = np.full((4000, 4), 7)
    toks, *_, at, acc, prob = spec_sample(rng, p, q, start)
    first = toks[..., 0].ravel()  # the first token of every continuation: from state 7, drafted at position 0
    emp = np.bincount(first, minlength=V) / first.size
    assert 0.5 * np.abs(emp - p[7]).sum() < 0.03
    drafted = at >= 0
    ev = stats.law_evidence(zip(at[drafted].tolist(), acc[drafted].astype(int).tolist(), prob[drafted].tolist()))
    assert all(abs(t.z) < 4 for t in ev.tests), [t.z for t in ev.tests]


@pytest.mark.slow  # a simulation (about 40 s): in the fast tier, left out of mutation runs
def test_the_stated_false_lossy_bound_holds_with_the_law_through_the_verdict():
    """1000 correct checks (data seed 21) whose drafting arm is speculative sampling with its law steps read: lossy no
    more often than FALSE_LOSSY_BOUND (1.58 %) allows (a count a true rate at the bound reaches less than 1 time in
    1000 fails). Measured (2-core AMD EPYC): 19 of 1000 here (20 with the law unread), 16 and 11 at data seeds 31
    and 32 (17 and 11 unread): 1.53 % of 3000, the law's reading adding no false call (docs/check-lossless.md)."""
    res, _ = law_checks(21, 1000)
    k = sum(v == stats.LOSSY for v, *_ in res)
    assert binomial_upper_tail(k, 1000, stats.FALSE_LOSSY_BOUND) >= 1e-3, k
    assert np.mean([stats.alarm(s) is not None for *_, s in res]) <= 0.45


@pytest.mark.slow  # a simulation: in the fast tier, left out of mutation runs
def test_a_verifier_that_over_accepts_is_lossy_through_the_law_test():
    """The verifier keeps every draft that is q's argmax (the planted rule of test_lossless_stats.py, here at the
    accept step itself): 100 checks (data seed 22), lossy in nearly all, and the law test is among the reasons."""
    def argmax_kept(p, q):
        star = q.argmax(1)
        return lambda state, d, a, pos: np.where(d == star[state], 1.0, a)

    res, _ = law_checks(22, 100, argmax_kept)
    lossy = [why for v, why, _ in res if v == stats.LOSSY]
    assert len(lossy) >= 95, len(lossy)
    assert sum("over-accepts" in why for why in lossy) >= 90


@pytest.mark.slow  # a simulation: in the fast tier, left out of mutation runs
def test_an_over_acceptance_at_one_position_is_found_by_the_law_test_where_the_others_miss_it():
    """The verifier keeps drafts at position 1 with a + 0.15 (capped at 1), every other step right: a lossy engine
    whose output law moves little. 100 checks (data seed 23), the same draws read with and without the law's
    steps: with them lossy in most, without them (the two output-law tests alone) far fewer: the planted fault of
    issue 46 that the default check called lossless. Measured: 100 of 100 with, 58 without; at + 0.05 (data seed
    24) 46 against 13."""
    def position_one(p, q):
        return lambda state, d, a, pos: np.where(pos == 1, np.minimum(1.0, a + 0.15), a)

    with_law, without = ([v for v, *_ in res] for res in law_checks(23, 100, position_one))
    assert with_law.count(stats.LOSSY) >= 80, with_law.count(stats.LOSSY)
    assert without.count(stats.LOSSY) <= with_law.count(stats.LOSSY) - 30, without.count(stats.LOSSY)


def test_the_law_tests_edges_as_the_rule_says():
    """No steps, no evidence; every level the law adds is in lossless.json's levels; a second stage's law does not
    confirm (or combine with) a first stage that had none (its levels were chosen without the law)."""
    assert stats.law_evidence([]) is None
    ok = two_sample(0.5)
    over = stats.LawEvidence((made(0, 400, 1e-19, decision=OVER, observed=0.9, expected=0.6),
                              made(None, 400, 1e-19, decision=OVER, observed=0.9, expected=0.6)))
    assert stats.verdict.levels(stats.Stage(ok, ok, None, over)) == {
        "alarm_excess": 0.26, "confirm_excess": 0.05, "alarm_two_sample": 0.265, "confirm_two_sample": 0.05,
        "combine": 0.005, "alarm_law": 0.015, "confirm_law": 0.001, "combine_law": 0.0005}
    bare, with_law = stats.Stage(two_sample(0.01), ok), stats.Stage(ok, ok, None, over)
    assert stats.confirmation(bare, with_law) is None
    assert stats.law_combined(bare, with_law) == [] and stats.law_combined(with_law, bare) == []


def test_a_law_tests_words_name_the_tail_on_its_side_or_what_made_it_certain():
    """The law's evidence in check-lossless's words: a certain departure by its count; a test with every step certain,
    "certain"; else z and the tail on z's side (under-acceptance's below 0, over-acceptance's from 0 up)."""
    from mtpbench.stats.acceptance import FOLLOWS, PositionTest
    from mtpbench.stats.verdict import _law_z

    def t(z, **kw):
        return PositionTest(0, 10, 0.5, 0.5, z, 0.0, 0.0, 0.31, 0.72, FOLLOWS, **kw)

    assert _law_z(t(None)) == "certain"
    assert _law_z(t(-1.5)) == "z -1.5, p 0.72" and _law_z(t(1.5)) == "z +1.5, p 0.31"
    assert _law_z(t(0.0)) == "z +0, p 0.31" and _law_z(t(0.5)) == "z +0.5, p 0.31"
    assert _law_z(t(float("inf"), certain_over=2)) == "2 accepted with probability 0: certain"
    assert _law_z(t(float("-inf"), certain_under=3)) == "3 rejected with probability 1: certain"
