"""Backends behind one declared interface, looked up by name and imported lazily.

A backend loads what it needs in ``start``, measures one grid point per ``run_point`` call and lets go
of what it holds in ``close`` (called at the end of every sweep, also on errors and Ctrl-C). The native
backend keeps one model for the whole sweep; the vLLM backend starts one engine per point in a
subprocess; the vLLM server backend starts one server per (k, MTP layers) and measures every load on
it, or attaches to a running server. ``import mtpbench`` never imports a heavy engine.

Everything orchestration reads of a backend beyond ``Backend`` is declared on ``BackendBase``, which every
backend inherits, with the default a backend that lacks it gives: nothing outside ``backends/`` probes a
backend with getattr/hasattr. What is known by name alone (served? a vLLM engine? planted rules?) is in
``backend_info.info(name)``; check-lossless's methods are ``lossless.CheckBackend``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable, Protocol

from mtpbench.backend_info import REGISTRY, BackendInfo, info
from mtpbench.errors import MtpBenchError

if TYPE_CHECKING:
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint, PointRun
    from mtpbench.prompts import Prompt

__all__ = ["REGISTRY", "Backend", "BackendBase", "BackendInfo", "get_backend", "implements", "info"]


class Backend(Protocol):
    name: str

    def start(self, cfg: "SweepConfig") -> dict:
        """Load what the sweep needs once; return engine facts for provenance."""

    def run_point(self, cfg: "SweepConfig", point: "GridPoint", prompts: list["Prompt"]) -> "PointRun":
        """Warm up, then measure one grid point."""

    def close(self) -> None:
        """Release engines or servers still running."""


class BackendBase:
    """The optional part of the interface, each with its default (a backend sets or overrides what it has)."""

    name: str

    # the dtype the target ran in, in the engine's own word: set by start or by the engines a call started
    # (check-lossless's numerical floor, a greedy sweep's margins); None: not reported
    dtype_name: str | None = None
    # check-lossless, after each sample_arm: the arm's spec-decode counters, its engine facts, and the seed its
    # draws came from ({"seed": int or None, "note": why}; None: the seed asked for)
    last_counters: dict | None = None
    last_engine: dict | None = None
    last_seed: dict | None = None
    # and a drafting arm's verify steps against their law ({"observable": True, "steps": [...]} or
    # {"observable": False, "why": ...}; None: the backend does not read them): check-lossless's third test
    last_law: dict | None = None
    # check-lossless: the engine that scored (runner asked and ran), where the backend scores in its own engine
    scoring_engine: dict | None = None
    # check-lossless: the URL of a server without drafting (the k = 0 arms of an attached --server)
    baseline_server: str | None = None
    # optional methods, None where the backend has none: the target's per-token (log p, H, Var)
    # (lossless.CheckBackend.target_moments), and the first divergence of greedy runs from a k = 0 pass
    target_moments: Callable | None = None
    greedy_divergences: Callable | None = None
    # sweep --law: (cfg, point, prompts) -> an untimed pass's verify steps against their law, for a backend whose
    # run_point does not record them itself (``PointRun.law``: the offline vLLM engine, a server)
    read_law: Callable | None = None
    # trace-layers: (cfg, mode, k, mtp_layers, prompts) -> the tracer's records and counters
    trace_point: Callable | None = None
    # trace-matrix: (cfg, k, prompts, forces, cpus=, workers=) -> one checkpoint loaded under load_check and traced
    # once per entry of forces (as the engine drafts, and with spec_step_idx forced); vLLM's
    inspect: Callable | None = None
    # check-drafter: (cfg, mode, k, mtp_layers, prompts, modules, plant=) -> each draft call's stages (the native
    # engine and an offline vLLM one); ``drafter_engine`` names the family's stage map it reads ("native", "vllm")
    drafter_point: Callable | None = None
    drafter_engine: str | None = None

    def grid_k(self) -> int | None:
        """An attached server's own k, after ``start`` (None: the backend runs the k it is given)."""
        return None

    def check_facts(self) -> dict:
        """Engine facts check-lossless records beside ``start``'s (the native engine: torch's threads)."""
        return {}

    def plant_faults(self, **switches) -> None:
        """Switch on planted lossy rules (``engine.Faults`` fields): known-positive controls of check-lossless."""
        raise MtpBenchError(f"the {self.name} backend has no planted rules (the native engine's)")


def _class(name: str) -> type:
    module, cls = info(name).target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str) -> Backend:
    return _class(name)()


def implements(name: str, methods: tuple[str, ...]) -> bool:
    """Does the backend registered as ``name`` have every one of ``methods`` (imports its module, not its engine)?"""
    cls = _class(name)
    return all(callable(getattr(cls, m, None)) for m in methods)
