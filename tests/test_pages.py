"""report.html for every kind of run, from real small runs, opened in headless Chromium as a person would: it loads
with no console error and no request beyond the file itself, its answer sentence is the one the numbers give, and
a screenshot is saved (``MTPBENCH_SCREENSHOTS=DIR`` keeps them); ``mtpbench report`` rebuilds each page."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from browser import chromium, visit
from typer.testing import CliRunner

from mtpbench.cli import app

runner = CliRunner()
SMALL = ["--num-prompts", "2", "--max-tokens", "8"]


def run(*args) -> None:
    r = runner.invoke(app, [*map(str, args)])
    assert r.exit_code in (0, 1), r.output  # check-lossless may exit 1 by design; the page is written either way


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pages")
    run("sweep", "--k", "0,1,2", "--mode", "reuse", "--repeats", "3", *SMALL, "--out", d / "sweep")
    run("sweep", "--k", "0,1,2", "--mode", "chain", "--repeats", "3", *SMALL, "--out", d / "sweep-chain")
    run("compare", d / "sweep", d / "sweep-chain", "--out", d / "compare", "--force")
    run("trace-layers", "--k", "4", "--mode", "chain", *SMALL, "--out", d / "trace")
    run("check-lossless", "--k", "2", "--temperature", "0", *SMALL, "--out", d / "lossless")
    run("tune", "--k", "0,1", "--batch-size", "1,2", "--repeats", "3", *SMALL, "--out", d / "tune")
    return {name: d / name for name in ("sweep", "compare", "trace", "lossless", "tune")}


def answer_in(page: Path) -> str:
    m = re.search(r'id="answer">(.*?)</p>', page.read_text())
    import html

    return html.unescape(m.group(1)) if m else ""


def expected_answer(kind: str, out: Path) -> str:
    """The sentence the numbers give, computed again from the saved JSON by the page's own function."""
    if kind == "sweep":
        from mtpbench.sweep.page import headline

        return headline([r for r in json.loads((out / "summary.json").read_text())["rows"] if r["category"] == "all"])[0]
    if kind == "trace":
        from mtpbench.trace.page import headline

        return headline(json.loads((out / "trace.json").read_text()))[0]
    if kind == "compare":
        from mtpbench.compare.page import headline

        return headline(json.loads((out / "compare.json").read_text()))[0]
    if kind == "lossless":
        from mtpbench.lossless.page import headline

        return headline(json.loads((out / "lossless.json").read_text()))[0]
    r = json.loads((out / "tune.json").read_text())["result"]
    return r["decision"][0].upper() + r["decision"][1:] + "."


KINDS = ["sweep", "compare", "trace", "lossless", "tune"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_run_writes_a_self_contained_page_that_answers_first(runs, kind):
    page = runs[kind] / "report.html"
    text = page.read_text()
    assert answer_in(page) == expected_answer(kind, runs[kind])
    assert text.index('id="answer"') < text.index("<img") if "<img" in text else True  # the answer before figures
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), "a page may fetch nothing"
    assert "<script src" not in text and "@import" not in text
    assert "data:image/png;base64," in text and "<table" in text and "Provenance" in text


@pytest.mark.parametrize("kind", KINDS)
def test_report_rebuilds_the_page(runs, kind, tmp_path):
    copy = tmp_path / kind
    shutil.copytree(runs[kind], copy)
    (copy / "report.html").unlink()
    r = runner.invoke(app, ["report", str(copy)])
    assert r.exit_code == 0, r.output
    assert answer_in(copy / "report.html") == answer_in(runs[kind] / "report.html")


@pytest.fixture(scope="module")
def browser_exe():
    exe = chromium()
    if exe is None:
        pytest.skip("no headless browser: Debian's chromium package is not installed (.ci/run installs it: "
                    "apt-get install chromium)")
    return exe


@pytest.mark.parametrize("kind", KINDS)
def test_each_page_opens_in_chromium_with_no_error_and_no_request(runs, kind, browser_exe, tmp_path):
    shots = Path(os.environ.get("MTPBENCH_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page = runs[kind] / "report.html"
    seen = visit(browser_exe, page, shots / f"{kind}.png")
    assert seen["console_errors"] == [] and seen["exceptions"] == [], seen
    outside = [u for u in seen["requests"] if not u.startswith(("file:", "data:"))]
    assert outside == [], outside
    assert seen["text"].strip() == expected_answer(kind, runs[kind])
    assert (shots / f"{kind}.png").stat().st_size > 10_000


@pytest.mark.vllm
def test_a_matrix_page_counts_the_verdicts_per_runner_and_opens_cleanly(tmp_path):
    from mtpbench.matrix.page import headline

    out = tmp_path / "matrix"
    run("trace-matrix", "--arch", "deepseek-v3,qwen3-next", "--out", out)
    cells = json.loads((out / "matrix.json").read_text())["cells"]
    said = answer_in(out / "report.html")
    assert said == headline(cells) and said.startswith("2 architectures. V1 as installed: ")
    assert "V1 forced: " in said
    exe = chromium()
    if exe is None:
        pytest.skip("no headless browser: Debian's chromium package is not installed")
    shots = Path(os.environ.get("MTPBENCH_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    seen = visit(exe, out / "report.html", shots / "matrix.png")
    assert seen["console_errors"] == [] and seen["exceptions"] == [], seen
    assert [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []
    assert seen["text"].strip() == said
