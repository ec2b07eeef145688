"""The intervals in a real sweep, against the saved raw numbers (coverage on synthetic data with a known answer:
tests/unit/test_coverage.py). Each interval of a row must be the one its rule gives from the point's own saved
requests and repeats: an interval that merely holds its value could not fail (each method, and the sweep's min /
max on the speedup, makes sure of that)."""

import json
import math

import numpy as np
import pytest
from scipy.special import stdtrit
from typer.testing import CliRunner

from mtpbench import stats
from mtpbench.cli import app
from mtpbench.sweep.load import load_run


def test_a_sweep_reports_intervals_in_every_output(tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(app, ["sweep", "--k", "0,2", "--modes", "chain", "--num-prompts", "6",
                                 "--max-tokens", "24", "--repeats", "6", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = {x["k"]: x for x in json.loads((out / "summary.json").read_text())["rows"] if x["category"] == "all"}
    k2 = rows[2]
    _, points, _ = load_run(out)
    saved = {p["point"]["k"]: p for p in points}
    tokps = {k: [x["output_tokens_per_sec"] for x in saved[k]["repeats"]] for k in (0, 2)}
    assert len(tokps[0]) == len(tokps[2]) == 6 and k2["num_repeats"] == 6
    # tokens/s: the geometric mean of the six repeats (the statistic the speedup is a ratio of, issue 55) and the
    # t interval on their logs, exp(mean -+ t(0.975, 5) s / sqrt(6)) (scipy's t)
    logs = np.log(tokps[2])
    half2 = stdtrit(5, 0.975) * logs.std(ddof=1) / math.sqrt(6)
    assert k2["output_tokens_per_sec"] == pytest.approx(math.exp(logs.mean()), abs=0.0051)
    assert (k2["output_tokens_per_sec_ci_low"], k2["output_tokens_per_sec_ci_high"]) == (
        pytest.approx(math.exp(logs.mean() - half2), abs=0.0051), pytest.approx(math.exp(logs.mean() + half2), abs=0.0051))
    # the speedup: the ratio of geometric means of the repeats, its interval Welch's t on the logs at
    # 1 - 0.05 / (1 point x 1 look) (stats.judge, written out here with scipy's t), rounded outward
    a, b = np.log(tokps[2]), np.log(tokps[0])
    est, va, vb = a.mean() - b.mean(), a.var(ddof=1) / 6, b.var(ddof=1) / 6
    df = (va + vb) ** 2 / (va * va / 5 + vb * vb / 5)
    half = stdtrit(df, 0.975) * math.sqrt(va + vb)
    assert k2["speedup"] == round(math.exp(est), 4) and k2["speedup_level"] == 0.95
    # ... never narrower than the machine's noise floor each side (the A/A control timed beside k = 0, issue 36)
    noise = json.loads((out / "summary.json").read_text())["noise"]
    assert noise["rounds"] == 6 and noise["floor"] > 0
    aa = [x["output_tokens_per_sec"] for x in json.loads((out / "aa-k0.json").read_text())["repeats"]]
    la = np.log(aa)
    vaa = la.var(ddof=1) / 6
    dfa = (vaa + vb) ** 2 / (vaa * vaa / 5 + vb * vb / 5)
    floor = abs(la.mean() - b.mean()) + stdtrit(dfa, 0.975) * math.sqrt(vaa + vb)
    half = max(half, floor)
    assert k2["speedup_ci_low"] == pytest.approx(math.floor(math.exp(est - half) * 1e4) / 1e4, abs=1.01e-4)
    assert k2["speedup_ci_high"] == pytest.approx(math.ceil(math.exp(est + half) * 1e4) / 1e4, abs=1.01e-4)
    lo, hi = k2["speedup_ci_low"], k2["speedup_ci_high"]
    assert k2["speedup_decision"] == ("faster" if lo > 1 else "slower" if hi < 1 else "open")
    assert hi / lo > 1.0001  # six timed runs a side: the interval is not a point
    # acceptance: pooled over the point's requests, the interval a bootstrap over those six prompts
    reqs = saved[2]["requests"]
    acc, drafts = [q["num_accepted_tokens"] for q in reqs], [q["num_drafts"] for q in reqs]
    assert len(reqs) == 6 and sum(drafts) > 0
    assert abs(k2["acceptance_length"] - (1 + sum(acc) / sum(drafts))) < 1e-4
    ci = stats.ratio_ci(acc, drafts)
    assert (k2["acceptance_length_ci_low"], k2["acceptance_length_ci_high"]) == (round(1 + ci[0], 4),
                                                                                  round(1 + ci[1], 4))
    assert len(k2["acceptance_rate_per_pos_ci_low"]) == 2
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert {"acceptance_length_ci_low", "acceptance_length_ci_high", "tpot_ms_p50_ci_high"} <= set(header)
    lo, hi = k2["acceptance_length_ci_low"], k2["acceptance_length_ci_high"]
    assert f"{k2['acceptance_length']:.3g} [{lo:.3g}, {hi:.3g}]" in r.output  # the interval's two ends
    assert (out / "al_histogram.png").stat().st_size > 1000
