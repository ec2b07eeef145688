"""One vLLM engine in a fresh worker process (``python -m mtpbench.backends.vllm.worker SPEC RESULT``), supervised
by ``mtpbench.procguard.run_worker``: memory is returned when it exits, and a crash inside vLLM (an assertion,
out of memory) becomes an error of this call while the caller goes on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mtpbench.backends.vllm.engine_args import with_cpu_binding, worker_env
from mtpbench.procguard import Workers, run_worker

WORKER_MODULE = "mtpbench.backends.vllm.worker"
WORKER_TIMEOUT_S = int(os.environ.get("MTPBENCH_VLLM_POINT_TIMEOUT", 3600))  # one point, start-up included


def call_worker(spec: dict, env: dict | None = None, timeout: float = WORKER_TIMEOUT_S,
                workers: Workers | None = None) -> dict:
    """Run one engine on ``spec`` (its ``op`` and arguments: ``worker``'s docstring) in a worker process; its
    result dict, or RuntimeError with the worker's error. ``workers``: stops it from another thread (Ctrl-C)."""
    import tempfile

    if workers is not None and workers.stopped:
        raise RuntimeError("stopped before this vLLM worker started")
    with tempfile.TemporaryDirectory(prefix="mtpbench-vllm-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        with open(Path(tmp) / "stdout", "w+") as out, open(Path(tmp) / "stderr", "w+") as err:
            finished, code = run_worker([sys.executable, "-m", WORKER_MODULE, str(spec_path), str(result_path)],
                                        with_cpu_binding({**worker_env(spec["engine_kwargs"]["model"],
                                                                       spec.get("runner")), **(env or {})},
                                                         spec["engine_kwargs"]), timeout, out, err, workers)
            if not finished:
                raise RuntimeError(f"vLLM worker did not finish within {timeout:.0f} s")
            if workers is not None and workers.stopped:
                raise RuntimeError("vLLM worker stopped: interrupted")
            if result_path.exists():
                data = json.loads(result_path.read_text())
                if "error" in data:
                    raise RuntimeError(explained(data["error"], (out, err), spec["engine_kwargs"]))
                return data
            err.seek(0)
            out.seek(0)
            tail = (err.read() or out.read()).strip().splitlines()[-5:]
            raise RuntimeError(explained(f"vLLM worker exited with code {code}: " + " | ".join(tail), (out, err),
                                         spec["engine_kwargs"]))


def explained(error: str, outputs, engine_kwargs: dict) -> str:
    """``error``, led by what vLLM's fault is where the engine ran pipeline parallel and its output (``outputs``: the
    worker's stdout and stderr files, which its vLLM processes share; vLLM logs a stage's traceback on stdout) names
    one that mtpbench knows (``layout.explain_pp_failure``)."""
    from mtpbench.environment import installed_vllm
    from mtpbench.layout import explain_pp_failure
    from mtpbench.runners import cpu_build

    text = []
    for f in outputs:
        f.seek(0)
        text.append(f.read())
    why = explain_pp_failure("\n".join([*text, error]), engine_kwargs.get("pipeline_parallel_size", 1),
                             installed_vllm() if cpu_build() else None)
    return f"{why}; vLLM's error: {error}" if why else error
