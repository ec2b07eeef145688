"""``mtpbench check-lossless``: options to a CheckConfig, ``mtpbench.lossless.run_check``, its summary and, with
--fail-if-lossy, its exit code."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import connection_options, engine_args, fail, set_threads, speculative_overrides, wrote
from mtpbench.cli.options import (BASE, BATCH_SIZE, ONE_K_DEFAULT, OUT, one_k, SERVER, SERVER_HELP, CheckDtype, EngineArg, MaxModelLen, Parallel, Runner, ServerAccess,
                                  SpeculativeConfig, Threads, Workload, grouped, shown)
from mtpbench.cli.progress import with_progress
from mtpbench.errors import MtpBenchError
from mtpbench.lossless.config import CHECK_DEFAULTS, DEFAULT_MAX_MDE, DEFAULT_SAMPLES_PER_PROMPT


@grouped
def check_lossless(
    model: Annotated[Optional[str], typer.Argument(help="Model directory.", show_default='the built-in tiny model')] = None,
    backend: Annotated[Optional[str], typer.Option(help="native, vllm (offline engines) or vllm-server (launched servers, or an attached --server with a --baseline-server).", show_default=BASE.backend)] = None,
    k: Annotated[Optional[int], typer.Option("--num-speculative-tokens", help="num_speculative_tokens: draft steps per proposal (one k; sweep and tune take a list, --k). Here the drafting arm, >= 1, checked against k = 0.", show_default=ONE_K_DEFAULT)] = None,
    temperature: Annotated[Optional[float], typer.Option("--check-temperature", help="The temperature whose law the check compares: > 0, the same law sampled? 0, the same tokens (greedy)? (sweep and tune decode at --temperature, default 0.)", show_default=shown(CHECK_DEFAULTS["temperature"]))] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts.", show_default=shown(CHECK_DEFAULTS["num_prompts"]))] = None,
    samples_per_prompt: Annotated[Optional[int], typer.Option(help="Sampling only: continuations of each prompt per arm.", show_default=str(DEFAULT_SAMPLES_PER_PROMPT))] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per continuation.", show_default=shown(CHECK_DEFAULTS["max_tokens"]))] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the check: the arms' seeds and the permutations derive from it.", show_default="0")] = None,
    mode: Annotated[Optional[str], typer.Option(help="Native drafting mode: reuse or chain.", show_default=shown(CHECK_DEFAULTS["mode"]))] = None,
    mtp_layers: Annotated[Optional[int], typer.Option("--num-mtp-layers", help="MTP layers to draft with: the checkpoint's first N (its num_nextn_predict_layers as loaded; sweep takes a list, --mtp-layers).", show_default='all the checkpoint has')] = None,
    workload: Workload = Workload(),
    batch_size: Annotated[Optional[int], typer.Option(*BATCH_SIZE, help="Sequences decoded together (vLLM's max_num_seqs); greedy's A/A control reruns k = 0 at batch size 1.", show_default=shown(CHECK_DEFAULTS["batch_size"]))] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 and so on.", show_default=BASE.device)] = None,
    dtype: CheckDtype = None,
    threads: Threads = None,
    runner: Runner = None,
    max_model_len: MaxModelLen = None,
    engine_arg: EngineArg = None,
    parallel: Parallel = Parallel(),
    speculative_config: SpeculativeConfig = None,
    server: Annotated[Optional[list[str]], typer.Option(*SERVER, help=SERVER_HELP + "Here: one that drafts and the same model without drafting (its k = 0 arms; or give that one as --baseline-server).")] = None,
    baseline_server: Annotated[Optional[str], typer.Option(help="URL of a running vLLM server of the same model without drafting: the k = 0 arms of an attached --server. It gets the same API key, headers and TLS settings as --server (both are servers you named); --metrics-url applies to --server only.")] = None,
    access: ServerAccess = ServerAccess(),
    planted_lossy: Annotated[bool, typer.Option("--planted-lossy", help="CONTROL, not a way to decode: the native drafter accepts every draft that is its own argmax, skipping the probability ratio min(1, p/q). Lossy on purpose (at temperature > 0): the check must call it lossy.")] = False,
    planted_subtle: Annotated[bool, typer.Option("--planted-subtle", help="CONTROL, not a way to decode: a subtler planted fault than --planted-lossy: the native engine's acceptance ratio min(1, p/q) takes p at 0.95 x the temperature (the residual and the bonus token keep the right one). Lossy on purpose (at temperature > 0).")] = False,
    max_detectable_shift: Annotated[Optional[float], typer.Option(help="Sampling: 'lossless' only if a shift of the mean target log-prob this large (nats/token) would have been detected with 80 % power; above it the verdict is inconclusive (underpowered), with the N that would reach it.", show_default=f"{DEFAULT_MAX_MDE}, the planted rule's measured shift")] = None,
    fail_if_lossy: Annotated[bool, typer.Option("--fail-if-lossy", help="A CI gate that fails closed: exit 1 on a lossy or divergent verdict, exit 3 on inconclusive (the check could not tell: the A/A control or the scorer's control failed, underpowered, nothing drafted); 2 is a refused input.")] = False,
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="With --fail-if-lossy: exit 0 on an inconclusive verdict (only lossy or divergent fail).")] = False,
    out: Annotated[Optional[str], typer.Option(*OUT, help="Output directory for lossless.json, lossless.md, lossless.png.", show_default=shown(CHECK_DEFAULTS["out"]))] = None,
) -> None:
    """Does MTP drafting change what the model says? k = K against k = 0: greedy, the same tokens; sampling, the same law (a permutation test with an A/A control)."""
    from mtpbench.config import resolve
    from mtpbench.lossless import CHECK_DEFAULTS, DEFAULT_MAX_MDE, CheckConfig, run_check

    servers = refuse(model, backend, tuple(server or ()), baseline_server, temperature, max_detectable_shift,
                     fail_if_lossy, allow_inconclusive)
    server = servers[0] if servers else None
    set_threads(threads)
    overrides, extra = speculative_overrides(speculative_config), engine_args(engine_arg)
    reach, header_values = connection_options(access)
    try:
        engine = resolve(dict(model=model, backend="vllm-server" if server else backend,
                              k=(() if server else None) if k is None else (k,),  # attached: the server's k
                              mode=None if mode is None else (mode,), **workload.config(),
                              mtp_layers=None if mtp_layers is None else (mtp_layers,), num_prompts=num_prompts,
                              max_tokens=max_tokens, temperature=temperature, batch_size=batch_size, seed=seed,
                              device=device, runner=runner, dtype="auto" if server and dtype is None else dtype,
                              max_model_len=max_model_len, engine_args=extra, server=server, out=out,
                              **asdict(parallel), **reach), None, CHECK_DEFAULTS)
        engine, baseline_server = attached(one_k(replace(engine, header_values=header_values)), servers, baseline_server)
        cfg = CheckConfig(engine, samples_per_prompt, planted_lossy, planted_subtle,
                          DEFAULT_MAX_MDE if max_detectable_shift is None else max_detectable_shift,
                          baseline_server=baseline_server, speculative_overrides=overrides)
        record = with_progress("check-lossless", run_check, cfg, timed=False)
    except MtpBenchError as e:
        fail(str(e))
    said(record, engine.out, fail_if_lossy, allow_inconclusive)


def said(record: dict, out: str, fail_if_lossy: bool, allow_inconclusive: bool) -> None:
    """The verdict on the terminal, the files written, and --fail-if-lossy's exit code."""
    from mtpbench.lossless import exit_code, summary
    from mtpbench.lossless.page import headline

    typer.echo(headline(record)[0] + "\n")  # the page's answer, first
    typer.echo(summary(record))
    wrote(out, "lossless.json", "lossless.md", "lossless.png", "report.html")
    if fail_if_lossy and (code := exit_code(record, allow_inconclusive)):
        raise typer.Exit(code)


def attached(engine, servers: tuple, baseline_server: Optional[str]) -> tuple:
    """Two --server: which one drafts (the engine's server) and which does not (the k = 0 arms), read from the
    servers themselves; else as given."""
    if len(servers) < 2:
        return engine, baseline_server
    from mtpbench.backends.vllm_server.attach import drafting_first
    from mtpbench.connection import connect

    first, baseline = drafting_first(connect(engine, servers[1]), servers)
    return replace(engine, server=first), baseline


def refuse(model, backend, servers, baseline_server, temperature, max_detectable_shift, fail_if_lossy,
           allow_inconclusive) -> tuple:
    """Exit 2 on options that contradict each other, before anything is loaded; the attached servers."""
    from mtpbench.builtin import BUILTIN_MODELS

    if model is not None and model not in BUILTIN_MODELS and not Path(model).is_dir() \
            and model.count("/") != 1:
        fail(f"model directory not found: {model}")
    if allow_inconclusive and not fail_if_lossy:
        fail("--allow-inconclusive qualifies --fail-if-lossy's exit code: give --fail-if-lossy too")
    if temperature is not None and temperature < 0:
        fail(f"--check-temperature must be >= 0, got {temperature}")
    if max_detectable_shift is not None and temperature is not None and temperature <= 0:
        fail("--max-detectable-shift applies to sampling (temperature > 0): greedy compares tokens")
    if servers and backend not in (None, "vllm-server"):
        fail(f"--server checks a running vLLM server: it takes --backend vllm-server, not {backend}")
    if len(servers) > 2 or (len(servers) == 2 and baseline_server):
        fail("check-lossless attaches two servers at most: one that drafts and the same model without drafting "
             "(a second --server, or --baseline-server)")
    return servers
