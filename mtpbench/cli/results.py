"""Commands over saved results, no model needed: ``mtpbench report`` (rebuild a sweep's or a trace-matrix's files)
and ``mtpbench compare`` (is B's difference from A real?)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import exit_if_partial, fail, plots_written, show, wrote
from mtpbench.cli.options import OUT, Wide
from mtpbench.errors import MtpBenchError


PAGE_ONLY = ("mtpbench.trace.page", "mtpbench.compare.page", "mtpbench.lossless.page", "mtpbench.drafter.page")


def report(out: Annotated[Path, typer.Argument(help="A sweep, tune, trace-matrix, trace-layers, compare, check-lossless or check-drafter output directory.")],
           wide: Wide = False) -> None:
    """Rebuild the table, summary.csv/json, plots and report.html from a sweep's saved JSON files (a tune's files
    from its sweeps, a trace-matrix's matrix.csv/md/png from its matrix.json; a trace's, compare's or
    check-lossless's or check-drafter's report.html from its JSON)."""
    from mtpbench.sweep.report import build
    from mtpbench.tune.report import is_tune_dir

    if not out.exists():
        fail(f"{out} does not exist")
    if is_tune_dir(out):
        from mtpbench.cli.tune import show_result
        from mtpbench.tune.report import build as build_tune

        try:
            result = build_tune(out)
        except MtpBenchError as e:
            fail(str(e))
        show_result(result, str(out))
        return
    if (out / "matrix.json").is_file() and not (out / "run.json").exists():
        from mtpbench.matrix import rebuild

        try:
            rebuild(out)
        except MtpBenchError as e:
            fail(str(e))
        typer.echo(Path(out, "matrix.md").read_text())
        wrote(out, "matrix.csv", "matrix.json", "matrix.md", "matrix.png")
        return
    from mtpbench.html.pages import kind_of, write_page

    if not (out / "run.json").exists() and kind_of(out) in PAGE_ONLY:
        write_page(out)  # its other files are written once, by the command
        wrote(out, "report.html")
        return
    try:
        rows = build(out)
    except MtpBenchError as e:
        fail(str(e))
    show(rows, out, wide)
    wrote(out, "summary.csv", "summary.json", *plots_written(out), "report.html")
    exit_if_partial(out)


def compare(
    a: Annotated[Path, typer.Argument(help="Sweep directory A (the reference).")],
    b: Annotated[Path, typer.Argument(help="Sweep directory B (the change).")],
    out: Annotated[str, typer.Option(*OUT, help="Where compare.csv/json/md/png go.")] = "compare",
    fail_if_worse: Annotated[Optional[float], typer.Option(help="Exit 1 when a metric of B is worse beyond noise by more than this many percent.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Compare runs that differ in model or prompts anyway.")] = False,
) -> None:
    """Is B's difference from A real? Paired intervals per metric, and better / worse / within noise."""
    import textwrap

    from mtpbench.compare import compare as run_compare, terminal_table, unjudged_beyond, worse_beyond
    from mtpbench.compare.page import headline as compare_headline
    from mtpbench.sweep.table import WIDTH, wrap
    from mtpbench.compare.pair import check_pct, exit_code

    try:
        if fail_if_worse is not None:
            check_pct(fail_if_worse)  # before the comparison: a refused threshold writes nothing
        result = run_compare(a, b, Path(out), force)
    except MtpBenchError as e:
        fail(str(e))
    # the answer first (report.html's headline, the same words), then what the reader must know before the table
    typer.echo(textwrap.fill(compare_headline(result)[0], WIDTH, break_on_hyphens=False) + "\n")
    typer.echo("differs: " + ("; ".join(result["differences"]) or "nothing in settings or versions"))
    for line in result["notes"]:
        typer.echo(wrap(f"note: {line}"))
    typer.echo("\n" + terminal_table(result))
    for f in result["failed"]:
        typer.echo(f"failed: {f['point']} in {f['failed_in']}: {f['error']}")
    wrote(out, "compare.csv", "compare.json", "compare.md", "compare.png", "report.html")
    if fail_if_worse is not None:
        unjudged = unjudged_beyond(result, fail_if_worse)
        if unjudged:
            typer.echo(f"moved by more than {fail_if_worse:g} % without an interval to judge it (more prompts, or "
                       f"--repeats 3 or more): {', '.join(unjudged[:5])}", err=True)
        code = exit_code(result, fail_if_worse)
        if code:
            bad = worse_beyond(result, fail_if_worse)
            typer.echo(f"worse beyond noise by more than {fail_if_worse:g} %: {', '.join(bad[:5])}", err=True)
            raise typer.Exit(code)
