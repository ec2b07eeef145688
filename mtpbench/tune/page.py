"""A tune's report.html, from tune.json, tune.md and tune.png: the decision and the ready --speculative-config
first (with why, where it is not the schedule of the per-load choices), then the picture, the tables and the
provenance."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.html.document import document, figure, provenance, write
from mtpbench.html.markdown import to_html


def headline(result: dict) -> tuple[str, str]:
    """(the decision in a sentence, its tone): what the page and the terminal say first; a decision that is not
    reliable says so first, never in green."""
    text = result["decision"][0].upper() + result["decision"][1:] + "."
    tone = "good" if result["speculative_config"] and not result.get("unmeasured") else "warn"
    if result.get("unreliable_because"):
        return f"Not reliable: {text[0].lower() + text[1:]}", "warn"
    return text, tone


def page(out: Path) -> Path:
    out = Path(out)
    result = json.loads((out / "tune.json").read_text())["result"]
    spec = result["speculative_config"]
    text, tone = headline(result)
    sub = f"--speculative-config '{json.dumps(spec)}'" if spec else "No --speculative-config: don't draft."
    note = result.get("decision_note")
    if note:  # why it is not the schedule of the per-load choices, or what validated it
        sub += f" {note[0].upper() + note[1:]}."
    for said in result.get("sweep_disagreements") or []:  # where a sweep's own page answers otherwise (issue 55)
        sub += f" Where the sweep's own page answers otherwise: {said}."
    if result.get("goodput"):  # the choice by goodput beside the one by tokens/s
        from mtpbench.tune.markdown import goodput_headline

        sub += f" {goodput_headline(result)}."
    md = (out / "tune.md").read_text() if (out / "tune.md").is_file() else ""
    body = (figure(out / "tune.png", "Tokens/s against load, one line per k; the schedule's envelope; the validated "
                   "schedule starred") + to_html(md) + provenance(result.get("provenance")))
    why = result.get("unreliable_because")
    if why:  # the answer carries its noise: said first (headline), and why right under it
        sub = "Why not: " + "; ".join(why) + ". " + sub
    return write(out / "report.html", document(f"mtpbench tune: {out.name}", "tune", text, tone,
                                              body, sub))
