"""Measure until decided: the stopping rule of a sequential comparison of two points' timings (tokens/s at k
against k = 0, or a chosen k against a rival), pure (numpy only, no I/O).

After each round past ``min_repeats`` the rule looks at the speedup's comparison (``stats.judge.ratio``: Welch t
on log timings) and stops the comparison once the interval lies wholly on one side of
the decision line: "faster" above it, "slower" below it; else it stays "open" until ``max_repeats`` rounds or the
time budget. Stopping on the data inflates the error of a fixed-sample interval (look often enough and one look
will exclude the line by chance), so each look's interval has level 1 - alpha / L, L the most looks the budget
allows (Bonferroni): the chance that any of the L intervals misses the true ratio is at most alpha (the union
bound), so whenever the rule stops, the side it names is wrong with probability at most alpha (and with a family of m
comparisons judged at once, a sweep's k > 0 points, at 1 - alpha / (m L): any of them, ``stats.judge``). A look's interval
is never narrower than the machine's noise floor (``floor``: the half-width, in log ratio, that an A/A timing of
one point against itself shows on this machine): two timings closer than the machine can tell stay open.
benchmarks/sequential_error_rate.py and tests/unit/test_sequential_properties.py check both by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mtpbench.stats import judge as judgement
from mtpbench.stats.intervals import LEVEL, MIN_REPEATS_RATIO

STATES = ("faster", "slower", "open")


@dataclass(frozen=True)
class Look:
    """One look at a comparison: rounds so far, the speedup (ratio of geometric means), its interval at the
    look's level widened to the noise floor, and the state it puts the comparison in."""

    repeats: int
    ratio: float | None
    lo: float | None
    hi: float | None
    state: str  # one of STATES


def max_looks(min_repeats: int, max_repeats: int) -> int:
    """The looks a budget allows: one after each round from ``min_repeats`` to ``max_repeats``."""
    return max(1, max_repeats - max(min_repeats, MIN_REPEATS_RATIO) + 1)


def judge(num, den, line: float = 1.0, alpha: float = 1.0 - LEVEL, looks: int = 1, floor: float = 0.0,
          family: int = 1) -> Look:
    """The look at timings ``num`` (the point's) against ``den`` (its baseline's): the comparison of
    ``stats.judge.ratio`` at 1 - alpha / (family x looks), never narrower than ``floor`` (log ratio, >= 0);
    "faster" where its low end is above ``line``, "slower" where its high end is below it, else "open" (also where
    fewer than MIN_REPEATS_RATIO timings a side give no interval)."""
    c = judgement.ratio(num, den, floor, family, looks, alpha)
    n = min(len(num), len(den))
    if c.estimate is None:
        return Look(n, None, None, None, "open")
    state = "faster" if c.low > line else "slower" if c.high < line else "open"
    return Look(n, c.estimate, c.low, c.high, state)


def next_step(state: str, repeats: int, max_repeats: int, elapsed_s: float = 0.0,
              max_seconds: float | None = None, round_s: float = 0.0) -> str:
    """What to do after a look whose state is ``state`` (a sweep's: "open" while any of its comparisons is):
    "decided" (stop: the interval excludes the line), "budget" (stop: max_repeats rounds done, or the time budget
    would be overrun by one more round as long as the last, ``round_s``), or "continue"."""
    if state != "open":
        return "decided"
    if repeats >= max_repeats or (max_seconds is not None and elapsed_s + round_s > max_seconds):
        return "budget"
    return "continue"


def run(draw, min_repeats: int, max_repeats: int, line: float = 1.0, alpha: float = 1.0 - LEVEL,
        floor: float = 0.0, clock=None, max_seconds: float | None = None, family: int = 1) -> tuple[Look, str]:
    """Round after round, ``draw()`` -> (the point's timing, its baseline's timing) until the rule stops: the last
    look and why it stopped ("decided" or "budget"). ``clock()``: seconds so far, for ``max_seconds``."""
    looks = max_looks(min_repeats, max_repeats)
    num: list[float] = []
    den: list[float] = []
    while True:
        a, b = draw()
        num.append(a)
        den.append(b)
        n = len(num)
        if n < min(max(min_repeats, MIN_REPEATS_RATIO), max_repeats):
            continue
        look = judge(num, den, line, alpha, looks, floor, family)
        step = next_step(look.state, n, max_repeats, clock() if clock else 0.0, max_seconds)
        if step != "continue":
            return look, step
