import json
import subprocess
import sys

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from conftest import greedy_trace_follows_its_law
from mtpbench.backends.native import NativeBackend
from mtpbench.cli import app
from mtpbench.config import SweepConfig
from mtpbench.engine import Faults
from mtpbench.errors import MtpBenchError
from mtpbench.trace.hooks import LayerTracer, discover
from mtpbench.trace.records import ABSENT, CallRecord
from mtpbench.trace.verdict import judge, loaded_vs_checkpoint
from mtpbench.trace.run import run_trace

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
    greedy_trace_follows_its_law(s)
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
    assert "the wrapper received spec_step_idx=1 but the predictor (model) received 0" in s["evidence"][0]


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
    args = ["trace-layers", "--num-speculative-tokens", "3", "--mode", "chain", "--max-tokens", "12", "--num-prompts", "1"]
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


# -- tracer fidelity: synthetic drafters shaped like vLLM's, driven by a tiny draft loop ------------------

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = nn.Linear(4, 4)

    def forward(self, x, spec_step_idx=0):
        return self.self_attn(x)


class Holder(nn.Module):  # vLLM's MiMoV2MTP keeps its layers here; this forward never runs
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        raise AssertionError("never called")


class NestedPredictor(nn.Module):
    def __init__(self, n, all_layers=False, boom_at=None):
        super().__init__()
        self.mtp = Holder(n)
        self.all_layers, self.boom_at = all_layers, boom_at

    def forward(self, x, spec_step_idx=0):
        if self.boom_at is not None and spec_step_idx == self.boom_at:
            raise AssertionError("only one step supported")
        layers = self.mtp.layers
        if self.all_layers:  # like Gemma4MTP: every layer in one call
            for layer in layers:
                x = layer(x)
            return x
        return layers[spec_step_idx % len(layers)](x, spec_step_idx)


class Wrapper(nn.Module):
    def __init__(self, n, **kw):
        super().__init__()
        self.model = NestedPredictor(n, **kw)

    def forward(self, x, spec_step_idx=0):
        return self.model(x, spec_step_idx)

    def compute_logits(self, x, spec_step_idx=0):  # like MiMoMTP: a head per layer, indexed without modulo
        return [x, x][spec_step_idx]


def drive(wrapper, k, proposals=3, target_raises=False, logits=False):
    """A draft loop: one target forward, then k draft calls with spec_step_idx = s (and, with ``logits``, the
    wrapper's compute_logits after each); ``target_raises``: the engine fails after the first proposal."""
    target = nn.Linear(4, 4)
    tracer = LayerTracer(wrapper, target).install()
    tracer.enabled = True
    tracer.start_batch()
    crash = None
    try:
        for p in range(proposals):
            if target_raises and p == 1:
                raise RuntimeError("prompt longer than max_model_len")
            x = target(torch.zeros(1, 4))
            for s in range(k):
                x = wrapper(x, spec_step_idx=s)
                if logits:
                    wrapper.compute_logits(x, spec_step_idx=s)
    except Exception as e:
        crash = f"{type(e).__name__}: {e}"
    finally:
        tracer.remove()
    v = judge(tracer.records, tracer.num_layers, k, [100] * tracer.num_layers, crash,
              crash_in_draft=tracer.draft_error is not None)
    return tracer, v


def test_layers_in_a_holder_whose_forward_never_runs_are_multi_module_not_swallowed():
    tracer, v = drive(Wrapper(2), k=4)
    assert v.verdict == "multi-module", v.evidence
    assert {r.predictor for r in tracer.records} == {"model"}
    assert [r.predictor_spec_step_idx for r in tracer.records[:4]] == [0, 1, 2, 3]


def test_k1_and_single_layer_are_inconclusive_not_reuse():
    _, v = drive(Wrapper(2), k=1)
    assert v.verdict == "inconclusive" and "k >= 2" in v.evidence[0]
    _, v = drive(Wrapper(1), k=3)
    assert v.verdict == "inconclusive" and "coincide" in v.evidence[0]


def test_unused_layers_count_only_layers_scheduled_at_this_k():
    _, v = drive(Wrapper(3), k=2)
    assert v.verdict == "multi-module" and v.unused_layers == [] and v.unused_layer_bytes == 0
    recs = [CallRecord(1, 1, s, executed_layer=0, expected_layer=s % 3) for s in range(2)]
    v = judge(recs, 3, 2, [100, 100, 100])
    assert v.verdict == "layer-0 reuse" and v.unused_layers == [1] and v.unused_layer_bytes == 100


def test_a_drafter_running_all_layers_per_call_has_its_own_verdict():
    tracer, v = drive(Wrapper(2, all_layers=True), k=2)
    assert v.verdict == "multi-layer calls"
    assert tracer.records[0].layers_run == "0 1" and "several MTP layers in one call" in v.evidence[0]


def test_crash_inside_the_draft_model_vs_engine_error():
    _, v = drive(Wrapper(2, boom_at=1), k=2)
    assert v.verdict == "crashed" and "draft step 1" in v.evidence[0] and "only one step" in v.evidence[0]
    tracer, v = drive(Wrapper(2), k=2, target_raises=True)  # after a whole proposal was drafted
    assert tracer.records and v.verdict == "engine error" and "max_model_len" in v.evidence[0]
    _, v = drive(Wrapper(2), k=3, logits=True)  # the head raises at step 2: the draft model did
    assert v.verdict == "crashed" and "IndexError" in v.evidence[0]


def test_what_was_not_observed_is_not_judged():
    # k = 4 asked, but only step 0 was ever called: nothing tells reuse from multi-module
    recs = [CallRecord(1, p, 0, executed_layer=0, expected_layer=0) for p in range(1, 6)]
    v = judge(recs, 2, 4, [100, 100])
    assert v.verdict == "inconclusive" and "only draft step(s) [0]" in v.evidence[0]
    # steps 0 and 1 ran layers 0 and 1, but k = 3 with 3 layers schedules layer 2 too: fewer calls than k
    recs = [CallRecord(1, 1, s, executed_layer=s, expected_layer=s) for s in range(2)]
    v = judge(recs, 3, 3, [100] * 3)
    assert v.verdict == "mismatch" and v.unused_layers == [2]


def test_a_model_that_ignores_the_index_it_receives_is_not_reuse():
    recs = [CallRecord(1, 1, s, wrapper_spec_step_idx=s, predictor_spec_step_idx=s, executed_layer=0,
                       expected_layer=s % 2) for s in range(4)]
    v = judge(recs, 2, 4, [100, 100])
    assert v.verdict == "mismatch" and "ignores the index" in v.evidence[0]


def test_layers_dropped_at_load_are_named_with_their_bytes():
    assert loaded_vs_checkpoint(2, 2, [5, 7]) == []
    line, = loaded_vs_checkpoint(3, 1, [5, 7, 11])
    assert "declares 3 MTP layers but the engine loaded 1" in line and "[1, 2] (18 bytes" in line
    line, = loaded_vs_checkpoint(1, 2, [5])
    assert "2 blocks for the checkpoint's 1 MTP layer" in line


def test_calls_that_ran_no_mtp_layer_are_inconclusive_not_a_mismatch():
    # the wrapper was called at steps 0..3, but no layer forward was seen in any call
    recs = [CallRecord(1, p, s, wrapper_spec_step_idx=s, expected_layer=s % 2) for p in (1, 2) for s in range(4)]
    v = judge(recs, 2, 4, [100, 100])
    assert v.verdict == "inconclusive", v.evidence
    assert "none of the 8 draft calls ran an MTP layer" in v.evidence[0] and "None" not in " ".join(v.evidence)
    # some calls ran no layer: judged from those that did, and said so
    recs = [CallRecord(1, 1, s, executed_layer=s % 2, expected_layer=s % 2) for s in range(4)]
    recs.append(CallRecord(1, 2, 0, expected_layer=0))
    v = judge(recs, 2, 4, [100, 100])
    assert v.verdict == "multi-module", v.evidence
    assert "1 of 5 draft calls (at step(s) [0]) ran no MTP layer" in v.evidence[-1]


def test_forcing_in_timed_runs_records_nothing_and_wraps_only_the_wrapper():
    """sweep --force-spec-step-idx on vLLM: the timed run gets the forced index but no tracer records, so
    nothing grows with the run and the predictor and layers run unwrapped."""
    from mtpbench.trace.hooks import force_spec_step_idx

    class IdxLogits(Wrapper):
        def compute_logits(self, x, spec_step_idx=0):
            return spec_step_idx

    wrapper, target = IdxLogits(2), nn.Linear(4, 4)
    ran = []
    for j, layer in enumerate(wrapper.model.mtp.layers):
        layer.register_forward_hook(lambda m, i, o, j=j: ran.append(j))
    tracer = force_spec_step_idx(wrapper, target)
    heads = []
    for _ in range(300):  # proposals of a long timed run; the draft loop passes no index (layer 0 unforced)
        x = target(torch.zeros(1, 4))
        for _s in range(3):
            x = wrapper(x)
            heads.append(wrapper.compute_logits(x))
    assert ran[:6] == [0, 1, 0, 0, 1, 0] and heads[:6] == [0, 1, 2, 0, 1, 2]  # forced: step s
    assert tracer.records == [] and tracer.current is None
    assert "forward" not in wrapper.model.__dict__
    assert all("forward" not in layer.__dict__ for layer in wrapper.model.mtp.layers)
    tracer.remove()
    x = target(torch.zeros(1, 4))
    wrapper(x), wrapper(x)
    assert ran[-2:] == [0, 0]  # removed: the loop's own (absent) index again


def test_the_verdict_needs_no_torch():
    # the verdict is pure logic on records: judging saved traces must not need torch (or an engine)
    code = "import sys; sys.modules['torch'] = None; import mtpbench.trace.verdict"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
