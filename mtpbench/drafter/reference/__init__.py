"""An independent reference of a checkpoint's MTP block, written from the architecture's definition: the tensors
read from the checkpoint's safetensors by name (never from a loaded engine), the stages in plain torch, in
float32. No vLLM import, and no import of mtpbench's own native model either.

``Reference.stage(name, x)`` computes one stage from the input the engine gave it; ``decoder`` is the block's
decoder layer where this package holds one for the family (``qwen2``: the built-in models' dense layer), else
None and check-drafter checks the engine's layer only through its input and the stages around it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mtpbench.drafter.families import Family
from mtpbench.drafter.reference.dense import DenseBlock, dense_block


def norm(x: torch.Tensor, w: torch.Tensor, eps: float, kind: str) -> torch.Tensor:
    """RMSNorm in float32: x / rms(x) * w, or Gemma's x / rms(x) * (1 + w)."""
    x = x.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + w) if kind == "gemma" else w)


class Tensors:
    """Lazy reads of one checkpoint's safetensors (one file or an index), as float32."""

    def __init__(self, model_dir: Path):
        from safetensors import safe_open

        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.exists():
            where = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(str(self.dir / "model.safetensors"), "pt") as f:
                where = {k: "model.safetensors" for k in f.keys()}
        self.where = where
        self._cache: dict[str, torch.Tensor] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            from safetensors import safe_open

            with safe_open(str(self.dir / self.where[name]), "pt") as f:
                self._cache[name] = f.get_tensor(name).float()
        return self._cache[name]

    def under(self, prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: self[k] for k in self.where if k.startswith(prefix)}


class Reference:
    """The MTP layers of one checkpoint, stage by stage."""

    def __init__(self, model_dir: Path, family: Family, cfg: dict):
        self.family, self.cfg = family, cfg
        self.t = Tensors(model_dir)
        self.eps = float(cfg.get(family.eps, 1e-6))
        self.num_layers = int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 1)
        self.decoders: dict[int, DenseBlock | None] = {}
        self.why_no_decoder = ""

    def w(self, key: str, j: int) -> torch.Tensor:
        return self.t[self.family.tensor(key, self.cfg, j)]

    def missing(self) -> list[str]:
        """The checkpoint tensors the reference needs and the checkpoint lacks (every MTP layer)."""
        names = [self.family.tensor("embed", self.cfg, 0)] + [
            self.family.tensor(k, self.cfg, j) for j in range(self.num_layers)
            for k in ("enorm", "hnorm", "proj", "final_norm", "head")]
        return [n for n in names if n not in self.t]

    def target_norm(self, x: torch.Tensor) -> torch.Tensor | None:
        """The target's final norm (``model.norm.weight`` unless the family names another), where the checkpoint
        holds it."""
        name = self.family.tensor("target_norm", self.cfg, 0)
        return norm(x, self.t[name], self.eps, self.family.norm) if name in self.t else None

    def head_copies_that_differ(self) -> list[str]:
        """The MTP layers' own copies of the shared output head (DeepSeek's shared_head.head) that differ from
        the head the architecture shares (a real checkpoint stores lm_head's values there)."""
        if "head_copy" not in self.family.names:
            return []
        names = [self.family.tensor("head_copy", self.cfg, j) for j in range(self.num_layers)]
        head = self.t[self.family.names["head"]]
        return [n for n in names if n in self.t and not torch.equal(self.t[n], head)]

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        e = self.t[self.family.tensor("embed", self.cfg, 0)][ids.long()]
        if self.family.mask_pos0:
            e = torch.where(positions.reshape(-1, 1) == 0, 0.0, e)
        return e

    def stage(self, name: str, x, j: int):
        f = self.family
        if name in ("enorm", "hnorm", "final norm"):
            return norm(x, self.w({"final norm": "final_norm"}.get(name, name), j), self.eps, f.norm)
        if name == "concat":
            e, h = x
            return torch.cat([e, h] if f.order == "eh" else [h, e], dim=-1)
        if name == "proj":
            return x.float() @ self.w("proj", j).T
        if name == "head":
            h = norm(x, self.w("final_norm", j), self.eps, f.norm) if f.head_norms else x.float()
            return h @ self.w("head", j).T
        raise KeyError(name)

    def decoder(self, j: int) -> DenseBlock | None:
        """Layer j's decoder layer, independent of any engine, or None (``why_no_decoder`` says why)."""
        if j not in self.decoders:
            block, self.why_no_decoder = dense_block(self.family, self.t, self.cfg, j, self.eps)
            self.decoders[j] = block
        return self.decoders[j]
