"""Measure until decided (issue 36) on the native engine: sequential rounds stop decided points, keep the budget,
time the A/A control beside k = 0, and every table, page, report and comparison states the machine's noise.
Nothing here asserts a timing: only what the rule did with the timings it got."""

import json
import math

from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.config import SweepConfig
from mtpbench.stats.sequential import judge
from mtpbench.sweep import run_sweep

runner = CliRunner()
TINY = dict(k=(0, 1), mode=("chain",), num_prompts=2, max_tokens=8)


def points(out):
    return {n: json.loads((out / f"{n}.json").read_text()) for n in ("k0", "aa-k0", "chain-L3-k1")}


def tokps(d):
    return [t["output_tokens_per_sec"] for t in d["repeats"]]


def test_a_point_stops_once_decided_and_its_baseline_and_the_aa_copy_go_on_with_it(tmp_path):
    cfg = SweepConfig(**TINY, repeats=3, max_repeats=6, out=str(tmp_path))
    rows = {r.k: r for r in run_sweep(cfg) if r.category == "all"}
    p = points(tmp_path)
    seq = p["chain-L3-k1"]["sequential"]
    n = len(p["chain-L3-k1"]["repeats"])
    assert 3 <= n <= 6 and seq["repeats"] == n and seq["looks"] == 4 and math.isclose(seq["level"], 1 - 0.05 / 4)
    # the saved look is the rule's on the timings saved: the point's, against k = 0's rounds up to its last look,
    # never narrower than the A/A floor of those rounds
    k0, aa = tokps(p["k0"]), tokps(p["aa-k0"])
    assert len(aa) == len(k0) >= n and [t["round"] for t in p["aa-k0"]["repeats"]] == list(range(len(k0)))
    look = judge(tokps(p["chain-L3-k1"]), k0[:n], alpha=0.05, looks=4, floor=seq["floor"])
    assert look.state == seq["state"] and math.isclose(look.lo, seq["lo"], rel_tol=1e-4)
    assert (seq["state"] == "open") == (n == 6) and seq["stopped"] == ("budget" if n == 6 else "decided")
    assert rows[1].speedup_decision == seq["state"] and rows[1].num_repeats == n
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["noise"]["rounds"] == len(k0) and summary["noise"]["floor"] > 0
    # a speedup interval is never narrower than the floor, each side
    lo, hi, sp = rows[1].speedup_ci_low, rows[1].speedup_ci_high, rows[1].speedup
    floor = summary["noise"]["floor"]
    assert lo <= sp * math.exp(-floor) * (1 + 1e-3) and hi >= sp * math.exp(floor) * (1 - 1e-3)
    assert all(r["mode"] != "aa" for r in summary["rows"])  # the A/A control is no row of the grid


def test_the_time_budget_stops_the_rounds_at_the_first_look(tmp_path):
    cfg = SweepConfig(**TINY, repeats=3, max_repeats=20, max_seconds=0.001, warmup=0, out=str(tmp_path))
    run_sweep(cfg)
    p = points(tmp_path)
    assert all(len(d["repeats"]) == 3 for d in p.values()) and p["k0"]["warmup"] == []
    seq = p["chain-L3-k1"]["sequential"]
    assert seq["stopped"] == ("decided" if seq["state"] != "open" else "budget") and seq["looks"] == 18


def test_the_noise_is_stated_in_the_table_the_page_the_report_and_compare(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        res = runner.invoke(app, ["sweep", "--k", "0,1", "--modes", "chain", "--num-prompts", "2", "--max-tokens", "8",
                                  "--repeats", "3", "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert "noise: on this machine two identical single runs differ by up to" in res.output
        assert "decided" in res.output.splitlines()[0] or "decided" in res.output  # the table's column
    page = (a / "report.html").read_text()
    assert "the A/A control (k = 0 against itself, 3 rounds)" in page
    before = json.loads((a / "summary.json").read_text())["noise"]
    (a / "summary.json").unlink()
    assert runner.invoke(app, ["report", str(a)]).exit_code == 0
    assert json.loads((a / "summary.json").read_text())["noise"] == before  # rebuilt from the saved files
    res = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "c")])
    assert res.exit_code in (0, 1), res.output
    result = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert result["noise"]["a"] == before and result["noise"]["b"]["rounds"] == 3
    assert any(n.startswith("A: noise:") for n in result["notes"])


def test_sequential_options_refused_in_one_line(tmp_path):
    for args, words in ((["--repeats", "3", "--max-repeats", "2"], "--max-repeats 2 is below --repeats 3"),
                        (["--repeats", "2", "--max-repeats", "5"], "the first look needs --repeats 3"),
                        (["--repeats", "3", "--max-repeats", "5", "--max-seconds", "0"], "--max-seconds must be > 0"),
                        (["--warmup", "-1"], "--warmup must be >= 0"),
                        (["--backend", "vllm", "--repeats", "3", "--max-repeats", "5"],
                         "the vllm backend times each point's repeats in one go")):
        out = tmp_path / "x"
        res = runner.invoke(app, ["sweep", "--k", "0,1", "--out", str(out), *args])
        assert res.exit_code == 2 and words in res.output and not out.exists(), res.output
