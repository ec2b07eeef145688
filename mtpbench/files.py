"""Writing result files: atomically, so an interrupted run never leaves a half-written one."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Write atomically, so an interrupted run never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=1) + "\n")
