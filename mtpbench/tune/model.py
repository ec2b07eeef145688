"""The throughput model behind ``mtpbench tune``'s prediction, from measured points only (no engine).

At one load (a batch size, or a served concurrency) a verify step of every sequence in flight costs t(k), and
yields E(k) tokens per sequence: 1 plus the joint acceptance rates of draft positions 1..k (vLLM's
``acceptance_rate_per_pos``; a draft at position i does not depend on k, so each rate pools every measured
point whose k reaches it). Throughput is then proportional to E(k) / t(k), and relative to plain decoding

    tokens/s(k) = tokens/s(0) * E(k) / (1 + f + c * k)        (k > 0)

where t(k) / t(0) = 1 + f + c * k: ``c`` the cost of one more drafted token as a fraction of a decode step (its
draft step and its place in the verify step over k + 1 tokens), ``f`` the fixed cost of drafting at all (the
draft model's pass over the accepted tokens, the rejection sampler). At a measured point, t(k) / t(0) is
E_measured(k) * tokens/s(0) / tokens/s(k) (the step count follows from the acceptance length), so ``c`` and
``f`` are a least-squares line through the measured k > 0 of that load. Loads that were not measured get
``f`` and ``c`` interpolated linearly in log2(load) between the nearest measured loads and tokens/s(0) as a power
of the load between them (beyond them: the nearest load's ``f`` and ``c``, tokens/s(0) along the last segment's
power law); k beyond the largest
measured k continue the last measured conditional acceptance rate. A prediction at a measured point can be
made without that point (``held_out``): that error is the one to expect where nothing was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mtpbench import stats


@dataclass
class Measured:
    """One measured (load, k) point: the tokens/s of its repeats and the spec-decode counters of its drafts."""

    load: int
    k: int
    tokps: list[float]
    num_drafts: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    repeats: list[dict] = field(default_factory=list)  # the repeats' timing dicts (goodput at any SLO: tune.goodput)
    looks: int = 1  # the looks its sweep's rounds allowed (stats.judge: the level of every comparison of it)
    noise: tuple | None = None  # its sweep's A/A control: (k = 0 runs, copy runs) (sweep.load.aa_runs); None: none
    sweep_family: int | None = None  # the comparisons its sweep judged at once (sweep.load.judge_of); None: unknown
    sweep: str | None = None  # its sweep's folder

    @property
    def gmean(self) -> float:
        """The geometric mean of its positive repeats: the statistic the judge compares (``stats.judge.ratio``), so
        what a tune shows, fits and ranks is what it judges (issue 55); the median where none is positive."""
        positive = [v for v in self.tokps if v is not None and v > 0]
        return stats.gmean(positive) if positive else stats.median(self.tokps)

    @property
    def acceptance_length(self) -> float:
        return 1 + sum(self.num_accepted_tokens_per_pos) / self.num_drafts if self.num_drafts else 1.0


@dataclass(frozen=True)
class Costs:
    """One load's fitted costs: tokens/s at k = 0, the fixed cost ``f`` and per-token cost ``c`` of drafting
    (fractions of a decode step), and how they were obtained."""

    load: int
    tokps0: float
    f: float
    c: float
    source: str  # "measured" (fitted at this load), "interpolated" or "extrapolated"

    def step_ratio(self, k: int) -> float:
        """t(k) / t(0)."""
        return 1.0 if k == 0 else 1 + self.f + self.c * k

    def break_even_al(self, k: int) -> float:
        """The acceptance length at which k drafts neither gain nor lose: t(k) / t(0)."""
        return self.step_ratio(k)


def joint_acceptance(points: list[Measured], k_max: int) -> list[float]:
    """Joint acceptance rate of draft positions 1..k_max, each pooled over the points whose k reaches it; positions
    beyond the measured ones continue the last conditional rate (the ratio of the last two joint rates)."""
    rates: list[float] = []
    for i in range(k_max):
        reach = [p for p in points if p.k > i and p.num_drafts and len(p.num_accepted_tokens_per_pos) > i]
        if reach:
            rates.append(sum(p.num_accepted_tokens_per_pos[i] for p in reach) / sum(p.num_drafts for p in reach))
        elif not rates:
            return [0.0] * k_max  # nothing drafted anywhere: no acceptance to build on
        else:
            q = rates[-1] / rates[-2] if len(rates) > 1 and rates[-2] > 0 else rates[-1]
            rates.append(rates[-1] * min(q, 1.0))
    return rates


def expected_tokens(rates: list[float], k: int) -> float:
    """E(k): tokens a verify step yields per sequence, 1 + the joint rates of positions 1..k."""
    return 1 + sum(rates[:k])


def fit_costs(load: int, points: list[Measured]) -> Costs | None:
    """``f`` and ``c`` at one load from its measured points (its k = 0 point and at least one k > 0); None without
    them. Each point's own acceptance length gives its step count."""
    base = [p for p in points if p.load == load and p.k == 0]
    spec = [p for p in points if p.load == load and p.k > 0 and p.num_drafts]
    if not base or not spec:
        return None
    t0 = base[0].gmean  # tokens/s as the judge compares it: the geometric mean of the repeats
    xs = [p.k for p in spec]
    ys = [p.acceptance_length * t0 / p.gmean - 1 for p in spec]  # t(k) / t(0) - 1
    if len(set(xs)) < 2:
        f, c = 0.0, sum(y / x for x, y in zip(xs, ys)) / len(xs)
    else:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        c = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        f = my - c * mx
    return Costs(load, t0, f, c, "measured")


class Model:
    """Predicted tokens/s at any (k, load) from measured points: costs per measured load, acceptance pooled per
    load (and over every load for loads that were not measured)."""

    def __init__(self, points: list[Measured], k_max: int | None = None):
        self.points = points
        self.k_max = max(k_max or 0, max((p.k for p in points), default=0))
        self.loads = sorted({p.load for p in points})
        self.costs = {b: c for b in self.loads if (c := fit_costs(b, points)) is not None}
        self.rates_all = joint_acceptance(points, self.k_max)
        self.rates = {b: joint_acceptance([p for p in points if p.load == b], self.k_max) for b in self.loads}

    def costs_at(self, load: int) -> Costs | None:
        if load in self.costs:
            return self.costs[load]
        costs = self._between(load)
        base = [p.gmean for p in self.points if p.load == load and p.k == 0]
        if costs is not None and base:  # a load measured at k = 0 only: its own tokens/s(0)
            costs = Costs(load, base[0], costs.f, costs.c, costs.source)
        return costs

    def _between(self, load: int) -> Costs | None:
        known = sorted(self.costs)
        if not known:
            return None
        below = [b for b in known if b < load]
        above = [b for b in known if b > load]
        if below and above:
            lo, hi, source = self.costs[below[-1]], self.costs[above[0]], "interpolated"
        else:
            pair = known[-2:] if below else known[:2]
            lo, hi, source = self.costs[pair[0]], self.costs[pair[-1]], "extrapolated"
        if lo.load == hi.load:
            return Costs(load, lo.tokps0, lo.f, lo.c, source)
        w = (math.log2(load) - math.log2(lo.load)) / (math.log2(hi.load) - math.log2(lo.load))
        # tokens/s(0) geometric in load (a power law, as throughput grows with the batch), never below 0
        tokps0 = lo.tokps0 * (hi.tokps0 / lo.tokps0) ** w if lo.tokps0 > 0 and hi.tokps0 > 0 else 0.0
        if source == "extrapolated":  # the drafting costs of the nearest load; tokens/s(0) along the last segment
            near = hi if below else lo
            return Costs(load, tokps0, near.f, near.c, source)
        return Costs(load, tokps0, lo.f + w * (hi.f - lo.f), lo.c + w * (hi.c - lo.c), source)

    def predict(self, k: int, load: int) -> float | None:
        costs = self.costs_at(load)
        if costs is None:
            return None
        if k == 0:
            return costs.tokps0
        rates = self.rates.get(load) if any(p.load == load and p.k > 0 for p in self.points) else None
        step = costs.step_ratio(k)
        if step <= 0:  # an impossible fit (a verify step that takes no time): it predicts nothing
            return None
        return costs.tokps0 * expected_tokens(rates or self.rates_all, k) / step

    def best_k(self, load: int, ks: list[int]) -> int | None:
        """The k of the highest predicted tokens/s (ties: the smaller k)."""
        preds = [(self.predict(k, load), k) for k in sorted(ks)]
        preds = [(p, k) for p, k in preds if p is not None]
        return max(preds, key=lambda pk: (pk[0], -pk[1]))[1] if preds else None


def held_out(points: list[Measured], target: Measured) -> float | None:
    """The prediction at ``target`` from every other point: a k > 0 point from its load's other points (from the
    neighbouring loads' costs where it was its load's only k > 0), a k = 0 point from the other loads."""
    others = [p for p in points if p is not target]
    if target.k == 0:
        others = [p for p in others if p.load != target.load]
    if not others:
        return None
    return Model(others, target.k).predict(target.k, target.load)
