"""The machine's noise, from an A/A timing: the k = 0 point timed twice in the same rounds, as if it were two
points (numpy only, no I/O).

Two figures, both at 95 %:

* ``single_run``: how far two single timed runs of the same point differ, ``t(df) * sqrt(2) * s`` in log
  tokens/s, s the pooled standard deviation of the logs of the two copies' repeats (each copy about its own
  mean, df = n_a + n_b - 2): what one run against one run can tell apart on this machine now.
* ``floor``: how far the two copies' 95 % speedup interval (``stats.judge.ratio``: Welch t on the logs, the
  comparison every speedup gets) reaches from 1, ``max(|ln lo|, |ln hi|)``: two identical points measured with
  these repeats differ by up to this much, a drift or an order effect included. No speedup interval of the
  sweep is shown narrower than it, and no comparison is decided inside it (``stats.judge``).
"""

from __future__ import annotations

import math

import numpy as np

from mtpbench.stats import judge
from mtpbench.stats.intervals import LEVEL, MIN_REPEATS_RATIO


def single_run(a, b, level: float = LEVEL) -> float | None:
    """The 95 % bound, in log ratio, of the difference between two single runs (None below 2 + 2 repeats)."""
    la, lb = np.log(np.asarray(a, float)), np.log(np.asarray(b, float))
    df = len(la) + len(lb) - 2
    if len(la) < 2 or len(lb) < 2:
        return None
    s2 = (((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()) / df
    return judge.t_isf((1 - level) / 2, df) * math.sqrt(2 * s2)


def floor(a, b, level: float = LEVEL) -> float | None:
    """The A/A interval's reach from 1, in log ratio (None below MIN_REPEATS_RATIO repeats a side)."""
    c = judge.ratio(b, a, alpha=1 - level)
    return None if c.estimate is None else max(abs(math.log(c.low)), abs(math.log(c.high)))


# a sweep's rounds (sweep.rounds) record each timed run's round: a comparison reads both points' runs up to the
# round its last look saw, and the floor as it stood then

def until_round(repeats: list[dict], last: int | None) -> list[dict]:
    """The timed runs of ``repeats`` up to round ``last`` (all where rounds were not recorded)."""
    if last is None:
        return list(repeats)
    return [t for t in repeats if t.get("round") is None or t["round"] <= last]


def last_round(repeats: list[dict]) -> int | None:
    """The last round a point was timed in, where its runs recorded rounds (sweep.rounds), else None."""
    rounds = [t.get("round") for t in repeats]
    return None if not rounds or None in rounds else max(rounds)


def tokps(repeats: list[dict]) -> list:
    return [t.get("output_tokens_per_sec") for t in repeats]


def floor_until(noise_runs: tuple | None, last: int | None) -> float:
    """The A/A noise floor (log ratio) from the control's runs up to round ``last``: what the rounds saw at a
    point's last look; 0 where no A/A was timed."""
    if not noise_runs:
        return 0.0
    a, b = (tokps(until_round(x, last)) for x in noise_runs)
    n = min(len(a), len(b))
    return floor(a[:n], b[:n]) or 0.0


def summary(a, b, level: float = LEVEL) -> dict:
    """What a sweep's summary and pages say of its A/A: both figures in log and in %, the copies' ratio and its
    interval, and whether the A/A itself was called different (``stats.judge.ratio`` decided: one test at 1 -
    level, a sweep's own control; a tune of several sweeps judges them as a family, ``tune.reliable``)."""
    n = min(len(a), len(b))
    f, s = floor(a, b, level), single_run(a, b, level)
    c = judge.ratio(b, a, alpha=1 - level) if n >= MIN_REPEATS_RATIO else None
    ok = c is not None and c.estimate is not None
    low, high = judge.outward(c, 5) if ok else (None, None)
    return {"rounds": n, "floor": rounded(f), "floor_pct": pct(f), "single_run": rounded(s),
            "single_run_pct": pct(s), "ratio": rounded(c.estimate) if ok else None, "ratio_ci_low": low,
            "ratio_ci_high": high,
            "called_different": c.decided if ok else None}


def rounded(x: float | None) -> float | None:
    """A floor (log ratio) as the summary writes it: 5 decimals."""
    return None if x is None else round(x, 5)


def pct(x: float | None) -> float | None:
    """A floor (log ratio) as a percentage of the ratio, 2 decimals."""
    return None if x is None else round(100 * math.expm1(x), 2)



def line(noise: dict | None) -> str | None:
    """The sentence every table and page states, or None where no A/A was timed."""
    if not noise or noise.get("floor") is None:
        return None
    text = (f"noise: on this machine two identical single runs differ by up to {noise['single_run_pct']:.1f} % at "
            f"95 %; the A/A control (k = 0 against itself, {noise['rounds']} rounds) differs by up to "
            f"{noise['floor_pct']:.1f} %, and no speedup interval is narrower than that")
    least = noise.get("floor_least_pct")
    if least is not None and f"{least:.1f}" != f"{noise['floor_pct']:.1f}":
        # a point decided at an earlier look keeps that look's floor (issue 55: "narrower than 5.46 %" beside +-0.58 %)
        text = (text[:-len("that")] + f"the floor as it stood at its point's last look ({noise['floor_pct']:.1f} % "
                f"after the last round, down to {least:.1f} % for a point decided at an earlier look)")
    if noise.get("called_different"):
        text += (f" (the A/A itself came out different, x{noise['ratio']:.3f} [{noise['ratio_ci_low']:.3f}, "
                 f"{noise['ratio_ci_high']:.3f}]: the machine drifted or its load changed)")
    return text
