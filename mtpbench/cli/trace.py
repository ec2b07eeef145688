"""``mtpbench trace-layers`` (one engine: which MTP layer drafted each step, and the verdict) and
``mtpbench trace-matrix`` (every synthetic architecture x runner x drafting: one verdict a cell)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import json

import typer

from dataclasses import asdict, replace

from mtpbench.cli.common import connection_options, engine_args, fail, model_or_profile, strs, wrote
from mtpbench.cli.options import (BASE, ONE_K_DEFAULT, OUT, RUNNER_HELP, one_k, SERVER, SERVER_HELP, Dtype, ForceSpecStepIdx, MaxModelLen, ModelOrProfile, Parallel,
                                  Runner, ServerAccess, grouped, shown)
from mtpbench.errors import MtpBenchError

TRACE_DEFAULTS = {"k": (), "mode": ("reuse",), "num_prompts": 2, "max_tokens": 32, "out": "trace"}
EXPECTED = {"multi-module": "multi-module", "layer-0-reuse": "layer-0 reuse", None: None}


@grouped
def trace_layers(
    model: ModelOrProfile = None,
    backend: Annotated[Optional[str], typer.Option(help="native, vllm (offline engine) or vllm-server (a server mtpbench launches with its trace plugin).", show_default=BASE.backend)] = None,
    server: Annotated[Optional[list[str]], typer.Option(*SERVER, help=SERVER_HELP + "Here: one, serving mtpbench's trace plugin (VLLM_PLUGINS=mtpbench_trace, --enforce-eager; docs/trace-layers.md).")] = None,
    k: Annotated[Optional[int], typer.Option("--num-speculative-tokens", help="num_speculative_tokens: draft steps per proposal (one k; sweep and tune take a list, --k).", show_default=ONE_K_DEFAULT)] = None,
    mtp_layers: Annotated[Optional[int], typer.Option("--num-mtp-layers", help="MTP layers to draft with: the checkpoint's first N (its num_nextn_predict_layers as loaded; sweep takes a list, --mtp-layers).", show_default='all the checkpoint has')] = None,
    mode: Annotated[Optional[str], typer.Option(help="Native drafting mode: reuse or chain.", show_default=shown(TRACE_DEFAULTS["mode"]))] = None,
    force_spec_step_idx: ForceSpecStepIdx = None,
    runner: Runner = None,
    expect: Annotated[Optional[str], typer.Option(help="multi-module or layer-0-reuse: exit 1 if the verdict differs.")] = None,
    synthetic: Annotated[Optional[str], typer.Option(help="Trace a synthetic checkpoint of this vLLM MTP architecture (mtpbench synth --list), built or taken from the cache; implies --backend vllm.")] = None,
    draft_model: Annotated[Optional[str], typer.Option(help="A drafter in a checkpoint of its own (vLLM speculative_config model).")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="'builtin' or a JSONL file.", show_default=BASE.prompts)] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts.", show_default=shown(TRACE_DEFAULTS["num_prompts"]))] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt.", show_default=shown(TRACE_DEFAULTS["max_tokens"]))] = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra vllm.LLM argument KEY=VALUE (repeatable).")] = None,
    parallel: Parallel = Parallel(),
    access: ServerAccess = ServerAccess(),
    profile: Annotated[Optional[str], typer.Option(help="Profile name or .toml path.")] = None,
    out: Annotated[Optional[str], typer.Option(*OUT, help="Output directory for trace.csv, trace.json, layers.png.", show_default=shown(TRACE_DEFAULTS["out"]))] = None,
) -> None:
    """Record which MTP layer ran at every draft step on every rank, and say whether drafting is right."""
    from mtpbench.config import resolve
    from mtpbench.trace.run import run_trace

    if expect not in EXPECTED:
        fail(f"--expect takes multi-module or layer-0-reuse, got {expect!r}")
    model, profile = model_or_profile(model, profile)
    if server and backend not in (None, "vllm-server"):
        fail(f"--server traces a running vLLM server: it takes --backend vllm-server, not {backend}")
    if len(server or ()) > 1:
        fail(f"trace-layers traces one server at a time: give one --server (got {len(server)})")
    server = server[0] if server else None
    reach, header_values = connection_options(access)
    engine = dict(model=model, backend="vllm-server" if server else backend, method=None, draft_model=draft_model,
                  dtype=dtype, engine_args=engine_args(engine_arg), server=server, **asdict(parallel), **reach)
    if synthetic:
        engine = synthetic_engine(synthetic, engine, profile, mtp_layers, Path(out or TRACE_DEFAULTS["out"]))
    try:
        cfg = resolve(dict(**engine, mtp_layers=None if mtp_layers is None else (mtp_layers,),
                           mode=None if mode is None else (mode,), prompts=prompts, num_prompts=num_prompts,
                           max_tokens=max_tokens, max_model_len=max_model_len,
                           force_spec_step_idx=force_spec_step_idx, runner=runner, out=out,
                           k=None if k is None else (k,)), profile, defaults=TRACE_DEFAULTS)
        cfg = replace(cfg, header_values=header_values)
        if cfg.server and k is None:  # an attached server's k is its own, whatever a profile or default says
            cfg = replace(cfg, k=())
        cfg = one_k(cfg)
        # a profile may list several k and modes: trace the largest k, first mode
        summary = run_trace(cfg, max(cfg.k) if cfg.k else None, cfg.mode[0])
    except MtpBenchError as e:
        fail(str(e))
    print_trace(summary)
    wrote(cfg.out, "trace.csv", "trace.json", "layers.png", "report.html")
    if EXPECTED[expect] and summary["verdict"] != EXPECTED[expect]:
        typer.echo(f"expected {EXPECTED[expect]}, got {summary['verdict']}", err=True)
        raise typer.Exit(1)


def synthetic_engine(name: str, engine: dict, profile: Optional[str], mtp_layers: Optional[int], out: Path) -> dict:
    """--synthetic: the engine settings of the cached synthetic checkpoint, refusing what contradicts it."""
    from mtpbench.synth import trace_engine

    if engine["model"] or profile:
        fail("--synthetic builds its own checkpoint: give no MODEL_OR_PROFILE or --profile with it")
    if engine["backend"] not in (None, "vllm"):
        fail(f"--synthetic traces vLLM's own model classes: it takes --backend vllm, not {engine['backend']}")
    try:
        return trace_engine(name, mtp_layers, out, engine["dtype"], engine["draft_model"], engine["engine_args"])
    except MtpBenchError as e:
        fail(str(e))


def print_trace(summary: dict) -> None:
    """Who drafted, the per-step table, acceptance by position and layer, the verdict and its evidence."""
    from tabulate import tabulate

    from mtpbench.trace.page import headline
    from mtpbench.trace.report import STEP_HEADERS

    typer.echo(headline(summary)[0] + "\n")  # the page's answer, first
    if summary.get("runner"):
        from mtpbench.runners import label

        typer.echo(f"drafted by vLLM's {label(summary['runner'], summary['drafter'])}; {summary['execution']}")
        for note in summary["notes"]:
            typer.echo(f"note: {note}")
    typer.echo(tabulate([list(r.values()) for r in summary["per_step"]], headers=STEP_HEADERS))
    acc = summary["acceptance_by_layer"]
    if acc and summary["num_drafts"]:
        typer.echo("\nacceptance by position (vLLM's joint rate) and the layer that drafted it:")
        typer.echo("  " + "   ".join(f"pos {a['position']}: {a['acceptance_rate']} (layer {a['layer']})" for a in acc))
    typer.echo(f"\nverdict: {summary['verdict']}")
    for line in summary["evidence"]:
        typer.echo(f"  - {line}")
    from mtpbench.metrics.law import law_lines

    for line in law_lines(summary.get("acceptance_law")):
        typer.echo(("\n" if not line.startswith(" ") else "") + line)


@grouped
def trace_matrix(
    arch: Annotated[Optional[str], typer.Option(help="Comma-separated architectures.", show_default='every one mtpbench synth --list can run')] = None,
    k: Annotated[Optional[int], typer.Option("--num-speculative-tokens", help="num_speculative_tokens: draft steps per proposal (one k; sweep and tune take a list, --k); its default is each architecture's 2L.", show_default=ONE_K_DEFAULT)] = None,
    jobs: Annotated[Optional[int], typer.Option(help="Engines side by side.", show_default="one per core (a core a rank when sharded), as free memory allows")] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens of the traced prompt.")] = 12,
    runner: Annotated[Optional[str], typer.Option(help="Comma-separated vLLM model runners, e.g. v1,v2. " + RUNNER_HELP, show_default='the one vLLM picks here')] = None,
    parallel: Parallel = Parallel(),
    out: Annotated[str, typer.Option(*OUT, help="Output directory for matrix.csv, .json, .md, .png.")] = "matrix",
) -> None:
    """Every runnable vLLM MTP architecture x {as vLLM drafts, forced spec_step_idx}: one verdict per cell, at any
    tensor parallel size (every rank load-checked and traced; ranks that disagree are a verdict). Ctrl-C stops the
    engines and writes the architectures that finished (exit code 130)."""
    from mtpbench.matrix import MatrixInterrupted, run_matrix

    def on_cell(c) -> None:
        # the runner asked for (the cell's column); "(asked V2, ran V1)" where the engine ran another
        typer.echo(f"  {c.arch:<18} {c.runner_asked:<3} {c.drafting:<13} {c.verdict}"
                   + (f" [{c.layer_per_step}]" if c.layer_per_step else "") + (f" ({c.note})" if c.note else "")
                   + (f"  {c.error.splitlines()[0][:100]}" if c.error else ""), err=True)

    try:
        from mtpbench.runners import parse_runners

        run_matrix(list(strs(arch, "--arch")) if arch else None, Path(out), k, jobs, max_tokens, on_cell,
                   runners=parse_runners(runner), layout=asdict(parallel))
    except MtpBenchError as e:
        fail(str(e))
    except MatrixInterrupted as e:
        typer.echo(Path(out, "matrix.md").read_text())
        typer.echo(f"interrupted: engines stopped; wrote a PARTIAL matrix ({e.finished} of {e.total} architectures "
                   f"finished) to {out}/matrix.csv, matrix.json, matrix.md, matrix.png", err=True)
        raise typer.Exit(130) from None
    from mtpbench.matrix.page import headline

    typer.echo(headline(json.loads(Path(out, "matrix.json").read_text())["cells"]) + "\n")  # the page's answer, first
    typer.echo(Path(out, "matrix.md").read_text())
    wrote(out, "matrix.csv", "matrix.json", "matrix.md", "matrix.png")
