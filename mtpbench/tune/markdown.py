"""tune.md: the decision in one sentence, the ready --speculative-config, then the evidence: measured tokens/s with
intervals, the costs and break-even acceptance, the prediction's error, the validation and the machine."""

from __future__ import annotations

import json

from mtpbench.stats.judge import ALPHA, end_text, interval_text, level_text


def ratio_text(r: dict, ratio: str, prefix: str) -> str:
    """A comparison as tune's tables show it: "x1.30 [1.05, 1.61] at 99.17 %, p 0.012, faster" (stats.judge: the
    interval is the one the choice read, never printed touching 1 where it excludes 1)."""
    if r.get(ratio) is None:
        return ""
    text = f"x{end_text(r[ratio], 1.0, 2, 'f')}"
    if r.get(f"{ratio}_ci_low") is not None:
        text += (f" {interval_text(r[f'{ratio}_ci_low'], r[f'{ratio}_ci_high'], 1.0, 2, 'f')} at "
                 f"{level_text(r[f'{ratio}_level'])}")
    if r.get(f"{prefix}_p") is not None:
        text += f", p {p_text(r[f'{prefix}_p'])}"
    if r.get(f"{prefix}_decision"):
        text += f", {r[f'{prefix}_decision']}"
    return text


def schedule_ratio_text(r: dict) -> str:
    """A validation row's schedule / arm as every output prints it: "1.023 [0.950, 1.102] at 99.17 %"."""
    if r.get("schedule_ratio") is None:
        return ""
    text = end_text(r["schedule_ratio"], 1.0, 3, "f")
    if r.get("schedule_ratio_ci_low") is None:
        return text
    return (f"{text} {interval_text(r['schedule_ratio_ci_low'], r['schedule_ratio_ci_high'], 1.0, 3, 'f')}"
            + (f" at {level_text(r['schedule_ratio_level'])}" if r.get("schedule_ratio_level") else ""))


def p_text(p: float) -> str:
    """An adjusted p-value as printed: 2 significant digits, more where 2 would carry it across the level."""
    for d in (2, 3, 6):
        if (float(f"{p:.{d}g}") < ALPHA) == (p < ALPHA):
            return f"{p:.{d}g}"
    return repr(p)


def _cell(r: dict) -> str:
    if r["k"] == 0:
        return f"{r['output_tokens_per_sec']:.1f}"
    return f"{r['output_tokens_per_sec']:.1f} ({ratio_text(r, 'speedup', 'speedup')})"


def measured_table(result: dict) -> list[str]:
    unit, ks = result["unit"], result["k"]
    rows = {(r["load"], r["k"]): r for r in result["rows"] if r["measured"]}
    lines = [f"| {unit} | " + " | ".join(f"k = {k}" for k in ks) + " | chosen |",
             "|---:|" + "---:|" * len(ks) + "---:|"]
    for c in result["choices"]:
        cells = []
        for k in ks:
            r = rows.get((c["load"], k))
            text = _cell(r) if r else "failed"
            cells.append(f"**{text}**" if k == c["chosen"] else text)
        lines.append(f"| {c['load']} | " + " | ".join(cells) + f" | {c['chosen']} |")
    return lines


def _goodput_cell(r: dict) -> str:
    if r.get("goodput_rps") is None:
        return "unknown"
    ci = (f" [{r['goodput_rps_ci_low']:.3g}, {r['goodput_rps_ci_high']:.3g}]"
          if r.get("goodput_rps_ci_low") is not None else "")
    text = f"{r['goodput_rps']:.3g}{ci}"
    if r["k"] and r.get("goodput_ratio") is not None:
        text += f" ({ratio_text(r, 'goodput_ratio', 'goodput')})"
    elif r["k"]:
        text += " (no ratio: a goodput of 0)"
    return text


def goodput_lines(result: dict) -> list[str]:
    """Goodput per load and k (req/s meeting the SLO, geometric mean [95 % interval], ratio to k = 0), the k chosen by goodput
    (bold) beside the one chosen by tokens/s, and what could not be tested."""
    g, unit, ks = result["goodput"], result["unit"], result["k"]
    rows = {(r["load"], r["k"]): r for r in result["rows"] if r["measured"]}
    by_tokps = {c["load"]: c["chosen"] for c in result["choices"]}
    lines = [f"SLO: {g['slo_text']}. Rule: {g['rule']}.", "",
             f"| {unit} | " + " | ".join(f"k = {k}" for k in ks) + " | chosen by goodput | chosen by tokens/s |",
             "|---:|" + "---:|" * len(ks) + "---:|---:|"]
    chosen = {c["load"]: c["chosen"] for c in g["choices"]}
    for b in result["loads"]:
        cells = []
        for k in ks:
            r = rows.get((b, k))
            text = _goodput_cell(r) if r else "failed"
            cells.append(f"**{text}**" if chosen.get(b) == k else text)
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {chosen.get(b, 'unknown')} | {by_tokps.get(b)} |")
    notes = [f"{unit} {b}: {n}" for b, ns in g["notes"].items() for n in ns]
    if g["unknown"]:
        notes.append(f"goodput unknown at {'; '.join(g['unknown'])}: {g['unknown_because']}")
    return lines + (["", *[f"- {n}." for n in notes]] if notes else [])


def goodput_headline(result: dict) -> str | None:
    """The choice by goodput in one sentence (None without --goodput)."""
    g = result.get("goodput")
    if not g:
        return None
    if not g["decision"]:
        return f"By goodput ({g['slo_text']}): unknown ({g['unknown_because']})"
    spec = g["speculative_config"]
    ready = f"--speculative-config '{json.dumps(spec)}'" if spec else "no --speculative-config"
    why = f"; why: {g['why']}" if g.get("why") else ""
    doubt = ("; not reliable: " + "; ".join(g["unreliable_because"])) if g.get("unreliable_because") else ""
    return f"By goodput ({g['slo_text']}): {g['decision']} ({ready}){why}{doubt}"


def costs_lines(result: dict) -> list[str]:
    ks = [k for k in result["k"] if k]
    lines = [f"| {result['unit']} | tokens/s at k = 0 | f | c | " +
             " | ".join(f"AL to break even at k = {k} / predicted AL" for k in ks) + " |",
             "|---:|---:|---:|---:|" + "---:|" * len(ks)]
    for c in result["costs"]:
        cells = [f"{c['break_even_acceptance_length'][k]:.2f} / {c['acceptance_length'][k]:.2f}" for k in ks]
        lines.append(f"| {c['load']} | {c['tokens_per_sec_k0']:.1f} | {c['f']:+.3f} | {c['c']:.3f} | "
                     + " | ".join(cells) + " |")
    return lines


def span(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f} to {hi:.2f}"


def why_not(result: dict) -> str | None:
    """The measured reason, where no k is chosen at any load (never an invented gain, never a reason the numbers
    beside it refute). The costs explain it only where the measured acceptance gives k = 1 less than it needs to
    break even at every measured load (each key of a load's tables may be an int or, read back from JSON, a
    string); where it gives more somewhere, drafting should pay there and the cause is the noise of the timings."""
    if any(c["chosen"] for c in result["choices"]):
        return None
    measured = [c for c in result["costs"] if c.get("source", "measured") == "measured"]
    at_1 = [(c["load"], c["c"], _at(c["break_even_acceptance_length"], 1), _at(c["acceptance_length"], 1))
            for c in measured]
    known = [x for x in at_1 if x[2] is not None and x[3] is not None]
    unit = result["unit"]
    head = f"No k beat plain decoding beyond noise at any {unit} measured."
    if not known:
        return head
    pays = [x for x in known if x[3] >= x[2]]
    if not pays:
        return (f"{head} Each drafted token costs c = {span([x[1] for x in known])} of a decode step here (its draft "
                f"step and its place in the verify step), so k = 1 breaks even only at an acceptance length of "
                f"{span([x[2] for x in known])}; the measured per-position acceptance gives "
                f"{span([x[3] for x in known])}.")
    where = "; ".join(f"{unit} {b}: {have:.2f} against {need:.2f}" for b, _, need, have in pays)
    return (f"{head} The costs do not explain it: the measured per-position acceptance gives k = 1 more than the "
            f"acceptance length it needs to break even ({where}), so drafting should pay there; the timings could not "
            f"tell it from plain decoding beyond noise. More repeats (--max-repeats, --max-seconds) or a quieter "
            f"machine decide it.")


def _at(table: dict, k: int):
    return table.get(k, table.get(str(k)))


def prediction_lines(result: dict) -> list[str]:
    p = result["prediction"]
    unit = result["unit"]
    lines = [f"Held-out error (each point predicted without it): median {p['held_out_abs_error_median']:.1%}, "
             f"worst {p['held_out_abs_error_max']:.1%}; in the fit: worst {p['fit_abs_error_max']:.1%}. "
             f"The predicted best k is the measured best k at {p['best_k_agrees']} of {len(p['best_k'])} loads.", "",
             f"| {unit} | k | measured tokens/s | predicted | in the fit | held out |", "|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        if r["measured"] and r["predicted_tokens_per_sec"] is not None:
            held = f"{r['held_out_error']:+.1%}" if r["held_out_error"] is not None else "n/a"
            lines.append(f"| {r['load']} | {r['k']} | {r['output_tokens_per_sec']:.1f} | "
                         f"{r['predicted_tokens_per_sec']:.1f} | {r['fit_error']:+.1%} | {held} |")
    return lines


def validation_lines(result: dict) -> list[str]:
    v = result.get("validation")
    if not v:
        return ["Not validated: `mtpbench tune --validate` runs the schedule beside the best fixed k."]
    lines = []
    if v["per_batch_size"]:
        lines.append("On the native engine a run's batch is fixed, so the schedule is per batch size: at each load "
                     "it ran the fixed k the schedule gives that load.")
    elif v["dynamic"]:
        lines.append("The schedule ran as one engine with vLLM's dynamic speculative decoding "
                     "(num_speculative_tokens_per_batch_size); drafts per step are vLLM's counters "
                     "(num_draft_tokens / num_drafts, over the steps that drafted) and drafted tokens per output "
                     "token (how much it drafted at all).")
    else:
        lines.append("The schedule is one k at every load, so it ran as that fixed k (no dynamic speculative "
                     "decoding needed); where an arm is the same k, it is the same run.")
    lines += ["", f"| {result['unit']} | arm | k | tokens/s | drafts per step | drafted tokens per output token | "
                  "schedule / arm [interval at its level] | verdict |", "|---:|---|---:|---:|---:|---:|---|---|"]
    for r in v["rows"]:
        ratio = schedule_ratio_text(r)
        per = "" if r["drafts_per_step"] is None else f"{r['drafts_per_step']:.2f}"
        tok = "" if r.get("draft_tokens_per_output_token") is None else f"{r['draft_tokens_per_output_token']:.3f}"
        lines.append(f"| {r['load']} | {r['arm']} | {r['k']} | {r['output_tokens_per_sec']:.1f} | {per} | {tok} | "
                     f"{ratio} | {r['verdict'] or ''} |")
    return lines


def markdown(result: dict) -> str:
    hw = (result.get("provenance") or {}).get("hardware") or {}
    spec = result["speculative_config"]
    ready = (f"`--speculative-config '{json.dumps(spec)}'`" if spec else
             "no `--speculative-config` (don't draft)")
    parts = [f"# mtpbench tune: {result['model']} on {result['backend']}", "",
             f"**{result['decision'][0].upper() + result['decision'][1:]}.** Run it with {ready}.", ""]
    if result.get("decision_note"):
        parts += [f"Why: {result['decision_note']}.", ""]
    for said in result.get("sweep_disagreements") or []:  # absent from tunes written before issue 55
        parts += [f"Where the sweep's own page answers otherwise: {said}.", ""]
    if result.get("goodput"):
        parts += [f"**{goodput_headline(result)}.**", ""]
    if result.get("unreliable_because"):
        parts += ["**This decision is not reliable:** " + "; ".join(result["unreliable_because"]) + ".", ""]
    if result["schedule_problem"]:
        parts += [f"vLLM would refuse this schedule: {result['schedule_problem']}", ""]
    reason = why_not(result)
    if reason:
        parts += [reason, ""]
    parts += [f"Rule: {result['rule']}. Best single k over every load: {result['best_single_k']}.", "",
              "## Measured tokens/s (speedup over k = 0 with the interval the choice read, at its level, the "
              "p-value adjusted for the tune's comparisons and the decision; chosen in bold)", "",
              *measured_table(result), "",
              *(["## Goodput (requests per second meeting the SLO, the geometric mean of the repeats (their median "
                 "where one met the SLO nowhere) [95 % interval], ratio to k = 0 with the "
                 "interval the goodput choice read, its adjusted p and decision; chosen by goodput in bold)", "",
                 *goodput_lines(result), ""]
                if result.get("goodput") else []),
              "## Costs", "",
              "t(k) / t(0) = 1 + f + c k: c is one drafted token's cost as a fraction of a decode step, f the fixed "
              "cost of drafting at all; k pays where the acceptance length exceeds 1 + f + c k.", "",
              *costs_lines(result), "", "## Prediction", "", *prediction_lines(result), "",
              "## Validation", "", *validation_lines(result), "", "## Machine", "",
              f"{hw.get('cpu') or 'unknown CPU'}, {hw.get('cpu_count')} cores, GPUs: "
              f"{', '.join(g.get('name', '?') for g in hw.get('gpus') or []) or 'none'}; sweeps: "
              f"{', '.join(result['sweeps'])}.", ""]
    if result["failed_points"]:
        parts += ["Failed points (left out): " + "; ".join(result["failed_points"]), ""]
    return "\n".join(parts)
