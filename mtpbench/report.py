"""``mtpbench report DIR``: rebuild the table, ``summary.csv``, ``summary.json`` and the PNG plots from
the saved point files alone (no model, no GPU).

Plots: ``acceptance_length.png`` (AL vs k, one line per mode x MTP-layer count), ``throughput.png``
(tokens/sec and speedup vs k, with the theoretical speedup dashed), ``per_position.png`` (vLLM's joint
per-position acceptance at the largest k of each line).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import replace
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.metrics import PointResult, PointRun, mean_call_s, summarize

# settings that change what a point measures; a saved point is reused only if these match
FINGERPRINT_KEYS = ("model", "backend", "method", "prompts", "num_prompts", "max_tokens", "temperature",
                    "batch_size", "seed", "device", "dtype", "force_spec_step_idx", "max_model_len",
                    "tensor_parallel_size", "gpu_memory_utilization", "engine_args")


def fingerprint(config: dict, versions: dict) -> dict:
    return {**{key: config.get(key) for key in FINGERPRINT_KEYS}, "versions": versions}


def point_name(mode: str, k: int, mtp_layers: int) -> str:
    return "k0" if k == 0 else f"{mode}-L{mtp_layers}-k{k}"


def write_text(path: Path, text: str) -> None:
    """Write atomically, so an interrupted run never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=1) + "\n")


TABLE_COLUMNS = [
    ("mode", "mode"), ("k", "k"), ("mtp_layers", "L"), ("category", "category"),
    ("acceptance_length", "AL"), ("acceptance_rate_per_pos", "accept/pos (joint)"), ("alpha", "alpha"),
    ("output_tokens_per_sec", "tok/s"), ("speedup", "speedup"), ("theoretical_speedup", "theory"),
    ("ttft_ms_median", "TTFT p50 ms"), ("tpot_ms_median", "TPOT p50 ms"),
    ("output_repetition", "rep4"), ("startup_s", "startup s"), ("status", "status"),
]


def _sort_key(p: dict) -> tuple:
    return (p["k"] != 0, p["mode"], p["mtp_layers"], p["k"])


def load_run(out: Path) -> tuple[dict, list[dict], list[dict]]:
    out = Path(out)
    run_path = out / "run.json"
    if not run_path.is_file():
        raise MtpBenchError(f"{out} holds no sweep (run.json missing)")
    run = _read_json(run_path)
    want = fingerprint(run["config"], run["provenance"]["versions"])
    points, failures = [], []
    for path in sorted(out.glob("*.json")):
        if path.name in ("run.json", "summary.json"):
            continue
        data = _read_json(path)
        if not isinstance(data, dict) or data.get("fingerprint") != want:
            continue  # left over from a sweep with other settings or versions, or not ours
        (failures if path.name.endswith(".failure.json") else points).append(data)
    return run, points, failures


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise MtpBenchError(f"{path}: unreadable ({e})") from None


def rows_from_points(points: list[dict], failures: list[dict]) -> list[PointResult]:
    rows: list[PointResult] = []
    loaded = [(d, PointRun.from_json(d)) for d in sorted(points, key=lambda d: _sort_key(d["point"]))]
    # the target's decode-step time at k = 0, per category: the unit of the draft cost ratio c
    step_s = {}
    for d, run in loaded:
        batches = run.batches
        if d["point"]["k"] == 0:
            step_s["all"] = mean_call_s(batches, "target")
            for b in batches:
                step_s.setdefault(b.category, mean_call_s([x for x in batches if x.category == b.category], "target"))
    for data, run in loaded:
        requests, batches = run.requests, run.batches
        p = data["point"]
        cats = sorted({r.category for r in requests})
        groups = [("all", requests, batches)]
        if len(cats) > 1:
            groups += [(c, [r for r in requests if r.category == c], [b for b in batches if b.category == c])
                       for c in cats]
        for cat, reqs, bats in groups:
            rows.append(summarize(p["backend"], p["mode"], p["k"], p["mtp_layers"], cat, reqs, bats,
                                  data.get("startup_s"), step_s.get(cat)))
    for f in sorted(failures, key=lambda d: _sort_key(d["point"])):
        p = f["point"]
        rows.append(PointResult(p["backend"], p["mode"], p["k"], p["mtp_layers"], "all", "failed",
                                error=f["error"]))
    base = {(r.backend, r.category): r.output_tokens_per_sec for r in rows if r.k == 0 and r.status == "ok"}
    return [replace(r, speedup=round(r.output_tokens_per_sec / base[(r.backend, r.category)], 4))
            if r.output_tokens_per_sec and base.get((r.backend, r.category)) else r for r in rows]


def csv_text(rows: list[PointResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=PointResult.columns(), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r.to_csv())
    return buf.getvalue()


def table(rows: list[PointResult]) -> str:
    from tabulate import tabulate

    def cell(v):
        if isinstance(v, tuple):
            return " ".join("-" if x is None else f"{x:.2f}" for x in v)
        return "-" if v is None else v

    body = [[cell(getattr(r, name)) for name, _ in TABLE_COLUMNS] for r in rows]
    text = tabulate(body, headers=[h for _, h in TABLE_COLUMNS], floatfmt=".3g")
    errors = [f"{point_name(r.mode, r.k, r.mtp_layers)}: {r.error}" for r in rows if r.error]
    return text + ("\n\nfailed points:\n" + "\n".join(errors) if errors else "")


def _lines(rows: list[PointResult]) -> dict[tuple[str, int], list[PointResult]]:
    """One line per (mode, layers); the k = 0 baseline starts every line."""
    ok = [r for r in rows if r.status == "ok" and r.category == "all"]
    base = [r for r in ok if r.k == 0]
    lines: dict[tuple[str, int], list[PointResult]] = {}
    for r in ok:
        if r.k > 0:
            lines.setdefault((r.mode, r.mtp_layers), list(base)).append(r)
    return lines


def plots(out: Path, rows: list[PointResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _lines(rows)
    if not lines:
        return []
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for (mode, L), pts in sorted(lines.items()):
        ax.plot([r.k for r in pts], [r.acceptance_length for r in pts], marker="o", label=f"{mode}, L={L}")
    ks = sorted({r.k for pts in lines.values() for r in pts})
    ax.plot(ks, [k + 1 for k in ks], ":", color="grey", label="upper bound k+1")
    ax.set(xlabel="num_speculative_tokens k", ylabel="acceptance length", title="Acceptance length vs k",
           xticks=ks)
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / "acceptance_length.png", plt))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for (mode, L), pts in sorted(lines.items()):
        (line,) = a1.plot([r.k for r in pts], [r.output_tokens_per_sec for r in pts], marker="o",
                          label=f"{mode}, L={L}")
        a2.plot([r.k for r in pts], [r.speedup for r in pts], marker="o", color=line.get_color(),
                label=f"{mode}, L={L} measured")
        a2.plot([r.k for r in pts], [r.theoretical_speedup for r in pts], "--", color=line.get_color(),
                label=f"{mode}, L={L} theoretical")
    a1.set(xlabel="k", ylabel="output tokens/sec", title="Throughput")
    a2.set(xlabel="k", ylabel="speedup vs k=0", title="Speedup (dashed: (1-a^(k+1))/((1-a)(kc+1)))")
    for a in (a1, a2):
        a.set_xticks(ks)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    paths.append(_save(fig, out / "throughput.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4))
    tops = [max((r for r in pts if r.k > 0), key=lambda r: r.k) for pts in lines.values()]
    width = 0.8 / len(tops)
    for i, r in enumerate(sorted(tops, key=lambda r: (r.mode, r.mtp_layers))):
        xs = [p + i * width for p in range(len(r.acceptance_rate_per_pos))]
        ax.bar(xs, r.acceptance_rate_per_pos, width=width, label=f"{r.mode}, L={r.mtp_layers}, k={r.k}")
    npos = max(len(r.acceptance_rate_per_pos) for r in tops)
    ax.set(xlabel="draft position", ylabel="acceptance rate (joint: positions 0..i accepted)",
           title="Per-position acceptance", ylim=(0, 1), xticks=[p + width * (len(tops) - 1) / 2 for p in range(npos)],
           xticklabels=range(npos))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    paths.append(_save(fig, out / "per_position.png", plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def build(out: Path) -> list[PointResult]:
    """Rebuild every summary file of a sweep directory from its point files; returns the rows."""
    out = Path(out)
    run, points, failures = load_run(out)
    rows = rows_from_points(points, failures)
    write_text(out / "summary.csv", csv_text(rows))
    write_json(out / "summary.json", {**run, "rows": [r.to_json() for r in rows]})
    plots(out, rows)
    return rows
