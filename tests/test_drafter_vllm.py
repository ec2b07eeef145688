"""check-drafter on vLLM (issue 35): parity between the engine's MTP draft steps and mtpbench's reference of the
checkpoint's MTP block, for the DeepSeek-V3, GLM-4.5, MiMo and Qwen3-Next classes on both model runners (V2
through Triton's interpreter), and on the built-in models, whose dense decoder layer the reference computes too
(with its own key/value history, so Model Runner V2's chained layers and padding rows are checked as well).
Synthetic checkpoints have random weights: parity needs no trained drafter. Each engine 10-60 s on the idle EPYC."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.drafter.families import STAGES

pytestmark = pytest.mark.vllm

# MiMo's vLLM class asserts spec_step_idx == 0, which Model Runner V2 passes at later steps: k = 1 there
CASES = [("deepseek-v3", "v1", 2), ("glm-4.5", "v1", 2), ("mimo", "v1", 2), ("qwen3-next", "v1", 2),
         ("deepseek-v3", "v2", 2), ("glm-4.5", "v2", 2), ("mimo", "v2", 1), ("qwen3-next", "v2", 2)]


def check(args: list[str], out) -> dict:
    r = CliRunner().invoke(app, ["check-drafter", *args, "--num-prompts", "2", "--max-tokens", "16",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "drafter.json").read_text())


def assert_parity(s: dict, runner: str, independent_block: bool) -> None:
    assert s["runner"] == runner and s["first_difference"] is None, (s["errors"], s["notes"])
    want = [st for st in STAGES if st != "block" or independent_block]
    assert s["stages_checked"] == want, s["stages_checked"]
    assert all(s["errors"][st] <= s["tolerance"] for st in want), s["errors"]
    # a later step reads the previous step's output one position back (V1) or at the same position (V2's chain)
    later = {h["offset"] for h in s["hidden_inputs"] if h["later_step"]}
    assert later <= ({-1} if runner == "v1" else {0}), s["hidden_inputs"]


@pytest.mark.parametrize("arch,runner,k", CASES, ids=[f"{a}-{r}" for a, r, _ in CASES])
def test_the_engines_draft_steps_equal_the_reference(arch, runner, k, tmp_path):
    s = check(["--synthetic", arch, "--runner", runner, "--num-speculative-tokens", str(k)], tmp_path / "d")
    assert_parity(s, runner, independent_block=arch == "mimo")


@pytest.mark.parametrize("model,runner,k", [("builtin", "v1", 2), ("builtin-glm", "v1", 2),
                                            ("builtin-glm", "v2", 2)])
def test_built_in_models_parity_and_the_acceptance_the_reference_implies(model, runner, k, tmp_path):
    """The reference's whole chain (its own decoder layer) drafts the engine's tokens: its acceptance per
    position equals the engine's drafts', and position 0 is the trained drafter's (> 0.5)."""
    s = check([model, "--backend", "vllm", "--runner", runner, "--num-speculative-tokens", str(k)], tmp_path / "d")
    assert_parity(s, runner, independent_block=True)
    assert s["reference_acceptance"] == s["engine_acceptance"] and s["engine_acceptance"][0] > 0.5


def test_a_drafter_in_a_checkpoint_of_its_own_is_refused_in_one_line(tmp_path):
    """Gemma 4's assistant drafter is a separate checkpoint (draft/), not MTP layers: no reference yet."""
    from conftest import one_line_error

    out = tmp_path / "d"
    one_line_error(CliRunner().invoke(app, ["check-drafter", "--synthetic", "gemma-4", "--out", str(out)]),
                   "its drafter is a separate checkpoint (draft/)")
    assert not (out / "drafter.json").exists()


EXCHANGED_NORMS = Path(__file__).parent / "vllm_mimo_exchanged_norms"


def test_a_wiring_fault_planted_in_vllms_mimo_layer_is_named_as_seen(tmp_path, monkeypatch):
    """vLLM's MiMo MTP layer with its two input norms called on each other's input (tests/vllm_mimo_exchanged_norms,
    in the engine processes): check-drafter fails, and says what the captured values show, the norms given each
    other's inputs; it claimed before (issue 46 item 5) that the projection's halves were in the other order, which
    they are not: by content the hidden state's half comes first, as MiMo defines."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXCHANGED_NORMS),
                                                                    os.environ.get("PYTHONPATH")])))
    out = tmp_path / "d"
    r = CliRunner().invoke(app, ["check-drafter", "--synthetic", "mimo", "--runner", "v1",
                                 "--num-speculative-tokens", "1", "--num-prompts", "2", "--max-tokens", "16",
                                 "--out", str(out)])
    assert r.exit_code == 1, r.output
    s = json.loads((out / "drafter.json").read_text())
    assert s["verdict"] == "differs" and s["first_difference"] == "embedding", (s["errors"], s["notes"])
    assert s["cause"].startswith("embedding and hidden input: exchanged: enorm was given the previous hidden state "
                                 "and hnorm the token embedding"), s["notes"]
    assert s["errors"]["concat"] <= s["tolerance"] and s["errors"]["proj"] <= s["tolerance"], s["errors"]
    assert not any("other order" in n for n in s["notes"]), s["notes"]
    assert s["cause"] in r.output.split("\n\n")[0]  # the answer, first on the terminal
