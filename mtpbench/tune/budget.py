"""How a tune shares its time budget (``--max-seconds``, the whole tune's) among the sweeps it runs: cheapest first,
each given the time left in proportion to its round's cost, so that what a sweep leaves unspent goes to the costly
ones after it (docs/measure-until-decided.md)."""

from __future__ import annotations

from mtpbench.config import SweepConfig


def round_cost(cfg: SweepConfig) -> float:
    """A sweep's round, in batches run one after another (its prompts over its batch size): what its share of a
    tune's time budget is proportional to, so that a slow load (batch 1) can get as many rounds as a fast one."""
    return max(1.0, (cfg.num_prompts or 8) / cfg.batch_size)


def budget_share(left_s: float, costs: list[float]) -> float:
    """The next sweep's share of the ``left_s`` seconds left, ``costs`` its round cost and those of the sweeps after
    it: in proportion to its cost (what a sweep leaves unspent goes to the sweeps after it)."""
    return max(left_s, 1e-3) * costs[0] / sum(costs)
