"""The interval code: quantiles, order statistics, edge cases, and the intervals in a real sweep (coverage on
synthetic data with a known answer: test_coverage.py)."""

import json

from typer.testing import CliRunner

from mtpbench.cli import app




def test_a_sweep_reports_intervals_in_every_output(tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(app, ["sweep", "--k", "0,2", "--mode", "chain", "--num-prompts", "6",
                                 "--max-tokens", "24", "--repeats", "6", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = {x["k"]: x for x in json.loads((out / "summary.json").read_text())["rows"]}
    k2 = rows[2]
    assert k2["acceptance_length_ci_low"] <= k2["acceptance_length"] <= k2["acceptance_length_ci_high"]
    assert len(k2["acceptance_rate_per_pos_ci_low"]) == 2 and k2["num_repeats"] == 6
    assert k2["output_tokens_per_sec_ci_low"] <= k2["output_tokens_per_sec"] <= k2["output_tokens_per_sec_ci_high"]
    assert k2["speedup_ci_low"] <= k2["speedup"] <= k2["speedup_ci_high"]
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"acceptance_length_ci_low", "acceptance_length_ci_high", "tpot_ms_p50_ci_high"} <= set(header)
    half = (k2["acceptance_length_ci_high"] - k2["acceptance_length_ci_low"]) / 2
    assert f"{k2['acceptance_length']:.3g} ± {half:.2g}" in r.output
    assert (out / "al_histogram.png").stat().st_size > 1000
