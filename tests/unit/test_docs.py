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


# --- what the pages say: what to run and what it means, not the project's diary ---------------------------------

CELL_MAX_WORDS = 80
OPENING_MAX_WORDS = 50
# Phrases of the project's history and process (which release, which machine, what came before) that tell a user
# nothing about what to run or what a figure means; a measurement names its CPU and command instead.
DIARY_PHRASES = [
    "this release's final code",
    "earlier release",
    "rerun after the restructuring",
    "code before",
    "this project's idle",
    "this project's machine",
]
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def table_cells(page: Path) -> list[tuple[int, str]]:
    """(line number, cell text) of every table cell outside code blocks; an unescaped '|' ends a cell, as on GitHub."""
    cells, fenced = [], False
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or not line.lstrip().startswith("|"):
            continue
        cells += [(n, cell.strip()) for cell in UNESCAPED_PIPE.split(line.strip().strip("|"))]
    return cells


def long_cells(page: Path, limit: int = CELL_MAX_WORDS) -> list[str]:
    return [f"{rel(page)}:{n}: {len(c.split())} words: {c[:70]}..."
            for n, c in table_cells(page) if len(c.split()) > limit]


def diary_phrases(page: Path) -> list[str]:
    found = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found += [f"{rel(page)}:{n}: {p!r}" for p in DIARY_PHRASES if p in line.lower()]
    return found


def first_sentence(page: Path) -> str:
    """The first sentence of prose after the title: headings, images, badges, HTML and tables skipped."""
    para: list[str] = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        text = line.strip()
        if not text:
            if para:
                break
            continue
        if text.startswith(("#", "|", "<", "![", "[![")):
            if para:
                break
            continue
        para.append(text)
    joined = " ".join(para)
    return re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\[])", joined, maxsplit=1)[0]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_table_cell_is_an_essay(page):
    long = long_cells(page)
    assert not long, (f"table cells over {CELL_MAX_WORDS} words (move the detail to prose under the table):\n"
                      + "\n".join(long))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_keeps_a_diary(page):
    found = diary_phrases(page)
    assert not found, ("the project's history, not what to run or what it means (keep the figure, its command and "
                       "its CPU; drop which code or machine ran it):\n" + "\n".join(found))


def test_the_readme_opens_with_a_short_sentence():
    sentence = first_sentence(README)
    assert sentence, "README.md has no prose after its title"
    n = len(sentence.split())
    assert n <= OPENING_MAX_WORDS, f"README.md's first sentence has {n} words (at most {OPENING_MAX_WORDS}): {sentence}"


def test_the_content_checks_see_what_they_should(tmp_path):
    """The checkers themselves: a cell of 81 words is long, 80 is not; an escaped pipe or a code block splits no
    cell; a diary phrase is found in any case; the opening sentence skips the title and badges and ends at its stop."""
    page = tmp_path / "p.md"
    page.write_text(
        "# Title\n\n[![ci](b.svg)](x)\n\nOne two three. Four five.\n\n"
        f"| a | b |\n|---|---|\n| {'w ' * 81}| {'w ' * 80}|\n| x \\| y | z |\n"
        "```\n| " + "w " * 90 + "|\n```\n"
        "Ran on This Release's Final Code.\n",
        encoding="utf-8",
    )
    assert [c.split(": ")[1] for c in long_cells(page)] == ["81 words"]
    assert ("x \\| y") in [c for _, c in table_cells(page)]
    assert len(diary_phrases(page)) == 1
    assert first_sentence(page) == "One two three."


# issue 45 item 3: each page opens with an example run and a short table; the specification below in short
# paragraphs. Pages that are generated (options.md), a record (mutation.md, first-hour.md: a session's own run) or
# a map of the code (layout.md) are not guides.
NOT_GUIDES = {"options.md", "mutation.md", "first-hour.md", "layout.md"}
GUIDES = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_GUIDES)


def opening(text: str) -> tuple[str | None, bool]:
    """The first fenced block's first line and whether a Markdown table follows it, before the page's first
    `##` section."""
    head = text.split("\n## ")[0]
    block = re.search(r"^```[a-z]*\n(.*?)\n", head, re.M)
    table = block is not None and re.search(r"^\|.*\|\n\|[-:| ]+\|$", head[block.end():], re.M) is not None
    return (block.group(1) if block else None), table


def long_paragraphs(text: str, most: int = 8) -> list[str]:
    """Prose paragraphs (not code, tables, headings or HTML; each list item on its own) longer than ``most`` lines,
    by their first words."""
    text = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    out = []
    for para in re.split(r"\n\s*\n|\n(?=\s{0,3}(?:[*-]|\d+\.) )", text):
        lines = [x for x in para.splitlines() if x.strip()]
        if lines and not lines[0].lstrip().startswith(("|", "#", "<", "!")) and len(lines) > most:
            out.append(" ".join(lines[0].split()[:8]))
    return out


@pytest.mark.parametrize("page", GUIDES)
def test_each_guide_opens_with_an_example_run_and_a_short_table(page):
    first, table = opening((ROOT / "docs" / page).read_text())
    assert first is not None and first.startswith("$ mtpbench "), (page, first)
    assert table, page


@pytest.mark.parametrize("page", GUIDES)
def test_no_paragraph_runs_over_eight_lines(page):
    assert long_paragraphs((ROOT / "docs" / page).read_text()) == []


def test_the_opening_and_paragraph_checks_see_what_they_should():
    good = "# T\n\nWhat it is.\n\n```console\n$ mtpbench env\nout\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## More\n"
    assert opening(good) == ("$ mtpbench env", True)
    assert opening(good.replace("| a | b |\n|---|---|\n| 1 | 2 |\n", "")) == ("$ mtpbench env", False)
    assert opening("# T\n\n## A\n```\n$ mtpbench env\n```\n") == (None, False)
    assert long_paragraphs("\n".join(["word"] * 9)) == ["word"]
    assert long_paragraphs("\n".join(["word"] * 8)) == []
    assert long_paragraphs("```\n" + "\n".join(["x"] * 20) + "\n```\n") == []
    assert long_paragraphs("\n".join(["* item", *["  more"] * 7] * 2)) == []  # two items of 8 lines
    assert long_paragraphs("\n".join(["* item", *["  more"] * 8])) == ["* item"]
