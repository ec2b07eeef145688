"""What a vLLM engine is started with: its ``LLM(...)`` keyword arguments for one grid point, the checkpoint
directory it loads, and its process environment (the offline worker's and a launched server's)."""

from __future__ import annotations

import os
from pathlib import Path

from mtpbench.checkpoint import derived_checkpoint
from mtpbench.config import SweepConfig
from mtpbench.errors import MtpBenchError
from mtpbench.paths import SHIMS_DIR

PLUGIN = "mtpbench_trace"  # the entry points' name (plugin.NAME; this module imports no vLLM)


def check_num_speculative_tokens(k: int, n_predict: int) -> str | None:
    """vLLM's rule (SpeculativeConfig): k <= n_predict, or k divisible by n_predict."""
    if k > n_predict and k % n_predict:
        return (f"num_speculative_tokens:{k} must be divisible by n_predict={n_predict} "
                f"(vLLM allows k <= n_predict or k a multiple of it)")
    return None


def engine_kwargs(cfg: SweepConfig, model: str, k: int) -> dict:
    kw = {"model": model, "dtype": cfg.dtype, "seed": cfg.seed, "disable_log_stats": False,
          "tensor_parallel_size": cfg.tensor_parallel_size, "max_num_seqs": cfg.batch_size}
    for name in ("pipeline_parallel_size", "data_parallel_size"):
        if getattr(cfg, name) != 1:
            kw[name] = getattr(cfg, name)
    for name in ("max_model_len", "gpu_memory_utilization", "distributed_executor_backend"):
        if getattr(cfg, name):
            kw[name] = getattr(cfg, name)
    if k > 0:
        kw["speculative_config"] = {"method": cfg.method, "num_speculative_tokens": k}
        if cfg.draft_model:
            kw["speculative_config"]["model"] = str(cfg.mtp_dir)
        kw["speculative_config"].update(cfg.speculative_config)  # --speculative-config
    kw.update(cfg.engine_args)
    return kw


def engine_model(cfg: SweepConfig, k: int, mtp_layers: int) -> str:
    """The checkpoint directory an engine at k loads: the model's own, or one with ``mtp_layers`` MTP layers."""
    model = str(cfg.model_dir)
    if k > 0:
        problem = check_num_speculative_tokens(k, mtp_layers)
        if problem:
            raise RuntimeError(problem)
        if cfg.draft_model:
            if mtp_layers != cfg.num_mtp_layers():
                raise RuntimeError(f"{mtp_layers} MTP layers asked for: a separate draft checkpoint runs whole "
                                   f"({cfg.num_mtp_layers()} layers)")
        else:
            model = str(derived_checkpoint(cfg.model_dir, mtp_layers))
    return model


def worker_env(model_dir=None, runner: str | None = None) -> dict:
    env = engine_env(model_dir, runner)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: hooks can reach it
    return env


def engine_env(model_dir=None, runner: str | None = None) -> dict:
    """The environment of a vLLM engine process (offline worker or launched server) for this model and
    model runner (``mtpbench.runners``: nothing for the one vLLM picks here, else the variables and shim
    the other needs)."""
    from mtpbench.runners import runner_env

    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the CPU build reserves ~21 GiB otherwise
    plugins = env.get("VLLM_PLUGINS")
    if plugins is not None and PLUGIN not in plugins.split(","):  # an allowlist: mtpbench's must be on it
        env["VLLM_PLUGINS"] = ",".join(filter(None, [plugins, PLUGIN]))
    if model_dir is not None and needs_torchvision_shim(model_dir):
        shims = str(SHIMS_DIR.resolve() / "torchvision")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [shims, env.get("PYTHONPATH")]))
    env.update(runner_env(runner, env))
    return env


def with_cpu_binding(env: dict, engine_kwargs: dict) -> dict:
    """``env`` with ``VLLM_CPU_OMP_THREADS_BIND`` for a sharded engine where the user set none: vllm-cpu binds each
    local rank's OpenMP threads to a NUMA node of its own and refuses more ranks than nodes ("Not enough allowed
    NUMA nodes"); this splits the CPUs this process may use into one contiguous group a rank ("0|1", "0-3|4-7").
    A GPU platform ignores the variable."""
    ranks = engine_kwargs.get("tensor_parallel_size", 1) * engine_kwargs.get("pipeline_parallel_size", 1)
    if ranks <= 1 or env.get("VLLM_CPU_OMP_THREADS_BIND"):
        return env
    binding = cpu_binding(sorted(os.sched_getaffinity(0)), ranks)
    return {**env, "VLLM_CPU_OMP_THREADS_BIND": binding} if binding else env


def cpu_binding(cpus: list[int], ranks: int) -> str | None:
    """The CPUs split into ``ranks`` contiguous groups of equal size (the remainder left out), in vLLM's
    notation; None where there are fewer CPUs than ranks."""
    size = len(cpus) // ranks
    if size == 0:
        return None
    return "|".join(_cpu_list(cpus[i * size:(i + 1) * size]) for i in range(ranks))


def _cpu_list(cpus: list[int]) -> str:
    if len(cpus) == 1:
        return str(cpus[0])
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus))


def needs_torchvision_shim(model_dir) -> bool:
    """vLLM's classes for some architectures (Qwen3.5, GLM-OCR, MiMo-V2-Omni: ``Arch.needs_torchvision_stub``)
    import transformers' vision processors, which import torchvision; with no torchvision installed, a
    text-only engine of those gets mtpbench's import shim (shims/torchvision). Never for other models:
    transformers would take the shim for the real thing."""
    import importlib.util

    from mtpbench.checkpoint import read_config
    from mtpbench.synth import archs

    if importlib.util.find_spec("torchvision") is not None:
        return False
    try:
        arch = (read_config(Path(model_dir)).get("architectures") or [""])[0]
    except MtpBenchError:
        return False
    return arch in {a.target for a in archs().values() if a.needs_torchvision_stub}
