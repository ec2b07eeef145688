"""Where mtpbench's own files are: the shipped assets and data in the package, and its cache."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).parent
BUILTIN_MODEL_DIR = PACKAGE / "assets" / "tiny"  # the built-in model
GLM_MTP_DIR = PACKAGE / "assets" / "glm_mtp"  # builtin-glm's fine-tuned MTP layers: mtp.safetensors + finetune.json
DATA_DIR = PACKAGE / "data"
SPEC_BENCH = DATA_DIR / "spec_bench_question.jsonl"
SHIMS_DIR = PACKAGE / "shims"  # import shims for engine processes only


def cache_dir(*parts: str) -> Path:
    """mtpbench's cache, ``$XDG_CACHE_HOME/mtpbench/...`` (``~/.cache`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).joinpath("mtpbench", *parts)
