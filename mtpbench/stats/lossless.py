"""Whether drafting changes what the model samples (check-lossless at temperature > 0): the two-sample permutation
test of continuations with drafting off against on, the one-sample score test, and the verdict that combines them
with their controls (numpy only: no torch, no I/O). Intervals are in ``stats.intervals``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from mtpbench.stats.intervals import LEVEL, SEED, _rng, _t_interval, t_quantile

# --- Is drafting lossless? (check-lossless, sampling at temperature > 0) -----------------------------------
#
# Two arms (drafting off: a, on: b) sample continuations of the same prompts with independent seeds; every
# sampled token carries the target's log-probability of it under its own prefix, from a teacher-forced k = 0
# pass. Tokens within a continuation depend on each other, so the unit is the continuation: under the null
# (both arms one law) the continuations of one prompt are exchangeable across arms, and permuting arm labels
# within each prompt gives an exact test at any N, whatever the law, with no large-sample approximation.
# Two statistics share the permutations:
# * scores: the difference (b - a) of the mean target log-prob per token, a per-continuation mean, averaged
#   within each prompt and weighted over prompts by nA nB / (nA + nB); two-sided;
# * tokens: at each (prompt, position), the squared distance between the two arms' token frequency vectors,
#   summed over all of them with the scores' weights (a continuation that has ended counts as one more token,
#   so lengths are compared too). Tables this sparse have no usable chi-square distribution; the permutation
#   null needs none. The chi-square's 1 / count weights were less powerful (they favour rare tokens, mostly
#   noise): against the planted mode at 8 prompts x 8, 0.25 for the chi-square alone, 0.33 for this one.
# They are combined by the smaller of their two permutation p-values, itself referred to its permutation
# distribution (Pesarin's non-parametric combination): exact whatever the two statistics' correlation, where
# Bonferroni (2 * min p) is exact only for disjoint rejections and conservative otherwise (here the two
# hardly correlate, and both gave the same rates within 0.1 %).
#
# Calibration (tests/unit/test_lossless_stats.py; a 50-token Markov chain with topic-like clusters, 16 tokens a
# continuation, DEFAULT_PROMPTS x DEFAULT_PER_PROMPT = 12 x 8 continuations a side, 1000 trials each):
# false alarms at nominal 5 % 4.9 % (scores alone 5.6 %, tokens alone 4.3 %); the 95 % interval of the
# log-prob difference covers 0 in 94.2 %. Against the planted lossy rule (a draft is accepted whenever it is
# the draft's argmax; k = 2; a draft 0.154 in total variation from the target per drafted token,
# +0.28 nats/token) lossy is called in 96.7 % (scores 97.9 %, tokens 42.1 %), the reported minimum
# detectable shift being 0.20. A test that takes tokens as the unit (Welch t on per-token log-probs) raises
# 13 % false alarms on the same null data. Below the default N power falls (500 trials, combined / scores
# alone): 61 / 64 % at 4 x 8 a side, 86 / 91 % at 8 x 8. The price of also testing the tokens is those few
# points; it buys a test of the law itself, not only of its mean score (lengths, or mass moved between
# tokens the target scores alike).

PERMUTATIONS = 2000
ALPHA = 0.05
DEFAULT_PROMPTS, DEFAULT_PER_PROMPT = 12, 8  # continuations a side: 8 of each of 12 prompts (96), see above
POWER = 0.8  # of the minimum detectable shift
MIN_CONTINUATIONS = 8  # per arm; fewer: inconclusive (the test stays exact, but has next to no power)
LOGPROB_FLOOR = -50.0  # a token the target gives probability 0 (-inf) counts as e^-50: loss enough, and finite
ENDED = -1  # the "token" at a position past a continuation's end


@dataclass(frozen=True)
class LosslessTest:
    """One two-sample test of a against b (off against on, or off against off for the A/A control)."""
    p_value: float  # combined
    p_value_scores: float
    p_value_tokens: float
    min_p_value: float  # the smallest p-value these sizes can reach (1 / number of distinct labelings, or of draws)
    mean_logprob_a: float  # mean target log-prob per token (nats), per continuation, averaged as the test does
    mean_logprob_b: float
    logprob_diff: float  # b - a
    logprob_diff_ci_low: float | None  # 95 % Welch t interval, from within-prompt spread
    logprob_diff_ci_high: float | None
    mde_logprob: float | None  # the |b - a| this N detects with POWER at alpha (the scores' half of the test)
    num_continuations_a: int
    num_continuations_b: int
    num_prompts: int
    permutations: int
    num_nonfinite: int = 0  # continuations whose score is NaN or +inf (a -inf log-prob is floored, LOGPROB_FLOOR)


def _generator(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else _rng(seed)


def lossless_arrays(a, b, prompts_a=None, prompts_b=None):
    """Arrays for ``lossless_test_arrays`` from two arms' continuations, each a list of (position, token_id,
    target_logprob) with positions 0-based from the continuation's start; ``prompts_*``: the prompt of each
    continuation (default: one prompt). Prompts absent from either arm are left out (nothing to compare).
    Returns scores (C,), tokens (C, L) (ENDED past a continuation's end), strata (C,) and arm (C,) (True: b)."""
    prompts_a = [0] * len(a) if prompts_a is None else list(prompts_a)
    prompts_b = [0] * len(b) if prompts_b is None else list(prompts_b)
    if len(prompts_a) != len(a) or len(prompts_b) != len(b):
        raise ValueError("one prompt per continuation")
    both = set(prompts_a) & set(prompts_b)
    rows = [(c, p, False) for c, p in zip(a, prompts_a) if p in both] + \
           [(c, p, True) for c, p in zip(b, prompts_b) if p in both]
    if any(not c for c, _, _ in rows):
        raise ValueError("an empty continuation")
    ids = {p: i for i, p in enumerate(sorted(both, key=str))}
    width = 1 + max((pos for c, _, _ in rows for pos, _, _ in c), default=-1)
    tokens = np.full((len(rows), width), ENDED, dtype=np.int64)
    scores = np.zeros(len(rows))
    for i, (c, _, _) in enumerate(rows):
        pos, tok, lp = (np.asarray(v) for v in zip(*c))
        tokens[i, pos.astype(int)] = tok
        scores[i] = np.maximum(lp.astype(float), LOGPROB_FLOOR).mean()
    return scores, tokens, np.array([ids[p] for _, p, _ in rows], dtype=int), np.array([r[2] for r in rows], bool)


def permuted_labels(strata, arm, permutations: int = PERMUTATIONS, seed=SEED) -> np.ndarray:
    """Arm labels shuffled within each stratum (prompt): (permutations + 1, C), row 0 the observed labels."""
    strata, arm = np.asarray(strata), np.asarray(arm, bool)
    keys = strata + _generator(seed).random((permutations, strata.size))  # sorts by stratum, randomly within
    order = np.argsort(keys, axis=1, kind="stable")
    base = np.argsort(strata, kind="stable")
    z = np.empty((permutations, strata.size), bool)
    np.put_along_axis(z, order, np.broadcast_to(arm[base], order.shape), axis=1)
    return np.vstack([arm[None], z])


def _upper_p(t: np.ndarray, scale: float) -> np.ndarray:
    """For each row's statistic, the share of rows at or above it (its permutation p-value). Values within
    1e-9 * ``scale`` (the data's, not the statistic's: equal data give a statistic of rounding noise) tie."""
    tol = 1e-9 * scale
    return (t.size - np.searchsorted(np.sort(t), t - tol, side="left")) / t.size


def _distinct_labelings(strata, arm) -> int:
    """How many labelings the within-prompt permutations can reach: an exact Python int (a product of
    binomials overflows int64 and float at the default N; 1 / it underflows to 0.0, which is harmless)."""
    return math.prod(math.comb(int((strata == s).sum()), int(arm[strata == s].sum())) for s in np.unique(strata))


def lossless_test_arrays(scores, tokens, strata, arm, permutations: int = PERMUTATIONS, seed=SEED,
                         alpha: float = ALPHA) -> LosslessTest | None:
    """The permutation test of the block comment above, on arrays from ``lossless_arrays``; ``seed``: an int or
    a numpy Generator (the permutations). None when some prompt lacks an arm or no arm has a continuation."""
    x, tok = np.asarray(scores, float), np.asarray(tokens)
    strata, arm = np.asarray(strata), np.asarray(arm, bool)
    prompts = np.unique(strata)
    n_b = np.array([arm[strata == s].sum() for s in prompts])
    n_a = np.array([(~arm[strata == s]).sum() for s in prompts])
    if x.size == 0 or (n_a == 0).any() or (n_b == 0).any():
        return None
    j = np.searchsorted(prompts, strata)
    na, nb = n_a[j].astype(float), n_b[j].astype(float)
    h = n_a * n_b / (n_a + n_b)
    w = (h / h.sum())[j]
    z = permuted_labels(strata, arm, permutations, seed)
    u = np.where(z, 1 / nb, -1 / na)  # b's share minus a's, per prompt, for every labeling
    # tokens: at each (prompt, position), the squared distance between the two arms' token frequencies,
    # weighted like the scores; a quadratic form u' G u in the labels, G_cd = h * (positions where c and d
    # agree), computed once and block by block (prompts never mix)
    t_tokens = np.zeros(permutations + 1)
    for s, hs in zip(prompts, h):
        m = strata == s
        g = (tok[m][:, None, :] == tok[m][None, :, :]).sum(-1) * hs
        t_tokens += ((u[:, m] @ g) * u[:, m]).sum(1)
    centred = x - np.array([x[strata == s].mean() for s in prompts])[j]  # the same differences, less rounding
    diff = (w * u) @ centred
    p_scores = _upper_p(np.abs(diff), float(np.abs(centred).max()))
    p_tokens = _upper_p(t_tokens, float(t_tokens.max()))
    combined = np.minimum(p_scores, p_tokens)
    p = float(np.mean(combined <= combined[0] * (1 + 1e-12)))
    # effect size: Welch t interval with each arm's within-prompt variance pooled over prompts
    means = {side: np.array([x[(strata == s) & (arm == side)].mean() for s in prompts]) for side in (False, True)}
    wp = h / h.sum()
    ci_low = ci_high = mde = None
    dev = x - np.where(arm, means[True][j], means[False][j])
    df_a, df_b = int((n_a - 1).sum()), int((n_b - 1).sum())
    if df_a > 0 and df_b > 0:
        va, vb = (dev[~arm] ** 2).sum() / df_a, (dev[arm] ** 2).sum() / df_b
        ca, cb = va * (wp ** 2 / n_a).sum(), vb * (wp ** 2 / n_b).sum()
        se = math.sqrt(ca + cb)
        if se > 1e-12 * max(float(np.abs(x).max()), 1.0):  # below: rounding of equal scores
            df = (ca + cb) ** 2 / (ca ** 2 / df_a + cb ** 2 / df_b)
            ci_low, ci_high = (float(v) for v in _t_interval(float(diff[0]), se, df, LEVEL))
            # the combination spends about alpha / 2 on each statistic (exactly so were they independent)
            mde = float((t_quantile(1 - alpha / 4, df) + t_quantile(POWER, df)) * se)
        elif math.isfinite(se):
            # no spread (identical continuations): the difference is what it is, but zero spread is no evidence
            # of power, so the detectable shift is unknown (None), never 0 (which passed any bound)
            ci_low = ci_high = float(diff[0])
    return LosslessTest(
        p_value=p, p_value_scores=float(p_scores[0]), p_value_tokens=float(p_tokens[0]),
        min_p_value=max(1 / _distinct_labelings(strata, arm), 1 / (permutations + 1)),
        mean_logprob_a=float(wp @ means[False]), mean_logprob_b=float(wp @ means[True]),
        logprob_diff=float(diff[0]), logprob_diff_ci_low=ci_low, logprob_diff_ci_high=ci_high,
        mde_logprob=mde, num_continuations_a=int((~arm).sum()), num_continuations_b=int(arm.sum()),
        num_prompts=int(prompts.size), permutations=permutations, num_nonfinite=int((~np.isfinite(x)).sum()))


def lossless_test(a, b, prompts_a=None, prompts_b=None, permutations: int = PERMUTATIONS, seed=SEED,
                  alpha: float = ALPHA) -> LosslessTest | None:
    """Do continuations ``a`` (drafting off) and ``b`` (on) come from one law? See ``lossless_arrays`` for the
    input and the block comment above for the test. None when no prompt has continuations in both arms."""
    scores, tokens, strata, arm = lossless_arrays(a, b, prompts_a, prompts_b)
    return lossless_test_arrays(scores, tokens, strata, arm, permutations, seed, alpha)


# --- the one-sample test: each arm against the scorer's law ---------------------------------------------------
#
# The target's law p_t is known at every sampled position (the teacher-forced pass), so each arm can also be
# tested on its own. If token x_t is drawn from p_t, D_t = log p_t(x_t) + H(p_t) has conditional mean 0 given
# the prefix and conditional variance Var_t = Var_{x ~ p_t}(log p_t(x)): the D_t are martingale differences, and
# Z = sum D_t / sqrt(sum Var_t) is close to N(0, 1) (martingale CLT) however the tokens of a continuation depend
# on each other. No off arm's noise enters, so at the default N its standard error is about half the
# two-sample test's (0.0101 against 0.0212 nats/token measured). It assumes what the two-sample test does not: that the scorer is the sampler's law (the same
# logits, temperature, no top-k/top-p).
#
# The verdict (stats.lossless_verdict) no longer rests on this test: it assumes an exact scorer, and a scorer biased
# alike in every arm slipped past its control (the off arms at a stricter level than the drafting arm). It is kept
# as the scorer's fit, reported per arm; the verdict compares the drafting arm's excess log p + H with the arms
# without drafting instead (stats.verdict.excess_test), which a bias common to all arms cannot move.


@dataclass(frozen=True)
class ScoreTest:
    """The one-sample test of one arm against the scorer's law (the block comment above)."""
    z: float | None  # sum(log p + H) / sqrt(sum Var); None when no token has any spread and some D is not 0
    p_value: float  # two-sided, normal
    mean_excess_logprob: float  # sum(log p + H) / tokens: nats/token above what the law itself expects
    se_logprob: float  # sqrt(sum Var) / tokens
    mde_logprob: float | None  # the mean excess this test detects with POWER at its share of alpha
    num_tokens: int
    num_nonfinite: int = 0  # tokens whose log-prob is NaN or +inf, or whose H or Var is not finite


def score_test(logprobs, entropies, variances, alpha: float = ALPHA / 2) -> ScoreTest | None:
    """One arm's tokens: their target log-probs, and at each position the entropy of the target's law and the
    variance of log p under it (all at the sampling temperature). ``alpha``: the level this test is used at
    (its MDE). None when the arm has no token."""
    lp = np.maximum(np.asarray(logprobs, float), LOGPROB_FLOOR)
    h, v = np.asarray(entropies, float), np.maximum(np.asarray(variances, float), 0.0)
    if lp.size == 0:
        return None
    bad = int((~(np.isfinite(lp) & np.isfinite(h) & np.isfinite(v))).sum())  # NaN survives np.maximum
    if bad:  # no number from them: the verdict is inconclusive, naming them (stats.verdict.nonfinite)
        return ScoreTest(None, math.nan, math.nan, math.nan, None, int(lp.size), bad)
    d, var = float((lp + h).sum()), float(v.sum())
    n = lp.size
    if var <= 0:  # every position deterministic: any D other than rounding is a token the law rules out
        exact = abs(d) <= 1e-6 * n
        return ScoreTest(0.0 if exact else None, 1.0 if exact else 0.0, d / n, 0.0, 0.0, n)
    z = d / math.sqrt(var)
    p = 2 * NormalDist().cdf(-abs(z))
    se = math.sqrt(var) / n
    mde = (NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(POWER)) * se
    return ScoreTest(z, p, d / n, se, mde, n)
