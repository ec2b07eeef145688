import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.prompts import load_prompts
from conftest import SHARED, one_line_error

runner = CliRunner()
SMALL = ["--num-prompts", "2", "--max-tokens", "12", "--repeats", "1"]  # one timed run: these read no timing


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def bad_inputs(tmp_path, no_mtp_model):
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"prompt": "ok"}\n{"prompt": \n')
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {
        "negative k": (["--k", "0,-1"], "--k must be >= 0"),
        "too many layers": (["--mtp-layers", "4"], "the checkpoint has 3 MTP layer(s)"),
        "unknown profile": (["--profile", "nope"], "unknown profile 'nope'"),
        "unknown mode": (["--mode", "reuse,zigzag"], "unknown mode 'zigzag'"),
        "missing model": ([str(tmp_path / "missing")], "model directory or profile not found"),
        "no MTP layers": ([str(no_mtp_model)], "has no MTP layers"),
        "malformed prompts": (["--prompts", str(bad_jsonl)], "bad.jsonl:2: not valid JSON"),
        "unwritable out": (["--out", str(a_file / "sub")], "output directory is not writable"),
        "draft model with native": (["--draft-model", str(tmp_path)], "--draft-model is a vLLM speculative_config"),
        "draft model not a checkpoint": (["--backend", "vllm", "--draft-model", str(tmp_path)], "no config.json there"),
    }


@pytest.mark.parametrize("case", ["negative k", "too many layers", "unknown profile", "unknown mode",
                                  "missing model", "no MTP layers", "malformed prompts", "unwritable out",
                                  "draft model with native", "draft model not a checkpoint"])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, no_mtp_model, case):
    args, message = bad_inputs(tmp_path, no_mtp_model)[case]
    out = tmp_path / "out"
    if "--out" not in args:
        args = args + ["--out", str(out)]
    r = run("sweep", *args, *SMALL)
    one_line_error(r, message)
    assert "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize("body,message", [
    ('k = [1, 2]\nbogus = 3\n', "unknown key 'bogus'"),
    ('k = "two"\n', "key 'k' must be a list of integers"),
    ('max_tokens = 1.5\n', "key 'max_tokens' must be an integer"),
])
def test_profile_validation_names_file_and_key(tmp_path, body, message):
    prof = tmp_path / "mine.toml"
    prof.write_text(body)
    r = run("sweep", "--profile", prof, "--out", tmp_path / "out")
    assert r.exit_code == 2
    assert str(prof) in r.output and message in r.output


def test_profiles_command_lists_real_model_profiles():
    r = run("profiles")
    assert r.exit_code == 0
    for name in ("tiny", "mimo-7b-rl", "deepseek-v3", "qwen3-next-80b-a3b", "qwen3.5", "glm-4.5-air"):
        assert name in r.output


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


def test_plain_prompt_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):", "category": "code"}\n\n{"prompt": "import os"}\n')
    ps = load_prompts(str(f))
    assert [p.text for p in ps] == ["def f(x):", "import os"] and ps[1].category == "none"


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


def test_code_identity_follows_the_sources(tmp_path, monkeypatch):
    import shutil

    from mtpbench import environment

    copy = tmp_path / "mtpbench"
    shutil.copytree(Path(environment.__file__).parent, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    monkeypatch.setattr(environment, "__file__", str(copy / "environment.py"))
    before = environment.code_identity()
    (copy / "metrics.py").write_text((copy / "metrics.py").read_text() + "\n# a fix\n")
    assert environment.code_identity() != before


def test_disable_log_stats_is_refused(tmp_path):
    r = run("sweep", "--backend", "vllm", "--engine-arg", "disable_log_stats=true", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "disable_log_stats=true would switch off the spec-decode counters" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


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
