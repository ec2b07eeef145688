"""check-drafter's report.html, rebuilt from drafter.json: the headline (parity, the first stage that differs, or
inconclusive where no stage was checked), each stage's error against the tolerance, the notes on the engine's inputs,
and the acceptance per position the reference implies beside the engine's."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.drafter.compare import cause, differs, first_difference, headline, verdict
from mtpbench.drafter.families import STAGES
from mtpbench.html.document import document, esc, provenance, table, write


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def stage_rows(s: dict) -> list[list]:
    """(stage, error, within tolerance?) in the order a draft step runs them; "not measured" where the engine's
    module for the stage was not seen or the reference has no independent computation of it."""
    return [[stage, _num(s["errors"].get(stage)),
             "not measured" if s["errors"].get(stage) is None else
             ("DIFFERS" if differs(s["errors"][stage], s["tolerance"]) else "ok")] for stage in STAGES]


def acceptance_rows(s: dict) -> list[list]:
    ref, eng, ctr = s.get("reference_acceptance"), s.get("engine_acceptance") or [], \
        s.get("engine_counters_acceptance") or []
    return [[i, _num(ref[i]) if ref else "-", _num(eng[i]) if i < len(eng) else "-",
             _num(ctr[i]) if i < len(ctr) else "-"] for i in range(s["k"])]


def answer(s: dict) -> tuple[str, str]:
    """(the answer, its tone) from the saved errors by today's rule (a drafter.json from before "inconclusive" said
    "parity" with no stage checked); green only for parity, never for a check that could not tell. The page and the
    terminal say it first."""
    errors, tol = s["errors"], s["tolerance"]
    tone = {"parity": "good", "differs": "bad"}.get(verdict(errors, tol), "warn")
    first = first_difference(errors, tol)
    return headline(first, [st for st in STAGES if errors.get(st) is not None],
                    s.get("reference_acceptance"), s.get("engine_acceptance") or [], s.get("num_calls"),
                    cause(first, s.get("notes") or {})), tone


def page(out: Path) -> Path:
    out = Path(out)
    s = json.loads((out / "drafter.json").read_text())
    said, tone = answer(s)
    body = ("<h2>Stage by stage</h2>"
            + table(["stage", "max |engine - reference| / max |reference|", f"tolerance {s['tolerance']:.3g}"],
                    stage_rows(s), caption=f"{s['dtype']}; decoder layer: {s['decoder']}")
            + "<h2>The engine's inputs</h2><ul>"
            + "".join(f"<li>{esc(n)} ({c} call{'s' if c != 1 else ''})</li>" for n, c in s["notes"].items())
            + "".join(f"<li>{'later steps' if h['later_step'] else 'step 0'}: {esc(h['from'])}'s hidden "
                      f"{'before' if h['kind'] == 'pre' else 'after'} its final norm at t{h['offset']:+d} "
                      f"({h['calls']} calls)</li>" for h in s["hidden_inputs"]) + "</ul>"
            + "<h2>Acceptance per position</h2>"
            + table(["position", "reference's drafts", "engine's drafts", "engine's counters"], acceptance_rows(s),
                    caption="greedy drafts against the target's tokens, on the engine's inputs; the counters cover "
                            "every proposal, the drafts the proposals inside the generated tokens")
            + provenance(s.get("provenance"), {"family": s["family"], "backend": s["backend"], "runner": s.get("runner"),
                                "draft calls": s["num_calls"], "requests": s["num_requests"]}))
    sub = f"{s['model']} on {s['backend']}{' (' + s['runner'] + ')' if s.get('runner') else ''}, k = {s['k']}."
    return write(out / "report.html", document(f"mtpbench check-drafter: {out.name}", "check-drafter",
                                              said, tone, body, sub))


def write_page(out: Path, summary: dict | None = None) -> Path | None:
    from mtpbench.html.pages import render

    return render(page, out)
