"""What every synthetic builder shares: a tiny transformers model of the target architecture (its tensor
names are the checkpoint names vLLM's loaders expect), the tokenizer, and the writer.

Weights are random (seed 0, the architecture's own initialiser: normal(0, 0.02) for matrices, norms at
their identity), stored in bfloat16: vLLM's CPU MoE kernels and gated-delta-net layers accept no other.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

VOCAB = 2048  # the built-in tokenizer's vocabulary
DTYPE = "bfloat16"


@dataclass(frozen=True)
class Arch:
    """One vLLM MTP architecture that mtpbench can synthesise and trace."""

    name: str  # the CLI name, e.g. "deepseek-v3"
    mtp_class: str  # vLLM's registry key of the MTP draft model, e.g. "DeepSeekMTPModel"
    target: str  # the target model's architecture, as config.json names it
    build: Callable[[Path, int], None]  # writes config.json and model.safetensors with L MTP layers
    engine_args: dict = field(default_factory=dict)  # what vLLM needs for it on CPU
    mtp_layers: int = 2  # the matrix's L
    max_mtp_layers: int | None = None  # what vLLM's class loads at most (None: no limit known)
    method: str = "mtp"  # speculative_config["method"]
    separate_draft: bool = False  # the drafter is a checkpoint of its own, written to <out>/draft
    needs_torchvision_stub: bool = False  # vLLM's class imports transformers' vision processors
    note: str = ""


def transformers_tensors(config_class: str, model_class: str | None = None, **kwargs) -> tuple[dict, dict]:
    """(config dict, tensors) of a randomly initialised transformers model, as save_pretrained writes them
    (save_pretrained undoes transformers' in-memory fusions, so the names are the checkpoint's).
    ``model_class``: a transformers class name, for configs AutoModelForCausalLM does not map (vision-language
    wrappers); default AutoModelForCausalLM."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cfg = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(0)
    if model_class:
        model = getattr(transformers, model_class)(cfg).to(torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        config = json.loads((Path(tmp) / "config.json").read_text())
        tensors = {}
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(str(shard)))
    return config, tensors


def randn(*shape, std: float = 0.02):
    import torch

    g = torch.Generator().manual_seed(hash(shape) & 0xFFFF)
    return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)


def ones(*shape):
    import torch

    return torch.ones(*shape, dtype=torch.bfloat16)


def write_checkpoint(out: Path, config: dict, tensors: dict) -> None:
    """config.json, model.safetensors, the built-in tokenizer and a generation config."""
    from safetensors.torch import save_file

    from mtpbench.prompts import BUILTIN_MODEL_DIR

    out.mkdir(parents=True, exist_ok=True)
    config = {**config, "torch_dtype": DTYPE, "dtype": DTYPE, "vocab_size": VOCAB, "bos_token_id": 0,
              "eos_token_id": 0, "pad_token_id": 0}
    config.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file({n: t.contiguous() for n, t in sorted(tensors.items())}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BUILTIN_MODEL_DIR / name, out / name)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}))


def deepseek_style_mtp(tensors: dict, n_hidden: int, n_mtp: int, hidden: int, prefix: str = "model.",
                       embed_in_first: bool = False) -> dict:
    """DeepSeek-V3's MTP layout, shared by GLM and OpenPangu: MTP layer i is decoder layer n_hidden + i (built by
    transformers as an ordinary layer, under ``<prefix>layers``) plus enorm, hnorm, eh_proj and
    shared_head.{norm,head}. ``embed_in_first``: the first MTP layer also carries its own copy of the
    embedding, for the classes that load it from there and never from ``<prefix>embed_tokens``."""
    out = dict(tensors)
    for i in range(n_hidden, n_hidden + n_mtp):
        p = f"{prefix}layers.{i}."
        out[p + "enorm.weight"] = ones(hidden)
        out[p + "hnorm.weight"] = ones(hidden)
        out[p + "eh_proj.weight"] = randn(hidden, 2 * hidden)
        out[p + "shared_head.norm.weight"] = ones(hidden)
        out[p + "shared_head.head.weight"] = randn(VOCAB, hidden)
    if embed_in_first:
        out[f"{prefix}layers.{n_hidden}.embed_tokens.weight"] = tensors[f"{prefix}embed_tokens.weight"].clone()
    return out
