"""Sweep configuration: one dataclass, resolved as CLI > profile file > defaults.

Profiles are data: ``profiles/<name>.toml``, whose keys are ``SweepConfig`` field names. Unknown keys
and wrong types are errors that name the file and the key.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from mtpbench.backend_info import REGISTRY, info
from mtpbench.builtin import resolve_model_dir
from mtpbench.checkpoint import no_mtp_layers, read_config
from mtpbench.datasets import check_random
from mtpbench.environment import installed_vllm
from mtpbench.errors import MtpBenchError
from mtpbench.files import check_writable
from mtpbench.layout import Machine, refusal
from mtpbench.runners import cpu_build

MODES = ("reuse", "chain")
DTYPES = ("float32", "bfloat16", "float16", "auto")
APIS = ("completions", "chat")
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")


@dataclass(frozen=True)
class SweepConfig:
    model: str = "builtin"
    backend: str = "native"
    method: str = "mtp"
    draft_model: str | None = None  # a drafter in a checkpoint of its own (speculative_config["model"])
    k: tuple[int, ...] = (0, 1, 2, 3)
    mtp_layers: tuple[int, ...] = ()  # empty: every MTP layer the checkpoint has
    mode: tuple[str, ...] = MODES
    prompts: str = "builtin"  # builtin, spec-bench, mt-bench, random, a JSONL file or a ShareGPT .json file
    random_input_len: int = 1024  # --prompts random (vLLM's random dataset): prompt tokens, ...
    random_output_len: int | None = None  # ... output tokens (None: max_tokens; given, it sets max_tokens) ...
    random_range_ratio: float = 0.0  # ... and the prompt lengths' spread, uniform in len x [1 - r, 1 + r]
    num_prompts: int | None = None  # None: 8 of the built-in set, every prompt of any other set
    chat_template: str = "auto"  # auto: through the checkpoint's chat template where it has one; none
    context_tokens: tuple[int, ...] = ()  # held-out text before each prompt, a grid dimension; (): none
    max_tokens: int = 128
    repeats: int = 1  # timed runs per point; with several, timings are their geometric mean and its interval
    max_repeats: int | None = None  # time points whose speedup is open up to this (sweep.rounds); None: repeats
    max_seconds: float | None = None  # ... or until this much time is spent on the rounds
    warmup: int = 1  # runs of every point before the rounds, timed and set aside (interleaving backends)
    aa_control: bool = True  # k = 0 timed twice (A/A) in the same rounds: the machine's noise floor
    law: bool = False  # --law: acceptance against its exact law at each k > 0 point, read untimed after its runs
    temperature: float = 0.0
    top_p: float = 1.0  # vLLM SamplingParams: (0, 1], 1 = off; the target's law (mtpbench.sampling)
    top_k: int = 0  # vLLM SamplingParams: 0 or -1 = off, else the k most likely tokens
    batch_size: int = 1
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    out: str = "results"
    force_spec_step_idx: bool = False
    runner: str | None = None  # vLLM's model runner, "v1" or "v2"; None: the one vLLM picks here (mtpbench.runners)
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    gpu_memory_utilization: float | None = None
    engine_args: dict = field(default_factory=dict)
    speculative_config: dict = field(default_factory=dict)  # merged into vLLM's speculative_config at k > 0
    server: str | None = None  # served runs: a running server's URL; None: mtpbench launches one per (k, L)
    servers: tuple[str, ...] = ()  # several running servers, each at its own k, as one sweep (server: the first)
    api: str = "completions"  # or chat
    concurrency: tuple[int, ...] = (1,)  # requests in flight at most
    request_rate: tuple[float, ...] = (math.inf,)  # Poisson arrivals per second; inf: all at once
    server_port: int = 0  # 0: any free port
    server_start_timeout_s: float = 600.0
    # how an attached --server is reached (mtpbench.connection): names only, never a secret's value
    api_key_env: str | None = None  # the variable holding the API key; None: OPENAI_API_KEY
    header: tuple[str, ...] = ()  # names of the --header headers (their values: header_values)
    header_env: tuple[str, ...] = ()  # "Name=VAR": a header whose value is the environment variable VAR's
    ca_cert: str | None = None  # verify https:// against this CA file instead of the system store
    insecure: bool = False  # https:// without verification (every row says so)
    metrics_url: str | None = None  # where /metrics is read; None: <server>/metrics
    metrics_credentials: bool = False  # send the credentials to --metrics-url's origin too
    description: str = ""
    label: str = ""  # --label: names the run in every file it writes (vllm bench serve's)
    metadata: dict = field(default_factory=dict)  # --metadata KEY=VALUE: recorded in every file
    # the latency statistics the table shows: metrics (ttft, tpot, itl, e2el) x percentiles; (): the usual columns
    percentile_metrics: tuple[str, ...] = ()
    metric_percentiles: tuple[float, ...] = ()
    # --header values: in memory only, never written (to_json leaves it out, profiles cannot set it)
    header_values: dict = field(default_factory=dict, repr=False, compare=False)
    # --replace: move an earlier sweep in --out aside and measure afresh; --force: write beside files in --out that
    # are not mtpbench's (sweep/store.py); actions, never written
    replace: bool = field(default=False, compare=False)
    force: bool = field(default=False, compare=False)

    @property
    def model_dir(self) -> Path:
        return resolve_model_dir(self.model)

    @property
    def mtp_dir(self) -> Path:
        """The checkpoint that holds the MTP layers: the separate draft model's, else the model's."""
        return resolve_model_dir(self.draft_model) if self.draft_model else self.model_dir

    def num_mtp_layers(self) -> int:
        """MTP layers of the drafter: the checkpoint's count, or every layer of a separate draft model."""
        from mtpbench.checkpoint import drafter_layers, num_mtp_layers

        check_draft_model(self)
        return drafter_layers(self.mtp_dir) if self.draft_model else num_mtp_layers(self.model_dir)

    def parallel_layout(self) -> dict:
        """How the engine is sharded, as vLLM names it (every result file and the fingerprint record it); an
        ``--engine-arg`` of the same name wins, as it does in the engine's arguments (``engine_kwargs``)."""
        own = {"tensor_parallel_size": self.tensor_parallel_size, "pipeline_parallel_size": self.pipeline_parallel_size,
               "data_parallel_size": self.data_parallel_size,
               "distributed_executor_backend": self.distributed_executor_backend}
        return {key: self.engine_args.get(key, value) for key, value in own.items()}

    def to_json(self) -> dict:
        """JSON-safe: tuples as lists, an infinite request rate as the string "inf"."""
        def safe(v):
            return "inf" if isinstance(v, float) and math.isinf(v) else v
        return {k: [safe(x) for x in v] if isinstance(v, tuple) else safe(v) for k, v in asdict(self).items()
                if k not in RUNTIME_ONLY}


RUNTIME_ONLY = ("header_values", "replace", "force")  # SweepConfig fields that are never written nor read from a profile
_TYPES = {f.name: f.type for f in fields(SweepConfig) if f.name not in RUNTIME_ONLY}

# SweepConfig fields that do not change what one saved point measures. Every other field is in the fingerprint,
# so a new field is in it unless named here (tests/unit/test_fingerprint.py pins the split: classify it by hand).
NOT_MEASURED = {
    "out": "where the files go",
    "description": "a note for the reader",
    "label": "a name for the reader", "metadata": "notes for the reader",
    "percentile_metrics": "what the table shows, from the saved per-request times",
    "metric_percentiles": "what the table shows, from the saved per-request times",
    # grid dimensions: each is in the point's own key (its file name and "point" record), so a sweep that
    # adds a value reuses the points of the others
    **dict.fromkeys(("k", "mtp_layers", "mode", "context_tokens", "concurrency", "request_rate"),
                    "grid dimension (point key)"),
    # how a launched server is reached and waited for, not what it runs
    "server_port": "the launched server's local port",
    "server_start_timeout_s": "how long to wait for a launched server",
    # how an attached server is reached and read, not what it runs (attached points are never reused)
    "api_key_env": "how the server is reached (the API key's variable)",
    "header": "how the server is reached (gateway header names)",
    "header_env": "how the server is reached (secret header names and their variables)",
    "ca_cert": "how the server's certificate is verified",
    "insecure": "how the server's certificate is verified (every row notes it when off)",
    "metrics_url": "where the same server's counters are read",
    "metrics_credentials": "whether credentials go to --metrics-url", "header_values": "runtime only: never written",
    "replace": "runtime only: what to do with an earlier sweep in --out",
    "force": "runtime only: whether to write beside files in --out that are not mtpbench's",
    "max_seconds": "a time budget: how many rounds a point got is in its file (a tune shares what is left)",
}
FINGERPRINT_KEYS = tuple(name for name in _TYPES if name not in NOT_MEASURED)


def fingerprint(config: dict, versions: dict) -> dict:
    """What a saved point was measured with (``config``: ``SweepConfig.to_json()``); a point is reused
    or read as part of a sweep only if this matches."""
    return {**{key: config.get(key) for key in FINGERPRINT_KEYS}, "versions": versions}


def execution(config: dict) -> dict:
    """How the engine executed every point of a run (``config``: a saved run's settings), as far as its
    settings tell: ``graphs`` "eager" or "compiled" (None: not known, e.g. an attached server's), and
    ``runner``, the vLLM model runner each engine was asked for (None: the native engine, or an attached
    server's, which cannot be observed). vLLM compiles the model and replays graphs
    unless told not to; ``--force-spec-step-idx`` runs every point eagerly, k = 0 included."""
    backend, args = REGISTRY.get(config.get("backend")), config.get("engine_args") or {}  # None: not known here
    if backend and not backend.vllm:
        graphs = "eager"  # plain PyTorch modules, never compiled
    elif config.get("server"):
        graphs = None
    elif args.get("enforce_eager") or (backend and backend.offline_vllm and config.get("force_spec_step_idx")):
        graphs = "eager"
    else:
        graphs = "compiled"
    return {"graphs": graphs, "runner": config.get("runner")}


def load_profile(name_or_path: str) -> tuple[Path, dict]:
    """A profile's values, checked against SweepConfig's fields (``mtpbench.profile``)."""
    from mtpbench.profile import load_profile

    return load_profile(name_or_path, _TYPES)


def resolve(cli: dict, profile: str | None = None, defaults: dict | None = None) -> SweepConfig:
    """CLI values that are not None win over the profile, which wins over the defaults (``SweepConfig``'s,
    updated by the command's own ``defaults``)."""
    cfg = replace(SweepConfig(), **(defaults or {}))
    if profile:
        path, values = load_profile(profile)
        if "model" in values and not Path(values["model"]).is_absolute() and values["model"] != "builtin" \
                and (path.parent / values["model"]).exists():
            values["model"] = str(path.parent / values["model"])
        cfg = replace(cfg, **values)
    given = {k: v for k, v in cli.items() if v is not None}
    unknown = set(given) - set(_TYPES)
    if unknown:
        raise MtpBenchError(f"unknown option(s): {', '.join(sorted(unknown))}")
    cfg = replace(cfg, **given)
    own = REGISTRY.get(cfg.backend)  # its --repeats and --dtype when none is given (an unknown name is refused later)
    for name, value in (own.defaults if own else {}).items():
        if name not in given and name not in (defaults or {}) and not (profile and name in values):
            cfg = replace(cfg, **{name: value})
    return with_output_len(cfg, given)


def with_output_len(cfg: SweepConfig, given: dict) -> SweepConfig:
    """--random-output-len is --max-tokens under another name (vLLM's random dataset's): it sets max_tokens, and
    giving both with different values is refused."""
    n = cfg.random_output_len
    if n is None:
        return cfg
    if "max_tokens" in given and given["max_tokens"] != n:
        raise MtpBenchError(f"--random-output-len {n} and --max-tokens {given['max_tokens']} name the same thing "
                            f"(output tokens per request): give one")
    return replace(cfg, max_tokens=n)


def validate(cfg: SweepConfig, checkpoint_layers: int | None) -> None:
    """Everything that can be checked before a model is loaded or a file is written."""
    from mtpbench.connection import check_options

    if not cfg.k and not cfg.server:  # an attached server's k is read from the server
        raise MtpBenchError("--k needs at least one value")
    for k in cfg.k:
        if k < 0:
            raise MtpBenchError(f"--k must be >= 0, got {k}")
    for m in cfg.mode:
        if m not in MODES:
            raise MtpBenchError(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    if cfg.dtype not in DTYPES:
        raise MtpBenchError(f"unknown dtype {cfg.dtype!r} (choose from {', '.join(DTYPES)})")
    for name in ("num_prompts", "max_tokens", "batch_size", "repeats"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise MtpBenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if any(c < 0 for c in cfg.context_tokens):
        raise MtpBenchError(f"--context-tokens takes integers >= 0, got {','.join(map(str, cfg.context_tokens))}")
    check_speculative_config(cfg)
    from mtpbench.metrics.latency import check as check_latency

    if problem := check_latency(cfg.percentile_metrics, cfg.metric_percentiles):
        raise MtpBenchError(problem)
    if cfg.temperature < 0:
        raise MtpBenchError(f"--temperature must be >= 0, got {cfg.temperature}")
    check_sampling(cfg)
    check_random(cfg)  # mtpbench.datasets
    if checkpoint_layers is not None:
        if checkpoint_layers < 1 and any(k > 0 for k in cfg.k):
            raise no_mtp_layers(cfg.model_dir)
        for L in cfg.mtp_layers:
            if not 1 <= L <= checkpoint_layers:
                raise MtpBenchError(f"{L} MTP layers asked for: the checkpoint has {checkpoint_layers} MTP layer(s)")
            if cfg.draft_model and L != checkpoint_layers:
                raise MtpBenchError(f"{L} MTP layers asked for: a separate draft checkpoint runs whole "
                                    f"({checkpoint_layers} layers)")
    check_draft_model(cfg)
    check_runner_option(cfg)
    if cfg.engine_args.get("disable_log_stats"):
        raise MtpBenchError("--engine-arg disable_log_stats=true would switch off the spec-decode counters "
                            "mtpbench reads: leave it out")
    validate_serving(cfg)
    check_parallel_layout(cfg)
    check_options(cfg)
    check_writable(cfg.out)


def check_speculative_config(cfg: SweepConfig) -> None:
    """--speculative-config: vLLM's own, merged into a drafting engine's; --k sets num_speculative_tokens."""
    if not cfg.speculative_config:
        return
    if not info(cfg.backend).vllm:
        raise MtpBenchError("--speculative-config is merged into vLLM's speculative_config: use --backend vllm or "
                            "vllm-server")
    if cfg.server:
        raise MtpBenchError("--speculative-config cannot change an attached --server's speculative config (it is "
                            "the server's own)")
    if "num_speculative_tokens" in cfg.speculative_config:
        raise MtpBenchError("--speculative-config: give num_speculative_tokens as --k or --num-speculative-tokens")


def check_sampling(cfg: SweepConfig) -> None:
    """vLLM's ranges (SamplingParams): top_p in (0, 1], top_k -1 or 0 (off) or >= 1; nothing vLLM takes is refused.
    At temperature 0 both are taken and do nothing (greedy), as in vLLM."""
    if not 0.0 < cfg.top_p <= 1.0:
        raise MtpBenchError(f"--top-p must be in (0, 1] (1 = off), got {cfg.top_p}")
    if cfg.top_k < -1:
        raise MtpBenchError(f"--top-k must be -1 or 0 (off) or >= 1, got {cfg.top_k}")


def truncated(cfg: SweepConfig) -> bool:
    """Whether top-k or top-p cut the law sampled at a temperature > 0 (top-k 0 and -1, top-p 1: off)."""
    return cfg.temperature > 0 and (cfg.top_p < 1.0 or cfg.top_k > 0)


def check_draft_model(cfg: SweepConfig) -> None:
    if cfg.draft_model:
        if not info(cfg.backend).vllm:
            raise MtpBenchError("--draft-model is a vLLM speculative_config model: use --backend vllm or vllm-server")
        if not (resolve_model_dir(cfg.draft_model) / "config.json").is_file():
            raise MtpBenchError(f"--draft-model {cfg.draft_model}: no config.json there")


def check_runner_option(cfg: SweepConfig) -> None:
    """--runner picks vLLM's model runner: only for an engine mtpbench starts."""
    from mtpbench.runners import check_runner

    if cfg.runner is None:
        return
    check_runner(cfg.runner)
    if not info(cfg.backend).vllm:
        raise MtpBenchError("--runner picks vLLM's model runner: use --backend vllm or vllm-server")
    if cfg.server:
        raise MtpBenchError("--runner cannot choose the model runner of an attached --server (it is the "
                            "server's own): leave it out, and the rows say the runner is unknown")


def with_runner(cfg: SweepConfig) -> SweepConfig:
    """The config with the runner each engine of it is asked for: the one given, or the one vLLM picks here
    by itself (decided before any shim is loaded); unchanged for the native backend and an attached server."""
    from mtpbench.runners import resolve

    if not info(cfg.backend).vllm or cfg.server:
        return cfg
    return replace(cfg, runner=resolve(cfg.runner))


def validate_serving(cfg: SweepConfig) -> None:
    """The served-run options: only with the server backend, and each in range."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if getattr(cfg, name) < 1:
            raise MtpBenchError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.distributed_executor_backend not in (None, *EXECUTOR_BACKENDS):
        raise MtpBenchError(f"unknown --distributed-executor-backend {cfg.distributed_executor_backend!r} "
                            f"(choose from {', '.join(EXECUTOR_BACKENDS)})")
    backend = info(cfg.backend)
    if backend.offline_vllm and cfg.data_parallel_size > 1 and cfg.distributed_executor_backend != "external_launcher":
        raise MtpBenchError(f"vllm.LLM does not run data parallel in one process (data_parallel_size "
                            f"{cfg.data_parallel_size}): serve it with --backend vllm-server")
    if not backend.served:
        loads = [flag for flag, name, default in (("--server", "server", None), ("--max-concurrency", "concurrency", (1,)),
                                                  ("--request-rate", "request_rate", (math.inf,)),
                                                  ("--api", "api", "completions"), ("--port", "server_port", 0))
                 if getattr(cfg, name) != default]
        if loads:
            raise MtpBenchError(f"{', '.join(loads)} appl{'ies' if len(loads) == 1 else 'y'} to served runs "
                                f"(--backend vllm-server); the {cfg.backend} backend batches with --batch-size")
        return
    if cfg.force_spec_step_idx:
        raise MtpBenchError("--force-spec-step-idx patches the draft model in mtpbench's own process: "
                            "not possible with --backend vllm-server (use --backend vllm)")
    if cfg.api not in APIS:
        raise MtpBenchError(f"unknown --api {cfg.api!r} (choose from {', '.join(APIS)})")
    if not cfg.concurrency or any(c < 1 for c in cfg.concurrency):
        raise MtpBenchError(f"--max-concurrency takes integers >= 1, got {','.join(map(str, cfg.concurrency))}")
    if not cfg.request_rate or any(not r > 0 for r in cfg.request_rate):
        raise MtpBenchError("--request-rate takes numbers > 0 or inf")
    for url in (cfg.server, *cfg.servers):
        if url and not url.startswith(("http://", "https://")):
            raise MtpBenchError(f"--server takes an http:// or https:// URL, got {url!r}")
    if not 0 <= cfg.server_port < 65536:
        raise MtpBenchError(f"--port must be 0..65535, got {cfg.server_port}")
    if cfg.server_port and (cfg.server or cfg.servers):
        raise MtpBenchError("--port is the port of a server mtpbench launches: an attached --server is reached at "
                            "its URL")


def local_model_dir(name: str) -> Path | None:
    """A model's directory where it is on this machine (a directory, or a hub id in the local cache), else None."""
    try:
        return path if (path := resolve_model_dir(name)).is_dir() else None
    except MtpBenchError:
        return None


def check_parallel_layout(cfg: SweepConfig) -> None:
    """A layout vLLM refuses, or pipeline parallel certain to fail on it, before any engine starts (``layout``)."""
    if not info(cfg.backend).vllm or cfg.server:  # an attached server's layout is its own
        return
    drafter = None if "speculative_config" in cfg.engine_args else cfg.draft_model  # sharded as the target
    # each model whose files are here (a dry run plans a model not on this machine: its layout is checked where
    # it runs, by the sweep before its engine starts)
    models = {name: read_config(path) for name in filter(None, (cfg.model, drafter))
              for path in [local_model_dir(name)] if path is not None}
    machine = Machine(installed_vllm() if cpu_build() else None, len(os.sched_getaffinity(0)),
                      os.environ.get("VLLM_CPU_OMP_THREADS_BIND"))
    eager = bool(cfg.engine_args.get("enforce_eager") or (info(cfg.backend).offline_vllm and cfg.force_spec_step_idx))
    if problem := refusal(cfg.parallel_layout(), models, machine, any(cfg.k), eager):
        raise MtpBenchError(problem)

