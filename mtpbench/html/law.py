"""Acceptance against its law on a page (``metrics.law``'s block): the verdict in words, the test's table a row a
draft position and the joint one, then where acceptance is lost (descriptive). trace-layers' page shows one block,
a sweep's one a k > 0 point."""

from __future__ import annotations

from mtpbench.html.document import esc, table

BREAKDOWNS = (("by_context", "context tokens", "By context length (descriptive)"),
              ("by_token_class", "draft token", "By draft token class (descriptive)"))


def law_section(block: dict | None, title: str = "Acceptance against its law", level: int = 2) -> str:
    """``block`` under a heading ``title`` (``<h{level}>``; its breakdowns one level below); nothing without one."""
    from mtpbench.metrics.law import LAW_HEADERS, law_rows

    if not block:
        return ""
    head = f"<h{level}>{esc(title)}</h{level}>"
    if not block["observable"]:
        return head + f"<p>Not observable: {esc(block['why'])}.</p>"
    sub = level + 1
    return (head + f"<p>{esc(block['verdict'].capitalize())}: the share of the drafts reaching each position that "
            "were accepted, against the share the law expects from the target's and the drafter's laws at each "
            "step (docs/acceptance-law.md).</p>" + table(LAW_HEADERS, law_rows(block))
            + "".join(f"<h{sub}>{name_title}</h{sub}>"
                      + table([name, "position", "steps", "observed", "expected", "TV(p, q)"],
                              [[g["group"], g["position"], g["steps"], g["observed"], g["expected"],
                                "" if g["tv"] is None else g["tv"]] for g in block[key]])
                      for key, name, name_title in BREAKDOWNS if block.get(key)))
