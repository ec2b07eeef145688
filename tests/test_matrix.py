"""trace-matrix without vLLM: Ctrl-C through the real command, worker processes and process groups (the
engine is a stand-in ``vllm`` package that sleeps), and the checks against vLLM on hand-made records."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mtpbench.matrix import vllm_check
from mtpbench.prompts import BUILTIN_MODEL_DIR
from mtpbench.trace.records import CallRecord

# The stand-in engine: "fast" refuses to start at once (a finished cell); any other model writes its pid and
# a child's pid, then sleeps as a slow engine start would.
FAKE_VLLM = {
    "vllm/__init__.py": """
        import os, subprocess, sys, time
        from pathlib import Path

        class LLM:
            def __init__(self, model, **kwargs):
                model = Path(model)
                if model.name == "fast":
                    raise ValueError("stand-in engine: fast refuses to start")
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                (model.parent / f"{model.name}.pids").write_text(f"{os.getpid()} {child.pid}")
                time.sleep(600)
        """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        from dataclasses import dataclass

        @dataclass
        class EngineArgs:
            pass
        """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/model_loader/__init__.py": "",
    "vllm/model_executor/model_loader/default_loader.py": """
        class DefaultModelLoader:
            def load_weights(self, model, model_config):
                pass
        """,
}

# `mtpbench trace-matrix` with three stand-in architectures, each the built-in checkpoint under its name
DRIVER = """
import sys
from pathlib import Path

import mtpbench.synth as synth
from mtpbench.cli import main
from mtpbench.synth.common import Arch

root = Path(sys.argv[1])
table = {n: Arch(n, "FakeMTP", "FakeForCausalLM", None, mtp_layers=1) for n in ("fast", "slow", "queued")}
synth.archs = lambda: table
synth.cached = lambda arch, mtp_layers=None: root / arch.name
sys.argv = ["mtpbench", "trace-matrix", "--arch", "fast,slow,queued", "--jobs", "1", "--out", str(root / "out")]
main()
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stand_in(root: Path, driver: str) -> dict:
    """The stand-in vllm package, the models "fast", "slow" and "queued", the driver script; the env."""
    for rel, text in FAKE_VLLM.items():
        (root / "fake" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "fake" / rel).write_text(textwrap.dedent(text))
    for name in ("fast", "slow", "queued"):
        shutil.copytree(BUILTIN_MODEL_DIR, root / name)
    (root / "driver.py").write_text(driver)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "fake"), os.environ.get("PYTHONPATH")]))}


def wait_gone(pids: list[int], seconds: float = 10) -> bool:
    end = time.monotonic() + seconds  # SIGKILL is sent; the kernel may take a moment
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


def kill_all(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("to", ["terminal", "process"])
def test_ctrl_c_stops_the_engines_and_writes_the_finished_cells(tmp_path, to):
    """``terminal``: SIGINT to the whole foreground process group, as Ctrl-C at a terminal sends it;
    ``process``: to mtpbench alone (``kill -INT``, a supervisor), so only mtpbench can stop the engines."""
    env = stand_in(tmp_path, DRIVER)
    # a session of its own, so a terminal-like Ctrl-C below reaches its whole process group and nothing else
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while not (any("fast" in line and "did not start" in line for line in err)
                   and (tmp_path / "slow.pids").exists()):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(err)
            time.sleep(0.2)
        time.sleep(0.5)  # the pid file is written before the child's sleep: let it settle
        pids = [int(x) for x in (tmp_path / "slow.pids").read_text().split()]
        if to == "terminal":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)  # today's code waits for every queued engine instead
        except subprocess.TimeoutExpired:
            raise AssertionError("trace-matrix did not exit within 30 s of Ctrl-C") from None
        out = proc.stdout.read()
        reader.join(5)
        text = "".join(err)
        assert proc.returncode == 130, text
        assert "PARTIAL matrix (1 of 3 architectures finished)" in text
        assert wait_gone(pids), "the stopped engine (or its child) is still running"
        assert not (tmp_path / "queued.pids").exists(), "a queued architecture started after Ctrl-C"
        data = json.loads((tmp_path / "out" / "matrix.json").read_text())
        assert data["interrupted"] is True
        got = {(c["arch"], c["drafting"]): c for c in data["cells"]}
        assert len(got) == 6
        assert got["fast", "as installed"]["verdict"] == "did not start"
        assert "fast refuses to start" in got["fast", "forced"]["error"]
        assert {got[a, d]["verdict"] for a in ("slow", "queued") for d in ("as installed", "forced")} == {"interrupted"}
        md = (tmp_path / "out" / "matrix.md").read_text()
        assert "Partial matrix" in md and "interrupted (Ctrl-C) before 2 of 3 architectures" in md and md in out
        assert (tmp_path / "out" / "matrix.csv").read_text().count("\n") == 7
        assert (tmp_path / "out" / "matrix.png").stat().st_size > 1000
    finally:
        kill_all(pids)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


CALLER = """
import sys
from pathlib import Path

from mtpbench.backends.vllm import call_worker

call_worker({"config": {}, "k": 2, "engine_kwargs": {"model": str(Path(sys.argv[1]) / "slow")}, "prompts": []})
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_engine_worker_never_outlives_its_caller(tmp_path, sig):
    """A sweep's worker (call_worker in the main thread): Ctrl-C ends its process group; SIGKILL of the
    caller closes the worker's stdin pipe, and the worker ends its own group."""
    env = stand_in(tmp_path, CALLER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "slow.pids").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        time.sleep(0.5)
        pids = [int(x) for x in (tmp_path / "slow.pids").read_text().split()]
        os.kill(proc.pid, sig)
        proc.wait(30)
        assert wait_gone(pids), f"the engine (or its child) outlived its caller ({sig.name})"
    finally:
        kill_all(pids)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_vllm_check_of_calls_that_ran_no_layer_says_unchecked():
    recs = [CallRecord(1, 1, s, wrapper_spec_step_idx=s) for s in range(2)]
    assert vllm_check(recs, 2, 2, 5, None) == "the layer rule not checked: no MTP layer ran"
    recs = [CallRecord(1, 1, s, predictor_spec_step_idx=s, executed_layer=s) for s in range(2)]
    assert vllm_check(recs, 2, 2, 5, None) == "consistent"
