"""``mtpbench check-drafter``: does the engine's MTP draft equal what the checkpoint's MTP layers compute?"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import engine_args, fail, model_or_profile, wrote
from mtpbench.cli.options import (BASE, ONE_K_DEFAULT, OUT, one_k, CheckDtype, MaxModelLen, ModelOrProfile, Parallel, Runner, grouped,
                                  shown)
from mtpbench.errors import MtpBenchError

# float32 on every backend: the reference is compared with the engine's numbers at float32's tolerance
DRAFTER_DEFAULTS = {"k": (), "mode": ("reuse",), "num_prompts": 2, "max_tokens": 24, "dtype": "float32",
                    "out": "drafter"}


@grouped
def check_drafter(
    model: ModelOrProfile = None,
    backend: Annotated[Optional[str], typer.Option(help="native or vllm (an offline engine).", show_default=BASE.backend)] = None,
    k: Annotated[Optional[int], typer.Option("--num-speculative-tokens", help="num_speculative_tokens: draft steps per proposal (one k; sweep and tune take a list, --k).", show_default=ONE_K_DEFAULT)] = None,
    mode: Annotated[Optional[str], typer.Option(help="Native drafting mode: reuse or chain.", show_default=shown(DRAFTER_DEFAULTS["mode"]))] = None,
    runner: Runner = None,
    synthetic: Annotated[Optional[str], typer.Option(help="Check a synthetic checkpoint of this vLLM MTP architecture (mtpbench synth --list), built or taken from the cache; implies --backend vllm.")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="'builtin' or a JSONL file.", show_default=BASE.prompts)] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Prompts, each generated on its own.", show_default=shown(DRAFTER_DEFAULTS["num_prompts"]))] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt.", show_default=shown(DRAFTER_DEFAULTS["max_tokens"]))] = None,
    dtype: CheckDtype = None,
    max_model_len: MaxModelLen = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra vllm.LLM argument KEY=VALUE (repeatable).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Profile name or .toml path.")] = None,
    out: Annotated[Optional[str], typer.Option(*OUT, help="Output directory for drafter.json and report.html.", show_default=shown(DRAFTER_DEFAULTS["out"]))] = None,
) -> None:
    """Capture every draft step of a short greedy run (what the engine fed its MTP module, what each stage
    produced), recompute it with mtpbench's independent reference of the checkpoint's MTP block, and name the
    first stage that differs; exit 1 where one does, 3 where no stage could be checked (inconclusive: no pass)."""
    from mtpbench.config import resolve
    from mtpbench.drafter.compare import EXIT_CODE, verdict
    from mtpbench.drafter.run import run_check

    model, profile = model_or_profile(model, profile)
    engine = dict(model=model, backend=backend, method=None, draft_model=None, dtype=dtype,
                  engine_args=engine_args(engine_arg), server=None, **asdict(Parallel()))
    if synthetic:
        from mtpbench.cli.trace import synthetic_engine

        engine = synthetic_engine(synthetic, engine, profile, None, Path(out or DRAFTER_DEFAULTS["out"]))
    try:
        cfg = resolve(dict(**engine, mtp_layers=None, mode=None if mode is None else (mode,), prompts=prompts,
                           num_prompts=num_prompts, max_tokens=max_tokens, max_model_len=max_model_len,
                           runner=runner, out=out, k=None if k is None else (k,)), profile,
                      defaults=DRAFTER_DEFAULTS)
        cfg = one_k(cfg)
        summary = run_check(cfg, max(cfg.k), cfg.mode[0])
    except MtpBenchError as e:
        fail(str(e))
    print_check(summary)
    wrote(cfg.out, "drafter.json", "report.html")
    code = EXIT_CODE[verdict(summary["errors"], summary["tolerance"])]
    if code:
        raise typer.Exit(code)


def print_check(s: dict) -> None:
    from tabulate import tabulate

    from mtpbench.drafter.page import acceptance_rows, answer, stage_rows

    typer.echo(answer(s)[0] + "\n")  # the page's answer, first
    typer.echo(f"{s['family']} family, {s['dtype']} (tolerance {s['tolerance']:.3g}); decoder layer: {s['decoder']}")
    typer.echo(tabulate(stage_rows(s), headers=["stage", "error", "verdict"]))
    for note in s["notes"]:
        typer.echo(f"note: {note}")
    typer.echo("\n" + tabulate(acceptance_rows(s), headers=["position", "reference", "engine drafts",
                                                            "engine counters"]))
