"""What every command module uses: the one-line error exit, and the parsers of the options' text (comma lists,
KEY=VALUE engine arguments, a model-or-profile argument, an attached server's access)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer

from mtpbench.cli.options import ServerAccess
from mtpbench.errors import MtpBenchError


def fail(msg: str) -> NoReturn:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def ints(text: Optional[str], name: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{name} takes comma-separated integers, got {text!r}")


def rates(text: Optional[str]) -> Optional[tuple[float, ...]]:
    from mtpbench.profile import parse_rate

    if text is None:
        return None
    try:
        return tuple(parse_rate(x.strip()) for x in text.split(",") if x.strip())
    except (TypeError, ValueError):
        fail(f"--request-rate takes comma-separated numbers or inf, got {text!r}")


def strs(text: Optional[str]) -> Optional[tuple[str, ...]]:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def engine_args(items: Optional[list[str]]) -> Optional[dict]:
    if not items:
        return None
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            fail(f"--engine-arg takes KEY=VALUE, got {item!r}")
        out[key] = parse_value(value)
    return out


def model_or_profile(arg: Optional[str], profile: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """A positional MODEL_OR_PROFILE is a model directory, a profile name or a .toml file."""
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


def show(rows, out) -> None:
    """The sweep's table, and one line when it has no GPU telemetry, saying why."""
    from mtpbench.sweep.report import notices
    from mtpbench.sweep.table import table

    typer.echo(table(rows))
    lines = notices(out)
    if lines:
        typer.echo("\n" + "\n".join(lines))


def wrote(out, *names: str) -> None:
    """The last lines of a command that wrote files: what it wrote in ``out``, then the page to open."""
    typer.echo(f"\nwrote {out}/: {', '.join(names)}")
    page = Path(out) / "report.html"
    if page.is_file():
        typer.echo(f"open {page}")
