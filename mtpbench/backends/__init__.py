"""Backends behind one small Protocol, looked up by name and imported lazily.

A backend loads what it needs in ``start``, measures one grid point per ``run_point`` call and lets go
of what it holds in ``close`` (called at the end of every sweep, also on errors and Ctrl-C). The native
backend keeps one model for the whole sweep; the vLLM backend starts one engine per point in a
subprocess; the vLLM server backend starts one server per (k, MTP layers) and measures every load on
it, or attaches to a running server. ``import mtpbench`` never imports a heavy engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from mtpbench.errors import MtpBenchError

if TYPE_CHECKING:
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint, PointRun
    from mtpbench.prompts import Prompt


class Backend(Protocol):
    name: str

    def start(self, cfg: "SweepConfig") -> dict:
        """Load what the sweep needs once; return engine facts for provenance."""

    def run_point(self, cfg: "SweepConfig", point: "GridPoint", prompts: list["Prompt"]) -> "PointRun":
        """Warm up, then measure one grid point."""

    def close(self) -> None:
        """Release engines or servers still running."""


REGISTRY = {
    "native": "mtpbench.backends.native:NativeBackend",
    "vllm": "mtpbench.backends.vllm:VllmBackend",
    "vllm-server": "mtpbench.backends.vllm_server:VllmServerBackend",
}


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise MtpBenchError(f"unknown backend {name!r} (choose from {', '.join(REGISTRY)})")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()
