import json

import pytest
from typer.testing import CliRunner

from mtpbench.prompts import load_prompts
from conftest import SHARED, one_line_error

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
    r = run("sweep", "--k", "0,1", "--modes", "chain", "--prompts", sub, "--max-tokens", "8", "--out", out)
    assert r.exit_code == 0, r.output
    csv_rows = (out / "summary.csv").read_text().splitlines()
    cats = {line.split(",")[4] for line in csv_rows[1:]}
    assert cats == {"all", "writing", "roleplay"}


def test_a_code_change_invalidates_saved_points(tmp_path, monkeypatch):
    """The fingerprint holds a hash of mtpbench's sources: points made by other code are never served as this
    code's. A rerun with the same code reuses them and says so; with other code it is refused, naming it, with
    every file as it was (issue 45: never silently), until --replace moves the earlier sweep aside whole."""
    from mtpbench import environment
    from unit.test_store import snapshot

    out = tmp_path / "s"
    args = ("sweep", "--k", "0", "--out", out, *SMALL)
    assert run(*args).exit_code == 0
    mtime = (out / "k0.json").stat().st_mtime_ns
    r = run(*args)
    assert r.exit_code == 0 and (out / "k0.json").stat().st_mtime_ns == mtime  # same code: reused, and said
    assert f"nothing to measure: the 1 point was measured before in {out} with the same settings" in r.output
    before = snapshot(out)
    monkeypatch.setattr(environment, "code_identity", lambda: "0123456789abcdef")  # as after a bug fix
    one_line_error(run(*args), "holds a sweep measured with other settings (versions.mtpbench_code ")
    assert snapshot(out) == before
    r = run(*args, "--replace")
    assert r.exit_code == 0 and "--replace: the earlier results in" in r.output
    assert json.loads((out / "k0.json").read_text())["fingerprint"]["versions"]["mtpbench_code"] == "0123456789abcdef"
    moved = next(tmp_path.glob("s.replaced-*"))
    assert snapshot(moved) == before  # the earlier sweep, whole, and still a sweep mtpbench reads
    assert run("report", moved).exit_code == 0 and (moved / "summary.json").is_file()


def test_a_rerun_says_what_it_reuses_and_an_interrupted_one_leaves_the_earlier_sweep_readable(tmp_path,
                                                                                              monkeypatch):
    """Issue 45 item 1: a second sweep with one more k into a finished sweep's folder: --dry-run counts only the
    point to run; the run says it reuses k0. Interrupted (Ctrl-C while measuring), the folder still reads as the
    earlier sweep, its k0 row as before."""
    from mtpbench.sweep import run as sweep_run

    out = tmp_path / "s"
    assert run("sweep", "--k", "0", "--modes", "chain", "--out", out, *SMALL).exit_code == 0
    first = json.loads((out / "summary.json").read_text())["rows"]
    dry = run("sweep", "--k", "0,1", "--modes", "chain", "--out", out, "--dry-run", *SMALL)
    assert dry.exit_code == 0, dry.output
    assert f"reused: 1 point measured before in {out} with the same settings, not run again: k0" in dry.output
    # the one point left to run: its warm-up and its timed run
    assert "grid: 1 points: chain-L3-k1" in dry.output and "timed runs: 2" in dry.output

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_run, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep_run.run_sweep(_config(out, k=(0, 1)))
    monkeypatch.undo()
    r = run("report", out)  # the interrupted run planned k1 and measured none of it: partial (issue 56), said first
    assert r.exit_code == 4 and "partial: 1 of 2 points measured (missing: chain-L3-k1)" in r.output, r.output
    again = json.loads((out / "summary.json").read_text())["rows"]
    assert [x for x in again if x["k"] == 0] == [x for x in first if x["k"] == 0]
    r = run("sweep", "--k", "0,1", "--modes", "chain", "--out", out, *SMALL)
    assert r.exit_code == 0 and f"reusing 1 of 2 points measured before in {out} with the same settings (k0)" \
        in r.output


def _config(out, k):
    from mtpbench.config import SweepConfig

    return SweepConfig(k=k, mode=("chain",), num_prompts=2, max_tokens=12, repeats=1, out=str(out))


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
