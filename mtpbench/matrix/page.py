"""A trace-matrix's report.html, from matrix.json, matrix.md and matrix.png: how many architectures reuse, chain,
swallow or crash on each runner first, then the grid coloured by verdict, the table and the provenance."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from mtpbench.html.document import document, figure, provenance, write
from mtpbench.html.markdown import to_html

WORDS = {"multi-module": "chain", "layer-0 reuse": "reuse layer 0", "swallowed": "swallow the index",
         "crashed": "crash"}


def headline(cells: list[dict]) -> str:
    """Per runner and drafting: how many architectures got each verdict."""
    parts = []
    for runner in sorted({c["runner_asked"] or c["runner"] for c in cells}):
        for drafting in ("as installed", "forced"):
            these = [c for c in cells if (c["runner_asked"] or c["runner"]) == runner and c["drafting"] == drafting]
            if not these:
                continue
            count = Counter(c["verdict"] for c in these)
            said = ", ".join(f"{n} {WORDS.get(v, v)}" for v, n in count.most_common())
            parts.append(f"{runner.upper()} {drafting}: {said}")
    n = len({c["arch"] for c in cells})
    return f"{n} architecture{'s' if n != 1 else ''}. " + "; ".join(parts) + "."


def page(out: Path) -> Path:
    out = Path(out)
    data = json.loads((out / "matrix.json").read_text())
    cells = data["cells"]
    md = (out / "matrix.md").read_text() if (out / "matrix.md").is_file() else ""
    body = (figure(out / "matrix.png", "Architecture x runner x drafting, coloured by verdict") + to_html(md)
            + provenance(data.get("provenance"), {"vLLM": data.get("vllm"), "engines side by side": data.get("jobs"),
                                                  "wall seconds": data.get("wall_s")}))
    tone = "warn" if data.get("interrupted") else "plain"
    return write(out / "report.html", document(f"mtpbench trace-matrix: {out.name}", "trace-matrix",
                                              headline(cells), tone, body))
