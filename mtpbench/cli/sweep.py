"""``mtpbench sweep``: options to a SweepConfig, ``mtpbench.sweep.run_sweep`` under a progress bar, the table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import (connection_options, engine_args, exit_if_partial, fail, ints, model_or_profile,
                                 plots_written, rates, reporting_options, set_threads, show, speculative_overrides,
                                 strs, wrote)
from mtpbench.cli.options import (ALIAS_NOTE, BASE, BATCH_SIZE, MAX_CONCURRENCY, OUT, SERVER, SERVER_HELP, Dtype, Earlier, EngineArg, ForceSpecStepIdx, Law, MaxModelLen, ModelOrProfile, Parallel,
                                  Reporting, Rounds, Runner, Seed, ServerAccess, SpeculativeConfig, Threads, Wide, Workload,
                                  grouped, shown)
from mtpbench.cli.progress import with_progress
from mtpbench.errors import PARTIAL, MtpBenchError


@dataclass(frozen=True)
class Served:
    """A served run: the server (attached or launched), its API and the load put on it."""
    server: Annotated[Optional[list[str]], typer.Option(*SERVER, help=SERVER_HELP + "Here: several servers of one model, each at its own k, make one sweep.")] = None
    api: Annotated[Optional[str], typer.Option(help="Served runs: completions (/v1/completions) or chat (/v1/chat/completions).", show_default=BASE.api)] = None
    concurrency: Annotated[Optional[str], typer.Option(*MAX_CONCURRENCY, help="Served runs: requests in flight at most, e.g. 1,4,16 (closed loop)." + ALIAS_NOTE, show_default=shown(BASE.concurrency))] = None
    request_rate: Annotated[Optional[str], typer.Option(help="Served runs: Poisson arrivals per second, e.g. 2,8,inf (inf = all at once).", show_default="inf")] = None
    port: Annotated[Optional[int], typer.Option(help="Served runs: port of the launched server on 127.0.0.1.", show_default='a free one')] = None

    def config(self) -> dict:
        servers = tuple(self.server or ())
        return dict(server=servers[0] if servers else None, servers=servers if len(servers) > 1 else None, api=self.api, concurrency=ints(self.concurrency, "--max-concurrency"),
                    request_rate=rates(self.request_rate), server_port=self.port)


@dataclass(frozen=True)
class SweepWorkload(Workload):
    """What is asked of the model: the prompts and how each request samples (shared with tune and check-lossless),
    how many prompts, how long the answers."""
    num_prompts: Annotated[Optional[int], typer.Option(help="Number of prompts, spread over the categories.", show_default='8 of builtin, all of any other set')] = None
    chat_template: Annotated[Optional[str], typer.Option(help="auto: prompts through the checkpoint's chat template where it has one; none: raw text.", show_default=BASE.chat_template)] = None
    context_tokens: Annotated[Optional[str], typer.Option(help="Tokens of held-out text before each prompt, a grid dimension, e.g. 0,512,1024.", show_default="none")] = None
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt.", show_default=str(BASE.max_tokens))] = None

    def config(self) -> dict:
        return dict(super().config(), num_prompts=self.num_prompts, chat_template=self.chat_template,
                    context_tokens=ints(self.context_tokens, "--context-tokens"), max_tokens=self.max_tokens)


@grouped
def sweep(
    model: ModelOrProfile = None,
    backend: Annotated[Optional[str], typer.Option(help="native, vllm (offline engine) or vllm-server (served, under load).", show_default=BASE.backend)] = None,
    k: Annotated[Optional[str], typer.Option("--k", help="num_speculative_tokens values, e.g. 0,1,2,3 (0 = plain decoding baseline; with --server: the server's).", show_default=shown(BASE.k))] = None,
    mtp_layers: Annotated[Optional[str], typer.Option(help="MTP layer counts, e.g. 1,2,3.", show_default='all the checkpoint has')] = None,
    mode: Annotated[Optional[str], typer.Option("--modes", help="Drafting modes: reuse (layer 0 every step), chain (step s runs layer s mod L); a list, e.g. reuse,chain (the other commands take one, --mode).", show_default=shown(BASE.mode))] = None,
    workload: SweepWorkload = SweepWorkload(),
    repeats: Annotated[Optional[int], typer.Option(help="Timed runs per point, round robin on the native backend: tokens/s, TTFT and TPOT as their geometric mean, with 95 % intervals (and speedup intervals) from 3.", show_default="6 on native; 3 on vLLM, each a whole timed run of the point: 3 times one run's time")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy; > 0 uses rejection sampling.", show_default=str(BASE.temperature))] = None,
    batch_size: Annotated[Optional[int], typer.Option(*BATCH_SIZE, help="Offline backends: sequences decoded together (vLLM's max_num_seqs)." + ALIAS_NOTE, show_default=str(BASE.batch_size))] = None,
    seed: Seed = None,
    law: Law = None,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (native backend).", show_default=BASE.device)] = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    parallel: Parallel = Parallel(),
    rounds: Rounds = Rounds(),
    engine_arg: EngineArg = None,
    speculative_config: SpeculativeConfig = None,
    threads: Threads = None,
    force_spec_step_idx: ForceSpecStepIdx = None,
    runner: Runner = None,
    draft_model: Annotated[Optional[str], typer.Option(help="A drafter in a checkpoint of its own (vLLM speculative_config model), e.g. Gemma 4's assistant.")] = None,
    served: Served = Served(),
    access: ServerAccess = ServerAccess(),
    reporting: Reporting = Reporting(),
    profile: Annotated[Optional[str], typer.Option(help="Profile name (see `mtpbench profiles`) or .toml path.")] = None,
    out: Annotated[Optional[str], typer.Option(*OUT, help="Output directory for point files, summary and plots (--result-dir: vllm bench serve's name).", show_default=BASE.out)] = None,
    earlier: Earlier = Earlier(),
    wide: Wide = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the grid, the engines, timed runs and tokens it would take, and a time estimated from an earlier sweep in --out; load, run and write nothing.")] = False,
) -> None:
    """Sweep k x MTP layers x drafting mode (x load, served); write point JSONs, summary.csv/json and PNG plots."""
    from mtpbench.config import resolve
    from mtpbench.sweep import run_sweep
    from mtpbench.sweep.servers import run_servers

    model, profile = model_or_profile(model, profile, absent_ok=dry_run)
    extra, spec, _ = engine_args(engine_arg), speculative_overrides(speculative_config), set_threads(threads)
    if served.server and backend not in (None, "vllm-server"):
        fail(f"--server measures a running vLLM server: it takes --backend vllm-server, not {backend}")
    reach, header_values = connection_options(access)
    try:
        cfg = resolve(dict(model=model, backend="vllm-server" if served.server else backend, k=ints(k, "--k"),
                           mtp_layers=ints(mtp_layers, "--mtp-layers"), mode=strs(mode, "--modes"), **workload.config(),
                           repeats=repeats, temperature=temperature, batch_size=batch_size, seed=seed, law=law, device=device,
                           dtype=dtype, max_model_len=max_model_len, **asdict(parallel), **asdict(rounds),
                           engine_args=extra, speculative_config=spec,
                           force_spec_step_idx=force_spec_step_idx, runner=runner, draft_model=draft_model,
                           **served.config(), out=out, **reach, **reporting_options(reporting)), profile)
        # an attached server's k is its own, whatever a profile lists
        cfg = replace(cfg, header_values=header_values, k=() if cfg.server and k is None else cfg.k,
                      replace=earlier.replace_earlier, force=earlier.force)
        if dry_run:
            return dry(cfg)
        rows = with_progress("sweep", run_servers if cfg.servers else run_sweep, cfg)
    except MtpBenchError as e:
        fail(str(e))
    finish(rows, cfg.out, wide)


def finish(rows, out: str, wide: bool = False) -> None:
    """The answer and the table, what was written, and exit code PARTIAL (errors.EXIT_CODES) where a point failed:
    a script reading the exit code must not take a sweep with holes for a whole one, nor nothing for a result."""
    show(rows, out, wide)
    wrote(out, "summary.csv", "summary.json", "point files", *plots_written(out))
    failed = [r for r in rows if r.status != "ok" and r.category == "all"]
    whole = [r for r in rows if r.category == "all"]
    if failed and len(failed) == len(whole):  # nothing measured
        typer.echo(f"error: every point of the sweep failed (each one's error is in {out}/summary.json)", err=True)
        raise typer.Exit(PARTIAL)
    exit_if_partial(out)


def dry(cfg) -> None:
    """--dry-run: the plan, printed; nothing loaded, run or written."""
    from mtpbench.sweep.plan import earlier_rows, estimate, lines, plan

    counts = plan(cfg)
    typer.echo("\n".join(lines(counts, estimate(earlier_rows(cfg.out, cfg), counts), cfg.out)))
