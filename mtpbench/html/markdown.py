"""The little Markdown mtpbench writes (headings, paragraphs, lists, pipe tables, code blocks, ``**bold**`` and
`` `code` ``) as HTML, so a page shows a feature's own .md tables as sortable HTML tables."""

from __future__ import annotations

import re

from mtpbench.html.document import esc

_BULLET = re.compile(r"^\s*[-*]\s+")
_INLINE = [(re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"), (re.compile(r"`([^`]+)`"), r"<code>\1</code>")]


def inline(text: str) -> str:
    out = esc(text)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> str:
    head = _cells(lines[0])
    rows = [_cells(x) for x in lines[2:]]
    th = "".join(f"<th>{inline(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table class="sortable"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def to_html(md: str, skip_title: bool = True) -> str:
    """``md`` as HTML; its first ``#`` heading left out where the page has its own title."""
    lines, out, i = md.splitlines(), [], 0
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            out.append(f"<pre>{esc(chr(10).join(lines[i + 1:end]))}</pre>")
            i = end + 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|?$", lines[i + 1]):
            flush()
            end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            out.append(_table(lines[i:end]))
            i = end
            continue
        heading = re.match(r"^(#{1,4})\s+(.*)", line)
        if heading:
            flush()
            level = len(heading.group(1))
            if not (skip_title and level == 1):
                out.append(f"<h{min(level + 1, 4)}>{inline(heading.group(2))}</h{min(level + 1, 4)}>")
        elif _BULLET.match(line):
            flush()
            items = []
            while i < len(lines) and _BULLET.match(lines[i]):
                items.append(f"<li>{inline(_BULLET.sub('', lines[i]))}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif not line.strip():
            flush()
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)
