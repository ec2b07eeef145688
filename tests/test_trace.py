import json

import pytest
from torch import nn
from typer.testing import CliRunner

from mtpbench.backends.native import NativeBackend
from mtpbench.cli import app
from mtpbench.config import SweepConfig
from mtpbench.engine import Faults
from mtpbench.errors import MtpBenchError
from mtpbench.trace import ABSENT, CallRecord, discover, judge, run_trace

runner = CliRunner()


def native_trace(tmp_path, mode, k=4, faults=None, force=False):
    cfg = SweepConfig(num_prompts=2, max_tokens=24, out=str(tmp_path / mode), force_spec_step_idx=force)
    backend = NativeBackend()
    backend.start(cfg)
    if faults:
        backend.faults = faults
    return run_trace(cfg, k, mode, backend=backend)


def test_chain_is_multi_module(tmp_path):
    s = native_trace(tmp_path, "chain", k=4)
    assert s["verdict"] == "multi-module"
    assert [row["ran layer:count"].split(":")[0] for row in s["per_step"]] == ["0", "1", "2", "0"]
    assert [a["layer"] for a in s["acceptance_by_layer"]] == [0, 1, 2, 0]
    for name in ("trace.csv", "trace.json", "layers.png"):
        assert (tmp_path / "chain" / name).stat().st_size > 100


def test_reuse_is_layer0_reuse_and_names_unused_layers(tmp_path):
    s = native_trace(tmp_path, "reuse", k=4)
    assert s["verdict"] == "layer-0 reuse"
    assert s["unused_layers"] == [1, 2] and s["unused_layer_bytes"] > 0
    csv = (tmp_path / "reuse" / "trace.csv").read_text().splitlines()
    assert csv[0].startswith("batch,proposal,draft_step,wrapper_spec_step_idx")
    assert all(f",{ABSENT}," in line for line in csv[1:])


def test_wrapper_that_drops_the_index_is_swallowed(tmp_path):
    s = native_trace(tmp_path, "chain", faults=Faults(wrapper_drops_spec_step_idx=True))
    assert s["verdict"] == "swallowed"
    assert "the wrapper received spec_step_idx=1 but the predictor received 0" in s["evidence"][0]


def test_loop_that_never_passes_the_index_is_layer0_reuse(tmp_path):
    s = native_trace(tmp_path, "chain", faults=Faults(loop_omits_spec_step_idx=True))
    assert s["verdict"] == "layer-0 reuse"


def test_force_spec_step_idx_turns_reuse_into_multi_module(tmp_path):
    s = native_trace(tmp_path, "reuse", k=3, force=True)
    assert s["verdict"] == "multi-module"


def test_judge_mismatch_and_crash():
    recs = [CallRecord(1, 1, s, wrapper_spec_step_idx=s, predictor_spec_step_idx=s, executed_layer=l,
                       expected_layer=s % 2) for s, l in [(0, 0), (1, 0), (2, 1), (3, 1)]]
    v = judge(recs, 2, 4, [10, 10])
    assert v.verdict == "mismatch" and "step 1 ran layer 0, expected 1" in v.evidence[0]
    assert judge(recs[:1], 2, 4, [10, 10], crash="AssertionError: no").verdict == "crashed"


def test_unrecognised_structure():
    with pytest.raises(MtpBenchError, match="unrecognised draft-model structure"):
        discover(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


def test_cli_expect_sets_exit_code(tmp_path):
    args = ["trace-layers", "--k", "3", "--mode", "chain", "--max-tokens", "12", "--num-prompts", "1"]
    ok = runner.invoke(app, args + ["--expect", "multi-module", "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    assert "verdict: multi-module" in ok.output
    bad = runner.invoke(app, args + ["--expect", "layer-0-reuse", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 1
    assert json.loads((tmp_path / "b" / "trace.json").read_text())["verdict"] == "multi-module"


def test_cli_model_without_mtp_layers(tmp_path, no_mtp_model):
    r = runner.invoke(app, ["trace-layers", str(no_mtp_model), "--out", str(tmp_path / "t")])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "has no MTP layers" in r.output
    assert not (tmp_path / "t").exists()
