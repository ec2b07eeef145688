"""The README and docs/ stay whole: every relative link and image resolves (anchors to a heading of the
page they name), every subcommand of the CLI is named in the README, every docs page is reachable from it,
and the README fits on a screen (at most 200 lines).

Reads files only: no model, no engine, no torch (``mtpbench.cli`` imports none of them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from mtpbench.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), with an optional "title"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a '#' or a '[x](y)' inside code is neither heading nor link."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    found = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        found += LINK.findall(INLINE_CODE.sub("", line))
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_file():
            broken.append(f"{target}: no file {rel(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    return broken


def command_names() -> list[str]:
    return sorted(typer.main.get_command(app).commands)


def test_the_pages_exist():
    assert README.is_file()
    assert len(PAGES) > 5, "docs/*.md is missing"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_and_image_resolves(page):
    assert links(page) or page != README, "the README links to nothing"
    broken = broken_links(page)
    assert not broken, "broken in " + rel(page) + ":\n" + "\n".join(broken)


def test_every_subcommand_is_named_in_the_readme():
    names = command_names()
    assert "sweep" in names and len(names) >= 10, names
    text = README.read_text(encoding="utf-8")
    missing = [n for n in names if not re.search(rf"`mtpbench {re.escape(n)}\b", text)]
    assert missing == [], f"README.md does not name these subcommands as `mtpbench NAME`: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    orphans = [rel(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert orphans == [], f"docs pages the README does not link to: {orphans}"


def test_the_readme_fits_on_a_screen():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES} (move the rest to docs/)"


def test_the_checker_sees_what_github_sees(tmp_path):
    """The checker itself: a code block hides links and headings; duplicate headings get -1; a bad anchor fails."""
    page = tmp_path / "p.md"
    page.write_text(
        "# Is it lossless? `mtpbench check-lossless`\n## On vLLM (`--backend vllm`)\n## On vLLM (`--backend vllm`)\n"
        "```\n# not a heading\n[x](missing.md)\n```\n"
        "[a](#is-it-lossless-mtpbench-check-lossless) [b](#on-vllm---backend-vllm-1) `[c](nowhere.md)`\n"
        "[d](#not-a-heading) ![e](gone.png)\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"is-it-lossless-mtpbench-check-lossless", "on-vllm---backend-vllm",
                             "on-vllm---backend-vllm-1"}
    assert [b.split(":")[0] for b in broken_links(page)] == ["#not-a-heading", "gone.png"]
