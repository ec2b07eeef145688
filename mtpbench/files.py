"""Writing result files: atomically (an interrupted run never leaves a half-written one), CSV from result rows,
and the output directory made or refused in one line."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

from mtpbench.errors import MtpBenchError


def write_text(path: Path, text: str) -> None:
    """Write atomically, so an interrupted run never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=1) + "\n")


def csv_text(fieldnames: list[str], rows: Iterable[dict]) -> str:
    """One CSV (header, then a line per row dict) as text, with "\\n" line ends."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fieldnames, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def blank_none(row) -> dict:
    """A dataclass row as a CSV row dict: None as an empty cell."""
    return {k: ("" if v is None else v) for k, v in asdict(row).items()}


def make_out_dir(out: Path) -> None:
    """Create the output directory (and its parents); one line naming it when it cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MtpBenchError(f"output directory is not writable: {out} ({e.strerror})") from None


def check_writable(out: Path | str) -> None:
    """An output directory that can be made or written, refused in one line before any work: empty, a file, or in a
    directory this user cannot write."""
    if not str(out).strip():
        raise MtpBenchError("--out is empty: give the directory to write into")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MtpBenchError(f"--out {out} is a file: give a directory (new, or one mtpbench wrote)")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise MtpBenchError(f"--out {out}: {probe} is a file, so the directory cannot be made there")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise MtpBenchError(f"output directory is not writable: {out}")
