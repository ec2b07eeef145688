"""A check-lossless report.html, from lossless.json, lossless.md and lossless.png: lossless, lossy, divergent or
inconclusive and why first, then the figure, the summary's tables and the provenance."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.html.document import document, esc, figure, provenance, table, write
from mtpbench.html.markdown import to_html


def headline(record: dict) -> tuple[str, str]:
    """(the verdict and why, its tone), the tone by --fail-if-lossy's exit code (``verdict.exit_code``, which the
    page reads rather than restates): bad exactly where it exits 1 (lossy, divergent), warn where it exits 3
    (inconclusive: the gate fails closed), good only for a lossless verdict that exits 0, plain for any other
    that exits 0 ("numerical only": divergences within rounding, which the gate passes)."""
    from mtpbench.lossless.verdict import EXIT_INCONCLUSIVE, EXIT_LOSSY, GREEDY_LOSSLESS, SAMPLING_LOSSLESS, exit_code

    verdict = record["verdict"]
    code = exit_code(record)
    tone = ("bad" if code == EXIT_LOSSY else "warn" if code == EXIT_INCONCLUSIVE
            else "good" if code == 0 and verdict in (GREEDY_LOSSLESS, SAMPLING_LOSSLESS) else "plain")
    return f"{verdict[0].upper() + verdict[1:]}: {record.get('why') or ''}".strip().rstrip(":"), tone


def _f(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def prompts_table(record: dict) -> str:
    """Every number of lossless.png: per prompt, greedy its first divergence (position, tokens, |logit gap|,
    margin, class) or sampling each arm's mean target log-prob."""
    pp = record.get("per_prompt") or []
    if record.get("kind") == "greedy":
        rows = []
        for p in pp:
            d = p.get("divergence") or {}
            rows.append([p["prompt_id"], "yes" if p.get("identical") else "no", d.get("position", "-"),
                         d.get("k0_token", "-"), d.get("spec_token", "-"),
                         _f(abs(d["logit_gap"]) if d.get("logit_gap") is not None else None), _f(d.get("margin")),
                         d.get("class", "-"), "yes" if p.get("aa_identical") else "no"])
        return table(["prompt", "identical to k = 0", "first divergence at", "k = 0 token", "drafted token",
                      "|logit gap|", "top-two margin", "class", "A/A identical"], rows)
    return table(["prompt", "mean log-prob k = 0", "mean log-prob drafting", "mean log-prob k = 0 (A/A)"],
                 [[p["prompt_id"], _f(p.get("mean_logprob_off")), _f(p.get("mean_logprob_on")),
                   _f(p.get("mean_logprob_off_aa"))] for p in pp])


def law_tables(record: dict) -> str:
    """The drafting arm's acceptance against its law, expected against observed per position, each stage (the
    third test of the verdict; trace-layers' table); nothing where the record has none."""
    from mtpbench.metrics.law import LAW_HEADERS, law_lines, law_rows

    html = ""
    for label, stage in (("", record), ("Stage 2: ", record.get("confirmation") or {})):
        block = stage.get("acceptance_law")
        if not block:
            continue
        html += f"<h2>{label}acceptance against its law (the drafting arm)</h2>"
        html += table(LAW_HEADERS, law_rows(block)) if block["observable"] else \
            f"<p>{esc(law_lines(block)[0])}</p>"
    return html


def page(out: Path) -> Path:
    out = Path(out)
    record = json.loads((out / "lossless.json").read_text())
    text, tone = headline(record)
    md = (out / "lossless.md").read_text() if (out / "lossless.md").is_file() else ""
    caption = ("Greedy: each divergence's |logit gap| against the threshold" if record.get("kind") == "greedy"
               else "Sampling: each prompt's mean score per arm")
    body = (figure(out / "lossless.png", caption)
            + figure(out / "lossless_detail.png", "Each arm's score distribution over prompts, and how often a "
                     "prompt's continuations share their most frequent token at each position")
            + law_tables(record)
            + "<h2>Per prompt</h2>" + prompts_table(record) + to_html(md) + provenance(record.get("provenance")))
    return write(out / "report.html", document(f"mtpbench check-lossless: {out.name}", "check-lossless", text, tone,
                                              body))
