"""``mtpbench report DIR``: rebuild the table, ``summary.csv``, ``summary.json`` and the PNG plots from
the saved point files alone (no model, no GPU).

Plots: ``acceptance_length.png`` (AL vs k, one line per mode x MTP-layer count [x load]),
``throughput.png`` (tokens/sec and speedup vs k, with the theoretical speedup dashed),
``per_position.png`` (vLLM's joint per-position acceptance at the largest k of each line), and for
served runs ``serving.png`` (tokens/sec vs k, one line per concurrency, best k marked; AL vs concurrency).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mtpbench.environment import load_change
from mtpbench.files import write_json, write_text
from mtpbench.metrics import PointResult
from mtpbench.stats.noise import line as noise_line
from mtpbench.sweep.load import aa_runs, judge_of, load_run, partial, read_json, read_noise, rows_from_points, sort_key
from mtpbench.html.pages import render
from mtpbench.sweep.page import page
from mtpbench.sweep.plots import al_histogram, plots
from mtpbench.sweep.table import csv_text


def notices(out: Path) -> list[str]:
    """Lines a reader needs under the table: what the prompts were, and why GPU telemetry is missing."""
    lines = []
    run = read_json(Path(out) / "run.json")
    ps = run.get("prompts")
    if ps:
        lines.append(f"prompts: {ps['set']}, {ps['num_prompts']} in {len(ps['categories'])} "
                     f"categor{'y' if len(ps['categories']) == 1 else 'ies'}" + "".join(f"; {n}" for n in ps["notes"]))
    tel = telemetry_notice(out)
    summary = Path(out) / "summary.json"
    said = noise_line(read_json(summary).get("noise")) if summary.is_file() else None
    return lines + ([tel] if tel else []) + ([said] if said else []) + load_change(run["provenance"])



def telemetry_notice(out: Path) -> str | None:
    """One line when no point of the sweep has GPU telemetry, saying why (from the point files)."""
    reasons = set()
    for path in Path(out).glob("*.json"):
        if path.name in ("run.json", "summary.json") or path.name.endswith(".failure.json"):
            continue
        tel = (read_json(path) or {}).get("telemetry") or {}
        if not tel.get("unavailable"):
            return None
        reasons.add(tel["unavailable"])
    return f"GPU telemetry: none ({'; '.join(sorted(reasons))})" if reasons else None


def labels(config: dict) -> dict:
    """A run's --label and --metadata as every row carries them (summary.csv: "key=value;...")."""
    return {"label": config.get("label") or None,
            "metadata": tuple(f"{k}={v}" for k, v in (config.get("metadata") or {}).items())}


def law_blocks(points: list[dict]) -> list[dict]:
    """--law: each k > 0 point's acceptance against its law as its file holds it (``metrics.law``'s block), in the
    rows' order, for report.html's tables; empty without --law."""
    return [{"point": d["point"], **d["acceptance_law"]}
            for d in sorted(points, key=lambda d: sort_key(d["point"])) if d.get("acceptance_law")]


def build(out: Path) -> list[PointResult]:
    """Rebuild every summary file of a sweep directory from its point files; returns the rows."""
    out = Path(out)
    run, points, failures = load_run(out)
    noise = read_noise(out, run, points)
    found = aa_runs(out, run, points)
    config = run.get("config") or {}
    family, looks = judge_of(run, points, failures)
    rows = [replace(r, **labels(config)) for r in
            rows_from_points(points, failures, found[1:] if found else None, config.get("metric_percentiles") or (),
                             family, looks)]
    write_text(out / "summary.csv", csv_text(rows))
    histogram = al_histogram(out, points, rows)
    drawn = [p.name for p in [*plots(out, rows), *([histogram] if histogram else [])]]  # "wrote plots" only then
    write_json(out / "summary.json", {**run, "noise": noise, "rows": [r.to_json() for r in rows],
                                      "acceptance_law": law_blocks(points), "partial": partial(run, points, failures),
                                      "plots": drawn})
    render(page, out)
    return rows
