"""The first hour's options on real runs (issue 37): --label and --metadata in every file, the per-request JSONL and
the latency statistics against it (numpy as the oracle), --percentile-metrics / --metric-percentiles in the table,
--num-warmups, --max-concurrency and --speculative-config, on the native engine, vLLM offline and a launched
vLLM server."""

from __future__ import annotations

import csv
import re
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mtpbench.cli import app

SMALL = ["--num-prompts", "3", "--max-tokens", "8", "--repeats", "1"]
REPORTING = ["--label", "first-hour", "--metadata", "gpu=none", "--metadata", "batch=2",
             "--percentile-metrics", "e2el,itl", "--metric-percentiles", "50,95"]


def sweep(*args) -> str:
    r = CliRunner().invoke(app, ["sweep", *args])
    assert r.exit_code == 0, r.output
    return r.output


def check_files(out: Path, points: list[str], prompts: int = 3, repeats: int = 1) -> None:
    """Every file names the run; each point's JSONL holds its requests (the first timed run's), and its row's
    statistics follow from them (over the repeats where it has several: their geometric mean, issue 55)."""
    run = json.loads((out / "run.json").read_text())["config"]
    assert run["label"] == "first-hour" and run["metadata"] == {"gpu": "none", "batch": 2}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["label"] == "first-hour"
    rows = {r["k"]: r for r in summary["rows"] if r["category"] == "all"}
    with open(out / "summary.csv") as f:
        assert {(r["label"], r["metadata"]) for r in csv.DictReader(f)} == {("first-hour", "gpu=none;batch=2")}
    for name in points:
        point = json.loads((out / f"{name}.json").read_text())
        assert point["label"] == "first-hour" and point["metadata"] == {"gpu": "none", "batch": 2}
        lines = [json.loads(x) for x in (out / f"{name}.requests.jsonl").read_text().splitlines()]
        assert len(lines) == prompts and {x["label"] for x in lines} == {"first-hour"}
        assert [x["e2el_ms"] for x in lines] == pytest.approx([r["latency_s"] * 1e3 for r in point["requests"]], abs=1e-3)
        row = rows[point["point"]["k"]]
        e2el = [x["e2el_ms"] for x in lines]
        itl = [g for x in lines for g in x["itl_ms"] or []]  # vLLM offline: no token-by-token times
        # each run's values (the first run's are the JSONL's); a row's statistic is the runs' geometric mean of it
        runs = [r["latency_ms"] for r in point["repeats"]] if repeats > 1 else [{"e2el": e2el, "itl": itl}]
        assert runs[0]["e2el"] == pytest.approx(e2el, abs=1e-3) and len(runs) == repeats

        def want(metric, f):
            xs = [f(run[metric]) for run in runs if run[metric]]
            return pytest.approx(float(np.exp(np.mean(np.log(xs)))), rel=1e-3, abs=2e-3) if xs else None

        assert row["e2el_ms_mean"] == want("e2el", np.mean) and row["e2el_ms_std"] == want("e2el", np.std)
        assert row["e2el_ms_p50"] == want("e2el", lambda xs: np.percentile(xs, 50))
        assert row["latency_percentiles_ms"]["e2el_ms_p95"] == want("e2el", lambda xs: np.percentile(xs, 95))
        assert row["latency_percentiles_ms"]["itl_ms_p95"] == want("itl", lambda xs: np.percentile(xs, 95))


def check_table(output: str) -> None:
    header = next(line for line in output.splitlines() if line.startswith("mode"))
    for col in ("E2EL mean ms", "E2EL p50 ms", "E2EL p95 ms", "ITL mean ms", "ITL p95 ms"):
        assert col in header, header
    assert "TTFT p50 ms" not in header


def test_a_native_sweep_names_itself_everywhere_and_its_statistics_follow_from_its_requests(tmp_path):
    out = tmp_path / "native"
    output = sweep("--k", "0,1", "--modes", "reuse", *SMALL, "--repeats", "2", "--num-warmups", "0", *REPORTING,
                   "--out", str(out))
    check_files(out, ["k0", "reuse-L3-k1"], repeats=2)
    check_table(output)
    for name in ("k0", "reuse-L3-k1"):
        assert json.loads((out / f"{name}.json").read_text())["warmup"] == []  # --num-warmups 0: none


@pytest.mark.vllm
def test_vllm_offline_takes_the_first_hour_options(tmp_path):
    out = tmp_path / "vllm"
    output = sweep("builtin-glm", "--backend", "vllm", "--k", "0,1", *SMALL, "--max-model-len", "1024",
                   "--engine-arg", "enforce_eager=true", "--num-warmups", "0", *REPORTING, "--out", str(out))
    check_files(out, ["k0", "vllm-L3-k1"])
    check_table(output)


@pytest.mark.vllm
def test_vllm_receives_the_speculative_config(tmp_path):
    """A value vLLM's own SpeculativeConfig refuses: the drafting point fails with vLLM's words about it."""
    out = tmp_path / "spec"
    r = CliRunner().invoke(app, ["sweep", "builtin-glm", "--backend", "vllm", "--k", "1", *SMALL, "--max-model-len",
                                 "1024", "--engine-arg", "enforce_eager=true", "--speculative-config",
                                 '{"draft_tensor_parallel_size": 0}', "--out", str(out)])
    assert r.exit_code == 4 and "every point of the sweep failed" in r.output, r.output  # its only point
    error = json.loads((out / "vllm-L3-k1.failure.json").read_text())["error"]
    assert "draft_tensor_parallel_size" in error, error


@pytest.mark.vllm
def test_a_launched_server_takes_the_first_hour_options(tmp_path):
    out = tmp_path / "served"
    output = sweep("builtin-glm", "--backend", "vllm-server", "--k", "0", "--max-concurrency", "1,2", *SMALL,
                   "--max-model-len", "1024", "--engine-arg", "enforce_eager=true", "--num-warmups", "2", *REPORTING,
                   "--out", str(out))
    for name in ("k0-c1", "k0-c2"):
        lines = [json.loads(x) for x in (out / f"{name}.requests.jsonl").read_text().splitlines()]
        assert all(x["sent_s"] is not None and x["itl_ms"] for x in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["concurrency"] for r in summary["rows"] if r["category"] == "all"] == [1, 2]
    check_table(output)
    assert json.loads((out / "run.json").read_text())["fingerprint"]["warmup"] == 2


NEWCOMER = ["--num-prompts", "2", "--max-tokens", "16", "--repeats", "3"]  # the main job, small


def mtpbench(cwd: Path, *args: str) -> tuple[int, str, str]:
    """``mtpbench ARGS`` as a person runs it, through a pipe (no terminal: 80 columns), in ``cwd``."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = subprocess.run([sys.executable, "-m", "mtpbench", *args], cwd=cwd, capture_output=True, text=True, env=env,
                       timeout=900)
    return p.returncode, p.stdout, p.stderr


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def measured(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files a sweep measured (the summaries, plots and page are rebuilt from them)."""
    return {k: v for k, v in files.items() if not k.startswith(("summary", "report")) and not k.endswith(".png")}


def test_a_newcomers_path(tmp_path):
    """Issue 45: a newcomer's first hour as one test (its output is in docs/first-hour.md): the main job (small),
    a rerun into the same folder (nothing measured, said, not a file changed), a sweep with other settings (refused
    there), the same sweep again beside it, compare (is it reproducible?), report, and help at 80 columns through a pipe. Each answer comes first,
    every table line within 120 columns."""
    code, out, err = mtpbench(tmp_path, "sweep", *NEWCOMER)
    assert code == 0, err
    first = out.split("\n\n")[0]
    assert re.match(r"(Best: |No k is faster|Drafting is slower|Nothing can be told apart|Not judged: )", first), out
    assert all(len(line) <= 120 for line in out.splitlines() if not line.startswith(("wrote", "open"))), out
    results = tmp_path / "results"
    before = snapshot(results)
    code, out2, err2 = mtpbench(tmp_path, "sweep", *NEWCOMER)  # the same again: old results, said
    assert code == 0 and "nothing to measure: all " in err2 and "--replace measures them anew" in err2, err2
    assert measured(snapshot(results)) == measured(before)
    code, out3, err3 = mtpbench(tmp_path, "sweep", *NEWCOMER, "--max-tokens", "24")  # other settings, same folder
    assert code == 2 and err3.startswith("error: --out results holds a sweep measured with other settings "
                                         "(max_tokens 16 there, 24 now)"), err3
    code, _, err = mtpbench(tmp_path, "sweep", *NEWCOMER, "--out", "second")  # the same again, beside it
    assert code == 0, err
    code, out4, err4 = mtpbench(tmp_path, "compare", "results", "second", "--out", "cmp")
    assert code == 0 and out4.startswith("B against A: "), (out4, err4)
    code, out5, _ = mtpbench(tmp_path, "report", "results")
    assert code == 0 and out5.split("\n\n")[0] == first  # the same answer, rebuilt from the files
    code, out6, _ = mtpbench(tmp_path, "sweep", "-h")
    assert code == 0 and len(out6.splitlines()) <= 100 and max(map(len, out6.splitlines())) <= 80
