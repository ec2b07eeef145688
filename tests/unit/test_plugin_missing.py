"""A rank without mtpbench's vLLM plugin (a Ray node whose Python lacks mtpbench, or whose VLLM_PLUGINS names other
plugins) fails the first collective_rpc call of every op: its error becomes one line saying what to install or set.
The texts are vLLM 0.32's, as a two-raylet Ray run with one node's VLLM_PLUGINS naming another plugin printed them."""

from __future__ import annotations

import pytest

from mtpbench.backends.vllm.inprocess import plugin_missing

SAID = ("RuntimeError: Worker failed with error ''CPUWorker' object has no attribute 'mtpbench_runner'', please "
        "check the stack trace above for the root cause")


def test_a_rank_without_the_plugin_is_named_with_what_to_do():
    got = plugin_missing(SAID)
    assert got.startswith("a rank of the engine runs without mtpbench's vLLM plugin: install mtpbench in the Python "
                          "that runs vLLM on every node, and where a node sets VLLM_PLUGINS, name mtpbench_trace")
    assert got.endswith(f"vLLM said: {SAID[:300]}")
    assert plugin_missing("NotImplementedError: Method 'mtpbench_trace_start' is not implemented.") is not None


@pytest.mark.parametrize("other", [
    "RuntimeError: Worker failed with error 'out of memory'",
    "AttributeError: 'CPUWorker' object has no attribute 'drafter'",  # vLLM's own, not the plugin's
    "RuntimeError: mtpbench_runner timed out",  # a plugin method that exists and failed otherwise
])
def test_any_other_error_is_left_as_it_is(other):
    assert plugin_missing(other) is None
