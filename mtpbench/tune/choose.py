"""``mtpbench tune``'s decision from measured points (no engine): the k to run at each measured load, the
boundaries between loads that get different k, and the whole as vLLM's dynamic speculative decoding schedule
(``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges ``[start, end, k]``, the first starting at
1; vLLM's ``v1/spec_decode/dynamic/utils.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mtpbench.stats import median_ratio_ci
from mtpbench.tune.model import Measured, Model

RULE = ("at each load, the smallest k that no other k beats beyond noise (k' beats k when the 95 % interval of "
        "tokens/s(k') / tokens/s(k) over their repeats lies wholly above 1): a k that cannot be shown faster "
        "than a smaller one is not worth its draft steps, its verify positions and its memory")


@dataclass
class LoadChoice:
    """The choice at one measured load: the chosen k, the k with the highest median, and which k beat which."""

    load: int
    chosen: int
    fastest: int
    beaten_by: dict[int, list[int]] = field(default_factory=dict)


def beats(a: Measured, b: Measured) -> bool:
    """Whether ``a`` is faster than ``b`` beyond noise."""
    ci = median_ratio_ci(a.tokps, b.tokps)
    return ci is not None and ci[0] > 1


def choose(points: list[Measured]) -> LoadChoice:
    """``RULE`` over the points of one load."""
    by_k = {p.k: p for p in points}
    ks = sorted(by_k)
    beaten = {k: [j for j in ks if j != k and beats(by_k[j], by_k[k])] for k in ks}
    chosen = next((k for k in ks if not beaten[k]), max(ks, key=lambda k: by_k[k].median))
    fastest = max(ks, key=lambda k: (by_k[k].median, -k))
    return LoadChoice(points[0].load, chosen, fastest, beaten)


def boundary(model: Model, lo: LoadChoice, hi: LoadChoice) -> int:
    """The first load above ``lo.load`` that runs ``hi.chosen``: where the model predicts it at least as fast as
    ``lo.chosen`` (the measured load ``hi.load`` at the latest)."""
    for b in range(lo.load + 1, hi.load):
        a, z = model.predict(lo.chosen, b), model.predict(hi.chosen, b)
        if a is not None and z is not None and z >= a:
            return b
    return hi.load


def schedule(choices: list[LoadChoice], model: Model) -> list[list[int]]:
    """vLLM's ranges ``[start, end, k]`` from load 1 to the largest measured load (the first range reaches down to
    1 where the smallest measured load is larger; vLLM carries the last k beyond the largest)."""
    choices = sorted(choices, key=lambda c: c.load)
    ranges = [[1, choices[0].load, choices[0].chosen]]
    for lo, hi in zip(choices, choices[1:]):
        if hi.chosen == ranges[-1][2]:
            ranges[-1][1] = hi.load
            continue
        b = boundary(model, lo, hi)
        ranges[-1][1] = b - 1
        ranges.append([b, hi.load, hi.chosen])
    return ranges


def check_schedule(ranges, num_speculative_tokens: int) -> str | None:
    """Why vLLM would refuse this schedule (its ``validate_and_normalize_dynamic_sd_schedule`` and
    ``build_dynamic_sd_schedule_lookup`` rules), or None."""
    if not isinstance(ranges, list) or not ranges:
        return "num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, k] ranges"
    if num_speculative_tokens <= 0:
        return "a schedule needs num_speculative_tokens > 0 (no k above 0: run without a speculative config)"
    previous = 0
    for entry in sorted(ranges, key=lambda e: e[0] if isinstance(e, (list, tuple)) and e else 0):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(isinstance(x, int) for x in entry):
            return f"each range is [start, end, k] of three integers, got {entry!r}"
        start, end, k = entry
        if start <= 0 or end <= 0:
            return f"batch-size range ({start}, {end}) must be positive"
        if start > end:
            return f"batch-size range start must be <= end, got {entry!r}"
        if k < 0:
            return f"k must be >= 0, got {entry!r}"
        if start <= previous:
            return f"batch-size ranges must not overlap: {entry!r} starts at or before {previous}"
        previous = end
    if min(e[0] for e in ranges) != 1:
        return "the first batch-size range must start at 1 (every batch size needs a k)"
    return None


def speculative_config(ranges: list[list[int]], method: str = "mtp") -> dict | None:
    """The ``--speculative-config`` object that runs ``ranges``; None where no range drafts."""
    k_max = max(k for _, _, k in ranges)
    if k_max == 0:
        return None
    if len(ranges) == 1:
        return {"method": method, "num_speculative_tokens": k_max}
    return {"method": method, "num_speculative_tokens": k_max, "num_speculative_tokens_per_batch_size": ranges}


def best_single_k(points: list[Measured]) -> int | None:
    """The one fixed k best over every load: the highest geometric mean of tokens/s(k) / tokens/s(0) over the loads
    (only k measured at every load; ties: the smaller k)."""
    loads = sorted({p.load for p in points})
    by = {(p.load, p.k): p for p in points}
    ks = sorted({p.k for p in points if all((b, p.k) in by for b in loads) and all((b, 0) in by for b in loads)})
    if not ks:
        return None

    def score(k: int) -> float:
        return sum(math.log(by[(b, k)].median / by[(b, 0)].median) for b in loads) / len(loads)

    return max(ks, key=lambda k: (score(k), -k))


def decision(ranges: list[list[int]], unit: str) -> str:
    """The schedule in one sentence: "run k = 3 up to batch 2, k = 1 up to 8, no drafting above"."""
    def what(k: int) -> str:
        return f"k = {k}" if k else "no drafting"

    if len(ranges) == 1:
        k = ranges[0][2]
        span = f"{unit} 1-{ranges[0][1]}"
        return f"run k = {k} at every load measured ({span})" if k else f"don't draft at any load measured ({span})"
    parts = [f"{what(k)} up to {unit + ' ' if i == 0 else ''}{end}" for i, (_, end, k) in enumerate(ranges[:-1])]
    return ("run " if ranges[0][2] else "") + ", ".join(parts) + f", {what(ranges[-1][2])} above"
