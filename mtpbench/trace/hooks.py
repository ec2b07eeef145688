"""Forward wrapping on the live draft and target models: finds the MTP layers by structure and records one
``CallRecord`` per draft-model forward (or only forces ``spec_step_idx``, for timed runs)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from torch import nn

from mtpbench.errors import MtpBenchError
from mtpbench.trace.records import ABSENT, CallRecord

IDX_NAMES = ("spec_step_idx", "spec_step_index")


@dataclass
class Structure:
    wrapper: nn.Module
    ancestors: list[tuple[str, nn.Module]]  # the modules from the wrapper (excluded) down to the layers' holder
    layers: list[nn.Module]
    path: str  # where the layers sit, e.g. "model.mtp_layers"

    @property
    def predictor(self) -> nn.Module:
        """The layers' holder; which module between wrapper and layers really runs is seen while tracing."""
        return self.ancestors[-1][1] if self.ancestors else self.wrapper

    def describe(self) -> dict:
        return {"wrapper": type(self.wrapper).__name__, "predictor": type(self.predictor).__name__,
                "layers": f"{self.path} ({type(self.layers[0]).__name__} x{len(self.layers)})"}


def discover(draft: nn.Module) -> Structure:
    """Find the MTP layers (the shallowest container of same-class blocks with attention) and the modules
    between the wrapper and them; the tracer wraps them all, and the predictor is the deepest whose
    forward actually runs (vLLM's MiMoV2MTP keeps its layers in a holder, ``model.mtp.layers``, whose own
    forward never runs)."""
    queue = [("", draft, [])]
    while queue:
        name, mod, chain = queue.pop(0)
        for child_name, child in mod.named_children():
            path = f"{name}.{child_name}" if name else child_name
            if isinstance(child, (nn.ModuleList, nn.ModuleDict)) and len(child):
                blocks = list(child.values()) if isinstance(child, nn.ModuleDict) else list(child)
                if len({type(b) for b in blocks}) == 1 and any(
                        "attn" in n or "attention" in n for n, _ in blocks[0].named_modules()):
                    return Structure(draft, chain, blocks, path)
            queue.append((path, child, chain + [(path, child)]))
    raise MtpBenchError(f"unrecognised draft-model structure ({type(draft).__name__}): "
                        "no ModuleList/ModuleDict of MTP layers with attention found under it")


class ArgReader:
    """Reads named arguments of one forward's calls, positional or keyword, without binding each call."""

    def __init__(self, fn):
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        self.pos = {p.name: i for i, p in enumerate(params)
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
        self.idx_name = next((n for n in IDX_NAMES if n in self.pos), None)

    def get(self, args, kwargs, name):
        if name in kwargs:
            return kwargs[name]
        i = self.pos.get(name)
        return args[i] if i is not None and i < len(args) else None

    def spec_step_idx(self, args, kwargs):
        """As the callee received it; ABSENT when it was not passed (the default applies)."""
        for key in IDX_NAMES:  # keyword, or swallowed into **kwargs
            if key in kwargs:
                return _as_int(kwargs[key])
        if self.idx_name is not None:
            i = self.pos[self.idx_name]
            if i < len(args):
                return _as_int(args[i])
        return ABSENT

    def with_spec_step_idx(self, args, kwargs, value: int):
        """The same call with spec_step_idx = value (in its positional slot if it was given there)."""
        if self.idx_name is not None:
            i = self.pos[self.idx_name]
            if i < len(args):
                return args[:i] + (value,) + args[i + 1:], kwargs
            return args, {**kwargs, self.idx_name: value}
        return args, {**kwargs, "spec_step_idx": value}

    def num_tokens(self, args, kwargs) -> int:
        for key in ("input_ids", "positions"):
            t = self.get(args, kwargs, key)
            if t is not None and hasattr(t, "numel"):
                return int(t.numel()) if key == "input_ids" else int(t.shape[-1])
        return 0


def _as_int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return str(v)


class Patches:
    """Methods replaced on live objects (an instance attribute over the class's method), and undone in reverse:
    the wrapper sees the original and an ``ArgReader`` of it (``functools.wraps`` keeps the signature readable by
    a second patch stacked on this one)."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []

    def patch(self, obj, attr: str, make) -> None:
        orig = getattr(obj, attr)
        self._undo.append((obj, attr, obj.__dict__.get(attr, _MISSING)))
        setattr(obj, attr, functools.wraps(orig)(make(orig, ArgReader(orig))))

    def undo(self) -> None:
        for obj, attr, old in reversed(self._undo):
            if old is _MISSING:
                obj.__dict__.pop(attr, None)
            else:
                setattr(obj, attr, old)
        self._undo.clear()


class LayerTracer:
    """Wraps forward methods on live modules; ``enabled`` gates recording (off during engine start-up).

    ``record=False`` (with ``force_spec_step_idx``) only forces the index: it wraps the target forward (to
    count draft steps), the wrapper's forward and its logits call, keeps no record and leaves the predictor
    and the layers unwrapped, so a timed run pays a few Python calls per draft step and no memory."""

    def __init__(self, draft: nn.Module, target: nn.Module, force_spec_step_idx: bool = False,
                 record: bool = True):
        if not record and not force_spec_step_idx:
            raise ValueError("a tracer that neither records nor forces does nothing")
        self.structure = discover(draft)
        self.target = target
        self.force = force_spec_step_idx
        self.record = record
        self.enabled = False
        self.records: list[CallRecord] = []
        self.batch = 0
        self.proposal = 0
        self.step = 0
        self.current_step: int | None = None  # the draft step of the call in progress
        self.current: CallRecord | None = None
        self.draft_error: str | None = None  # an exception raised inside the draft model's forward
        self._depth: dict[str, int] = {}  # depth of each wrapped module between wrapper and layers
        self._patches = Patches()

    @property
    def num_layers(self) -> int:
        return len(self.structure.layers)

    def _patch(self, obj, attr: str, make):
        self._patches.patch(obj, attr, make)

    def install(self) -> "LayerTracer":
        s = self.structure
        self._patch(self.target, "forward", self._target_forward)
        self._patch(s.wrapper, "forward", self._wrapper_forward)
        for attr in ("compute_logits", "get_top_tokens"):
            if hasattr(s.wrapper, attr):
                self._patch(s.wrapper, attr, self._logits_call)
        if not self.record:
            return self
        for depth, (path, module) in enumerate(s.ancestors):
            if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):  # containers have no forward of their own
                self._depth[path] = depth
                self._patch(module, "forward", lambda orig, sig, path=path: self._predictor_forward(orig, sig, path))
        for j, layer in enumerate(s.layers):
            self._patch(layer, "forward", lambda orig, sig, j=j: self._layer_forward(orig, sig, j))
        return self

    def remove(self) -> None:
        self._patches.undo()

    def start_batch(self) -> None:
        self.batch += 1
        self.step = 0

    # -- wrapped forwards --------------------------------------------------------------------------

    def _target_forward(self, orig, sig):
        def forward(*args, **kwargs):
            if self.enabled:
                self.proposal += 1
                self.step = 0
            return orig(*args, **kwargs)
        return forward

    def _wrapper_forward(self, orig, sig):
        def forward(*args, **kwargs):
            if not self.enabled:
                return orig(*args, **kwargs)
            s = self.current_step = self.step
            self.step += 1
            if not self.record:  # forcing only
                args, kwargs = sig.with_spec_step_idx(args, kwargs, s)
                return orig(*args, **kwargs)
            rec = CallRecord(self.batch, self.proposal, s, wrapper_spec_step_idx=sig.spec_step_idx(args, kwargs),
                             expected_layer=s % self.num_layers, num_tokens=sig.num_tokens(args, kwargs))
            if self.force:
                args, kwargs = sig.with_spec_step_idx(args, kwargs, s)
                rec.wrapper_spec_step_idx, rec.forced = s, True
            if not self._depth:  # layers sit right under the wrapper
                rec.predictor_spec_step_idx = rec.wrapper_spec_step_idx
            self.current = rec
            self.records.append(rec)
            try:
                return orig(*args, **kwargs)
            except Exception as e:  # raised inside the draft model: the model refused this step
                self.draft_error = self.draft_error or f"{type(e).__name__}: {e}".strip()[:2000]
                raise
        return forward

    def _logits_call(self, orig, sig):
        def call(*args, **kwargs):
            if self.enabled and self.current_step is not None:
                if self.current is not None:
                    self.current.logits_spec_step_idx = sig.spec_step_idx(args, kwargs)
                if self.force and sig.idx_name is not None:
                    args, kwargs = sig.with_spec_step_idx(args, kwargs, self.current_step)
            try:
                return orig(*args, **kwargs)
            except Exception as e:  # the draft model's head raised (e.g. MiMo's unbounded layer index)
                if self.enabled:
                    self.draft_error = self.draft_error or f"{type(e).__name__}: {e}".strip()[:2000]
                raise
        return call

    def _predictor_forward(self, orig, sig, path: str):
        def forward(*args, **kwargs):
            rec = self.current
            # the deepest module that runs between wrapper and layers is the predictor
            if self.enabled and rec is not None and (not rec.predictor or self._depth[path] >= self._depth[rec.predictor]):
                rec.predictor, rec.predictor_spec_step_idx = path, sig.spec_step_idx(args, kwargs)
            return orig(*args, **kwargs)
        return forward

    def _layer_forward(self, orig, sig, j: int):
        def forward(*args, **kwargs):
            if self.enabled and self.current is not None:
                rec = self.current
                if rec.executed_layer is None:
                    rec.executed_layer = j
                    rec.layer_spec_step_idx = sig.spec_step_idx(args, kwargs)
                else:
                    if not rec.layers_run:
                        rec.layers_run = str(rec.executed_layer)
                    rec.layers_run += f" {j}"
                    rec.executed_layer = -1  # several layers in one call
            return orig(*args, **kwargs)
        return forward


_MISSING = object()


def force_spec_step_idx(draft: nn.Module, target: nn.Module) -> LayerTracer:
    """``--force-spec-step-idx`` for timed runs: every draft call from now on gets spec_step_idx = its draft
    step, and nothing is recorded (``tracer.remove()`` undoes it)."""
    tracer = LayerTracer(draft, target, force_spec_step_idx=True, record=False).install()
    tracer.enabled = True
    return tracer
