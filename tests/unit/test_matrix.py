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

call_worker({"op": "run", "config": {}, "k": 2, "engine_kwargs": {"model": str(Path(sys.argv[1]) / "slow")}, "prompts": []})
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


# ---- cells filed by the runner asked for, on hand-made traces (no engine) --------------------------------

def _trace(layers: list[int], forced: bool, ran: str, drafter: str, asked: str) -> dict:
    """One traced generation of a 2-layer MTP at k = 2: three proposals whose steps ran ``layers``."""
    recs = [CallRecord(0, p, s, wrapper_spec_step_idx=s if forced else "absent",
                       predictor_spec_step_idx=s if forced else "absent", executed_layer=layer, expected_layer=s,
                       forced=forced)
            for p in range(3) for s, layer in enumerate(layers)]
    # the engine's own note where it ran another runner (backends.vllm.engine_runner), kept in the evidence
    notes = [f"asked for vLLM model runner {asked.upper()}, the engine ran {ran.upper()} {drafter}"] * (asked != ran)
    return {"records": [vars(r) for r in recs], "crash": None, "crash_in_draft": False, "num_layers": 2,
            "num_drafts": 3, "runner": ran, "drafter": drafter, "notes": notes}


def _engine(asked: str, ran: str, drafter: str, as_installed: list[int]) -> dict:
    return {"traces": [_trace(as_installed, False, ran, drafter, asked), _trace([0, 1], True, ran, drafter, asked)],
            "layer_bytes": [100, 100], "startup_s": 1.0}


def _asked_v1_and_v2_but_v2_ran_v1():
    from mtpbench.matrix.cells import cells_for as _cells_for
    from mtpbench.synth.common import Arch

    arch = Arch("toy", "ToyMTP", "ToyForCausalLM", None, mtp_layers=2)
    v1 = _cells_for(arch, 2, 2, _engine("v1", "v1", "EagleProposer", [0, 0]), "", "", 0, "v1")
    # the engine asked for V2 fell back to V1 (a build without the V2 runner): it drafts as V1 does
    v2 = _cells_for(arch, 2, 2, _engine("v2", "v1", "EagleProposer", [0, 0]), "", "", 0, "v2")
    # a second architecture whose V2 engine did run V2
    other = Arch("other", "OtherMTP", "OtherForCausalLM", None, mtp_layers=2)
    return v1 + v2 + _cells_for(other, 2, 2, _engine("v1", "v1", "EagleProposer", [0, 0]), "", "", 0, "v1") + \
        _cells_for(other, 2, 2, _engine("v2", "v2", "MultiModuleMTPSpeculator", [0, 1]), "", "", 0, "v2")


def test_a_cell_is_filed_under_the_runner_asked_for_with_a_note_when_another_ran(tmp_path):
    """An engine asked for V2 that ran V1 once overwrote the V1 cell, and the V2 column of its
    architecture disappeared. Each cell stays in its asked column; "asked V2, ran V1" says what ran."""
    from mtpbench.matrix import headers, markdown, rows, write_matrix

    cells = _asked_v1_and_v2_but_v2_ran_v1()
    head = headers(cells)
    assert "V1 as installed (layer per step)" in head and "V2 as installed (layer per step)" in head
    table = {r[0]: dict(zip(head, r)) for r in rows(cells)}
    toy = table["toy"]
    assert toy["V1 as installed (layer per step)"] == "layer-0 reuse (0 0)"  # its own cell, no note
    assert toy["V2 as installed (layer per step)"] == "layer-0 reuse (0 0); asked V2, ran V1"
    assert toy["V2 forced spec_step_idx (layer per step)"] == "multi-module (0 1); asked V2, ran V1"
    assert toy["V1 drafted by"] == "EagleProposer" and toy["V2 drafted by"] == "EagleProposer (ran V1)"
    assert table["other"]["V2 as installed (layer per step)"] == "multi-module (0 1)"
    assert table["other"]["V2 drafted by"] == "MultiModuleMTPSpeculator"
    moved = [c for c in cells if c.note]
    assert [(c.arch, c.runner_asked, c.runner, c.note) for c in moved] == [("toy", "v2", "v1", "asked V2, ran V1")] * 2
    write_matrix(tmp_path, cells, "0.32.0", 10.0, 1)
    import csv

    with open(tmp_path / "matrix.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert [(r["arch"], r["runner_asked"], r["runner"], r["note"]) for r in csv_rows if r["drafting"] == "forced"] == [
        ("toy", "v1", "v1", ""), ("toy", "v2", "v1", "asked V2, ran V1"), ("other", "v1", "v1", ""),
        ("other", "v2", "v2", "")]
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert {(c["runner_asked"], c["note"]) for c in data["cells"] if c["arch"] == "toy"} == {
        ("v1", ""), ("v2", "asked V2, ran V1")}
    md = (tmp_path / "matrix.md").read_text()
    assert md == markdown(cells, "0.32.0", 10.0, 1) and "layer-0 reuse (0 0); asked V2, ran V1" in md
    assert (tmp_path / "matrix.png").stat().st_size > 1000


def test_report_rebuilds_an_old_matrix_json_with_the_asked_runner_from_the_evidence(tmp_path):
    """A matrix.json from before cells recorded the runner asked for: ``mtpbench report`` rebuilds its
    files. The V2-asked engine that ran V1 is found by the engine's own note in its evidence; other cells
    fall back to the runner they ran."""
    from dataclasses import asdict

    from typer.testing import CliRunner

    from mtpbench.cli import app

    old = [{k: v for k, v in asdict(c).items() if k not in ("runner_asked", "note")}
           for c in _asked_v1_and_v2_but_v2_ran_v1()]
    assert all(c["runner"] == "v1" for c in old if c["arch"] == "toy")  # as the old code filed them
    prov = {"hardware": {"cpu": "AMD EPYC", "cpu_flags": {"avx512f": True, "amx_bf16": False}}}
    (tmp_path / "matrix.json").write_text(json.dumps({"vllm": "0.32.0", "wall_s": 474.0, "jobs": 2,
                                                      "interrupted": False, "cells": old, "provenance": prov}))
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "matrix.md").read_text()
    assert "V2 as installed (layer per step)" in md and "layer-0 reuse (0 0); asked V2, ran V1" in md
    assert "CPU: AMD EPYC [avx512f; no amx_bf16]" in md and "474 s with 2 engine(s)" in md and md in r.output
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["provenance"] == prov and len(data["cells"]) == 8
    assert sorted((c["arch"], c["runner_asked"], c["runner"], c["note"]) for c in data["cells"]
                  if c["drafting"] == "forced") == [("other", "v1", "v1", ""), ("other", "v2", "v2", ""),
                                                    ("toy", "v1", "v1", ""), ("toy", "v2", "v1", "asked V2, ran V1")]
    assert "asked V2, ran V1" in (tmp_path / "matrix.csv").read_text()
    # a cell the file cannot describe: one line, exit 2
    (tmp_path / "matrix.json").write_text(json.dumps({"cells": [{"arch": "toy"}]}))
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "cell 0 lacks mtp_class" in r.output
