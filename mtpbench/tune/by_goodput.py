"""``mtpbench tune --goodput``'s part of the answer: each measured point's goodput (median of its repeats, with
intervals, and its ratio to k = 0's), the k per load chosen by goodput (``goodput.RULE``) beside the one chosen by
tokens/s, and the schedule and --speculative-config of those choices. Goodput is recomputed from the repeats' saved
per-request times, so ``tune --from DIR --goodput ...`` decides at any SLO without running anything."""

from __future__ import annotations

from dataclasses import asdict

from mtpbench.stats import median, median_ci, median_ratio_ci
from mtpbench.tune.choose import recommend, speculative_config
from mtpbench.tune.goodput import RULE, choose, describe, ranges_of, samples, testable
from mtpbench.tune.model import Measured

UNKNOWN = ("their point files keep no per-request times (written by an mtpbench before goodput), so which requests "
           "met the targets is unknown; run the sweeps again to choose by goodput")


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def point_fields(xs: list[float] | None, base: list[float] | None) -> dict:
    """One point's goodput columns (TuneRow's ``goodput_*``): median req/s with its interval, and its ratio to the same
    load's k = 0 with the interval, only where both have goodput above 0 in every repeat (no ratio of a zero)."""
    if xs is None:
        return {}
    ci = median_ci(xs)
    out = {"goodput_rps": _r(median(xs)), "goodput_rps_ci_low": _r(ci[0]) if ci else None,
           "goodput_rps_ci_high": _r(ci[1]) if ci else None}
    if base is not None and testable(xs) and testable(base):
        ratio = median_ratio_ci(xs, base)
        out.update(goodput_ratio=_r(median(xs) / median(base)), goodput_ratio_ci_low=_r(ratio[0]) if ratio else None,
                   goodput_ratio_ci_high=_r(ratio[1]) if ratio else None)
    return out


def section(points: list[Measured], slo: dict[str, float], unit: str, method: str) -> tuple[dict, dict]:
    """The result's ``goodput`` object and, per (load, k), the TuneRow fields to set."""
    per = {(m.load, m.k): samples(m.repeats, slo) for m in points}
    known = {key: xs for key, xs in per.items() if xs is not None}
    choices, notes = choose(known)
    chosen = {(c.load, c.chosen) for c in choices}
    p_holm = {(c.load, k): p for c in choices for k, p in c.p_vs_0.items()}
    fields = {}
    for (b, k), xs in per.items():
        f = point_fields(xs, known.get((b, 0)))
        if xs is not None and (b, 0) in known:
            f["goodput_chosen"] = (b, k) in chosen
            f["goodput_p_holm"] = float(f"{p_holm[b, k]:.3g}") if (b, k) in p_holm else None
        fields[b, k] = f
    unknown = sorted(key for key, xs in per.items() if xs is None)
    ranges = ranges_of(choices) if choices else None
    # what to run, as the tokens/s decision has it (choose.recommend): a schedule that would run a load at k = 0
    # under a speculative config (not plain decoding, measured nowhere) gives way to one k at every load, here the
    # one of most goodput that is below k = 0's beyond noise at no load (its points' "tokens/s" are its goodputs)
    plan = recommend(choices, ranges, [Measured(b, k, xs) for (b, k), xs in known.items() if testable(xs)],
                     unit) if ranges else None
    return {"slo": slo, "slo_text": describe(slo), "rule": RULE, "choices": [asdict(c) for c in choices],
            "notes": {str(b): n for b, n in notes.items()},
            "unknown": [f"{unit} {b}, k = {k}" for b, k in unknown],
            "unknown_because": UNKNOWN if unknown else None, "schedule": ranges,
            "run": plan["run"] if plan else None, "decision": plan["decision"] if plan else None,
            "why": plan["note"] if plan else None,
            "speculative_config": speculative_config(plan["run"], method) if plan else None}, fields
