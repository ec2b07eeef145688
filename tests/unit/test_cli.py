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
        "unknown mode": (["--modes", "reuse,zigzag"], "unknown mode 'zigzag'"),
        "missing model": ([str(tmp_path / "missing")], "model directory or profile not found"),
        "no MTP layers": ([str(no_mtp_model)], "has no MTP layers"),
        "malformed prompts": (["--prompts", str(bad_jsonl)], "bad.jsonl:2: not valid JSON"),
        "unwritable out": (["--out", str(a_file / "sub")], "is a file, so the directory cannot be made there"),
        "empty out": (["--out", ""], "--out is empty"),  # not the current directory
        "out is a file": (["--out", str(a_file)], "is a file: give a directory"),
        "wrong type": (["--max-tokens", "abc"], "Invalid value for '--max-tokens'"),  # not a boxed panel
        "unknown option": (["--nope"], "sweep takes no option --nope"),
        "draft model with native": (["--draft-model", str(tmp_path)], "--draft-model is a vLLM speculative_config"),
        "draft model not a checkpoint": (["--backend", "vllm", "--draft-model", str(tmp_path)], "no config.json there"),
    }


@pytest.mark.parametrize("case", ["negative k", "too many layers", "unknown profile", "unknown mode",
                                  "missing model", "no MTP layers", "malformed prompts", "unwritable out",
                                  "empty out", "out is a file", "wrong type", "unknown option",
                                  "draft model with native", "draft model not a checkpoint"])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, no_mtp_model, case, monkeypatch):
    args, message = bad_inputs(tmp_path, no_mtp_model)[case]
    out = tmp_path / "out"
    if "--out" not in args:
        args = args + ["--out", str(out)]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    r = run("sweep", *SMALL, *args)  # the case last: it wins over SMALL
    one_line_error(r, message)
    assert "Traceback" not in r.output
    assert not out.exists() and not any(cwd.iterdir())


@pytest.mark.parametrize("args,message", [
    (["report", "/nonexistent/run"], "/nonexistent/run does not exist"),
    (["tune", "--k", "0,-1"], "--k must be >= 0, got -1"),
    (["check-lossless", "/nonexistent/model"], "model directory not found: /nonexistent/model"),
    (["nocmd"], "No such command 'nocmd'"),
    (["compare", "only-a"], "Missing argument 'b'"),
])
def test_other_commands_refuse_in_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    one_line_error(r, message)
    assert not any(tmp_path.iterdir())


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


MT_BENCH = SHARED / "data" / "mt_bench_question.jsonl"


def test_plain_prompt_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f(x):", "category": "code"}\n\n{"prompt": "import os"}\n')
    ps = load_prompts(str(f))
    assert [p.text for p in ps] == ["def f(x):", "import os"] and ps[1].category == "none"


def test_code_identity_follows_the_sources(tmp_path, monkeypatch):
    import shutil

    from mtpbench import environment

    copy = tmp_path / "mtpbench"
    shutil.copytree(Path(environment.__file__).parent, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    monkeypatch.setattr(environment, "__file__", str(copy / "environment.py"))
    before = environment.code_identity()
    (copy / "metrics" / "row.py").write_text((copy / "metrics" / "row.py").read_text() + "\n# a fix\n")
    assert environment.code_identity() != before


def test_disable_log_stats_is_refused(tmp_path):
    r = run("sweep", "--backend", "vllm", "--engine-arg", "disable_log_stats=true", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "disable_log_stats=true would switch off the spec-decode counters" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
