"""The served backend: a vLLM OpenAI-compatible server under load, measured from outside.

Launched (``--backend vllm-server``, ``launch``): for each (k, MTP layers) mtpbench starts a server, measures
every load point (concurrency x request rate) of that (k, L) on it, and stops it; its log is kept next to the
point files as ``<mode>-L<L>-k<k>.server.log`` (``k0.server.log``). Attached (``--server URL``, ``attach``): a
server the user runs, measured as it runs.

Each load point: warm-up requests first (excluded), then ``/metrics`` is read, the load generator runs
(``mtpbench.loadgen``) with the GPU sampler on, ``/metrics`` is read again, and the spec-decode counters'
deltas (``counters``) give acceptance, exactly as ``vllm bench serve`` computes it. Requests the server
finished in the window beyond ours (``vllm:request_success_total``) are reported, not hidden.

check-lossless (``lossless.CheckBackend``) runs on a k = 0 server and a k = K one: ``check``.
"""

from __future__ import annotations

import math
from pathlib import Path

from mtpbench.backends.vllm import EXPAND_FAULT, check_num_speculative_tokens, counter_delta
from mtpbench.backends.vllm.engine_args import PLUGIN
from mtpbench.backends.vllm_server import check
from mtpbench.backends.vllm_server.attach import attach, attach_pair, attached_runner, is_local
from mtpbench.backends.vllm_server.counters import read_metrics, settled_metrics, window_traffic
from mtpbench.backends.vllm_server.http import Server
from mtpbench.backends.vllm_server.launch import exited_server, launch, port_taken, server_args, server_env
from mtpbench.checkpoint import derived_checkpoint, mtp_layer_bytes
from mtpbench.config import SweepConfig
from mtpbench.environment import require_vllm
from mtpbench.backends import BackendBase
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import BatchRecord, GridPoint, PointRun, RequestRecord
from mtpbench.prompts import Prompt

WARMUP_TOKENS = 16


class VllmServerBackend(BackendBase):
    name = "vllm-server"

    def __init__(self):
        self.server: Server | None = None
        self.key: tuple | None = None  # the (k, L) the running server serves
        self.failed: dict[tuple, str] = {}
        self.facts: dict = {}
        self.ran: dict = {}  # the runner the running server ran (launched_runner / attached_runner)
        self.check_servers: check.CheckServers | None = None  # check-lossless's, from start on
        self.tracing = False  # launch servers for trace-layers (plugin routes, eager)

    # -- sweep protocol -------------------------------------------------------------------------------

    def start(self, cfg: SweepConfig) -> dict:
        from mtpbench.telemetry import unavailable_reason

        self.cfg = cfg
        self.dtype_name = None if cfg.dtype == "auto" else cfg.dtype  # a server does not say which it ran
        baseline = None
        if cfg.server:
            from mtpbench.connection import connect

            self.conn = connect(cfg, self.baseline_server)  # credentials and TLS; MtpBenchError on bad input
            if self.baseline_server:
                baseline = attach_pair(self.conn, cfg.server, self.baseline_server)
            self.server, self.facts = attach(cfg, self.conn)
            self.ran = attached_runner()
        else:
            if cfg.server_port and port_taken(cfg.server_port):
                raise MtpBenchError(f"port {cfg.server_port} on 127.0.0.1 is already in use")
            self.facts = {"engine": "vllm-server", "attached": False, "vllm": require_vllm()}
        local = not cfg.server or is_local(cfg.server)
        self.facts["gpu_telemetry"] = unavailable_reason() if local else \
            f"the server at {cfg.server} is not on this machine"
        self.check_servers = check.CheckServers(cfg, self.facts, self.server if cfg.server else None, baseline)
        # the dtype a launched server is started with; an attached server's cannot be read from outside
        return {**self.facts, "dtype": None if cfg.server else cfg.dtype}

    def servers(self) -> check.CheckServers:
        """check-lossless's servers: ``start``'s, or, on a backend not started for a check (a sweep asking for
        greedy margins), the attached server alone or none, which refuse a k = 0 arm in one line."""
        if self.check_servers is None:
            self.check_servers = check.CheckServers(self.cfg, self.facts, self.server if self.cfg.server else None)
        return self.check_servers

    def grid_k(self) -> int | None:
        """An attached server's k (None for a launched one, whose k the sweep chooses)."""
        return self.facts.get("k") if self.facts.get("attached") else None

    def run_point(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        notes = []
        if cfg.server:
            if self.facts["k_source"] != "server /metrics":
                notes.append(f"k = {point.k} taken as given: the server does not expose num_speculative_tokens")
            if point.k > 0:  # plain decoding runs no MTP layer: nothing to take or to miss
                notes.append("MTP layer count taken as given (--mtp-layers): a server does not expose it"
                             if point.mtp_layers is not None else "MTP layer count unknown: a server does not expose it")
            startup, weights = None, None
        else:
            startup = self._ensure_server(cfg, point, prompts)
            weights = (sum(mtp_layer_bytes(Path(self.model_dir), drafter=bool(cfg.draft_model))[: point.mtp_layers])
                       if point.k else 0)
        try:
            run = self._measure(cfg, point, prompts)
        except (RuntimeError, OSError):
            # a launched server that died under the load: the point's failure names that, with the log's tail, and
            # not the refused connection it left; the later points of this (k, L) fail with the same words
            dead = None if cfg.server else exited_server(
                [(f"the vLLM server (k={point.k}, L={point.mtp_layers})", self.server)])
            if not dead:
                raise
            self.failed[(point.k, point.mtp_layers)] = f"{dead} (during the sweep)"
            self.close()
            raise RuntimeError(self.failed[(point.k, point.mtp_layers)]) from None
        run.startup_s, run.mtp_weight_bytes = startup, weights
        ran = dict(self.ran)
        if ran.get("sampler_fault") == EXPAND_FAULT and cfg.temperature > 0:  # as the offline backend's rows
            notes.append(EXPAND_FAULT)
        run.notes = self.server.conn.notes() + notes + ran.pop("notes") + run.notes
        run.engine = {**{k: v for k, v in self.facts.items() if k not in ("gpu_telemetry", "notes")}, **ran}
        return run

    def trace_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt]) -> dict:
        """trace-layers on the server (``trace.trace_served``): an attached one as it runs, or one launched for the
        trace with mtpbench's plugin enabled and eager execution."""
        from mtpbench.backends.vllm_server.trace import trace_served

        if not cfg.server:
            self.tracing = True
            self._ensure_server(cfg, GridPoint(mode, k, mtp_layers), prompts)
        data = trace_served(self.server, cfg, k, prompts, cfg.force_spec_step_idx)
        ran = dict(self.ran)
        data["notes"] = self.server.conn.notes() + ran.pop("notes", [])
        data.update({key: ran.get(key) for key in ("runner", "drafter")})
        return data

    def close(self) -> None:
        if self.server is not None and self.server.guard is not None:
            self.server.stop()
            self.server, self.key = None, None
        if self.check_servers is not None:
            self.check_servers.close()

    # -- check-lossless (lossless.CheckBackend): a k = 0 server and a k = K one, in ``check`` ---------------

    def encode(self, prompts: list[Prompt]) -> list[list[int]]:
        """The checkpoint's tokenizer.json: every arm and score sees the same ids (``check.encode``)."""
        return check.encode(self.cfg.model_dir, prompts)

    @check.check_call
    def sample_arm(self, cfg: SweepConfig, ids: list, k: int, seed: int, n: int, temperature: float,
                   max_tokens: int, speculative_overrides: dict | None = None,
                   batch_size: int | None = None) -> list[list[list[int]]]:
        """Per prompt (token ids), ``n`` continuations (token ids) from the k = 0 server (k = 0) or the
        drafting one; one request a continuation, ``batch_size`` (None: ``cfg.batch_size``) in flight. No
        request seed (``check``'s docstring): ``seed`` is a launched server's engine seed when this arm starts
        it. The drafting arm's spec-decode counters (/metrics deltas) are kept in ``last_counters``, the
        server's facts in ``last_engine``, the seed its draws came from in ``last_seed`` (``arm_seed``)."""
        arm = check.sample_arm(self.servers(), cfg, ids, k, seed, n, temperature, max_tokens,
                               speculative_overrides, batch_size)
        self.last_counters, self.last_engine, self.last_seed, self.last_law = arm.counters, arm.engine, arm.seed, \
            arm.law
        return arm.continuations

    @check.check_call
    def target_logprobs(self, ids: list[list[int]], continuations: list[list[int]],
                        temperature: float) -> list[list[float]]:
        """Each continuation token's log-prob under the target at ``temperature``, teacher-forced on the
        k = 0 server (the offline backend's maths, ``backends.vllm.scores``): vLLM's prompt log-probs are
        of the raw logits, the law at T = 1; at any other T the server returns the whole vocabulary at each
        position and the scores are renormalized, lp / T - logsumexp(lp / T)."""
        return check.target_logprobs(self.servers(), ids, continuations, temperature)

    @check.check_call
    def target_moments(self, ids: list[list[int]], continuations: list[list[int]],
                       temperature: float) -> list[list[tuple[float, float, float]]]:
        """``target_logprobs`` with each position's entropy and variance of log p under the target's law at
        ``temperature`` (check-lossless's one-sample test), from the k = 0 server's whole-vocabulary prompt
        log-probs: a launched baseline runs with --max-logprobs -1; ``errors.Unavailable`` where an attached one
        caps them, or where the vocabulary is too large (``scoring.moments_vocab``)."""
        return check.target_moments(self.servers(), ids, continuations, temperature)

    @check.check_call
    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]]) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between every row sent at once and each row
        alone (one request in flight), on the same k = 0 server: only the batch composition differs."""
        return check.logprob_noise(self.servers(), ids, continuations)

    @check.check_call
    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]]) -> list:
        """Per prompt, the first token where ``spec`` leaves ``k0`` with the target's top-two margin there
        (``scoring.Divergence``), or None; from the k = 0 server's prompt log-probs over the prompt and the
        shared prefix (top 2 with the k0 token, and the spec token's own). Margin and gap are differences of
        raw log-probs, equal to those of the logits."""
        return check.greedy_divergences(self.servers(), ids, k0, spec)

    # -- launched servers -----------------------------------------------------------------------------

    def _ensure_server(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> float | None:
        key = (point.k, point.mtp_layers)
        if key in self.failed:
            raise RuntimeError(self.failed[key])
        if self.key == key:
            if not self.server.guard.running():  # it died under an earlier load of this (k, L)
                self.failed[key] = f"the vLLM server exited during the sweep; server log: {self.server.guard.log_tail()}"
                self.close()
                raise RuntimeError(self.failed[key])
            return self.startup_s
        self.close()
        try:
            self.startup_s = self._launch(cfg, point, prompts)
        except RuntimeError as e:
            self.failed[key] = str(e)
            raise
        self.key = key
        return self.startup_s

    def _launch(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> float:
        """The server of ``point``'s (k, L), started and warmed up; its start-up time (without the warm-up)."""
        model = cfg.model_dir
        if point.k > 0:
            problem = check_num_speculative_tokens(point.k, point.mtp_layers)
            if problem:
                raise RuntimeError(problem)
            if not cfg.draft_model:  # a separate draft checkpoint runs whole
                model = derived_checkpoint(cfg.model_dir, point.mtp_layers)
        self.model_dir = str(cfg.mtp_dir if cfg.draft_model else model)
        args = server_args(cfg, str(model), point.k)
        env = server_env(model, cfg.runner)
        if self.tracing:  # the trace routes, and Python forwards the tracer sees (trace.py's docstring)
            args["enforce_eager"] = True
        if self.tracing or (cfg.law and point.k > 0):  # vLLM serves an endpoint plugin's routes only when named
            env["VLLM_PLUGINS"] = ",".join(filter(None, [env.get("VLLM_PLUGINS"), PLUGIN]))
        self.facts["server_args"] = args
        log = Path(cfg.out) / f"{GridPoint(point.mode, point.k, point.mtp_layers).name}.server.log"
        up = launch(cfg, args, env, log, point.k,
                    f"vLLM server (k={point.k}, L={point.mtp_layers})", port=cfg.server_port,
                    ready=lambda server: warm_up(server, cfg, prompts, max(cfg.concurrency)))
        self.server, self.ran = up.server, up.ran
        return up.startup_s

    def _warm_up(self, cfg: SweepConfig, prompts: list[Prompt], n: int) -> list[str]:
        """--num-warmups rounds of ``n`` requests at once before a window (0: none)."""
        return [note for _ in range(cfg.warmup) for note in warm_up(self.server, cfg, prompts, n)]

    # -- one load point -------------------------------------------------------------------------------

    def _measure(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        from mtpbench.telemetry import GpuSampler

        run = PointRun(notes=self._warm_up(cfg, prompts, point.concurrency or 1))
        for i in range(cfg.repeats):
            # GPU telemetry over the first window's load alone: not the /metrics polling around it
            sampler = GpuSampler(off=self.facts.get("gpu_telemetry"), pids=self._server_pids) if i == 0 else None
            requests, batch, notes = self._window(cfg, point, prompts, sampler)
            run.add_repeat(requests, [batch])
            run.notes += [n for n in notes if n not in run.notes]
            if sampler is not None:
                run.telemetry = {**sampler.record, "timed_runs": 1}
        if cfg.law and point.k > 0:
            run.law = self._law_pass(cfg, point, prompts)
        return run

    def _law_pass(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> dict:
        """sweep --law: after the point's windows, one untimed batch of its prompts (the window's API, sampling
        settings and concurrency) between the plugin's law routes (``trace.start_law``): every verify step against
        its law, or why the server cannot say (an attached one without the plugin: then no request is sent). The
        requests carry no seed (the engine's generator draws for each, independently: the window's one seed for all
        would correlate their accept decisions); the counters settle before the next window reads them. Failed
        requests leave the timed windows standing and say so in the block."""
        from mtpbench.backends.vllm_server.trace import start_law, stop_law
        from mtpbench.loadgen import payload, post_all

        s = self.server
        url = s.base_url + ("/v1/chat/completions" if cfg.api == "chat" else "/v1/completions")
        bodies = [{key: v for key, v in payload(cfg.api, s.model, p, cfg.max_tokens, cfg.temperature, None, cfg.top_p,
                                                cfg.top_k).items() if key not in ("stream", "stream_options")}
                  for p in prompts]
        started = start_law(s)
        if isinstance(started, str):  # no law routes here: nothing to send
            return stop_law(s, started)
        before = read_metrics(s.conn)
        try:
            errors = [e for _, e in post_all(url, bodies, point.concurrency or 1, conn=s.conn) if e]
        finally:
            law = stop_law(s, started)
        settled_metrics(s.conn, before, len(prompts))
        if errors:  # the timed windows stand: the law's block says why it is missing
            return {"observable": False, "why": f"{len(errors)} of {len(prompts)} requests of the untimed pass failed; "
                                                f"first: {errors[0]}"[:500]}
        return law

    def _window(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt],
                sampler=None) -> tuple[list[RequestRecord], BatchRecord, list[str]]:
        """One measured window: the load (under ``sampler``, if any), and the /metrics deltas around it."""
        from contextlib import nullcontext

        from mtpbench.loadgen import run_load

        base, s = self.server.base_url, self.server
        before = read_metrics(s.conn)
        with sampler if sampler is not None else nullcontext():
            load = run_load(base, s.model, prompts, api=cfg.api, max_tokens=cfg.max_tokens,
                            temperature=cfg.temperature, seed=cfg.seed, concurrency=point.concurrency or 1,
                            request_rate=point.request_rate if point.request_rate is not None else math.inf,
                            conn=s.conn, top_p=cfg.top_p, top_k=cfg.top_k)
        if load.errors:
            raise RuntimeError(f"{len(load.errors)} of {len(prompts)} requests failed; first: {load.errors[0]}")
        after, late = settled_metrics(s.conn, before, len(prompts))
        foreign, traffic = window_traffic(before, after, len(prompts),
                                          sum(len(r.output_token_ids) for r in load.requests))
        notes = ([late] if late else []) + traffic
        batch = BatchRecord("all", load.wall_s, **counter_delta(before, after, point.k), foreign_requests=foreign,
                            client_cpu_s=load.client_cpu_s)
        share = load.client_cpu_s / load.wall_s if load.wall_s > 0 else 0
        if share > 0.5:
            notes.append(f"the load generator used {share:.0%} of a CPU core: it may have limited the load")
        return load.requests, batch, notes

    def _server_pids(self) -> set[int]:
        """The processes of the launched server (its process group); empty for an attached one."""
        g = self.server.guard if self.server else None
        return g.pids() if g is not None else set()


def warm_up(server: Server, cfg: SweepConfig, prompts: list[Prompt], n: int) -> list[str]:
    """``n`` requests at once, before (and so excluded from) a window: shapes the engine has not seen yet (a
    new batch size) are compiled or cached here, not inside the measurement. Returns the notes a point
    measured after it must carry."""
    from mtpbench.loadgen import run_load

    before = read_metrics(server.conn)
    result = run_load(server.base_url, server.model, (prompts * n)[:n], api=cfg.api, max_tokens=WARMUP_TOKENS,
                      temperature=0.0, seed=cfg.seed, concurrency=n, conn=server.conn)
    if result.errors:
        raise RuntimeError(f"warm-up request failed: {result.errors[0]}")
    _, late = settled_metrics(server.conn, before, n)  # so no warm-up count lands in the window
    return [f"warm-up: {late}; the rest may land in the first window, as foreign traffic"] if late else []
