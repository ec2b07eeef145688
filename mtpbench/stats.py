"""Uncertainty of a point's numbers, and of the difference between two runs (numpy only: no torch, no I/O).

* Acceptance (AL, draft acceptance rate, per-position rates) is a ratio of sums over prompts, e.g.
  ``AL = 1 + sum(accepted) / sum(drafts)``. Its 95 % interval is a bootstrap that resamples *prompts* (a
  prompt's drafts stay together: their acceptances are not independent), with a fixed seed, so a report
  rebuilt from the same files gives the same interval. The plain percentile interval is too narrow for
  few prompts (90 % coverage at 8), so it is the *expanded* percentile interval (Hesterberg 2015): the
  tail probability is taken at ``sqrt(n/(n-1)) * t_{n-1}`` instead of ``z``, which keeps coverage at
  94-95 % from 5 prompts up (``tests/test_stats.py``). Fewer than ``MIN_PROMPTS`` prompts: no interval.
* Timings (tokens/s, TTFT, TPOT) vary from run to run, not from prompt to prompt: ``--repeats N`` repeats
  a point's timed run, the figure is the median of the N, and its interval the distribution-free one
  from order statistics (the narrowest ``[x_(j), x_(N+1-j)]`` that covers the median with >= 95 %
  probability). That needs N >= ``MIN_REPEATS`` (6); below it no interval is given, and the bootstraps
  of medians (differences, speedups) are not given either: with 2-3 repeats they call noise a
  difference far more often than 5 % of the time.
* A difference B - A pairs prompts where both runs have per-request data (one resample of prompt indices
  serves both sides), and resamples each side's repeats independently for timings.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
MIN_PROMPTS = 5  # fewer: a bootstrap over prompts cannot hold its coverage
MIN_REPEATS = 6  # fewer: no order-statistic interval reaches 95 % (min..max of 5 covers 94 %)


def _rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (Cornish-Fisher expansion; within 0.01 of the exact value for df >= 3)."""
    z = NormalDist().inv_cdf(p)
    g = [(z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def _percentiles(samples: np.ndarray, level: float = LEVEL, n: int | None = None) -> tuple[float, float] | None:
    """The central ``level`` of the bootstrap samples; with ``n`` (items resampled), the expanded interval."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    a = (1 - level) / 2
    if n is not None:
        a = 1 - NormalDist().cdf(math.sqrt(n / (n - 1)) * t_quantile(1 - a, n - 1))
    lo, hi = np.quantile(finite, [a, 1 - a])
    return float(lo), float(hi)


def ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
             level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of sum(num)/sum(den), resampling the paired items (prompts)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if num.size < MIN_PROMPTS or den.sum() <= 0:
        return None
    idx = _rng(seed).integers(0, num.size, size=(resamples, num.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = num[idx].sum(1) / den[idx].sum(1)
    return _percentiles(samples, level, num.size)


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
    both sides (prompt i of A is prompt i of B)."""
    arrays = [np.asarray(v, dtype=float) for v in (num_a, den_a, num_b, den_b)]
    n = arrays[0].size
    if n < MIN_PROMPTS or any(a.size != n for a in arrays) or arrays[1].sum() <= 0 or arrays[3].sum() <= 0:
        return None
    idx = _rng(seed).integers(0, n, size=(resamples, n))
    na, da, nb, db = (a[idx].sum(1) for a in arrays)
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = nb / db - na / da
    return _percentiles(samples, level, n)


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


def median_ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of median(num) / median(den) (a speedup from two points' repeats), unpaired."""
    rng = _rng(seed)
    mn, md = _medians(num, rng, resamples), _medians(den, rng, resamples)
    if mn is None or md is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentiles(mn / md, level)


def speedup_diff_ci(a_k, a_0, b_k, b_0, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of B's speedup minus A's, each speedup the median tokens/s of a point over the median of
    its own run's k = 0 point: drift between the two runs cancels, drift within a run does not."""
    rng = _rng(seed)
    med = [_medians(v, rng, resamples) for v in (a_k, a_0, b_k, b_0)]
    if any(m is None for m in med):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentiles(med[2] / med[3] - med[0] / med[1], level)
