"""Which page a run directory gets: by the file that marks its kind (a tune directory holds sweeps, so it is asked
first)."""

from __future__ import annotations

from pathlib import Path

KINDS = [("tune.json", "mtpbench.tune.page"), ("summary.json", "mtpbench.sweep.page"),
         ("matrix.json", "mtpbench.matrix.page"), ("trace.json", "mtpbench.trace.page"),
         ("compare.json", "mtpbench.compare.page"), ("lossless.json", "mtpbench.lossless.page"),
         ("drafter.json", "mtpbench.drafter.page")]


def kind_of(out: Path) -> str | None:
    return next((module for marker, module in KINDS if (Path(out) / marker).is_file()), None)


def write_page(out: Path) -> Path | None:
    """report.html for ``out`` (None: not a run directory mtpbench knows)."""
    import importlib

    module = kind_of(out)
    return importlib.import_module(module).page(Path(out)) if module else None


def render(page, out: Path) -> Path | None:
    """``page(out)``, the last file a run writes: where it fails, one warning line and the run's other files stand
    (a page is a view of them; its tests are tests/test_pages.py)."""
    import sys

    try:
        return page(Path(out))
    except Exception as e:  # never lose a finished run to its page
        print(f"warning: {out}/report.html not written ({type(e).__name__}: {e})"[:500], file=sys.stderr)
        return None
