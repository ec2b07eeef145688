"""What the engine fed its MTP module and what each stage of it produced, at every draft step: forward hooks on
the live draft and target models (the same discovery as the layer tracer, ``trace.hooks.discover``), usable in
the native engine and inside a vLLM worker (``backends/vllm/plugin.py``). Imports torch and the trace hooks only.

One record per draft-model call: its step in the proposal, the spec_step_idx it was given, the token ids,
positions and previous hidden states it was handed, each stage's input and output (``families``' pointers) and
the logits call after it. One record per target forward: its positions, its output and its final norm's first
call's input (the hidden before the norm, the residual added where the norm is fused) and output. Rows are flattened to [tokens, hidden],
float32, on the CPU.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from mtpbench.trace.hooks import Patches, discover

# the target's final norm: most models, the native ones, Nemotron-H, a multimodal wrapper's text model
TARGET_NORMS = ("model.norm", "body.norm", "model.norm_f", "language_model.model.norm")


def _rows(t) -> torch.Tensor | None:
    if not isinstance(t, torch.Tensor):
        return None
    t = t.detach().float().cpu().clone()  # the engine may write into its buffers later
    return t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(-1)


def _flat(t) -> torch.Tensor | None:
    return t.detach().cpu().clone().reshape(-1) if isinstance(t, torch.Tensor) else None


def _positions(t) -> torch.Tensor | None:
    """A call's positions, one per token: M-RoPE's [3, tokens] (multimodal models) gives its first row, which a
    text token shares with the other two."""
    return _flat(t[0] if isinstance(t, torch.Tensor) and t.dim() == 2 else t)


def module_input(args, kwargs) -> torch.Tensor | None:
    """A stage's input: its first tensor argument (``hidden_states`` / ``x``), plus the residual where the
    module adds one first (vLLM's fused add-norm ``norm(x, residual)``, a decoder layer given a residual)."""
    x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
    if not isinstance(x, torch.Tensor):
        return None
    res = args[1] if len(args) > 1 else kwargs.get("residual")
    if isinstance(res, torch.Tensor) and res.shape == x.shape:
        x = x + res
    return _rows(x)


def module_output(out, summed: bool) -> torch.Tensor | None:
    """A stage's output: a norm's normed tensor (the first of vLLM's ``(out, residual)``), or a decoder layer's
    hidden plus residual (``summed``: vLLM's layers return them apart and the MTP layer adds them)."""
    if isinstance(out, (tuple, list)):
        if summed and len(out) > 1 and isinstance(out[1], torch.Tensor) and isinstance(out[0], torch.Tensor):
            return _rows(out[0] + out[1])
        out = out[0]
    return _rows(out)


def resolve(structure, path: str, j: int) -> nn.Module | None:
    where, _, rest = path.partition(".")
    mod = structure.layers[j] if where == "layer" else structure.predictor
    for attr in filter(None, rest.split(".")):
        mod = getattr(mod, attr, None)
        if mod is None:
            return None
    return mod


class DraftCapture:
    """Install on (draft, target), set ``enabled``, run, read ``calls`` and ``targets``; ``remove()`` undoes it."""

    def __init__(self, draft: nn.Module, target: nn.Module, modules: dict[str, tuple[str, str]]):
        self.structure = discover(draft)
        self.draft, self.target, self.modules = draft, target, modules
        self.enabled = False
        self.calls: list[dict] = []
        self.targets: list[dict] = []
        self.current: dict | None = None
        self.phase = "forward"
        self.proposal = 0
        self.step = 0
        self.missing: list[str] = []  # stage pointers that name no module of this draft model
        self._handles: list = []
        self._patches = Patches()

    # ---- installation ----

    def install(self) -> "DraftCapture":
        self._patch(self.target, "forward", self._target_forward)
        self._patch(self.draft, "forward", self._draft_forward)
        if hasattr(self.draft, "compute_logits"):
            self._patch(self.draft, "compute_logits", self._logits_call)
        norm = next((m for p in TARGET_NORMS if (m := _get(self.target, p)) is not None), None)
        if norm is not None:
            self._handles.append(norm.register_forward_hook(self._target_norm, with_kwargs=True))
        for stage, (path, side) in self.modules.items():
            shared = path.startswith("pred")
            found = False
            for j in ([None] if shared else range(len(self.structure.layers))):
                mod = resolve(self.structure, path, 0 if j is None else j)
                if mod is None:
                    continue
                found = True
                hook = functools.partial(self._stage, stage, side, j)
                self._handles.append(mod.register_forward_hook(hook, with_kwargs=True))
            if not found:
                self.missing.append(f"{stage}: {path}")
        return self

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._patches.undo()

    def _patch(self, obj, attr: str, make) -> None:
        self._patches.patch(obj, attr, make)

    # ---- the hooks ----

    def _target_forward(self, orig, sig):
        def forward(*args, **kwargs):
            if self.enabled:
                self.proposal += 1
                self.step = 0
                self.targets.append({"proposal": self.proposal,
                                     "positions": _positions(sig.get(args, kwargs, "positions")),
                                     "pre": None, "post": None})
            out = orig(*args, **kwargs)
            if self.enabled:
                self.targets[-1]["out"] = module_output(out, summed=False)
            return out
        return forward

    def _target_norm(self, module, args, kwargs, out):
        if self.enabled and self.targets and self.targets[-1]["pre"] is None:
            self.targets[-1]["pre"] = module_input(args, kwargs)
            self.targets[-1]["post"] = module_output(out, summed=False)

    def _draft_forward(self, orig, sig):
        def forward(*args, **kwargs):
            if not self.enabled:
                return orig(*args, **kwargs)
            idx = sig.spec_step_idx(args, kwargs)
            self.current = {"proposal": self.proposal, "step": self.step, "spec_step_idx": idx,
                            "input_ids": _flat(sig.get(args, kwargs, "input_ids")),
                            "positions": _positions(sig.get(args, kwargs, "positions")),
                            "h_prev": _rows(sig.get(args, kwargs, "hidden_states")), "stages": {}, "logits": []}
            self.calls.append(self.current)
            self.step += 1
            self.phase = "forward"
            try:
                return orig(*args, **kwargs)
            finally:
                self.phase = "after"
        return forward

    def _logits_call(self, orig, sig):
        def call(*args, **kwargs):
            if not (self.enabled and self.current is not None):
                return orig(*args, **kwargs)
            self.phase = "logits"
            try:
                out = orig(*args, **kwargs)
            finally:
                self.phase = "after"
            hidden = args[0] if args else kwargs.get("hidden_states")
            self.current["logits"].append({"in": _rows(hidden), "out": _rows(out)})
            return out
        return call

    def _stage(self, stage, side, j, module, args, kwargs, out):
        if not self.enabled or self.current is None or self.phase == "after":
            return
        rec = {"j": j, "phase": self.phase}
        if side in ("", "in"):
            rec["in"] = module_input(args, kwargs)
        if side in ("", "out"):
            rec["out"] = module_output(out, summed=stage.startswith("block"))
        self.current["stages"].setdefault(stage, []).append(rec)


def _get(mod: nn.Module, path: str) -> nn.Module | None:
    for attr in path.split("."):
        mod = getattr(mod, attr, None)
        if mod is None:
            return None
    return mod

