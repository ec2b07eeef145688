"""``mtpbench tune --goodput``'s part of the answer: each measured point's goodput (``goodput.typical``: the geometric
mean of its repeats, the median where a repeat met the SLO nowhere, with intervals, and its ratio to k = 0's), the k
per load chosen by goodput (``goodput.RULE``) beside the one chosen by tokens/s, and the schedule and --speculative-config of those choices. Goodput is recomputed from the repeats' saved
per-request times, so ``tune --from DIR --goodput ...`` decides at any SLO without running anything."""

from __future__ import annotations

from dataclasses import asdict, replace

from mtpbench.stats import gmean_ci, median_ci
from mtpbench.tune.choose import comparison_fields, recommend, speculative_config
from mtpbench.tune.goodput import RULE, choose, describe, ranges_of, samples, testable, typical
from mtpbench.tune.model import Measured

UNKNOWN = ("their point files keep no per-request times (written by an mtpbench before goodput), so which requests "
           "met the targets is unknown; run the sweeps again to choose by goodput")


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def point_fields(xs: list[float] | None, vs_0: dict | None) -> dict:
    """One point's goodput columns (TuneRow's ``goodput_*``): req/s meeting the SLO as the goodput choice ranks it
    (``goodput.typical``: the geometric mean of the repeats with its t interval on the logs, or where a repeat's
    goodput is 0, which has no logarithm, their median with its order-statistic interval), and its ratio to the same
    load's k = 0 as the goodput choice judged it (``vs_0``: LoadChoice.vs_0's; only where both have goodput above 0
    in every repeat: no ratio of a zero)."""
    if xs is None:
        return {}
    ci = gmean_ci(xs) if testable(xs) else median_ci(xs)  # the interval of the statistic ``typical`` gives
    out = {"goodput_rps": _r(typical(xs)), "goodput_rps_ci_low": _r(ci[0]) if ci else None,
           "goodput_rps_ci_high": _r(ci[1]) if ci else None}
    return {**out, **comparison_fields(vs_0, "goodput_ratio", "goodput", ("higher", "lower"))}


def section(points: list[Measured], slo: dict[str, float], unit: str, method: str) -> tuple[dict, dict]:
    """The result's ``goodput`` object and, per (load, k), the TuneRow fields to set."""
    per = {(m.load, m.k): samples(m.repeats, slo) for m in points}
    as_goodput = {(m.load, m.k): replace(m, tokps=per[m.load, m.k]) for m in points if per[m.load, m.k] is not None}
    known = {key: m.tokps for key, m in as_goodput.items()}
    choices, notes = choose(as_goodput)
    chosen = {(c.load, c.chosen) for c in choices}
    vs_0 = {(c.load, k): v for c in choices for k, v in c.vs_0.items()}
    fields = {}
    for (b, k), xs in per.items():
        f = point_fields(xs, vs_0.get((b, k)))
        if xs is not None and (b, 0) in known:
            f["goodput_chosen"] = (b, k) in chosen
        fields[b, k] = f
    unknown = sorted(key for key, xs in per.items() if xs is None)
    ranges = ranges_of(choices) if choices else None
    # what to run, as the tokens/s decision has it (choose.recommend): a schedule that would run a load at k = 0
    # under a speculative config (not plain decoding, measured nowhere) gives way to one k at every load, here the
    # one of most goodput that is below k = 0's beyond noise at no load (its points' "tokens/s" are its goodputs)
    plan = recommend(choices, ranges, [m for m in as_goodput.values() if testable(m.tokps)], unit,
                     can_validate=False) if ranges else None
    return {"slo": slo, "slo_text": describe(slo), "rule": RULE, "choices": [asdict(c) for c in choices],
            "notes": {str(b): n for b, n in notes.items()},
            "unknown": [f"{unit} {b}, k = {k}" for b, k in unknown],
            "unknown_because": UNKNOWN if unknown else None, "schedule": ranges,
            "run": plan["run"] if plan else None, "decision": plan["decision"] if plan else None,
            "why": plan["note"] if plan else None,
            "speculative_config": speculative_config(plan["run"], method) if plan else None}, fields
