"""A compare's report.html, from compare.json, compare.md and compare.png: better, worse or within noise per row
first, then the differences with their intervals, the table and the two runs' provenance."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.html.document import document, figure, provenance, write
from mtpbench.html.markdown import to_html


def headline(result: dict) -> tuple[str, str]:
    from mtpbench.compare.report import table_lines

    words = [r[7] for r in table_lines(result)]
    n = {w: words.count(w) for w in ("better", "worse", "within noise", "no interval")}
    text = (f"B against A: {n['better']} better, {n['worse']} worse, {n['within noise']} within noise"
            + (f", {n['no interval']} without an interval" if n["no interval"] else "") + f" (of {len(words)} rows)"
            + (f"; {len(result['failed'])} point(s) failed" if result.get("failed") else "") + ".")
    tone = "bad" if n["worse"] or result.get("failed") else "good" if n["better"] else "plain"
    return text, tone


def page(out: Path) -> Path:
    out = Path(out)
    result = json.loads((out / "compare.json").read_text())
    text, tone = headline(result)
    md = (out / "compare.md").read_text() if (out / "compare.md").is_file() else ""
    body = figure(out / "compare.png", "B - A relative to A, with 95 % intervals") + to_html(md)
    for side in ("a", "b"):
        run = Path(str(result.get(side, ""))) / "run.json"
        prov = json.loads(run.read_text()).get("provenance") if run.is_file() else None
        body += provenance(prov, {"run": result.get(side)}).replace("<h2>Provenance</h2>",
                                                                    f"<h2>Provenance of {side.upper()}</h2>")
    return write(out / "report.html", document(f"mtpbench compare: {out.name}", "compare", text, tone, body))
