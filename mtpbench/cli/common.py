"""What every command module uses: the one-line error exit, and the parsers of the options' text (comma lists,
KEY=VALUE engine arguments, a model-or-profile argument, an attached server's access)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer

from mtpbench.cli.options import Reporting, ServerAccess
from mtpbench.errors import MtpBenchError


def fail(msg: str) -> NoReturn:
    typer.echo(f"error: {as_typed(msg)}", err=True)
    raise typer.Exit(2)


def as_typed(msg: str, argv: list[str] | None = None) -> str:
    """``msg`` with each option named as the user typed it: where only an alias was given ("--base-url x"), the
    message's name for it ("--server takes an http:// ... URL") becomes that alias. ``argv``: the arguments (default:
    the running command's, ``options.TYPED``)."""
    import re

    from mtpbench.cli.options import TYPED, aliases

    if argv is None:
        argv = TYPED
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    for name, *others in aliases():
        typed = next((o for o in others if o in given), None)
        if typed and name not in given:
            msg = re.sub(rf"{re.escape(name)}(?![\w-])", typed, msg)
    return msg


def items(text: str, name: str, parse) -> tuple:
    """A comma list's values, each through ``parse`` (ValueError or TypeError: not one), refused in one line naming
    the flag where an item is empty ("1,,2": a value lost to a typo) or a value comes twice ("0,1,1": a point
    measured twice, silently)."""
    parts = [x.strip() for x in text.split(",")]
    if any(not x for x in parts):
        fail(f"{name} {text!r} has an empty item: give comma-separated values, e.g. {name} 0,1,2")
    values = tuple(parse(x) for x in parts)
    twice = sorted({parts[i] for i, v in enumerate(values) if values.index(v) != i})
    if twice:
        fail(f"{name} {text!r} lists {', '.join(twice)} more than once")
    return values


def ints(text: Optional[str], name: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        return items(text, name, int)
    except ValueError:
        fail(f"{name} takes comma-separated integers, got {text!r}")


def rates(text: Optional[str], name: str = "--request-rate") -> Optional[tuple[float, ...]]:
    from mtpbench.profile import parse_rate

    if text is None:
        return None
    try:
        return items(text, name, parse_rate)
    except (TypeError, ValueError):
        fail(f"{name} takes comma-separated numbers or inf, got {text!r}")


def strs(text: Optional[str], name: str | None = None) -> Optional[tuple[str, ...]]:
    """A comma list of words; with ``name``, an empty item or a word given twice is refused naming the flag."""
    if text is None:
        return None
    if name is None:
        return tuple(x.strip() for x in text.split(",") if x.strip())
    return items(text, name, str)


def parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def engine_args(items: Optional[list[str]], flag: str = "--engine-arg") -> Optional[dict]:
    """KEY=VALUE items (--engine-arg, --metadata) as a dict, each value read as JSON where it is JSON."""
    if not items:
        return None
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            fail(f"{flag} takes KEY=VALUE, got {item!r}")
        out[key] = parse_value(value)
    return out


def floats(text: Optional[str], name: str) -> Optional[tuple[float, ...]]:
    if text is None:
        return None
    try:
        return items(text, name, float)
    except ValueError:
        fail(f"{name} takes comma-separated numbers, got {text!r}")


def json_value(text: str, flag: str, what: str, kind: type):
    """An option's JSON value of the given type (``what`` names it in the one-line error)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        fail(f"{flag} takes {what}: {err.msg} at character {err.pos}")
    if not isinstance(value, kind):
        fail(f"{flag} takes {what}, got {type(value).__name__}")
    return value


def speculative_overrides(text: Optional[str]) -> Optional[dict]:
    """--speculative-config: a JSON object, or None."""
    return None if text is None else json_value(text, "--speculative-config", "a JSON object", dict)


def set_threads(threads: Optional[int]) -> None:
    """--threads: torch's CPU threads in this process (>= 1), or torch's own where not given."""
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    if threads:
        import torch

        torch.set_num_threads(threads)


def model_or_profile(arg: Optional[str], profile: Optional[str],
                     absent_ok: bool = False) -> tuple[Optional[str], Optional[str]]:
    """A positional MODEL_OR_PROFILE is a model directory, a profile name or a .toml file; ``absent_ok``: a path
    not on this machine is taken as the model (a dry run plans without its files)."""
    if arg is None:
        return None, profile
    from mtpbench.builtin import BUILTIN_MODELS
    from mtpbench.profile import list_profiles

    if arg in BUILTIN_MODELS or Path(arg).is_dir() or (arg.count("/") == 1 and not Path(arg).exists()
                                                   and not arg.endswith(".toml")):
        return arg, profile  # a directory, or a hub id (resolved from the local Hugging Face cache)
    if arg in list_profiles() or arg.endswith(".toml"):
        if profile:
            fail("give a profile either as MODEL_OR_PROFILE or with --profile, not both")
        return None, arg
    if absent_ok and "/" in arg and not arg.endswith(".toml"):
        return arg, profile
    fail(f"model directory or profile not found: {arg}")


def connection_options(access: ServerAccess) -> tuple[dict, dict]:
    """The config's connection settings (names only) and the --header values (kept apart: never written)."""
    from mtpbench.connection import Hidden, parse_header

    values = Hidden()
    try:
        for text in access.header or []:
            name, value = parse_header(text)
            if name.lower() in (n.lower() for n in values):
                raise MtpBenchError(f"--header {name} is given twice: give it once")
            values[name] = value
    except MtpBenchError as e:
        fail(str(e))
    return (dict(api_key_env=access.api_key_env, header=tuple(values) if access.header else None,
                 header_env=tuple(access.header_env) if access.header_env else None, ca_cert=access.ca_cert,
                 insecure=access.insecure or None, metrics_url=access.metrics_url,
                 metrics_credentials=access.metrics_credentials or None), values)


def reporting_options(reporting: Reporting) -> dict:
    """The config's --label, --metadata and latency statistics options, parsed."""
    return dict(label=reporting.label, metadata=engine_args(reporting.metadata, "--metadata"),
                percentile_metrics=strs(reporting.percentile_metrics, "--percentile-metrics"),
                metric_percentiles=floats(reporting.metric_percentiles, "--metric-percentiles"))


def show(rows, out, wide: bool = False) -> None:
    """The sweep's answer in words (report.html's headline, the same text), then its table (fitting 120 columns
    unless ``wide``) with a legend of its columns, then what a reader needs under it."""
    import textwrap

    from mtpbench.metrics.latency import columns
    from mtpbench.sweep.load import read_json
    from mtpbench.sweep.page import answer
    from mtpbench.sweep.report import notices
    from mtpbench.sweep.table import WIDTH, table, wrap

    run, summary = Path(out) / "run.json", Path(out) / "summary.json"
    config = (read_json(run).get("config") or {}) if run.is_file() else {}
    if summary.is_file():
        typer.echo(textwrap.fill(answer(read_json(summary))[0], WIDTH, break_on_hyphens=False) + "\n")
    typer.echo(table(rows, columns(tuple(config.get("percentile_metrics") or ()),
                                   tuple(config.get("metric_percentiles") or ())), None if wide else WIDTH))
    lines = notices(out)
    if lines:
        typer.echo("\n" + "\n".join(map(wrap, lines)))


def plots_written(out) -> list[str]:
    """["plots"] where the sweep's last build drew any (summary.json's ``plots``), else nothing to say."""
    from mtpbench.sweep.load import read_json

    summary = Path(out) / "summary.json"
    return ["plots"] if summary.is_file() and read_json(summary).get("plots", True) else []


def exit_if_partial(out) -> None:
    """A sweep folder with points failed or missing (summary.json's ``partial``): the line that says so, on stderr,
    and exit code PARTIAL (errors.EXIT_CODES), neither "ok" nor a check's negative answer."""
    from mtpbench.errors import PARTIAL
    from mtpbench.sweep.load import partial_text, read_json

    summary = Path(out) / "summary.json"
    p = read_json(summary).get("partial") if summary.is_file() else None
    if p:
        typer.echo(f"{partial_text(p)}: each failure's error is in {out}/summary.json; a rerun with the same "
                   f"settings measures what is missing", err=True)
        raise typer.Exit(PARTIAL)


def wrote(out, *names: str) -> None:
    """The last lines of a command that wrote files: what it wrote in ``out``, then the page to open."""
    typer.echo(f"\nwrote {out}/: {', '.join(names)}")
    page = Path(out) / "report.html"
    if page.is_file():
        typer.echo(f"open {page}")
