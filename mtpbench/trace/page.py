"""A trace's report.html, from trace.json and layers.png: which MTP layer served each draft step and the verdict
first, then the heatmap, the per-step table, the evidence, acceptance by layer and the provenance."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.html.document import document, esc, figure, provenance, table, write
from mtpbench.html.law import law_section

TONES = {"multi-module": "good", "layer-0 reuse": "warn", "multi-layer calls": "plain", "inconclusive": "plain"}


def _ran(cell) -> str:
    """What one step's "ran layer:count" cell ("0:5 1:3") says in words: every layer that ran, with its count
    when there were several ("layer 0 x5, layer 1 x3"); -1 is several layers in one call, None no MTP layer."""
    parts = [p.rpartition(":") for p in str(cell or "").split()]
    name = {"-1": "all layers in one call", "None": "no MTP layer"}
    if len(parts) == 1:
        return name.get(parts[0][0], f"layer {parts[0][0]}")
    return ", ".join(f"{name.get(j, f'layer {j}')} x{n}" for j, _, n in parts) or "layer -"


def headline(t: dict) -> tuple[str, str]:
    """(the verdict and which layers ran at each draft step, its tone): good for multi-module, warn for layer-0
    reuse, plain for what tells nothing wrong of the drafter (multi-layer calls, inconclusive), bad otherwise."""
    steps = "; ".join(f"step {s['step']}: {_ran(s.get('ran layer:count'))}" for s in t.get("per_step") or [])
    who = t.get("drafter") or t.get("backend")
    text = (f"Verdict: {t['verdict']}. {steps or 'No draft step ran'} ({t['mode']}, k = {t['k']}, "
            f"{t['num_mtp_layers']} MTP layer{'s' if t['num_mtp_layers'] != 1 else ''}, drafted by {who}).")
    return text, TONES.get(t["verdict"], "bad")


def page(out: Path) -> Path:
    out = Path(out)
    t = json.loads((out / "trace.json").read_text())
    answer, tone = headline(t)
    steps = t.get("per_step") or []
    headers = list(steps[0]) if steps else []
    layers = t.get("acceptance_by_layer") or []
    body = (figure(out / "layers.png", "Draft step x MTP layer: how often each layer ran at each step")
            + "<h2>Per draft step</h2>" + table(headers, [[s.get(h) for h in headers] for s in steps])
            + "<h2>Evidence</h2><ul>" + "".join(f"<li>{esc(e)}</li>" for e in t.get("evidence") or []) + "</ul>"
            + "<h2>Acceptance by draft position</h2>"
            + table(["position", "layer", "accepted tokens", "acceptance rate"],
                    [[x["position"], x["layer"], x["num_accepted_tokens"], x["acceptance_rate"]] for x in layers])
            + law_section(t.get("acceptance_law"))
            + (f"<p>Unused MTP layers: {esc(t['unused_layers'])} ({esc(t['unused_layer_bytes'])} bytes).</p>"
               if t.get("unused_layers") else "")
            + provenance(t.get("provenance"), {"runner": t.get("runner"), "execution": t.get("execution"),
                                               "structure": json.dumps(t.get("structure"))[:1000]}))
    cfg = t.get("config") or {}
    sub = f"{cfg.get('model')} on {t.get('backend')}; {t.get('num_drafts')} drafts traced."
    return write(out / "report.html", document(f"mtpbench trace-layers: {out.name}", "trace-layers", answer, tone,
                                              body, sub))
