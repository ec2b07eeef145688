"""The checkpoints mtpbench makes: ``mtpbench synth`` (a real vLLM MTP architecture, random weights) and
``mtpbench make-model`` (the built-in tiny model, or its GLM-4.5 form)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import fail
from mtpbench.cli.options import OUT
from mtpbench.errors import MtpBenchError


def synth(
    arch: Annotated[Optional[str], typer.Argument(help="Architecture name (see --list).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="Every MTP class of the installed vLLM's registry, with its status here.")] = False,
    mtp_layers: Annotated[Optional[int], typer.Option("--num-mtp-layers", help="MTP layers to build into the checkpoint (its num_nextn_predict_layers or the family's name for it; a run's --num-mtp-layers N drafts with the first N).", show_default="the architecture's, 2 where vLLM allows")] = None,
    out: Annotated[Optional[str], typer.Option(*OUT, help="Output directory (new or empty).", show_default='synth-ARCH')] = None,
) -> None:
    """Write the smallest checkpoint of a real vLLM MTP architecture (random weights, built-in tokenizer)."""
    from tabulate import tabulate

    from mtpbench import synth as synth_mod

    try:
        if list_:
            rows = synth_mod.listing()
            typer.echo(tabulate([[r["registry"], r["class"], r["status"]] for r in rows],
                                headers=["vLLM registry key", "class", "status on this build"]))
            return
        if not arch:
            fail("give an architecture (mtpbench synth --list shows them)")
        path = synth_mod.build(arch, Path(out or f"synth-{arch}"), mtp_layers)
    except MtpBenchError as e:
        fail(str(e))
    typer.echo(f"wrote {synth_mod.describe(arch, path)}")


def make_model(
    out: Annotated[str, typer.Option(*OUT, help="Checkpoint directory to write.")] = "tiny-mtp",
    steps: Annotated[Optional[int], typer.Option(help="Training steps.", show_default="900; --format glm: the shipped fine-tune's")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 256,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (the built-in model used 1; results differ with the count).", show_default="torch's own")] = None,
    fmt: Annotated[str, typer.Option("--format", help="mimo: train the MiMo-format model. glm: fine-tune --source's MTP layers "
                                             "in GLM's (DeepSeek's) convention, target frozen, and write GLM-4.5's format "
                                             "(from builtin: the same bytes as 'builtin-glm'; of the training options only --steps applies).")] = "mimo",
    source: Annotated[str, typer.Option(help="--format glm: the MiMo-format checkpoint to start from.")] = "builtin",
) -> None:
    """Train the built-in tiny MTP model from this interpreter's standard library (no download), or make its
    GLM-4.5 form (--format glm), whose MTP class honours spec_step_idx (Model Runner V2 drafts with every layer)."""
    if fmt not in ("mimo", "glm"):
        fail(f"unknown --format {fmt!r} (choose mimo or glm)")
    import torch

    from mtpbench.train import make_glm, make_model as train

    try:
        if fmt == "glm":
            info = make_glm(source, Path(out), steps=steps, log=typer.echo)
        else:
            if threads:
                torch.set_num_threads(threads)
            info = train(Path(out), steps=900 if steps is None else steps, batch=batch, seq_len=seq_len, seed=seed,
                         log=typer.echo)
    except MtpBenchError as e:
        fail(str(e))
    if fmt == "glm":
        typer.echo(f"wrote {out} (GLM-4.5 format, from {source}; MTP fine-tune {info['train_seconds']} s)")
    else:
        typer.echo(f"wrote {out} in {info['train_seconds']} s")
