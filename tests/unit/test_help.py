"""Every command's help as a user sees it, plain text (mtpbench/cli/help.py): ``-h`` brief, one line an option,
within about two screens at 80 columns, no name cut at any width; ``--help`` every option in full, its help text
exactly as written (nothing eaten as markup) at 80 and 200 columns, every default shown in one style, "[default:
...]" at the end of the option's help, and the values the commands really use; no help text that writes its own
default."""

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


def rendered(command: str, columns: int = 3000, flag: str = "--help") -> str:
    args = [command, flag] if command else [flag]
    r = CliRunner().invoke(app, args, env={"COLUMNS": str(columns)}, terminal_width=columns)
    assert r.exit_code == 0, r.output
    return r.output


def rows(command: str) -> dict[str, str]:
    """Each option of the full help: its first name -> its name line and the help under it, spaces collapsed."""
    out, current = {}, None
    for line in rendered(command).splitlines():
        m = re.match(r"  (--[a-z0-9-]+)", line)
        if m:
            current = m.group(1)
            out[current] = line
        elif current and line.startswith("      "):
            out[current] += " " + line
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in out.items()}


def params(command: str) -> list:
    cmd = typer.main.get_command(app)
    cmd = cmd.commands[command] if command else cmd
    ctx = cmd.make_context(command or "mtpbench", [], resilient_parsing=True)
    return [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]


def names_of(p) -> list[str]:
    return [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])] if p.param_type_name == "option" \
        else [p.name.upper()]


@pytest.mark.parametrize("command", COMMANDS)
def test_brief_help_fits_two_screens_at_80_columns_and_cuts_no_name(command):
    """Issue 45 item 3: `sweep -h` was 478 lines at 80 columns, its description column ~20 characters, 14 names cut
    ("--max-concurrency,…"). Now one line an option where it fits: at most 100 lines at 80 columns, none wider than
    the terminal, every name whole at 80 and at 200 columns."""
    for columns in (80, 200):
        text = rendered(command, columns, "-h")
        lines = text.splitlines()
        assert all(len(line) <= columns for line in lines), [x for x in lines if len(x) > columns]
        words = set(re.findall(r"[-\w]+", text.replace(",", " ").replace("/", " ")))
        for p in params(command):
            for name in names_of(p):
                assert name in words, (command, columns, name)
        if columns == 80:
            assert len(lines) <= 100, (command, len(lines))


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("command", COMMANDS)
def test_full_help_prints_every_help_text_as_written(command, columns):
    """--help at 80 and 200 columns holds every option's help text, word for word as its source string (brackets,
    parentheses and all: "uniform in [len x (1 - r), len x (1 + r)], r in [0, 1)" once read "uniform in , r in
    [0, 1)"), every name whole, no line wider than the terminal."""
    text = rendered(command, columns)
    assert all(len(line) <= columns for line in text.splitlines())
    flat = " ".join(text.split())
    for p in params(command):
        if p.help:
            assert " ".join(p.help.split()) in flat, (command, p.name, p.help)
        for name in names_of(p):
            assert name in flat, (command, name)


def test_the_top_level_help_is_brief_and_names_every_command():
    text = rendered("", 80, "-h")
    assert len(text.splitlines()) <= 40 and all(len(x) <= 80 for x in text.splitlines())
    for command in COMMANDS:
        assert re.search(rf"^  {command} ", text, re.M), command


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
    from mtpbench.cli.options import ONE_K_DEFAULT
    from mtpbench.config import SweepConfig
    from mtpbench.lossless.config import CHECK_DEFAULTS

    def text(v):
        return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)

    s, sweep = SweepConfig(), rows("sweep")
    for opt, field in (("--backend", "backend"), ("--k", "k"), ("--modes", "mode"), ("--prompts", "prompts"),
                       ("--max-tokens", "max_tokens"), ("--temperature", "temperature"), ("--batch-size", "batch_size"),
                       ("--seed", "seed"), ("--device", "device"), ("--out", "out"), ("--api", "api"),
                       ("--max-concurrency", "concurrency")):
        assert shown(sweep[opt]) == text(getattr(s, field)), (opt, sweep[opt])
    for command, defaults in (("tune", DEFAULTS), ("check-lossless", CHECK_DEFAULTS), ("trace-layers", TRACE_DEFAULTS),
                              ("check-drafter", DRAFTER_DEFAULTS)):
        r = rows(command)
        for field, value in defaults.items():
            opt = "--check-temperature" if (command, field) == ("check-lossless", "temperature") else \
                "--" + field.replace("_", "-")
            if command != "tune" and field == "k":  # one k: vLLM's name (sweep and tune take a list, --k)
                assert shown(r["--num-speculative-tokens"]) == ONE_K_DEFAULT and value == ()  # the rule, one_k
                continue
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


def test_docs_options_md_is_the_code_s():
    """docs/options.md lists every option by command, generated from the code: it is what the code says now
    (regenerate with `python benchmarks/options_md.py > docs/options.md`)."""
    from pathlib import Path

    from mtpbench.cli.help import options_markdown

    group = typer.main.get_command(app)
    want = options_markdown(group, list(group.commands))
    got = (Path(__file__).parents[2] / "docs" / "options.md").read_text()
    assert got == want, "docs/options.md is stale: python benchmarks/options_md.py > docs/options.md"
    for command in COMMANDS:  # every option of every command is in it
        for p in params(command):
            if p.param_type_name == "option":
                assert f"`{', '.join(p.opts)}" in got, (command, p.opts)


def _options_by_name() -> dict[str, dict[str, tuple]]:
    """Every option name (each alias too) -> {command: (its value as help names it, the other names it goes by)}."""
    from mtpbench.cli.help import _metavar

    group = typer.main.get_command(app)
    seen: dict[str, dict[str, tuple]] = {}
    for command, cmd in group.commands.items():
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option" or "--help" in p.opts or "-h" in p.opts:
                continue
            names = (*p.opts, *p.secondary_opts)
            for n in names:
                seen.setdefault(n, {})[command] = ("" if p.is_flag else _metavar(p), tuple(sorted(names)))
    return seen


def test_one_name_takes_one_kind_of_value_in_every_command():
    """One vocabulary (issue 45): an option name takes the same kind of value (one INT, a TEXT list, a repeatable
    TEXT, a switch) and goes by the same other names in every command that has it. Where one command takes a list
    and another one value, the names differ (--k / --num-speculative-tokens, --mtp-layers / --num-mtp-layers,
    --batch-sizes / --batch-size)."""
    mixed = {name: by for name, by in _options_by_name().items() if len(set(by.values())) > 1}
    assert not mixed, mixed


def test_one_name_has_one_default_in_every_command_but_the_sizes_of_a_run():
    """Issue 45 item 4: "the same default everywhere, or a different name". The defaults that may differ are the
    size of a run (how many prompts, tokens, repeats, sequences, loads, MTP layers; the output folder) and --dtype
    (a check runs float32 on every backend), each stated in docs/options.md; any other option with two defaults in
    two commands fails here (the old --temperature 0.0 / 1.0 and --mode reuse,chain / reuse did)."""
    from mtpbench.cli.help import SIZES, default_text

    exempt = {*SIZES, "--dtype"}
    group = typer.main.get_command(app)
    defaults: dict[str, dict[str, str]] = {}
    for command, cmd in group.commands.items():
        for p in cmd.params:
            first = p.opts[0] if p.opts else p.name
            if first in exempt or "--help" in p.opts or "-h" in p.opts:
                continue
            defaults.setdefault(first, {})[command] = default_text(p)
    mixed = {name: by for name, by in defaults.items() if len(set(by.values())) > 1}
    assert not mixed, mixed
    assert set(defaults["--temperature"]) == {"sweep", "tune"} and set(defaults["--check-temperature"]) == {
        "check-lossless"} and set(defaults["--modes"]) == {"sweep"}


def test_the_list_and_the_one_value_names_are_where_the_issue_put_them():
    seen = _options_by_name()
    assert set(seen["--k"]) == {"sweep", "tune"} and {v for v, _ in seen["--k"].values()} == {"TEXT"}
    assert set(seen["--num-speculative-tokens"]) == {"trace-layers", "trace-matrix", "check-lossless",
                                                      "check-drafter"}
    assert set(seen["--mtp-layers"]) == {"sweep"}
    assert set(seen["--num-mtp-layers"]) == {"trace-layers", "synth", "check-lossless", "tune"}
    assert set(seen["--batch-sizes"]) == {"tune"} and "tune" not in seen["--batch-size"]
    assert {v for v, _ in seen["--server"].values()} == {"TEXT (repeatable)"}
    assert set(seen["--server"]) == {"sweep", "tune", "trace-layers", "check-lossless"}


@pytest.mark.parametrize("command, given, wanted, meaning", [
    ("check-lossless", "--k", "--num-speculative-tokens", "one k"),
    ("trace-layers", "--k", "--num-speculative-tokens", "one k"),
    ("sweep", "--num-speculative-tokens", "--k", "a list of k"),
    ("trace-layers", "--mtp-layers", "--num-mtp-layers", "one MTP layer count"),
    ("synth", "--mtp-layers", "--num-mtp-layers", "one MTP layer count"),
    ("tune", "--batch-size", "--batch-sizes", "a list of batch sizes"),
    ("tune", "--max-num-seqs", "--batch-sizes", "a list of batch sizes"),
    ("sweep", "--batch-sizes", "--batch-size", "one batch size"),
    ("sweep", "--mode", "--modes", "a list of drafting modes"),
    ("trace-layers", "--modes", "--mode", "one drafting mode"),
    ("check-lossless", "--temperature", "--check-temperature", "the temperature whose law it checks (default 1.0)"),
    ("sweep", "--check-temperature", "--temperature", "the temperature it decodes at (default 0.0, greedy)"),
])
def test_the_other_commands_name_for_a_value_is_pointed_to_in_one_line(command, given, wanted, meaning):
    """A saved command line with the name another command uses (one value or a list) is refused in one line, exit
    2, that names this command's option for it."""
    r = CliRunner().invoke(app, [command, given, "2"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and f"{command} takes {meaning}: {wanted}" in lines[0], lines


def test_one_k_is_twice_the_layers_drafted_with_unless_a_k_or_a_server_is_given():
    """--num-speculative-tokens' default (one_k): 2 x the fewest MTP layers asked for, else 2 x the checkpoint's
    (the built-in model has 3); a k given, or an attached server's (its own), stays."""
    from dataclasses import replace

    from mtpbench.cli.options import one_k
    from mtpbench.config import SweepConfig

    base = SweepConfig(k=())
    assert one_k(base).k == (6,)
    assert one_k(replace(base, mtp_layers=(2, 1))).k == (2,)
    assert one_k(replace(base, k=(5,), mtp_layers=(1,))).k == (5,)
    assert one_k(replace(base, server="http://127.0.0.1:9")).k == ()
