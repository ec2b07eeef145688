"""Uncertainty of a point's numbers, and of the difference between two runs (numpy only: no torch, no I/O).

* Acceptance (AL, draft acceptance rate, per-position rates) is a ratio of sums over prompts, e.g.
  ``AL = 1 + sum(accepted) / sum(drafts)``. Its 95 % interval is a percentile bootstrap that resamples
  *prompts* (a prompt's drafts stay together: their acceptances are not independent), with a fixed seed,
  so a report rebuilt from the same files gives the same interval.
* Timings (tokens/s, TTFT, TPOT) vary from run to run, not from prompt to prompt: ``--repeats N`` repeats
  a point's timed run, the figure is the median of the N, and its interval the distribution-free one
  from order statistics (the narrowest ``[x_(j), x_(N+1-j)]`` that covers the median with >= 95 %
  probability; with N < 6 none does, and min..max is given, covering 1 - 2^(1-N): 94 % at N = 5).
* A difference B - A pairs prompts where both runs have per-request data (one resample of prompt indices
  serves both sides), and resamples each side's repeats independently for timings.
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


def _rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def _percentiles(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    lo, hi = np.quantile(finite, [a, 1 - a])
    return float(lo), float(hi)


def ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
             level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of sum(num)/sum(den), resampling the paired items (prompts)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if num.size < 2 or den.sum() <= 0:
        return None
    idx = _rng(seed).integers(0, num.size, size=(resamples, num.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = num[idx].sum(1) / den[idx].sum(1)
    lo, hi = _percentiles(samples, level)
    return None if math.isnan(lo) else (lo, hi)


def median_ci(values, level: float = LEVEL) -> tuple[float, float] | None:
    """Distribution-free interval for a median from order statistics (see the module docstring)."""
    x = sorted(v for v in values if v is not None)
    n = len(x)
    if n < 2:
        return None
    best = 1  # j = 1: min .. max
    for j in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if coverage >= level:
            best = j
    return float(x[best - 1]), float(x[n - best])


def median(values) -> float | None:
    x = [v for v in values if v is not None]
    return float(np.median(x)) if x else None


def paired_ratio_diff_ci(num_a, den_a, num_b, den_b, resamples: int = RESAMPLES, seed: int = SEED,
                         level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a), resampling the same prompt indices on
    both sides (prompt i of A is prompt i of B)."""
    arrays = [np.asarray(v, dtype=float) for v in (num_a, den_a, num_b, den_b)]
    n = arrays[0].size
    if n < 2 or any(a.size != n for a in arrays) or arrays[1].sum() <= 0 or arrays[3].sum() <= 0:
        return None
    idx = _rng(seed).integers(0, n, size=(resamples, n))
    na, da, nb, db = (a[idx].sum(1) for a in arrays)
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = nb / db - na / da
    lo, hi = _percentiles(samples, level)
    return None if math.isnan(lo) else (lo, hi)


def median_diff_ci(a, b, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of median(b) - median(a), resampling each side's repeats independently."""
    a, b = np.asarray([x for x in a if x is not None], float), np.asarray([x for x in b if x is not None], float)
    if a.size < 2 or b.size < 2:
        return None
    rng = _rng(seed)
    ma = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    return _percentiles(mb - ma, level)


def median_ratio_ci(num, den, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of median(num) / median(den) (a speedup from two points' repeats), unpaired."""
    num, den = np.asarray([x for x in num if x is not None], float), np.asarray([x for x in den if x is not None], float)
    if num.size < 2 or den.size < 2:
        return None
    rng = _rng(seed)
    mn = np.median(num[rng.integers(0, num.size, size=(resamples, num.size))], axis=1)
    md = np.median(den[rng.integers(0, den.size, size=(resamples, den.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentiles(mn / md, level)


def speedup_diff_ci(a_k, a_0, b_k, b_0, resamples: int = RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of B's speedup minus A's, each speedup the median tokens/s of a point over the median of
    its own run's k = 0 point: drift between the two runs cancels, drift within a run does not."""
    sides = [np.asarray([x for x in v if x is not None], float) for v in (a_k, a_0, b_k, b_0)]
    if any(v.size < 2 for v in sides):
        return None
    rng = _rng(seed)
    med = [np.median(v[rng.integers(0, v.size, size=(resamples, v.size))], axis=1) for v in sides]
    with np.errstate(divide="ignore", invalid="ignore"):
        return _percentiles(med[2] / med[3] - med[0] / med[1], level)
