"""GPU telemetry of a measured window, read through NVML (``pynvml``, from nvidia-ml-py).

A ``GpuSampler`` is a context manager around the window a backend times: a thread reads, every
``interval_s``, each GPU's power draw, memory used and utilisation, and at both ends NVML's total-energy
counter where the GPU has one (Volta and newer). What it kept (``sampler.record``) goes into the point
file as is; ``summarize_samples`` turns it into the row's figures, from saved JSON alone:

* ``energy_j``: the energy counter's delta summed over GPUs, or, where a GPU lacks the counter, the
  power samples integrated over time (trapezoids); ``energy_method`` says which;
* ``avg_power_w``: energy / window length; ``peak_gpu_mem_bytes``: the largest total of memory used
  across the sampled GPUs at one sample.

Without an NVIDIA GPU (no driver, no pynvml, the engine on the CPU, a remote server) the record is
``{"unavailable": reason}`` and every figure is ``None``: nothing fails.
"""

from __future__ import annotations

import os
import threading
import time

INTERVAL_S = 0.1


def _nvml():
    """The initialised pynvml module, or the reason it cannot be used."""
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA driver here
        return None, f"NVML is not available here ({e}): no NVIDIA GPU driver"
    return pynvml, None


def visible_gpu_indices(nvml, count: int) -> list[int]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES leaves visible (all when it is unset, none when it is
    empty). Integer entries are taken in NVML's (PCI) order, CUDA's own with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    out = []
    for item in (x.strip() for x in visible.split(",")):
        if item.isdigit():
            if int(item) < count:
                out.append(int(item))
            continue
        for i in range(count):  # a UUID (GPU-...) or MIG id: match it against each device's UUID
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            if uuid.startswith(item) or item.startswith(uuid):
                out.append(i)
    return out


def unavailable_reason() -> str | None:
    """None when NVML sees at least one NVIDIA GPU here, else one line saying why not."""
    nvml, reason = _nvml()
    if nvml is None:
        return reason
    try:
        if not visible_gpu_indices(nvml, nvml.nvmlDeviceGetCount()):
            return "NVML sees no NVIDIA GPU visible to this process"
    except Exception as e:  # NVMLError: no permission, a GPU fallen off the bus, ...
        return f"NVML failed ({e})"
    finally:
        nvml.nvmlShutdown()
    return None


def own_pids() -> set[int]:
    """This process and its descendants (engine workers it started)."""
    from mtpbench.procguard import descendants

    return descendants(os.getpid())


class GpuSampler:
    """``with GpuSampler() as s: <measured work>``; then ``s.record`` holds the samples.

    ``off``: a reason not to sample (e.g. the engine runs on the CPU); the record then says it.
    ``pids``: a callable giving the engine's processes; only the GPUs they run on are sampled
    (``record["selection"]``), or every visible GPU when NVML shows none of them (containers may hide
    other processes' ids), which the record says too."""

    def __init__(self, interval_s: float = INTERVAL_S, off: str | None = None, pids=own_pids):
        self.interval_s = interval_s
        self.pids = pids
        self.record: dict = {"unavailable": off} if off else {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuSampler":
        if self.record.get("unavailable"):
            return self
        nvml, reason = _nvml()
        if nvml is None:
            self.record = {"unavailable": reason}
            return self
        self.nvml = nvml
        try:
            self._open()
        except Exception as e:  # NVMLError mid-set-up: no figures, and the point goes on
            nvml.nvmlShutdown()
            self._thread = None
            self.record = {"unavailable": f"NVML failed ({e})"}
        return self

    def _open(self) -> None:
        nvml = self.nvml
        indices = visible_gpu_indices(nvml, nvml.nvmlDeviceGetCount())
        if not indices:
            raise RuntimeError("no NVIDIA GPU is visible to this process")
        wanted = self.pids() if self.pids else set()
        used = [i for i in indices if wanted & _gpu_pids(nvml, nvml.nvmlDeviceGetHandleByIndex(i))]
        selection = "gpus of the engine's processes" if used else "all visible"
        indices = used or indices
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        names = [nvml.nvmlDeviceGetName(h) for h in self.handles]
        self.record = {"source": "nvml", "interval_s": self.interval_s, "selection": selection,
                       "gpus": [{"index": i, "name": n.decode() if isinstance(n, bytes) else str(n)}
                                for i, n in zip(indices, names)],
                       "t_s": [], "power_w": [], "mem_used_bytes": [], "util_pct": [],
                       "energy_counter_mj": None}
        self._energy_start = self._energy()
        self.t0 = time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="mtpbench-gpu-sampler", daemon=True)
        self._thread.start()

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        end = self._energy()
        self.record["window_s"] = time.perf_counter() - self.t0
        if self._energy_start is not None and end is not None:
            self.record["energy_counter_mj"] = {"start": self._energy_start, "end": end}
        self.nvml.nvmlShutdown()

    def _energy(self) -> list[int] | None:
        try:
            return [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]
        except Exception:  # NVMLError_NotSupported before Volta: integrate power instead
            return None

    def _sample(self) -> None:
        n, r = self.nvml, self.record
        power, mem, util = [], [], []
        for h in self.handles:
            power.append(_try(lambda: n.nvmlDeviceGetPowerUsage(h) / 1e3))  # mW -> W
            mem.append(_try(lambda: int(n.nvmlDeviceGetMemoryInfo(h).used)))
            util.append(_try(lambda: int(n.nvmlDeviceGetUtilizationRates(h).gpu)))
        r["t_s"].append(round(time.perf_counter() - self.t0, 4))
        r["power_w"].append(power)
        r["mem_used_bytes"].append(mem)
        r["util_pct"].append(util)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()


def _gpu_pids(nvml, handle) -> set[int]:
    try:
        return {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # not supported, or no permission: no match, so every visible GPU is sampled
        return set()


def _try(read):
    try:
        return read()
    except Exception:  # one reading NVML does not support on this GPU: left unknown
        return None


def integrate_power_j(t_s: list[float], power_w: list[list[float | None]]) -> float | None:
    """Energy in J from power samples (W, one list per sample over GPUs) by the trapezoid rule."""
    total = [sum(p) if p and all(x is not None for x in p) else None for p in power_w]
    if len(t_s) < 2 or any(x is None for x in total):
        return None
    return sum((t_s[i + 1] - t_s[i]) * (total[i] + total[i + 1]) / 2 for i in range(len(t_s) - 1))


def summarize_samples(record: dict | None) -> dict:
    """energy_j, energy_method, avg_power_w, peak_gpu_mem_bytes and gpu_util_pct_mean of one record;
    an empty dict when there is nothing to summarize (no GPU)."""
    if not record or record.get("unavailable") or not record.get("t_s"):
        return {}
    t, window = record["t_s"], record.get("window_s") or (record["t_s"][-1] if record["t_s"] else 0)
    counter = record.get("energy_counter_mj")
    if counter:
        energy, method = sum(e - s for s, e in zip(counter["start"], counter["end"])) / 1e3, "nvml_energy_counter"
    else:
        energy, method = integrate_power_j(t, record["power_w"]), "integrated_power"
    totals = [sum(m) for m in record["mem_used_bytes"] if m and all(x is not None for x in m)]
    util = [x for u in record["util_pct"] for x in u if x is not None]
    return {"energy_j": energy, "energy_method": method if energy is not None else None,
            "avg_power_w": energy / window if energy is not None and window > 0 else None,
            "peak_gpu_mem_bytes": max(totals) if totals else None,
            "gpu_util_pct_mean": sum(util) / len(util) if util else None}
