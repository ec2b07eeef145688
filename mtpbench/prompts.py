"""Prompt sets: the built-in code prompts, MT-Bench / Spec-Bench JSONL, and plain {"prompt": ...} JSONL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mtpbench.errors import MtpBenchError

BUILTIN_MODEL_DIR = Path(__file__).parent / "assets" / "tiny"


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "none"
    id: str = ""


def load_prompts(spec: str, num_prompts: int | None = None) -> list[Prompt]:
    """``builtin`` or a path to a JSONL file. MT-Bench lines use their first turn."""
    path = BUILTIN_MODEL_DIR / "prompts.jsonl" if spec == "builtin" else Path(spec)
    if not path.is_file():
        raise MtpBenchError(f"prompts file not found: {path}")
    try:
        text_lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise MtpBenchError(f"{path}: not UTF-8 text") from None
    out = []
    for lineno, line in enumerate(text_lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MtpBenchError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise MtpBenchError(f"{path}:{lineno}: expected a JSON object")
        if isinstance(row.get("turns"), list) and row["turns"] and isinstance(row["turns"][0], str):
            text = row["turns"][0]
        elif isinstance(row.get("prompt"), str):
            text = row["prompt"]
        else:
            raise MtpBenchError(f"{path}:{lineno}: needs a 'prompt' string or a non-empty 'turns' list")
        if not text:
            raise MtpBenchError(f"{path}:{lineno}: empty prompt")
        out.append(Prompt(text, str(row.get("category", "code" if spec == "builtin" else "none")),
                          str(row.get("question_id", row.get("id", lineno)))))
    if not out:
        raise MtpBenchError(f"{path}: no prompts")
    return out[:num_prompts] if num_prompts else out


def batches(prompts: list[Prompt], batch_size: int) -> list[list[Prompt]]:
    """Batches that never mix categories, so per-category timing is exact."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    return [g[i: i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)]
