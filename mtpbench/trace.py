"""``mtpbench trace-layers``: which MTP layer serves each draft step, and is that right?

The tracer wraps, on the live draft model, the ``forward`` of the wrapper (e.g. vLLM's ``MiMoMTP``), of
the inner predictor and of every MTP layer, plus the target model's ``forward``. Instance ``forward`` is
wrapped rather than hooked because classes under vLLM's ``@support_torch_compile`` replace ``__call__``.
Arguments are bound to each forward's signature, so a positional ``spec_step_idx`` is read too; one that
was never passed is recorded as ``absent``. The draft step s of a call is its order among the draft calls
since the last target forward. The MTP layers are found by structure (the first ModuleList/ModuleDict of
same-class blocks under the draft model), not by class name.

Output: ``trace.csv`` (one row per draft-model forward), ``trace.json`` (summary, verdict, evidence) and
``layers.png`` (draft step x MTP layer execution counts).
"""

from __future__ import annotations

import csv
import functools
import inspect
import io
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

from torch import nn

from mtpbench.errors import MtpBenchError

ABSENT = "absent"
IDX_NAMES = ("spec_step_idx", "spec_step_index")


@dataclass
class CallRecord:
    """One draft-model forward."""

    batch: int  # which generate call of the traced run
    proposal: int  # target forwards seen before this call: one proposal per verify step
    draft_step: int
    wrapper_spec_step_idx: int | str = ABSENT
    predictor_spec_step_idx: int | str = ABSENT
    layer_spec_step_idx: int | str = ABSENT
    logits_spec_step_idx: int | str = ABSENT
    executed_layer: int | None = None  # -1: several layers ran in this one call
    expected_layer: int = 0
    num_tokens: int = 0
    forced: bool = False  # --force-spec-step-idx put the step into this call
    predictor: str = ""  # the module between wrapper and layers whose forward ran (its path)
    layers_run: str = ""  # every layer that ran in this call, in order ("0 1 2"), when there were several


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
        self._undo: list[tuple[nn.Module, str, object]] = []

    @property
    def num_layers(self) -> int:
        return len(self.structure.layers)

    def _patch(self, obj, attr: str, make):
        orig = getattr(obj, attr)
        self._undo.append((obj, attr, obj.__dict__.get(attr, _MISSING)))
        # functools.wraps keeps the signature readable by a second tracer stacked on this one
        setattr(obj, attr, functools.wraps(orig)(make(orig, ArgReader(orig))))

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
        for obj, attr, old in reversed(self._undo):
            if old is _MISSING:
                obj.__dict__.pop(attr, None)
            else:
                setattr(obj, attr, old)
        self._undo.clear()

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


@dataclass
class Verdict:
    verdict: str
    evidence: list[str] = field(default_factory=list)
    unused_layers: list[int] = field(default_factory=list)
    unused_layer_bytes: int = 0


VERDICTS = ("multi-module", "layer-0 reuse", "swallowed", "multi-layer calls", "mismatch", "inconclusive",
            "crashed", "engine error")


def _is_zero_or_absent(v) -> bool:
    return v == ABSENT or v == 0


def judge(records: list[CallRecord], num_layers: int, k: int, layer_bytes: list[int],
          crash: str | None = None, crash_in_draft: bool = True) -> Verdict:
    """The verdict and the evidence behind it (see the README for what each verdict means).

    Judged from what executed first (which layer ran at each step), then from what was passed. A layer
    counts as unused only if a correct schedule at this k (step s runs layer s mod L) would have run it.
    ``crash_in_draft``: the exception was raised inside the draft model's forward (else the engine's)."""
    if crash and crash_in_draft:
        step = next((r.draft_step for r in reversed(records)), None)
        where = f" at draft step {step}" if step is not None else ""
        return Verdict("crashed", [f"the draft model raised{where}: {crash}"])
    if crash:
        return Verdict("engine error", [f"the engine raised outside the draft model (not a drafting verdict): {crash}"])
    if not records:
        return Verdict("mismatch", ["no draft-model call was recorded: the wrapped forwards never ran "
                                    "(drafting off, or a compiled/graph-replayed draft model)"])
    # a call in which no MTP layer ran tells nothing about the schedule: judge from the calls that ran one
    silent = [r for r in records if r.executed_layer is None]
    if len(silent) == len(records):
        return Verdict("inconclusive", [
            f"none of the {len(records)} draft calls ran an MTP layer the tracer could see: the layers' "
            "forwards were skipped or replaced (a compiled or fused path, or a draft model that bypasses its "
            "layers), so which layer serves a draft step was not observed",
            "spec_step_idx received by the wrapper: " + ", ".join(sorted({str(r.wrapper_spec_step_idx)
                                                                          for r in records}))])
    v = _judge_observed([r for r in records if r.executed_layer is not None], num_layers, k, layer_bytes)
    if silent:
        v.evidence.append(f"{len(silent)} of {len(records)} draft calls (at step(s) "
                          f"{sorted({r.draft_step for r in silent})}) ran no MTP layer: judged from the others")
    return v


def _judge_observed(records: list[CallRecord], num_layers: int, k: int, layer_bytes: list[int]) -> Verdict:
    """The verdict from calls that each ran at least one MTP layer."""
    by_step: dict[int, Counter] = {}
    for r in records:
        by_step.setdefault(r.draft_step, Counter())[r.executed_layer if r.executed_layer != -1 else "all"] += 1
    steps = "; ".join(f"step {s}: " + ", ".join(f"layer {j} x{n}" for j, n in sorted(c.items(), key=str))
                      for s, c in sorted(by_step.items()))
    scheduled = sorted({s % num_layers for s in range(k)})  # what a correct schedule at this k runs
    ran = {r.executed_layer for r in records}
    unused = [j for j in scheduled if j not in ran and -1 not in ran]
    unused_bytes = sum(layer_bytes[j] for j in unused if j < len(layer_bytes))
    wrapper_seen = sorted({str(r.wrapper_spec_step_idx) for r in records})
    never_reached = all(_is_zero_or_absent(r.wrapper_spec_step_idx) for r in records)

    decisive = sorted({r.draft_step for r in records if r.draft_step % num_layers != 0})  # steps that tell
    multi = [r for r in records if r.executed_layer == -1]
    if multi:
        return Verdict("multi-layer calls", [
            f"{len(multi)} of {len(records)} draft calls ran several MTP layers in one call (first: layers "
            f"{multi[0].layers_run} at step {multi[0].draft_step}): the drafter chains its layers inside one "
            "forward, so no step-to-layer schedule applies", f"layers run per step: {steps}"])
    if all(r.executed_layer == r.expected_layer for r in records):
        if num_layers == 1:
            return Verdict("inconclusive", [
                f"with a single MTP layer every schedule runs layer 0: layer-0 reuse and multi-module coincide "
                f"({steps})", f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"])
        if not decisive:
            why = ("k = 1 drafts one step" if k == 1 else
                   f"only draft step(s) {sorted({r.draft_step for r in records})} were called (k = {k})")
            return Verdict("inconclusive", [
                f"{why}, and every schedule runs layer 0 there ({steps}): trace with k >= {num_layers} "
                f"(k = {2 * num_layers} shows the wrap-around) to tell reuse from multi-module",
                f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"])
        if unused:
            return Verdict("mismatch", [
                f"the steps that were called ran layer s mod {num_layers} ({steps}), but layers {unused}, which "
                f"k = {k} schedules, never ran: the proposer made fewer than k draft calls per proposal"],
                unused, unused_bytes)
        ev = [f"every draft step s ran layer s mod {num_layers}: {steps}",
              f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"]
        if k < num_layers:
            ev.append(f"k = {k} < {num_layers} layers: layers {list(range(k, num_layers))} are not scheduled at "
                      f"this k (k >= {num_layers} exercises them all)")
        return Verdict("multi-module", ev, unused, unused_bytes)
    if all(r.executed_layer == 0 for r in records):
        swallowed = [r for r in records if isinstance(r.wrapper_spec_step_idx, int) and r.wrapper_spec_step_idx > 0
                     and _is_zero_or_absent(r.predictor_spec_step_idx)]
        if swallowed:
            r = swallowed[0]
            return Verdict("swallowed", [
                f"{len(swallowed)} call(s): the wrapper received spec_step_idx={r.wrapper_spec_step_idx} but the "
                f"predictor ({r.predictor or 'the layers holder'}) received {r.predictor_spec_step_idx} (first at "
                f"proposal {r.proposal}, step {r.draft_step}), so layer 0 ran", f"layers run per step: {steps}"],
                unused, unused_bytes)
        ignored = [r for r in records if isinstance(r.predictor_spec_step_idx, int)
                   and r.predictor_spec_step_idx % num_layers != 0]
        if ignored:
            r = ignored[0]
            return Verdict("mismatch", [
                f"the predictor ({r.predictor or 'the layers holder'}) received spec_step_idx="
                f"{r.predictor_spec_step_idx} at proposal {r.proposal}, step {r.draft_step}, but layer 0 ran: the "
                f"model ignores the index it gets", f"layers run per step: {steps}"], unused, unused_bytes)
        ev = [f"every draft step ran layer 0: {steps}",
              f"spec_step_idx {'never reached the model' if never_reached else 'reached the predictor only as 0'} "
              f"(wrapper received: {', '.join(wrapper_seen)})"]
        if unused:
            ev.append(f"layers a correct schedule at k = {k} would run but never ran: {unused}, holding "
                      f"{unused_bytes} bytes of weights in the checkpoint")
        return Verdict("layer-0 reuse", ev, unused, unused_bytes)
    bad = next((r for r in records if r.executed_layer != r.expected_layer), records[0])
    return Verdict("mismatch", [
        f"proposal {bad.proposal}, step {bad.draft_step} ran layer {bad.executed_layer}, expected "
        f"{bad.expected_layer}", f"layers run per step: {steps}"], unused, unused_bytes)


def loaded_vs_checkpoint(checkpoint_layers: int, loaded_layers: int, layer_bytes: list[int]) -> list[str]:
    """A line naming the MTP layers the checkpoint declares but the engine did not load, with their bytes
    (or saying that the engine's blocks are finer than the checkpoint's MTP layers)."""
    if loaded_layers > checkpoint_layers:
        return [f"the draft model holds {loaded_layers} blocks for the checkpoint's {checkpoint_layers} MTP layer(s): "
                "an MTP layer is made of several blocks here (e.g. Nemotron-H's mtp_hybrid_override_pattern), so "
                "a 'layer' of this trace is one block"]
    if loaded_layers == checkpoint_layers:
        return []
    dropped = list(range(loaded_layers, checkpoint_layers))
    size = sum(layer_bytes[j] for j in dropped if j < len(layer_bytes))
    return [f"the checkpoint declares {checkpoint_layers} MTP layers but the engine loaded {loaded_layers}: "
            f"layers {dropped} ({size} bytes of weights) never reached memory"]


def layer_per_step(records: list[CallRecord]) -> dict[int, int | None]:
    """The layer that most often produced draft step s (the layer behind acceptance position s)."""
    out: dict[int, Counter] = {}
    for r in records:
        out.setdefault(r.draft_step, Counter())[r.executed_layer] += 1
    return {s: c.most_common(1)[0][0] for s, c in sorted(out.items())}


def trace_csv(records: list[CallRecord]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in fields(CallRecord)], lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})
    return buf.getvalue()


def step_table(records: list[CallRecord], num_layers: int) -> list[list]:
    """Per draft step: calls, which layers ran, what the wrapper/predictor/layer received."""
    rows = []
    for s in sorted({r.draft_step for r in records}):
        rs = [r for r in records if r.draft_step == s]
        ran = Counter(r.executed_layer for r in rs)
        seen = [",".join(sorted({str(getattr(r, attr)) for r in rs}))
                for attr in ("wrapper_spec_step_idx", "predictor_spec_step_idx", "layer_spec_step_idx")]
        rows.append([s, len(rs), s % num_layers, " ".join(f"{j}:{n}" for j, n in sorted(ran.items(), key=str)),
                     *seen,
                     round(sum(r.num_tokens for r in rs) / len(rs), 1)])
    return rows


STEP_HEADERS = ["step", "calls", "expected layer", "ran layer:count", "wrapper idx", "predictor idx",
                "layer idx", "tokens/call"]


def heatmap(path, records: list[CallRecord], num_layers: int, k: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.zeros((max(k, 1), num_layers), dtype=int)
    for r in records:
        if r.draft_step < k and r.executed_layer is not None and 0 <= r.executed_layer < num_layers:
            grid[r.draft_step, r.executed_layer] += 1
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * num_layers, 1.4 + 0.6 * k))
    ax.imshow(grid, cmap="Blues", aspect="auto")
    for s in range(grid.shape[0]):
        for j in range(num_layers):
            ax.text(j, s, str(grid[s, j]), ha="center", va="center",
                    color="white" if grid[s, j] > grid.max() / 2 else "black")
        ax.add_patch(plt.Rectangle((s % num_layers - 0.5, s - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
    ax.set(xticks=range(num_layers), yticks=range(grid.shape[0]), xlabel="MTP layer executed",
           ylabel="draft step s", title=title)
    fig.text(0.01, 0.01, "red box: expected layer s mod L", fontsize=7, color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def model_label(model_dir) -> str:
    """How a picture names the model: its architecture and directory."""
    from pathlib import Path

    from mtpbench.checkpoint import read_config

    arch = (read_config(model_dir).get("architectures") or ["?"])[0]
    return f"{arch} ({Path(model_dir).name})"


def provenance_versions(summary: dict) -> str:
    return summary["provenance"]["versions"].get("vllm") or "?"


def run_trace(cfg, k: int, mode: str = "reuse", backend=None) -> dict:
    """Trace one short generation and write trace.csv, trace.json and layers.png into ``cfg.out``.

    ``backend`` may be passed in already started (tests use it to set the native fault switches).
    """
    import json
    from pathlib import Path

    from mtpbench.backends import get_backend
    from mtpbench.config import validate
    from mtpbench.prompts import prompt_set
    from mtpbench.checkpoint import mtp_layer_bytes
    from mtpbench.report import write_json, write_text
    from mtpbench.environment import provenance

    n_layers = cfg.num_mtp_layers()
    if k < 1:
        raise MtpBenchError(f"--k must be >= 1 to trace drafting, got {k}")
    validate(cfg, n_layers)
    L = max(cfg.mtp_layers) if cfg.mtp_layers else n_layers
    if cfg.backend == "vllm-server":
        raise MtpBenchError("trace-layers wraps the draft model in mtpbench's own process: use --backend vllm "
                            "(a served engine's modules are out of reach)")
    if cfg.backend == "vllm" and cfg.tensor_parallel_size > 1:
        raise MtpBenchError("tracing needs the vLLM engine in one process: use tensor_parallel_size 1 "
                            f"(got {cfg.tensor_parallel_size})")
    prompts = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template).prompts
    if backend is None:
        backend = get_backend(cfg.backend)
        backend.start(cfg)
    if cfg.backend == "vllm":
        mode = "vllm"
    try:
        data = backend.trace_point(cfg, mode, k, L, prompts)
    except (RuntimeError, OSError) as e:  # the engine did not start (a crash while drafting is a verdict)
        raise MtpBenchError(f"the {cfg.backend} engine could not run the trace: {e}") from None
    records: list[CallRecord] = data["records"]

    # weight bytes per layer as stored in the checkpoint: the same figure for every backend, whatever
    # form (dtype, prepacked) the engine keeps them in
    all_bytes = mtp_layer_bytes(cfg.mtp_dir, drafter=bool(cfg.draft_model))
    layer_bytes = (all_bytes + [0] * data["num_layers"])[: data["num_layers"]]
    v = judge(records, data["num_layers"], k, layer_bytes, data["crash"], data.get("crash_in_draft", True))
    # the layers asked of the engine (the derived checkpoint's L) against those it holds
    dropped = loaded_vs_checkpoint(L, data["num_layers"], all_bytes)
    v.evidence += dropped
    drafts = data["num_drafts"]
    steps = layer_per_step(records)
    attribution = [{"position": i, "layer": steps.get(i), "num_accepted_tokens": n,
                    "acceptance_rate": round(n / drafts, 4) if drafts and n is not None else None}
                   for i, n in enumerate(data["num_accepted_tokens_per_pos"])]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "trace.csv", trace_csv(records))
    summary = {"verdict": v.verdict, "evidence": v.evidence, "backend": cfg.backend, "mode": mode, "k": k,
               "num_mtp_layers": data["num_layers"], "structure": data["structure"],
               "force_spec_step_idx": cfg.force_spec_step_idx, "num_draft_calls": len(records),
               "num_proposals": len({(r.batch, r.proposal) for r in records}),
               "unused_layers": v.unused_layers, "unused_layer_bytes": v.unused_layer_bytes,
               "checkpoint_mtp_layers": L, "dropped_at_load": list(range(data["num_layers"], L)),
               "crash": data["crash"], "per_step": [dict(zip(STEP_HEADERS, row)) for row in
                                                    step_table(records, data["num_layers"])],
               "acceptance_by_layer": attribution, "num_drafts": drafts,
               "config": cfg.to_json(), "provenance": provenance()}
    write_json(out / "trace.json", summary)
    from mtpbench import __version__

    engine = f"vLLM {provenance_versions(summary)}" if cfg.backend == "vllm" else f"mtpbench {__version__} native"
    heatmap(out / "layers.png", records, data["num_layers"], k,
            f"{model_label(cfg.model_dir)} on {engine} ({mode}, k={k}): {v.verdict}")
    return json.loads((out / "trace.json").read_text())
