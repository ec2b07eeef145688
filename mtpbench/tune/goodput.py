"""Goodput, as ``vllm bench serve --goodput`` defines it, and ``mtpbench tune --goodput``'s choice by it (pure: no
engine, no files).

An SLO is one or more targets in ms on TTFT, TPOT and E2EL (``--goodput ttft:500 tpot:50``). A request is good when
it meets every target given (``<=``; TPOT counts as 0 for a request of one output token, as vLLM's does), and a timed
run's goodput is its good requests over its wall time, in requests per second (vLLM's ``request_goodput``). Each
repeat of a point keeps its requests' TTFT, TPOT and E2EL and its wall time (``metrics.records.timing``), so the
goodput of every repeat follows for any SLO, from saved files. ``RULE`` chooses the k per load by goodput with the
tokens/s rule's discipline (``choose.choose_all``: ``stats.judge`` at 1 - alpha / (m L) over the family, the
interval wholly above 1, a k > 0 must beat k = 0); a point with goodput 0 in some repeat has no ratio test (its log is -infinity), which is said, never
divided by."""

from __future__ import annotations

import math
import statistics

from mtpbench import stats
from mtpbench.errors import MtpBenchError
from mtpbench.tune.choose import ALPHA, LoadChoice, choose_all
from mtpbench.tune.model import Measured

METRICS = ("ttft", "tpot", "e2el")  # vLLM's names, in its order
KEYS = {m: f"request_{m}_ms" for m in METRICS}  # where a repeat (timing()) keeps each request's value
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}

RULE = ("a request is good when it meets every target (vllm bench serve --goodput), a run's goodput is its good "
        "requests per second of its wall time; a k > 0 qualifies at a load when its goodput beats k = 0's there, and "
        "the chosen k is the smallest qualifying k that no larger qualifying k beats (k = 0 where none qualifies). k' "
        "beats k when the interval of goodput(k') / goodput(k) (Welch's t on the logs of their repeats' goodput, never "
        "narrower than the A/A noise floor) lies wholly above 1 at 1 - "
        f"{ALPHA:g} / (m L): m every goodput comparison the tune makes, L the looks its sweeps' rounds allowed; its "
        f"p-value, adjusted the same way (Bonferroni), is then below {ALPHA:g}. A "
        "point with goodput 0 in some repeat (no request met the targets) has no ratio test: it beats nothing and is "
        "beaten by nothing, and where k = 0 is such a point no k > 0 can qualify")


def parse(pairs: list[str]) -> dict[str, float]:
    """``KEY:VALUE`` pairs (vLLM's syntax; several in one string split at spaces or commas) as {metric: ms}."""
    slo: dict[str, float] = {}
    for pair in (p for text in pairs for p in text.replace(",", " ").split()):
        key, sep, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not sep or key not in METRICS:
            raise MtpBenchError(f"--goodput {pair!r}: give KEY:VALUE with KEY one of {', '.join(METRICS)} and VALUE in "
                                f"ms, e.g. --goodput 'ttft:500 tpot:50'")
        if not (math.isfinite(ms) and ms >= 0):
            raise MtpBenchError(f"--goodput {pair!r}: the target must be a number of ms >= 0")
        if key in slo:
            raise MtpBenchError(f"--goodput gives {key} twice ({slo[key]:g} and {ms:g} ms)")
        slo[key] = ms
    if not slo:
        raise MtpBenchError("--goodput needs at least one KEY:VALUE target, e.g. --goodput 'ttft:500 tpot:50'")
    return slo


def describe(slo: dict[str, float]) -> str:
    """The SLO in words: "TTFT <= 500 ms, TPOT <= 50 ms"."""
    return ", ".join(f"{NAMES[m]} <= {slo[m]:.10g} ms" for m in METRICS if m in slo)


def good_requests(repeat: dict, slo: dict[str, float]) -> int | None:
    """Requests of one timed run meeting every target; None where the run kept no per-request times (a point file
    from before they were kept) or a request's time for a target is unknown."""
    columns = [repeat.get(KEYS[m]) for m in slo]
    if any(c is None for c in columns):
        return None
    good = 0
    for values in zip(*columns):
        if any(v is None for v in values):
            return None
        good += all(v <= slo[m] for m, v in zip(slo, values))
    return good


def run_goodput(repeat: dict, slo: dict[str, float]) -> float | None:
    """One timed run's goodput in requests per second; None where unknown (``good_requests``, or no wall time)."""
    good, wall = good_requests(repeat, slo), repeat.get("wall_s")
    if good is None or wall is None or wall <= 0:
        return None
    return good / wall


def samples(repeats: list[dict], slo: dict[str, float]) -> list[float] | None:
    """Every repeat's goodput; None where any is unknown."""
    out = [run_goodput(r, slo) for r in repeats]
    return None if not out or any(g is None for g in out) else out


def testable(xs: list[float]) -> bool:
    """A ratio test on logs needs every repeat's goodput above 0."""
    return all(x > 0 for x in xs)


def typical(xs: list[float]) -> float | None:
    """A point's goodput as the choice ranks it and its column shows it: the geometric mean of its repeats, as its
    comparisons judge it, where every repeat met the SLO somewhere (goodput above 0); else the median (a goodput of
    0 has no logarithm)."""
    return stats.gmean(xs) if testable(xs) else statistics.median(xs)


def rank(m: Measured) -> float:
    """What ranks a point's goodput (``typical`` of its repeats)."""
    return typical(m.tokps)


def choose(measured: dict[tuple[int, int], Measured]) -> tuple[list[LoadChoice], dict[int, list[str]]]:
    """``RULE`` over every load at once: (load, k) -> the point with its repeats' goodput as its values (``tokps``; the
    points whose goodput is known), judged as tokens/s are (its sweep's rounds, floor and looks). Returns one
    LoadChoice per load with k = 0 (``fastest``: the k ranked highest by ``rank``), and per load what could not be
    tested and why."""
    goodputs = {key: m.tokps for key, m in measured.items()}
    loads = sorted({b for b, k in goodputs if (b, 0) in goodputs})
    open_loads = [b for b in loads if testable(goodputs[b, 0])]
    points = [m for (b, k), m in sorted(measured.items()) if b in open_loads and testable(m.tokps)]
    found = {c.load: c for c in choose_all(points)}
    notes: dict[int, list[str]] = {b: [] for b in loads}
    out = []
    for b in loads:
        ks = sorted(k for load, k in goodputs if load == b)
        best = max(ks, key=lambda k: (rank(measured[b, k]), -k))
        if b not in found:
            met = [k for k in ks if k and testable(goodputs[b, k])]
            notes[b].append("k = 0 had goodput 0 in some repeat (no request met the SLO): no ratio test against it, so no k > 0 "
                            "can qualify" + (f" (k = {', '.join(map(str, met))} had goodput above 0 in every repeat)"
                                             if met else ""))
            out.append(LoadChoice(b, 0, best, ks=ks))
            continue
        zero = [k for k in ks if not testable(goodputs[b, k])]
        if zero:
            notes[b].append(f"k = {', '.join(map(str, zero))}: goodput 0 in some repeat, no ratio test")
        c = found[b]
        out.append(LoadChoice(b, c.chosen, best, c.beaten_by, c.p_vs_0, c.vs_0, ks))
    return out, {b: n for b, n in notes.items() if n}


def ranges_of(choices: list[LoadChoice]) -> list[list[int]]:
    """vLLM's ``[start, end, k]`` ranges of the per-load choices, switching at the measured load that chose the next
    k (no model predicts goodput between measured loads)."""
    choices = sorted(choices, key=lambda c: c.load)
    ranges = [[1, choices[0].load, choices[0].chosen]]
    for c in choices[1:]:
        if c.chosen == ranges[-1][2]:
            ranges[-1][1] = c.load
        else:
            ranges.append([ranges[-1][1] + 1, c.load, c.chosen])
    return ranges
