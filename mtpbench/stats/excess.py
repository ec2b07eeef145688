"""check-lossless's excess test (numpy only): the drafting arm's mean excess log-prob, log p + H, against the arms
without drafting, within each prompt (``stats.verdict``'s module docstring gives the rule and why)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from mtpbench.stats.lossless import LOGPROB_FLOOR


@dataclass(frozen=True)
class ExcessTest:
    """The drafting arm's mean excess log-prob (log p + H, nats/token) against the arms without drafting."""
    z: float | None  # None: no spread at all (every continuation of a prompt alike)
    p_value: float  # two-sided, normal
    excess_on: float  # mean per-continuation excess, prompts weighted as in the difference
    excess_off: float
    diff: float  # on - off
    se: float | None  # the permutation standard deviation of diff
    num_continuations_on: int
    num_continuations_off: int
    num_nonfinite: int = 0  # continuations whose excess is NaN or infinite


def continuation_excess(logprobs, entropies) -> float:
    """One continuation's mean of D_t = log p_t(x_t) + H_t (log-probs floored at LOGPROB_FLOOR, as the other tests;
    NaN stays NaN)."""
    lp = np.maximum(np.asarray(logprobs, float), LOGPROB_FLOOR)
    return float(np.mean(lp + np.asarray(entropies, float)))


def excess_test(excess, strata, on) -> ExcessTest | None:
    """The excess test of the module docstring: ``excess`` per continuation, its prompt (``strata``) and whether it
    came from the drafting arm (``on``). None when some prompt lacks either side."""
    x, strata, on = np.asarray(excess, float), np.asarray(strata), np.asarray(on, bool)
    prompts = np.unique(strata)
    n_on = np.array([on[strata == s].sum() for s in prompts])
    n_off = np.array([(~on[strata == s]).sum() for s in prompts])
    if x.size == 0 or (n_on == 0).any() or (n_off == 0).any():
        return None
    bad = int((~np.isfinite(x)).sum())
    if bad:
        return ExcessTest(None, math.nan, math.nan, math.nan, math.nan, None, int(n_on.sum()), int(n_off.sum()), bad)
    h = n_on * n_off / (n_on + n_off)
    w = h / h.sum()
    m_on = np.array([x[(strata == s) & on].mean() for s in prompts])
    m_off = np.array([x[(strata == s) & ~on].mean() for s in prompts])
    s2 = np.array([x[strata == s].var(ddof=1) for s in prompts])  # at least 2 values a prompt: one of each side
    diff = float(w @ (m_on - m_off))
    se = math.sqrt(float((w ** 2 * s2 * (1 / n_on + 1 / n_off)).sum()))
    if se <= 1e-12 * max(float(np.abs(x).max()), 1.0):  # below: rounding of equal values
        z, p = None, 1.0
    else:
        z = diff / se
        p = 2 * NormalDist().cdf(-abs(z))
    return ExcessTest(z, p, float(w @ m_on), float(w @ m_off), diff, None if z is None else se,
                      int(n_on.sum()), int(n_off.sum()))
