"""A compare's report.html, from compare.json, compare.md and compare.png: better, worse or within noise per row
first, then the differences with their intervals, the table and the two runs' provenance."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.compare.pair import worse_beyond
from mtpbench.html.document import document, figure, provenance, write
from mtpbench.html.markdown import to_html


def _unjudged_loss(r: dict) -> bool:
    """A row without an interval whose B - A moved the bad way: a loss nothing could judge."""
    return r["verdict"] == "no interval" and bool(r["diff"]) and (r["diff"] > 0) != r["higher_is_better"]


def headline(result: dict) -> tuple[str, str]:
    """(the answer, its tone) over the rows of all prompts and the points that did not pair, by the rule of
    --fail-if-worse (``pair.worse_beyond``, which fails at a threshold only what it fails at 0 %):

    * bad: --fail-if-worse fails at 0 %: a point failed in B or is missing from B, or a metric is worse beyond
      noise where the gate counts it;
    * warn: else, something speaks against B that the gate sets aside (a worse raw timing while the k = 0
      control drifted, a worse metric whose relative change rounds to 0), a point failed in A, or a row
      without an interval moved the bad way;
    * good: else, some row is better;
    * plain: nothing moved beyond noise.

    The sentence counts the rows by verdict, the points missing from B and the failed points by side."""
    rows = [r for r in result["rows"] if r["category"] == "all"]
    n = {w: sum(r["verdict"] == w for r in rows) for w in ("better", "worse", "within noise", "no interval")}
    failed = {side: sum(f["failed_in"] == side for f in result["failed"]) for side in ("B", "A", "A and B")}
    missing = len(result.get("missing_in_b") or [])
    gate = worse_beyond(result, 0.0)
    aside = n["worse"] - (len(gate) - failed["B"] - missing)
    text = (f"B against A: {n['better']} better, {n['worse']} worse, {n['within noise']} within noise"
            + (f", {n['no interval']} without an interval" if n["no interval"] else "") + f" (of {len(rows)} rows)"
            + (f"; {missing} point{'s' if missing != 1 else ''} of A missing in B" if missing else "")
            + "".join(f"; {c} point{'s' if c != 1 else ''} failed in {side}" for side, c in failed.items() if c)
            + (f"; {aside} worse row{'s' if aside != 1 else ''} that --fail-if-worse does not count"
               + (" (timings drifted)" if result.get("timings_drifted") else "") if aside else "") + ".")
    if gate:
        return text, "bad"
    if n["worse"] or failed["A"] or failed["A and B"] or any(_unjudged_loss(r) for r in rows):
        return text, "warn"
    return text, "good" if n["better"] else "plain"


def page(out: Path) -> Path:
    out = Path(out)
    result = json.loads((out / "compare.json").read_text())
    text, tone = headline(result)
    md = (out / "compare.md").read_text() if (out / "compare.md").is_file() else ""
    body = figure(out / "compare.png", "B - A relative to A, each line its interval at the level of the table below") + to_html(md)
    for side in ("a", "b"):
        run = Path(str(result.get(side, ""))) / "run.json"
        prov = json.loads(run.read_text()).get("provenance") if run.is_file() else None
        body += provenance(prov, {"run": result.get(side)}).replace("<h2>Provenance</h2>",
                                                                    f"<h2>Provenance of {side.upper()}</h2>")
    return write(out / "report.html", document(f"mtpbench compare: {out.name}", "compare", text, tone, body))
