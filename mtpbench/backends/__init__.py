"""Backends behind one small Protocol, looked up by name and imported lazily.

A backend loads what it needs in ``start`` and measures one grid point per ``run_point`` call. The
native backend keeps one model for the whole sweep; the vLLM backend starts one engine per point in a
subprocess. ``import mtpbench`` never imports a heavy engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from mtpbench.errors import MtpBenchError

if TYPE_CHECKING:
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import PointRun
    from mtpbench.prompts import Prompt


class Backend(Protocol):
    name: str

    def start(self, cfg: "SweepConfig") -> dict:
        """Load what the sweep needs once; return engine facts for provenance."""

    def run_point(self, cfg: "SweepConfig", mode: str, k: int, mtp_layers: int,
                  prompts: list["Prompt"]) -> "PointRun":
        """Warm up, then measure one grid point."""


REGISTRY = {
    "native": "mtpbench.backends.native:NativeBackend",
    "vllm": "mtpbench.backends.vllm:VllmBackend",
}


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise MtpBenchError(f"unknown backend {name!r} (choose from {', '.join(REGISTRY)})")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)()
