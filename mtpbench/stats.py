"""Uncertainty of a point's numbers, and of the difference between two runs (numpy only: no torch, no I/O).

* Acceptance (AL, draft acceptance rate, per-position rates) is a ratio of sums over prompts, e.g.
  ``AL = 1 + sum(accepted) / sum(drafts)``. Its 95 % interval is a studentized bootstrap (bootstrap-t) that
  resamples *prompts* (a prompt's drafts stay together: their acceptances are not independent), with a
  fixed seed, so a report rebuilt from the same files gives the same interval. The statistic is
  (R* - R) / se*, se the delta-method (linearized) standard error sqrt(n/(n-1) sum_i (a_i - R d_i)^2) /
  sum(d), computed afresh in each resample; each end is then kept at least as far out as the t interval
  R -+ t_{n-1} se. Coverage of the 95 % interval (4000 trials of 2000 resamples, so +-0.35 %; the
  same generators, fewer trials and resamples, are checked at every size by ``tests/unit/test_coverage.py``):

  ============================  =====  =====  =====  =====  =====
  prompts                           5      6      8     20     80
  ============================  =====  =====  =====  =====  =====
  independent                    96.2   96.2   96.3   95.9   95.8
  correlated                     95.0   95.5   95.4   95.6   95.6
  fixed output budget            95.5   95.0   95.5   95.4   95.4
  old (expanded percentile), i.  91.5   93.0   94.3   95.0   95.2
  old (expanded percentile), c.  85.7   88.5   90.6   93.8   94.8
  ============================  =====  =====  =====  =====  =====

  "independent": drafts per prompt 20 + Poisson(20), acceptance p ~ Beta(3, 2), accepted ~
  Binomial(2 drafts, p); "correlated": drafts 5 + Poisson(40 (p/0.6)^2), so prompts that accept more
  also draft more; "fixed output budget": drafts Poisson(96 / (1 + 2p)), fewer drafts where more are
  accepted. Intervals are 1.7x the old width at 5 prompts, 1.2x at 8, 1.05x at 20. Heavier-tailed draft
  counts than these (drafts ~ p^3, or ~ 1/p) bring it to 91-93 % at 5-8 prompts: read intervals from
  fewer than 20 prompts with that in mind. Fewer than ``MIN_PROMPTS`` (5) prompts: no interval.
* Timings (tokens/s, TTFT, TPOT) vary from run to run, not from prompt to prompt: ``--repeats N`` repeats
  a point's timed run, the figure is the median of the N, and its interval the distribution-free one
  from order statistics (the narrowest ``[x_(j), x_(N+1-j)]`` that covers the median with >= 95 %
  probability). That needs N >= ``MIN_REPEATS`` (6); below it no interval is given.
* A speedup (tokens/s at k over k = 0) needs fewer: timing noise is multiplicative, so both points share
  its shape on the log scale. From 4 + 4 repeats ``median_ratio_ci`` gives the distribution-free rank
  interval of the pairwise ratios (exact coverage 97.1 % at 4 + 4, 96.8 % at 5 + 5, 95.9 % at 6 + 6);
  from 3 + 3 (where no rank interval reaches 95 %) the Welch t interval on logs. Coverage of a true
  speedup of 1.3 (1500-2000 trials; lognormal noise of 3 %, alone / with a 10 % chance per repeat of a
  10-25 % slower run): 96.2 / 97.5 % at 3 repeats, 97.2 / 96.6 % at 4, 96.6 / 95.9 % at 6; the old
  bootstrap of the ratio of medians gave 89.6 / 89.1 %, 92.8 / 92.2 %, 97.1 / 95.7 %. Fewer than
  ``MIN_REPEATS_RATIO`` (3) repeats: none (the old bootstrap covered 65 % at 2).
* A difference B - A pairs prompts where both runs have per-request data (one resample of prompt indices
  serves both sides, studentized as above). A difference of speedups is a Welch t interval from the four
  sets of repeats (delta method on the logs), centred on the difference of the two ratios of geometric
  means (``speedup_diff``, whose speedups compare shows), from 3 repeats each: 96.7-96.9 % at 3, 96.0 % at
  4, 95.8-96.0 % at 6 (98 % with slow outliers). Difference of medians of timings: a bootstrap of medians
  of each side's repeats, from 6.
* Whether drafting changes what the model samples (check-lossless at temperature > 0): a permutation test of
  continuations with drafting off against on, its calibration and power in the block before ``lossless_test``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
MIN_PROMPTS = 5  # fewer: a bootstrap over prompts cannot hold its coverage
MIN_REPEATS = 6  # fewer: no order-statistic interval of one median reaches 95 % (min..max of 5 covers 94 %)
MIN_REPEATS_RATIO = 3  # a speedup (ratio of two points) and a difference of speedups: t intervals on logs


def _rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: exact for df 1 and 2, Cornish-Fisher from 3 (within 0.01 of the exact value),
    linear in 1/df between whole df (the quantile is convex in 1/df, so that errs wide)."""
    if df < 1:
        raise ValueError("t_quantile needs df >= 1")
    if df != int(df):
        lo, hi = math.floor(df), math.ceil(df)
        w = (1 / df - 1 / hi) / (1 / lo - 1 / hi)
        return w * t_quantile(p, lo) + (1 - w) * t_quantile(p, hi)
    df = int(df)
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g = [(z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def _percentiles(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """The central ``level`` of the bootstrap samples."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    a = (1 - level) / 2
    lo, hi = np.quantile(finite, [a, 1 - a])
    return float(lo), float(hi)


def resample_counts(n: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """How often each of n items (prompts) is drawn in each bootstrap resample: shape (resamples, n)."""
    idx = _rng(seed).integers(0, n, size=(resamples, n))
    return np.bincount((idx + n * np.arange(resamples)[:, None]).ravel(), minlength=resamples * n
                       ).reshape(resamples, n).astype(float)


def _ratio(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(num) / sum(den) and its gradient, from the sums s[..., 0:2]."""
    r = s[..., 0] / s[..., 1]
    return r, np.stack([1 / s[..., 1], -r / s[..., 1]], -1)


def _ratio_diff(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(num_b) / sum(den_b) - sum(num_a) / sum(den_a) and its gradient, from sums (num_a, den_a, num_b, den_b)."""
    ra, ga = _ratio(s[..., 0:2])
    rb, gb = _ratio(s[..., 2:4])
    return rb - ra, np.concatenate([-ga, gb], -1)


def _studentized(x: np.ndarray, counts: np.ndarray, stat, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap-t interval of a smooth function of sums over items, for a batch of data sets at once.

    ``x``: (sets, n, m), m values per item (per prompt); ``counts``: (resamples, n) from ``resample_counts``;
    ``stat(sums) -> (value, gradient)``. The standard error is the delta-method (linearized) one,
    sqrt(n/(n-1) * sum_i (g . x_i)^2), computed afresh in every resample; each end is at least as far out as
    the t interval value -+ t_{n-1} * se (the bootstrap-t alone falls to 92-93 % at 6-8 prompts when drafts
    correlate with acceptance). Returns (low, high) arrays of shape (sets,); nan where there is no interval.
    """
    n = x.shape[1]
    a = (1 - level) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        theta, g = stat(x.sum(1))                                         # (sets,), (sets, m)
        lin = np.einsum("snm,sm->sn", x, g)
        se = np.sqrt((lin ** 2).sum(1) * n / (n - 1))
        sums = np.einsum("bn,snm->sbm", counts, x)                        # (sets, resamples, m)
        prods = np.einsum("bn,snj,snk->sbjk", counts, x, x)
        theta_b, g_b = stat(sums)
        se_b = np.sqrt(np.maximum(np.einsum("sbj,sbjk,sbk->sb", g_b, prods, g_b), 0) * n / (n - 1))
        t_b = (theta_b - theta[:, None]) / se_b
    t_b = np.where(theta_b == theta[:, None], 0.0, t_b)  # a resample with no spread at the estimate itself
    # left out: a resample with an empty denominator, or with no spread (all its prompts at one ratio) away
    # from the estimate, whose t would be infinite (with 5 prompts, 1 resample in 600 draws one prompt only)
    t_b = np.where(np.isnan(theta_b) | np.isinf(t_b), np.nan, t_b)
    q_lo, q_hi = np.nanquantile(t_b, [a, 1 - a], axis=1, method="inverted_cdf")
    t = t_quantile(1 - a, n - 1)
    with np.errstate(invalid="ignore"):
        lo = theta - np.maximum(q_hi, t) * se
        hi = theta - np.minimum(q_lo, -t) * se
    lo = np.where(se == 0, theta, lo)
    hi = np.where(se == 0, theta, hi)
    return lo, hi


def _interval(lo: float, hi: float) -> tuple[float, float] | None:
    return (float(lo), float(hi)) if math.isfinite(lo) and math.isfinite(hi) else None


def ratio_ci_batch(num, den, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """``ratio_ci`` for many data sets of n prompts at once (arrays of shape (sets, n)); nan: no interval."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    lo, hi = _studentized(np.stack([num, den], -1), resample_counts(num.shape[1], resamples, seed), _ratio, level)
    # a ratio of non-negative counts is not negative
    lo = np.where((num >= 0).all(1) & (den >= 0).all(1), np.maximum(lo, 0), lo)
    return lo, hi


def ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
             level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of sum(num)/sum(den) over paired items (prompts): the studentized bootstrap of the module
    docstring. None with fewer than MIN_PROMPTS items or no denominator."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if num.size < MIN_PROMPTS or num.size != den.size or den.sum() <= 0:
        return None
    lo, hi = ratio_ci_batch(num[None], den[None], resamples, seed, level)
    return _interval(lo[0], hi[0])


def median_ci(values, level: float = LEVEL) -> tuple[float, float] | None:
    """Distribution-free interval for a median from order statistics (see the module docstring)."""
    x = sorted(v for v in values if v is not None)
    n = len(x)
    best = None
    for j in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if coverage >= level:
            best = j
    return None if best is None else (float(x[best - 1]), float(x[n - best]))


def median(values) -> float | None:
    x = [v for v in values if v is not None]
    return float(np.median(x)) if x else None


def paired_ratio_diff_ci(num_a, den_a, num_b, den_b, resamples: int = RESAMPLES, seed: int = SEED,
                         level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a), resampling the same prompt indices on
    both sides (prompt i of A is prompt i of B); the studentized bootstrap of ``ratio_ci``."""
    arrays = [np.asarray(v, dtype=float) for v in (num_a, den_a, num_b, den_b)]
    n = arrays[0].size
    if n < MIN_PROMPTS or any(a.size != n for a in arrays) or arrays[1].sum() <= 0 or arrays[3].sum() <= 0:
        return None
    lo, hi = _studentized(np.stack(arrays, -1)[None], resample_counts(n, resamples, seed), _ratio_diff, level)
    return _interval(lo[0], hi[0])


def _medians(values, rng: np.random.Generator, resamples: int) -> np.ndarray | None:
    """Bootstrap medians of one point's repeats; None with fewer than MIN_REPEATS."""
    x = np.asarray([v for v in values if v is not None], float)
    if x.size < MIN_REPEATS:
        return None
    return np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)


def median_diff_ci(a, b, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of median(b) - median(a), resampling each side's repeats independently."""
    rng = _rng(seed)
    ma, mb = _medians(a, rng, resamples), _medians(b, rng, resamples)
    return None if ma is None or mb is None else _percentiles(mb - ma, level)


def _positive(values) -> list[float]:
    return [v for v in values if v is not None and v > 0]


def _logs(values) -> np.ndarray:
    return np.log(np.asarray(_positive(values), float))


def _welch(parts: list[tuple[float, np.ndarray]]) -> tuple[float, float] | None:
    """Standard error and Welch-Satterthwaite df of sum(w * mean(x)) over independent groups (w, x)."""
    if any(x.size < 2 for _, x in parts):
        return None
    c = [w * w * x.var(ddof=1) / x.size for w, x in parts]
    if sum(c) == 0:
        return 0.0, math.inf
    return math.sqrt(sum(c)), sum(c) ** 2 / sum(ci * ci / (x.size - 1) for ci, (_, x) in zip(c, parts))


def _t_interval(est: float, se: float, df: float, level: float) -> tuple[float, float]:
    half = 0.0 if se == 0 else t_quantile(1 - (1 - level) / 2, df) * se
    return est - half, est + half


def log_ratio_t_ci(num, den, level: float = LEVEL) -> tuple[float, float] | None:
    """Welch t interval, on log values, of the ratio of two points' typical timings (e.g. tokens/s at k over
    tokens/s at k = 0), returned on the ratio scale. Timing noise is multiplicative (a few %), so logs make
    it near-normal; the estimate is the ratio of geometric means. From MIN_REPEATS_RATIO repeats a side."""
    ln, ld = _logs(num), _logs(den)
    if min(ln.size, ld.size) < MIN_REPEATS_RATIO:
        return None
    se, df = _welch([(1.0, ln), (1.0, ld)])
    lo, hi = _t_interval(float(ln.mean() - ld.mean()), se, df, level)
    return math.exp(lo), math.exp(hi)


def _rank_sum_counts(n: int, m: int) -> list[int]:
    """Null distribution of the Mann-Whitney count U (pairs with x_i > y_j): arrangements per value of U."""
    table = [[[1] if i == 0 or j == 0 else None for j in range(m + 1)] for i in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            # the largest of all values is an x (adds j to U) or a y (adds nothing)
            a, b = table[i - 1][j], table[i][j - 1]
            out = [0] * (i * j + 1)
            for u, c in enumerate(a):
                out[u + j] += c
            for u, c in enumerate(b):
                out[u] += c
            table[i][j] = out
    return table[n][m]


def rank_ratio_ci(num, den, level: float = LEVEL) -> tuple[float, float] | None:
    """Distribution-free interval of the ratio of two points' timings from the n*m pairwise ratios
    num_i / den_j: [r_(j), r_(nm+1-j)] with the largest j whose coverage, from the exact rank-sum (Mann-Whitney)
    distribution, is >= level. It assumes only that both points' noise has the same shape on the log scale
    (multiplicative noise), and then covers the ratio of medians (of any quantile) with exactly that
    probability. None when no j reaches the level (3 + 3 repeats reach 90 %, 4 + 4 97.1 %, 3 + 5 96.4 %)."""
    ln, ld = _logs(num), _logs(den)
    n, m = ln.size, ld.size
    if min(n, m) < 2:
        return None
    counts = _rank_sum_counts(n, m)
    total, below, best = sum(counts), 0, None
    for j in range(1, n * m // 2 + 1):
        below += counts[j - 1]  # P(U <= j - 1): the truth lies below r_(j)
        if 1 - 2 * below / total < level:
            break
        best = j
    if best is None:
        return None
    r = np.sort((ln[:, None] - ld[None, :]).ravel())
    return math.exp(r[best - 1]), math.exp(r[n * m - best])


def median_ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of median(num) / median(den) (a speedup from two points' repeats), unpaired: the rank
    interval (``rank_ratio_ci``) where its exact coverage reaches the level (4 + 4 repeats and up), else
    the t interval on logs (``log_ratio_t_ci``, from 3 + 3 repeats); None below that. ``resamples`` and
    ``seed`` are kept for callers; neither method resamples.

    The interval always holds the ratio of medians it is shown with. Neither method is centred on it (the
    rank interval on the median of the pairwise ratios, the t interval on the ratio of geometric means),
    yet up to 11 + 11 repeats it provably lies inside: at least ceil(n/2) ceil(m/2) pairwise ratios lie at
    or below it (and as many at or above), which is no fewer than the rank interval's j, and at 3 + 3 or
    3 + 4 a median of logs lies within 0.87 standard deviations of the mean, short of the t half-width.
    From 12 + 12 repeats the rank interval can miss it (two-mode noise mixed unequally at the two points:
    5.6 % of trials at 16 + 16, 13 % at 20 + 20); the interval is then stretched to reach it, which can
    only raise coverage, so the figures in the module docstring (3, 4 and 6 repeats) are unchanged."""
    ci = rank_ratio_ci(num, den, level) or log_ratio_t_ci(num, den, level)
    if ci is None:
        return None
    r = math.exp(float(np.log(median(_positive(num))) - np.log(median(_positive(den)))))
    return min(ci[0], r), max(ci[1], r)


def speedup_diff(a_k, a_0, b_k, b_0, level: float = LEVEL) -> tuple[float, float, tuple[float, float]] | None:
    """A's speedup, B's, and the interval of B's minus A's: each speedup a point's tokens/s over its own run's
    k = 0 point, so drift between the two runs cancels (drift within a run does not). One estimator for all
    three: each speedup is the ratio of geometric means of the repeats (a difference of mean logs), the
    interval is centred on their difference, by the delta method with Welch-Satterthwaite df over the four
    sets of repeats. From MIN_REPEATS_RATIO repeats each, else None. (A ratio of medians beside an interval
    built around ratios of geometric means can lie outside it: +0.394 against [-0.137, +0.392] was seen.)"""
    logs = [_logs(v) for v in (a_k, a_0, b_k, b_0)]
    if min(x.size for x in logs) < MIN_REPEATS_RATIO:
        return None
    sa = math.exp(logs[0].mean() - logs[1].mean())
    sb = math.exp(logs[2].mean() - logs[3].mean())
    se, df = _welch([(sa, logs[0]), (sa, logs[1]), (sb, logs[2]), (sb, logs[3])])
    lo, hi = _t_interval(sb - sa, se, df, level)
    return sa, sb, (float(lo), float(hi))


def speedup_diff_ci(a_k, a_0, b_k, b_0, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """The interval of ``speedup_diff`` alone. ``resamples`` and ``seed`` are kept for callers."""
    out = speedup_diff(a_k, a_0, b_k, b_0, level)
    return None if out is None else out[2]


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
ALPHA_AA = 0.01  # the A/A control (off against off) checks the engine, not a second coin toss: lossless_verdict
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
        else:
            ci_low, ci_high, mde = float(diff[0]), float(diff[0]), 0.0
    return LosslessTest(
        p_value=p, p_value_scores=float(p_scores[0]), p_value_tokens=float(p_tokens[0]),
        min_p_value=max(1 / _distinct_labelings(strata, arm), 1 / (permutations + 1)),
        mean_logprob_a=float(wp @ means[False]), mean_logprob_b=float(wp @ means[True]),
        logprob_diff=float(diff[0]), logprob_diff_ci_low=ci_low, logprob_diff_ci_high=ci_high,
        mde_logprob=mde, num_continuations_a=int((~arm).sum()), num_continuations_b=int(arm.sum()),
        num_prompts=int(prompts.size), permutations=permutations)


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
# logits, temperature, no top-k/top-p). The off arms test that assumption: an off arm that fails it means the
# scorer is not the law the engine samples from, and the check is inconclusive (lossless_verdict).
#
# The verdict combines the two tests on the drafting arm by Bonferroni: each at alpha / 2 (Holm's first step is
# the same here: the verdict is lossy when either rejects). Control of the scorer: each of the two off arms at
# ALPHA_AA / 2, so a correct engine with an exact scorer loses about 1 % of its checks to it. Calibration
# (tests/unit/test_lossless_stats.py, the Markov chain above, 12 x 8 continuations of 16 tokens a side): z on 4000
# null arms mean +0.010, sd 0.989, |z| > 1.96 in 5.05 %; 1000 null trials lossy in 4.7 % (two-sample alone at
# alpha / 2 1.7 %, one-sample alone 3.4 %), the scorer's control 1.2 %, the A/A control 0.6 %. Power, 500 trials:
# the planted rule 98.4 % (two-sample alone 93.6 %); a subtler rule (the acceptance ratio's p at 0.9 T, TV 0.037
# per drafted token, +0.087 nats/token) 44.0 % against 11.8 % (19.6 % at the old full alpha). The one-sample
# test sees a shift of the mean log-prob only where each token's own law moves (its local excess): a fault that
# moves mass between tokens the target scores alike is left to the tokens half of the two-sample test.


@dataclass(frozen=True)
class ScoreTest:
    """The one-sample test of one arm against the scorer's law (the block comment above)."""
    z: float | None  # sum(log p + H) / sqrt(sum Var); None when no token has any spread and some D is not 0
    p_value: float  # two-sided, normal
    mean_excess_logprob: float  # sum(log p + H) / tokens: nats/token above what the law itself expects
    se_logprob: float  # sqrt(sum Var) / tokens
    mde_logprob: float | None  # the mean excess this test detects with POWER at its share of alpha
    num_tokens: int


def score_test(logprobs, entropies, variances, alpha: float = ALPHA / 2) -> ScoreTest | None:
    """One arm's tokens: their target log-probs, and at each position the entropy of the target's law and the
    variance of log p under it (all at the sampling temperature). ``alpha``: the level this test is used at
    (its MDE). None when the arm has no token."""
    lp = np.maximum(np.asarray(logprobs, float), LOGPROB_FLOOR)
    h, v = np.asarray(entropies, float), np.maximum(np.asarray(variances, float), 0.0)
    if lp.size == 0:
        return None
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


LOSSLESS, LOSSY, INCONCLUSIVE = "lossless", "lossy", "inconclusive"
# why a sampling check is inconclusive, in a word (the summary's headline and lossless.json's inconclusive_reason)
MISSING, AA_REJECTS, SCORER, TOO_FEW, UNDERPOWERED = ("a test is missing", "A/A control rejects",
                                                       "scorer is not the sampler's law", "too few continuations",
                                                       "underpowered")


def detectable_shift(ab: LosslessTest) -> float | None:
    """The smallest shift of the mean target log-prob (nats/token) the verdict detects with POWER: the two-sample
    test's. Not the one-sample test's, though it is often smaller: that one sees the local excess log p + H, which
    misses a fault that moves which prefixes are visited (their entropies) or mass between tokens scored alike, so
    its power says nothing of a shift of the mean target log-prob, the quantity the bound is set on."""
    return ab.mde_logprob


def lossless_verdict(ab: LosslessTest | None, aa: LosslessTest | None, alpha: float = ALPHA,
                     alpha_aa: float = ALPHA_AA, max_mde: float | None = None, score_on: ScoreTest | None = None,
                     score_off: tuple = ()) -> tuple[str, str]:
    """(verdict, why) from the off/on test ``ab``, the off/off control ``aa`` and, where the backend gave the
    target's entropies, the one-sample tests of the drafting arm (``score_on``) and of the off arms
    (``score_off``, the scorer's control). An inconclusive why starts with its reason (MISSING ... UNDERPOWERED).

    The two-sample test assumes two runs with independent seeds differ only by sampling; the A/A control checks
    that for this engine (batch composition, a seed that is not independent, ...). If the control itself rejects
    at ``alpha_aa``, no verdict on drafting can be drawn: inconclusive. ``alpha_aa`` is below ``alpha`` so a
    correct engine loses only 1 % of its checks to the control, not 5 %. With the one-sample test, each of the
    two tests runs at alpha / 2 (Bonferroni) and the off arms' one-sample tests at alpha_aa / 2 each; an off arm
    that fails it makes the one-sample test unusable: inconclusive, unless the two-sample test rejects by itself.
    Inconclusive too when either two-sample test is missing, when fewer than MIN_CONTINUATIONS continuations a
    side leave next to no power, when the smallest reachable p-value is not below alpha, or when the smallest
    detectable shift (``detectable_shift``) exceeds ``max_mde`` (nats per token). A rejection is called lossy
    whatever the power."""
    if ab is None or aa is None:
        return INCONCLUSIVE, f"{MISSING}: no prompt with continuations in both arms"
    if aa.p_value < alpha_aa:
        return INCONCLUSIVE, (f"{AA_REJECTS}: off against off, p = {aa.p_value:.3g} < {alpha_aa:g}; two runs "
                              "without drafting already differ more than sampling explains")
    one = score_on is not None
    a2 = alpha / 2 if one else alpha
    if ab.p_value < a2:
        return LOSSY, (f"p = {ab.p_value:.3g} < {a2:g}: drafting changes the output law "
                       f"(mean target log-prob {ab.logprob_diff:+.3g} nats/token)")
    if one:
        bad = [s for s in score_off if s is None or s.p_value < alpha_aa / max(len(score_off), 1)]
        if bad or not score_off:
            zs = ", ".join("unknown" if s is None or s.z is None else f"z = {s.z:+.3g}" for s in score_off)
            return INCONCLUSIVE, (f"{SCORER}: an arm without drafting fails the one-sample test ({zs or 'none'}; "
                                  f"alarm below p = {alpha_aa / max(len(score_off), 1):g} each), so the target's "
                                  "scores are not the law the engine samples from")
        if score_on.p_value < a2:
            z = "unknown" if score_on.z is None else f"{score_on.z:+.3g}"
            return LOSSY, (f"one-sample z = {z}, p = {score_on.p_value:.3g} < {a2:g}: the drafting arm's tokens "
                           f"are not the target's law (mean excess log-prob {score_on.mean_excess_logprob:+.3g} "
                           "nats/token)")
    if min(ab.num_continuations_a, ab.num_continuations_b) < MIN_CONTINUATIONS or ab.min_p_value >= a2:
        return INCONCLUSIVE, (f"{TOO_FEW}: {ab.num_continuations_a} and {ab.num_continuations_b}; at least "
                              f"{MIN_CONTINUATIONS} each, to detect anything")
    mde = detectable_shift(ab)
    if max_mde is not None and (mde is None or mde > max_mde):
        n = ab.num_continuations_b
        need = None if mde is None else math.ceil(n * (mde / max_mde) ** 2)
        reach = "" if need is None else (f"; about {math.ceil(need / ab.num_prompts)} continuations a prompt "
                                         f"({need} an arm, {n} now; the detectable shift falls as "
                                         "1 / sqrt(continuations)) would reach it")
        return INCONCLUSIVE, (f"{UNDERPOWERED}: the smallest detectable shift "
                              f"({'unknown' if mde is None else format(mde, '.3g')} nats/token) exceeds the bound "
                              f"{max_mde:g}{reach}")
    p1 = "" if not one else f", one-sample p = {score_on.p_value:.3g}"
    shift = "" if mde is None else f"; it would detect a shift of {mde:.3g} nats/token"
    return LOSSLESS, f"no difference detectable at this N (p = {ab.p_value:.3g}{p1}{shift})"
