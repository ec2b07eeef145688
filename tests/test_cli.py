import json

import pytest
from typer.testing import CliRunner

from mtpbench.prompts import load_prompts
from conftest import SHARED

runner = CliRunner()
SMALL = ["--num-prompts", "2", "--max-tokens", "12", "--repeats", "1"]  # one timed run: these read no timing


from unit.test_cli import bad_inputs, run  # noqa: E402,F401  (shared)


def test_sweep_writes_files_and_report_reproduces_summary(tmp_path):
    out = tmp_path / "sweep"
    r = run("sweep", "--k", "0,2", "--mtp-layers", "1,3", "--out", out, *SMALL)
    assert r.exit_code == 0, r.output
    names = {p.name for p in out.iterdir()}
    assert {"run.json", "k0.json", "reuse-L1-k2.json", "chain-L3-k2.json", "summary.csv", "summary.json",
            "acceptance_length.png", "throughput.png", "per_position.png"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["k"] == [0, 2] and summary["provenance"]["versions"]["torch"]
    rows = {(r["mode"], r["mtp_layers"], r["k"]): r for r in summary["rows"]}
    chain = rows[("chain", 3, 2)]
    # speedup is the point's tok/s over the k = 0 baseline's, from the same run
    base = rows[("plain", 0, 0)]["output_tokens_per_sec"]
    assert chain["speedup"] == pytest.approx(chain["output_tokens_per_sec"] / base, rel=2e-3)
    assert 1 <= chain["acceptance_length"] <= 3 and chain["speedup"] > 0
    assert chain["theoretical_speedup"] is not None and chain["draft_cost_ratio"] > 0
    csv_before = (out / "summary.csv").read_text()
    for p in ["summary.csv", "summary.json", "throughput.png"]:
        (out / p).unlink()
    r = run("report", out)
    assert r.exit_code == 0, r.output
    assert (out / "summary.csv").read_text() == csv_before
    assert (out / "throughput.png").stat().st_size > 1000
    # a second sweep with the same settings skips every saved point
    mtime = (out / "k0.json").stat().st_mtime_ns
    assert run("sweep", "--k", "0,2", "--mtp-layers", "1,3", "--out", out, *SMALL).exit_code == 0
    assert (out / "k0.json").stat().st_mtime_ns == mtime


MT_BENCH = SHARED / "data" / "mt_bench_question.jsonl"


@pytest.mark.skipif(not MT_BENCH.exists(), reason="shared MT-Bench file not present")
def test_mt_bench_prompts_and_category_rows(tmp_path):
    prompts = load_prompts(str(MT_BENCH))
    assert len(prompts) == 80
    assert prompts[0].category == "writing" and prompts[0].text.startswith("Compose an engaging travel blog")
    sub = tmp_path / "two-categories.jsonl"
    lines = MT_BENCH.read_text().splitlines()
    sub.write_text("\n".join([lines[0], lines[1], lines[10], lines[11]]) + "\n")
    out = tmp_path / "sweep"
    r = run("sweep", "--k", "0,1", "--mode", "chain", "--prompts", sub, "--max-tokens", "8", "--out", out)
    assert r.exit_code == 0, r.output
    csv_rows = (out / "summary.csv").read_text().splitlines()
    cats = {line.split(",")[4] for line in csv_rows[1:]}
    assert cats == {"all", "writing", "roleplay"}


def test_a_code_change_invalidates_saved_points(tmp_path, monkeypatch):
    """The fingerprint holds a hash of mtpbench's sources: points made by other code are measured again."""
    from mtpbench import environment

    out = tmp_path / "s"
    args = ("sweep", "--k", "0", "--out", out, *SMALL)
    assert run(*args).exit_code == 0
    mtime = (out / "k0.json").stat().st_mtime_ns
    assert run(*args).exit_code == 0 and (out / "k0.json").stat().st_mtime_ns == mtime  # same code: reused
    monkeypatch.setattr(environment, "code_identity", lambda: "0123456789abcdef")  # as after a bug fix
    assert run(*args).exit_code == 0
    assert (out / "k0.json").stat().st_mtime_ns != mtime
    assert json.loads((out / "k0.json").read_text())["fingerprint"]["versions"]["mtpbench_code"] == "0123456789abcdef"


def test_native_dtype_auto_is_the_checkpoints():
    from mtpbench.backends.native import NativeBackend
    from mtpbench.config import SweepConfig

    facts = NativeBackend().start(SweepConfig(dtype="auto"))
    assert facts["dtype"] == "bfloat16"  # the built-in checkpoint's torch_dtype, not float32


def test_a_busy_machine_gets_one_warning_and_its_load_on_record(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    out = tmp_path / "busy"
    r = run("sweep", "--k", "0", "--out", out, *SMALL)
    assert r.exit_code == 0
    assert r.output.count("warning: load average 64.00 exceeds the") == 1
    prov = json.loads((out / "run.json").read_text())["provenance"]
    assert prov["load_average"] == [64.0, 64.0, 64.0] and prov["load_average_end"] == [64.0, 64.0, 64.0]
