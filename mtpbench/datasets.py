"""vLLM's benchmark datasets, implemented after ``vllm bench``'s definitions (``vllm/benchmarks/datasets``):

* ``random`` (``--prompts random``): per request a prompt of ``input_len`` random token ids of the model's vocabulary
  (special tokens left out), its length uniform over the integers in [floor(n (1 - r)), ceil(n (1 + r))] with
  n = ``input_len`` less the special tokens the tokenizer adds, r = ``range_ratio`` in [0, 1); decoded to text and
  read back, and cut or topped up until it reads back as that many tokens (a few tries; where they do not converge,
  a token or two off, as vLLM warns of the same). Seeded (numpy's default_rng): the same seed, the same prompts. Unlike vLLM's, the output length is the
  run's one --max-tokens (every backend decodes a batch to one length): the range ratio spreads the inputs only.
* ShareGPT (``--prompts FILE.json``): a JSON list of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", ...}, ...]}``; a conversation's first turn (the human's) is the prompt, as vLLM's ShareGPTDataset
  takes it, and conversations with fewer than two turns are left out, as vLLM leaves them out. vLLM also drops
  prompts under 4 or over 1024 tokens; mtpbench keeps every one, in file order (--num-prompts takes the first).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from mtpbench.errors import MtpBenchError

RETRIES = 10  # decode / read back rounds before a prompt's length is kept as it reads back


def length_range(input_len: int, range_ratio: float, num_special: int = 0) -> tuple[int, int]:
    """The prompt lengths the random dataset draws from, ends included (vLLM's ``get_sampling_params``)."""
    n = max(0, input_len - num_special)
    return math.floor(n * (1 - range_ratio)), math.ceil(n * (1 + range_ratio))


def random_lengths(num: int, input_len: int, range_ratio: float, seed: int, num_special: int = 0) -> list[int]:
    """``num`` prompt lengths, uniform over ``length_range``; at least 1 token each."""
    low, high = length_range(input_len, range_ratio, num_special)
    if high < 1:
        raise MtpBenchError(f"--random-input-len {input_len}: the tokenizer adds {num_special} special token(s), "
                            f"which leaves no room for a prompt")
    rng = np.random.default_rng(seed)
    return [max(1, int(n)) for n in rng.integers(low, high + 1, size=num)]


def random_token_prompts(tokenizer, num: int, input_len: int, range_ratio: float, seed: int) -> list[tuple[str, int]]:
    """``num`` random prompts as (text, the tokens it reads back as) through a ``tokenizers.Tokenizer``."""
    num_special = len(tokenizer.encode("", add_special_tokens=True).ids)
    lengths = random_lengths(num, input_len, range_ratio, seed, num_special)
    special = set(tokenizer.get_added_tokens_decoder())
    allowed = np.array([i for i in range(tokenizer.get_vocab_size()) if i not in special])
    rng = np.random.default_rng([seed, 1])  # the tokens' own stream: the lengths stay those of random_lengths
    out = []
    for n in lengths:
        ids = allowed[rng.integers(0, len(allowed), size=n)].tolist()
        for _ in range(RETRIES):
            text = tokenizer.decode(ids, skip_special_tokens=False)
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) == n:
                break
            ids = ids[:n] + allowed[rng.integers(0, len(allowed), size=max(0, n - len(ids)))].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        out.append((text, len(tokenizer.encode(text, add_special_tokens=False).ids)))
    return out


def read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(id, first turn) of every usable conversation of a ShareGPT-format JSON file; a file that is not
    one is refused in one line naming what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise MtpBenchError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise MtpBenchError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, list):
        raise MtpBenchError(f"{path}: a ShareGPT file is a JSON list of conversations, got {type(data).__name__}")
    out = []
    for i, row in enumerate(data):
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            raise MtpBenchError(f"{path}: entry {i} has no 'conversations' list (ShareGPT format)")
        if len(turns) < 2:  # vLLM's ShareGPTDataset keeps conversations of two turns or more
            continue
        first = turns[0]
        if not isinstance(first, dict) or not isinstance(first.get("value"), str):
            raise MtpBenchError(f"{path}: entry {i}: a turn is {{\"from\": ..., \"value\": \"...\"}}")
        if not first["value"]:
            continue
        out.append((str(row.get("id", i)), first["value"]))
    if not out:
        raise MtpBenchError(f"{path}: no conversation of two turns or more with a prompt (ShareGPT format)")
    return out


def check_random(cfg) -> None:
    """vLLM's random dataset's options: only with --prompts random, each in vLLM's range."""
    defaults = type(cfg)()  # a SweepConfig
    given = [f"--{n.replace('_', '-')}" for n in ("random_input_len", "random_output_len", "random_range_ratio")
             if getattr(cfg, n) != getattr(defaults, n)]
    if cfg.prompts != "random":
        if given:
            raise MtpBenchError(f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to --prompts random "
                                f"(vLLM's random dataset)")
        return
    if cfg.random_input_len < 1:
        raise MtpBenchError(f"--random-input-len must be >= 1, got {cfg.random_input_len}")
    if cfg.random_output_len is not None and cfg.random_output_len < 1:
        raise MtpBenchError(f"--random-output-len must be >= 1, got {cfg.random_output_len}")
    if not 0.0 <= cfg.random_range_ratio < 1.0:
        raise MtpBenchError(f"--random-range-ratio must be in [0, 1), got {cfg.random_range_ratio}")
    if cfg.context_tokens and any(cfg.context_tokens):
        raise MtpBenchError("--context-tokens puts held-out text of a prompt set before each prompt: --prompts "
                            "random has none (lengthen the prompts with --random-input-len)")
