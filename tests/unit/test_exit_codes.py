"""Issue 56, what a script reads from mtpbench without a model run: one table of exit codes (errors.EXIT_CODES, in
``mtpbench -h`` and the README), a closed stdout that never turns into an exit code, bad lists and folders refused in
one line naming the flag as typed, and a partial folder said to be partial with its own code. The oracles are the
issue's words and the table as the README states it; no engine."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
PARTIAL, BAD_INPUT = 4, 2  # as the README's table states them


def test_each_exit_code_has_one_meaning_and_the_table_is_the_same_in_the_help_and_the_readme():
    codes = [c for c, _ in EXIT_CODES]
    assert len(set(codes)) == len(codes) and len({m for _, m in EXIT_CODES}) == len(codes)
    assert {0, 1, 2, 130, 143} <= set(codes)  # done, the negative answer, bad input, SIGINT, SIGTERM as a shell has them
    help_text = CliRunner().invoke(app, ["-h"], env={"COLUMNS": "80"}).output
    listed = dict((int(c), m.strip()) for c, m in re.findall(r"^\s+(\d+)  (.+)$", help_text.split("Exit codes")[1], re.M))
    assert listed == dict(EXIT_CODES)
    readme = (ROOT / "README.md").read_text()
    head = next(line for line in readme.splitlines() if line.startswith("| exit code |"))
    means = next(line for line in readme.splitlines() if line.startswith("| means |"))
    assert [int(c) for c in head.strip("|").split("|")[1:]] == codes
    assert [m.strip() for m in means.strip("|").split("|")[1:]] == [m for _, m in EXIT_CODES]


def test_the_checks_answer_with_the_tables_codes():
    from mtpbench.drafter.compare import EXIT_CODE
    from mtpbench.lossless.verdict import EXIT_INCONCLUSIVE, EXIT_LOSSY

    table = dict(EXIT_CODES)
    assert "negative" in table[EXIT_LOSSY] and "inconclusive" in table[EXIT_INCONCLUSIVE]
    assert EXIT_CODE == {"parity": 0, "differs": EXIT_LOSSY, "inconclusive": EXIT_INCONCLUSIVE}


def closed_stdout(*args: str) -> tuple[int, str]:
    """``mtpbench ARGS`` whose reader has gone before it writes a byte (``| head -0``): its exit code and stderr."""
    p = subprocess.Popen([sys.executable, "-m", "mtpbench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


@pytest.mark.parametrize("args, code", [(["profiles"], 0), (["-h"], 0), (["sweep", "--k", "x"], BAD_INPUT)])
def test_a_closed_stdout_ends_quietly_with_the_commands_own_code(args, code):
    """`mtpbench check-lossless ... | head -1` exited 1, the code of "lossy", after printing "Lossless": a closed pipe
    is no answer. The command runs to its own end and code, and says nothing of the pipe."""
    got, err = closed_stdout(*args)
    assert got == code, err
    assert "BrokenPipe" not in err and "Traceback" not in err, err


def folder(tmp_path: Path, file: str, text: str) -> Path:
    """An --out that holds one file."""
    out = tmp_path / "s"
    out.mkdir()
    (out / file).write_text(text)
    return out


def sweep(tmp_path: Path, *args: str):
    return CliRunner().invoke(app, ["sweep", *args, "--dry-run"], env={"COLUMNS": "120"})


@pytest.mark.parametrize("flag, value, said", [
    ("--k", "1,,2", "--k '1,,2' has an empty item"),
    ("--k", "0,1,1", "--k '0,1,1' lists 1 more than once"),
    ("--modes", "reuse,reuse", "--modes 'reuse,reuse' lists reuse more than once"),
    ("--mtp-layers", "1,", "--mtp-layers '1,' has an empty item"),
    ("--max-concurrency", "1,4,4", "--max-concurrency '1,4,4' lists 4 more than once"),
    ("--concurrency", "1,4,4", "--concurrency '1,4,4' lists 4 more than once"),  # the alias, as typed
])
def test_a_list_with_an_empty_item_or_a_value_twice_is_refused_in_one_line(tmp_path, flag, value, said):
    """`--k '1,,2'` ran without k = 0 and `--k 0,1,1` measured k = 1 twice, silently."""
    out = tmp_path / "s"
    extra = ["--backend", "vllm-server"] if "concurrency" in flag else []
    r = sweep(tmp_path, *extra, flag, value, "--out", str(out))
    assert r.exit_code == BAD_INPUT, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and said in lines[0], r.output
    assert not out.exists()


def test_an_out_of_files_that_are_not_mtpbenchs_is_refused_unless_forced(tmp_path):
    """`--out` naming a folder of unrelated files: run.json was written there and measuring started."""
    out = folder(tmp_path, "notes.txt", "mine")
    r = sweep(tmp_path, "--out", str(out))
    assert r.exit_code == BAD_INPUT and "holds files that are not mtpbench's (notes.txt)" in r.output, r.output
    assert "--force" in r.output and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    forced = sweep(tmp_path, "--out", str(out), "--force")
    assert forced.exit_code == 0 and "dry run: nothing was loaded, run or written" in forced.output, forced.output


def test_a_corrupt_run_json_is_named_unreadable_as_report_names_it(tmp_path):
    out = folder(tmp_path, "run.json", '{"config": ')
    r = sweep(tmp_path, "--out", str(out))
    assert r.exit_code == BAD_INPUT and "its run.json is unreadable" in r.output, r.output
    rep = CliRunner().invoke(app, ["report", str(out)])
    assert rep.exit_code == BAD_INPUT and "unreadable" in rep.output, rep.output


@pytest.mark.parametrize("flag", ["--server", "--base-url"])
def test_an_error_names_the_flag_as_typed(flag):
    r = CliRunner().invoke(app, ["sweep", flag, "not-a-url", "--dry-run"])
    assert r.exit_code == BAD_INPUT, r.output
    assert f"{flag} takes an http:// or https:// URL" in r.output, r.output


def test_as_typed_renames_only_an_option_given_by_its_alias():
    from mtpbench.cli.common import as_typed

    msg = "--server takes an http:// or https:// URL; see --server-x and --out"
    assert as_typed(msg, ["--base-url", "x"]) == "--base-url takes an http:// or https:// URL; see --server-x and --out"
    assert as_typed(msg, ["--server", "x", "--base-url", "y"]) == msg  # both given: the message's own name
    assert as_typed("--out is empty", ["--result-dir="]) == "--result-dir is empty"
    assert as_typed(msg, []) == msg


def test_an_interrupted_folder_is_reported_partial_with_its_own_code(tmp_path):
    """`mtpbench report` on a sweep stopped before any point was saved said "No drafting point finished", printed an
    empty table, exited 0 and said it wrote plots it had not drawn."""
    from mtpbench.config import SweepConfig

    out = folder(tmp_path, "run.json", json.dumps({"config": SweepConfig().to_json(), "provenance": {"versions": {}},
                                                   "engine": {}, "fingerprint": {"x": 1},
                                                   "planned": ["k0", "chain-L3-k1"]}))
    r = CliRunner().invoke(app, ["report", str(out)])
    assert r.exit_code == PARTIAL, r.output
    assert r.output.startswith("Partial: 0 of 2 points measured (missing: k0, chain-L3-k1)."), r.output
    assert "partial: 0 of 2 points measured (missing: k0, chain-L3-k1)" in r.output
    wrote = next(line for line in r.output.splitlines() if line.startswith("wrote "))
    assert "plots" not in wrote, wrote
    page = (out / "report.html").read_text()
    assert "Partial: 0 of 2 points measured" in page


def test_a_rerun_that_measures_nothing_warns_of_no_load(monkeypatch, capsys):
    """The load-average warning is for a run about to time something: a rerun whose first step is its last (the
    report of points measured before) prints none; a run that measures prints it once."""
    from mtpbench.cli import progress

    monkeypatch.setattr("mtpbench.environment.load_warning", lambda: "LOADED")
    p = progress.Progress("sweep", tty=False)
    p.on_point(1, 1, "report")
    assert "LOADED" not in capsys.readouterr().err
    p = progress.Progress("sweep", tty=False)
    p.on_point(0, 3, "k0")
    p.on_point(1, 3, "k1")
    assert capsys.readouterr().err.count("LOADED") == 1
