"""What a trace writes: the per-step table, ``trace.csv`` and the ``layers.png`` heatmap, from records alone."""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import fields

from mtpbench.files import blank_none, csv_text
from mtpbench.trace.records import CallRecord


def trace_csv(records: list[CallRecord]) -> str:
    return csv_text([f.name for f in fields(CallRecord)], (blank_none(r) for r in records))


def step_table(records: list[CallRecord], num_layers: int) -> list[list]:
    """Per draft step: calls, which layers ran, what the wrapper/predictor/layer received."""
    rows = []
    for s in sorted({r.draft_step for r in records}):
        rs = [r for r in records if r.draft_step == s]
        ran = Counter(r.executed_layer for r in rs)
        seen = [",".join(sorted({str(getattr(r, attr)) for r in rs}))
                for attr in ("wrapper_spec_step_idx", "predictor_spec_step_idx", "layer_spec_step_idx")]
        rows.append([s, len(rs), s % num_layers, " ".join(f"{j}:{n}" for j, n in sorted(ran.items(), key=str)),
                     *seen,
                     round(sum(r.num_tokens for r in rs) / len(rs), 1)])
    return rows


STEP_HEADERS = ["step", "calls", "expected layer", "ran layer:count", "wrapper idx", "predictor idx",
                "layer idx", "tokens/call"]


def heatmap(path, records: list[CallRecord], num_layers: int, k: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.zeros((max(k, 1), num_layers), dtype=int)
    for r in records:
        if r.draft_step < k and r.executed_layer is not None and 0 <= r.executed_layer < num_layers:
            grid[r.draft_step, r.executed_layer] += 1
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * num_layers, 1.4 + 0.6 * k))
    ax.imshow(grid, cmap="Blues", aspect="auto")
    for s in range(grid.shape[0]):
        for j in range(num_layers):
            ax.text(j, s, str(grid[s, j]), ha="center", va="center",
                    color="white" if grid[s, j] > grid.max() / 2 else "black")
        ax.add_patch(plt.Rectangle((s % num_layers - 0.5, s - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
    ax.set(xticks=range(num_layers), yticks=range(grid.shape[0]), xlabel="MTP layer executed", ylabel="draft step s")
    # wrapped to the figure's width: a narrow heatmap (few layers) cut a one-line title off at both ends
    ax.set_title("\n".join(textwrap.wrap(title, max(24, int(9 * (1.6 + 1.1 * num_layers))))), fontsize=8)
    fig.text(0.01, 0.01, "red box: expected layer s mod L", fontsize=7, color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def model_label(model_dir) -> str:
    """How a picture names the model: its architecture and directory."""
    from pathlib import Path

    from mtpbench.checkpoint import read_config

    arch = (read_config(model_dir).get("architectures") or ["?"])[0]
    return f"{arch} ({Path(model_dir).name})"


def provenance_versions(summary: dict) -> str:
    return summary["provenance"]["versions"].get("vllm") or "?"
