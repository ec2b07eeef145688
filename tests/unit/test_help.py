"""Every command's --help as a user sees it (rendered by typer and Rich, one option a line): every default shown
in one style, "[default: ...]" at the end of the option's help, and the values the commands really use; no help
text that writes its own default (Rich reads "[default: ...]" there as markup and deletes it, leaving " .")."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from mtpbench.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)
# options with nothing to default to: an absent value means "not used" (a URL, a file, a check to run)
NO_DEFAULT = {"--server", "--baseline-server", "--profile", "--draft-model", "--engine-arg", "--header",
              "--header-env", "--metrics-url", "--expect", "--synthetic", "--schedule", "--from", "--fail-if-worse",
              "--speculative-config", "--help", "--version", "--concurrency-only", "--ca-cert", "--request-rate",
              "--list", "--json", "--source"}


def rendered(command: str) -> str:
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "3000"}, terminal_width=3000)
    assert r.exit_code == 0, r.output
    return r.output


def rows(command: str) -> dict[str, str]:
    """Each option's row of the rendered help: its first name -> the row's text, spaces collapsed."""
    out = {}
    for line in rendered(command).splitlines():
        m = re.match(r"│\s+(\*\s+)?(--[a-z0-9-]+)", line)
        if m:
            out[m.group(2)] = " ".join(line.strip("│ ").split())
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_shows_its_default_in_one_style(command):
    for name, row in rows(command).items():
        if name in NO_DEFAULT:
            continue
        assert re.search(r"\[default: [^\]]+\]$", row), f"{command} {name}: no default shown: {row}"
        assert not re.search(r" \.( \[|$)", row) and "<bool>" not in row, f"{command} {name}: {row}"


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_text_writes_its_own_default(command):
    cmd = typer.main.get_command(app).commands[command]
    for p in cmd.params:
        text = getattr(p, "help", None) or ""
        assert not re.search(r"[\[(]default:|Default:", text), f"{command} {p.name}: {text}"


def shown(row: str) -> str:
    return re.search(r"\[default: \(?([^\]]*?)\)?\]$", row).group(1)


def test_the_defaults_shown_are_the_ones_the_commands_use():
    """Read from where each command takes them: SweepConfig, and the tune, check-lossless, trace-layers and
    check-drafter defaults."""
    from mtpbench.cli.drafter import DRAFTER_DEFAULTS
    from mtpbench.cli.trace import TRACE_DEFAULTS
    from mtpbench.cli.tune import DEFAULTS, ROUNDS
    from mtpbench.config import SweepConfig
    from mtpbench.lossless.config import CHECK_DEFAULTS

    def text(v):
        return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)

    s, sweep = SweepConfig(), rows("sweep")
    for opt, field in (("--backend", "backend"), ("--k", "k"), ("--mode", "mode"), ("--prompts", "prompts"),
                       ("--max-tokens", "max_tokens"), ("--temperature", "temperature"), ("--batch-size", "batch_size"),
                       ("--seed", "seed"), ("--device", "device"), ("--out", "out"), ("--api", "api"),
                       ("--max-concurrency", "concurrency")):
        assert shown(sweep[opt]) == text(getattr(s, field)), (opt, sweep[opt])
    for command, defaults in (("tune", DEFAULTS), ("check-lossless", CHECK_DEFAULTS), ("trace-layers", TRACE_DEFAULTS),
                              ("check-drafter", DRAFTER_DEFAULTS)):
        r = rows(command)
        for field, value in defaults.items():
            opt = "--" + field.replace("_", "-")
            if field == "dtype" or (field in ("repeats", "num_prompts") and command == "tune"):  # and what more
                assert shown(r[opt]).startswith(text(value)), (command, opt, r[opt])
            else:
                assert shown(r[opt]) == text(value), (command, opt, r[opt])
    tune = rows("tune")
    assert str(ROUNDS["max_repeats"]) in shown(tune["--max-repeats"])
    assert text(int(ROUNDS["max_seconds"])) in shown(tune["--max-seconds"])
    assert "OPENAI_API_KEY" in shown(sweep["--api-key-env"])
    assert shown(sweep["--dtype"]) == "float32 on native, auto on vLLM"  # the backends' defaults (backend_info)
    assert shown(sweep["--repeats"]).startswith("6 on native; 3 on vLLM")


def test_short_help_and_version():
    from mtpbench import __version__

    r = CliRunner().invoke(app, ["sweep", "-h"], terminal_width=200)
    assert r.exit_code == 0 and "--max-tokens" in r.output
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"mtpbench {__version__}"
