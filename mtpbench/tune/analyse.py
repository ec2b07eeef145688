"""From a tune's measured points to its answer: one ``TuneRow`` per (load, k), measured or predicted; the choice
at each measured load; the schedule as vLLM takes it; the costs behind it; and how well the model predicted."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mtpbench.stats import gmean_ci
from mtpbench.tune.choose import (ALPHA, PLAIN, RULE, best_single_k, check_schedule, choose_all, comparison_fields,
                                  comparisons, predicted_between, recommend, schedule, speculative_config,
                                  sweep_disagreements)
from mtpbench.tune.model import Model, expected_tokens, held_out
from mtpbench.tune.points import Sweeps, check

PREDICT_EXTRA_K = 1  # the prediction also covers this many k beyond the largest measured


@dataclass
class TuneRow:
    """One (load, k): measured (the geometric mean of its repeats, with intervals) or only predicted."""

    load: int
    k: int
    measured: bool
    output_tokens_per_sec: float | None = None
    output_tokens_per_sec_ci_low: float | None = None  # of the geometric mean (t on the logs; from 3 repeats)
    output_tokens_per_sec_ci_high: float | None = None
    num_repeats: int | None = None
    # tokens/s over the same load's k = 0 as the choice judged it (choose.comparisons, stats.judge): the ratio of
    # geometric means, its interval at speedup_level never narrower than the A/A floor, its decision
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    speedup_level: float | None = None
    speedup_decision: str | None = None
    acceptance_length: float | None = None
    predicted_tokens_per_sec: float | None = None
    predicted_speedup: float | None = None
    fit_error: float | None = None  # (predicted - measured) / measured, this point in the fit
    held_out_error: float | None = None  # the same, predicted without this point (model.held_out)
    speedup_p: float | None = None  # the same comparison's two-sided p, adjusted for the tune's family (choose)
    chosen: bool = False  # the choice at this measured load (choose.RULE)
    scheduled_k: int | None = None  # the schedule's k at this load
    # with --goodput (tune.by_goodput): requests meeting the SLO per second, median of the repeats with its interval,
    # its ratio to k = 0's as the goodput choice judged it (where neither has a repeat of goodput 0), the adjusted p,
    # the decision and the goodput choice
    goodput_rps: float | None = None
    goodput_rps_ci_low: float | None = None
    goodput_rps_ci_high: float | None = None
    goodput_ratio: float | None = None
    goodput_ratio_ci_low: float | None = None
    goodput_ratio_ci_high: float | None = None
    goodput_ratio_level: float | None = None
    goodput_decision: str | None = None
    goodput_p: float | None = None
    goodput_chosen: bool | None = None


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def measured_rows(sweeps: Sweeps, model: Model, choices) -> list[TuneRow]:
    base = {m.load: m for m in sweeps.points if m.k == 0}
    vs_0 = {(c.load, k): v for c in choices for k, v in c.vs_0.items()}
    rows = []
    for m in sweeps.points:
        ci = gmean_ci(m.tokps)
        pred, loo = model.predict(m.k, m.load), held_out(sweeps.points, m)
        row = TuneRow(m.load, m.k, True, _r(m.gmean, 2), _r(ci[0], 2) if ci else None,
                      _r(ci[1], 2) if ci else None, len(m.tokps), 1.0 if m.k == 0 else None,
                      acceptance_length=_r(m.acceptance_length), predicted_tokens_per_sec=_r(pred, 2),
                      predicted_speedup=_r(pred / base[m.load].gmean) if pred is not None else None,
                      fit_error=_r((pred - m.gmean) / m.gmean) if pred is not None else None,
                      held_out_error=_r((loo - m.gmean) / m.gmean) if loo is not None else None)
        for name, value in comparison_fields(vs_0.get((m.load, m.k))).items():
            setattr(row, name, value)
        rows.append(row)
    return rows


def predicted_rows(model: Model, ks: list[int], max_load: int, measured: set[tuple[int, int]]) -> list[TuneRow]:
    rows = []
    for b in range(1, max_load + 1):
        base = model.predict(0, b)
        for k in ks:
            if (b, k) not in measured and (pred := model.predict(k, b)) is not None:
                rows.append(TuneRow(b, k, False, predicted_tokens_per_sec=_r(pred, 2),
                                    predicted_speedup=_r(pred / base) if base else None))
    return rows


def costs_table(sweeps: Sweeps, model: Model, ks: list[int]) -> list[dict]:
    """Per measured load: the fitted costs and, per k, the acceptance length that breaks even against the one
    predicted from the measured per-position acceptance."""
    out = []
    for b in sorted({m.load for m in sweeps.points}):
        c = model.costs_at(b)
        rates = model.rates.get(b) or model.rates_all
        out.append({"load": b, "tokens_per_sec_k0": _r(c.tokps0, 2), "f": _r(c.f), "c": _r(c.c), "source": c.source,
                    "break_even_acceptance_length": {k: _r(c.break_even_al(k)) for k in ks if k},
                    "acceptance_length": {k: _r(expected_tokens(rates, k)) for k in ks if k}})
    return out


def held_out_used(rows: list[TuneRow], between) -> float | None:
    """The worst held-out error of the points whose prediction places a boundary of the schedule (the k > 0 chosen
    on either side of it, at the two measured loads around it: ``choose.predicted_between``); None where the
    schedule run places none. A boundary compares the two k's predictions at a load, in which tokens/s at k = 0
    cancels: k = 0's own prediction is not read."""
    errs = [abs(r.held_out_error) for r in rows if r.measured and r.k > 0 and r.held_out_error is not None
            and any(r.load in (lo.load, hi.load) and r.k in (lo.chosen, hi.chosen) for lo, hi in between)]
    return _r(max(errs)) if errs else None


def controls(points) -> list[dict]:
    """Each sweep's A/A control (the copy of k = 0 against its original), judged as one family of the tune's controls
    (stats.judge: a tune of n sweeps flags drift on a steady machine at most 5 % of the time)."""
    from mtpbench.stats import judge
    from mtpbench.stats.noise import tokps

    seen = {}
    for m in sorted(points, key=lambda m: m.load):
        if m.k == 0 and m.noise and id(m.noise) not in seen:
            seen[id(m.noise)] = (m.load, m.noise)
    out = []
    for load, (k0, aa) in seen.values():
        a, b = tokps(k0), tokps(aa)
        n = min(len(a), len(b))
        c = judge.ratio(b[:n], a[:n], family=len(seen))
        if c.estimate is not None:
            out.append({"load": load, **c.to_json()})
    return out


def prediction_summary(rows: list[TuneRow], choices, model: Model, ks: list[int]) -> dict:
    errs = [abs(r.held_out_error) for r in rows if r.held_out_error is not None]
    agree = {c.load: {"measured_best_k": c.fastest, "predicted_best_k": model.best_k(c.load, ks)} for c in choices}
    return {"held_out_abs_error_median": _r(sorted(errs)[len(errs) // 2]) if errs else None,
            "held_out_abs_error_max": _r(max(errs)) if errs else None,
            "fit_abs_error_max": _r(max((abs(r.fit_error) for r in rows if r.fit_error is not None), default=0)),
            "best_k": agree, "best_k_agrees": sum(a["measured_best_k"] == a["predicted_best_k"]
                                                  for a in agree.values())}


def schedule_measured(validation: dict | None, ranges: list[list[int]], loads: list[int],
                      unit: str) -> tuple[bool, str] | None:
    """What --validate found at the measured ``loads`` where the schedule gives k = 0 beside drafting ranges: (no
    slower than no speculative config beyond noise at every one of them, the figures), or None where it did not run
    this schedule as vLLM runs it (dynamic speculative decoding) at each of them with an interval."""
    if not validation or not validation["dynamic"] or validation["schedule"] != ranges:
        return None
    k_of = {b: k for s, e, k in ranges for b in range(s, e + 1)}
    rows = {r["load"]: r for r in validation["rows"] if r["arm"] == PLAIN}
    idle = [b for b in loads if k_of.get(b) == 0]
    if not idle or any(b not in rows or rows[b]["verdict"] is None for b in idle):
        return None
    from mtpbench.tune.markdown import schedule_ratio_text

    figures = "; ".join(f"{unit} {b}: x{schedule_ratio_text(rows[b])}" for b in idle)
    return all(rows[b]["verdict"] != "schedule slower" for b in idle), figures


def analyse(sweeps: Sweeps, validation: dict | None = None, slo: dict[str, float] | None = None) -> dict:
    """Everything ``tune`` decides and reports, as JSON; ``validation`` (``validate.read_validation``) says whether
    the schedule's no-drafting ranges were measured under its speculative config; ``slo`` (--goodput) adds the choice
    by goodput (``by_goodput``: the result's ``goodput``, null without an SLO)."""
    check(sweeps)  # hand-made Sweeps too: no drafted point leaves nothing to fit the costs from
    model = Model(sweeps.points)
    loads = sorted({m.load for m in sweeps.points})
    ks = sorted({m.k for m in sweeps.points})
    choices = choose_all(sweeps.points)
    ranges = schedule(choices, model)
    measured_there = schedule_measured(validation, ranges, loads, sweeps.unit)
    plan = recommend(choices, ranges, sweeps.points, sweeps.unit, measured_there)
    k_of = {b: k for s, e, k in ranges for b in range(s, e + 1)}
    rows = measured_rows(sweeps, model, choices)
    chosen = {(c.load, c.chosen) for c in choices}
    for r in rows:
        r.chosen = (r.load, r.k) in chosen
    pred_ks = list(range(0, max(ks) + 1 + PREDICT_EXTRA_K))
    rows += predicted_rows(model, pred_ks, max(loads), {(r.load, r.k) for r in rows})
    for r in rows:
        r.scheduled_k = k_of.get(r.load)
    by_goodput = None
    if slo:
        from mtpbench.tune.by_goodput import section

        by_goodput, fields = section(sweeps.points, slo, sweeps.unit, sweeps.run["config"].get("method") or "mtp")
        for r in rows:
            if r.measured:
                for name, value in fields.get((r.load, r.k), {}).items():
                    setattr(r, name, value)
    spec = speculative_config(plan["run"], sweeps.run["config"].get("method") or "mtp")
    problem = check_schedule(plan["run"], max(k for *_, k in plan["run"])) if spec else None
    prediction = prediction_summary([r for r in rows if r.measured], choices, model, pred_ks)
    prediction["held_out_used_max"] = held_out_used(rows, predicted_between(choices) if plan["run"] == ranges else [])
    return {"unit": sweeps.unit, "backend": sweeps.backend, "mode": sweeps.mode, "mtp_layers": sweeps.mtp_layers,
            "loads": loads, "k": ks, "rule": RULE, "alpha": ALPHA, "family": len(comparisons(sweeps.points)),
            "choices": [asdict(c) for c in choices], "schedule": ranges, "run": plan["run"],
            "speculative_config": spec, "schedule_problem": problem, "decision": plan["decision"],
            "decision_note": plan["note"], "unmeasured": plan["unmeasured"],
            "best_single_k": best_single_k(sweeps.points),
            "costs": costs_table(sweeps, model, pred_ks), "prediction": prediction,
            "controls": controls(sweeps.points),
            "sweep_disagreements": sweep_disagreements(sweeps.points, choices, sweeps.unit),
            "goodput": by_goodput, "rows": [asdict(r) for r in rows], "sweeps": sweeps.dirs,
            "failed_points": sweeps.failed}
