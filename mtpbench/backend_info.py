"""The backends by name, and what is known of each before it is imported.

Config validation, the sweep's grid, trace-layers, check-lossless and the prompt set ask ``info(name)`` for a
backend's static facts instead of comparing its name, so a new backend (SGLang, TensorRT-LLM) is one entry here
plus one class that inherits ``backends.BackendBase``. Nothing here imports an engine, nor the ``backends``
package (which re-exports these): config and prompts read it, and synth, which imports them, must not load
a backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpbench.errors import MtpBenchError


@dataclass(frozen=True)
class BackendInfo:
    name: str
    target: str  # "module:Class", imported by ``backends.get_backend`` only
    # the model runs in a vLLM engine: a model runner to pick (--runner), graphs compiled unless enforce_eager,
    # a speculative_config (--draft-model, --speculative-config) and --max-model-len
    vllm: bool
    # requests go over HTTP to a server: loads (--concurrency x --request-rate), --server, --api; the server
    # may apply its own chat template, and does not say which dtype it runs
    served: bool
    # the grid's one mode where the engine drafts its own way (trace-layers tells which); None: --mode's
    drafting_mode: str | None = None
    # --repeats and --dtype when none is given; None: SweepConfig's
    default_repeats: int | None = None
    default_dtype: str | None = None
    # one engine in mtpbench's process serves every point, so the sweep times repeats round robin over the
    # points, asking run_point for one repeat at a time
    interleaves_repeats: bool = False
    # the native engine's planted lossy rules (engine.Faults): check-lossless's --planted-lossy, --planted-subtle
    planted_faults: bool = False

    @property
    def defaults(self) -> dict:
        """The config fields this backend defaults differently from SweepConfig (where nothing sets them)."""
        return {k: v for k, v in (("repeats", self.default_repeats), ("dtype", self.default_dtype)) if v is not None}

    @property
    def offline_vllm(self) -> bool:
        """``vllm.LLM`` in a worker process mtpbench starts: --force-spec-step-idx and trace-layers reach its
        draft model on every rank there (``backends.vllm.plugin``, traced eagerly), and it runs no data parallel
        but under external_launcher."""
        return self.vllm and not self.served


REGISTRY: dict[str, BackendInfo] = {b.name: b for b in (
    # 6 repeats: the native engine times its repeats round robin in this process, and 6 is the fewest that give
    # tokens/s, TTFT and TPOT an interval (3 already give the speedup one); a vLLM point gets 3, the fewest that give
    # its speedup an interval (each repeat is a whole timed run of the point's engine: 3 runs take 3 times one).
    # float32 on the native engine: its checks compare exact numbers (the built-in model is trained in it); vLLM's
    # own default, auto (the checkpoint's dtype, bfloat16 for a float32 one on a CPU), on vLLM: what a deployment runs
    BackendInfo("native", "mtpbench.backends.native:NativeBackend", vllm=False, served=False, default_repeats=6,
                interleaves_repeats=True, planted_faults=True),
    BackendInfo("vllm", "mtpbench.backends.vllm.backend:VllmBackend", vllm=True, served=False, drafting_mode="vllm",
                default_repeats=3, default_dtype="auto"),
    BackendInfo("vllm-server", "mtpbench.backends.vllm_server.backend:VllmServerBackend", vllm=True, served=True,
                drafting_mode="vllm", default_repeats=3, default_dtype="auto"),
)}


def info(name: str) -> BackendInfo:
    """The registered backend ``name``'s facts; an unknown name is refused in the words ``get_backend`` uses."""
    if name not in REGISTRY:
        raise MtpBenchError(f"unknown backend {name!r} (choose from {', '.join(REGISTRY)})")
    return REGISTRY[name]
