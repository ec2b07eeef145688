"""What mtpbench offers and sees: ``mtpbench profiles`` (the shipped profiles) and ``mtpbench env`` (versions,
CPU, CUDA, NVML)."""

from __future__ import annotations

from typing import Annotated

import typer

from mtpbench.cli.common import fail
from mtpbench.errors import MtpBenchError


def profiles() -> None:
    """List the profiles and what they set."""
    from tabulate import tabulate

    from mtpbench.config import load_profile
    from mtpbench.profile import list_profiles

    body = []
    try:
        for name, path in list_profiles().items():
            _, values = load_profile(str(path))
            body.append([name, values.get("backend", "native"), values.get("model", "builtin"),
                         ",".join(map(str, values.get("k", ()))), values.get("description", "")])
    except MtpBenchError as e:
        fail(str(e))
    typer.echo(tabulate(body, headers=["profile", "backend", "model", "k", "description"]))


def env(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """What mtpbench sees: Python, torch, vLLM, the CPU and its flags, threads and load, CUDA devices, NVML (kept in every run's provenance)."""
    import json

    from mtpbench.environment import as_text, environment, vllm_version_warning

    facts = environment()
    warning = vllm_version_warning(facts["versions"]["vllm"])
    if warning:
        typer.echo(warning, err=True)
    typer.echo(json.dumps(facts, indent=1) if as_json else as_text(facts))
