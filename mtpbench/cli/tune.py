"""``mtpbench tune``: options to a TuneConfig, ``mtpbench.tune.run_tune`` under a progress bar, the decision."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Annotated, Optional

import typer

from mtpbench.cli.common import (connection_options, engine_args, fail, ints, json_value, model_or_profile,
                                 reporting_options, set_threads, speculative_overrides, strs, wrote)
from mtpbench.cli.options import (ALIAS_NOTE, BASE, MAX_CONCURRENCY, OUT, ROUNDS, SERVER, SERVER_HELP, Dtype, Earlier, EngineArg, Goodput,
                                  MaxModelLen, ModelOrProfile, Parallel, Reporting, Rounds, Runner, Seed, ServerAccess,
                                  SpeculativeConfig, Threads, Workload, grouped, shown)
from mtpbench.cli.progress import with_progress
from mtpbench.errors import MtpBenchError
from mtpbench.tune.run import DEFAULT_LOADS

# a tune's own defaults (its sweeps otherwise take the sweep's): k 0-4, enough prompts for the largest batch,
# short outputs, the repeats a ratio of tokens/s needs for an interval, and more for the points still undecided
# within a budget for the whole tune (docs/measure-until-decided.md: what they cost and decide on this machine)
DEFAULTS = {"k": (0, 1, 2, 3), "num_prompts": 16, "max_tokens": 64, "repeats": 3}


@grouped
def tune(
    model: ModelOrProfile = None,
    backend: Annotated[Optional[str], typer.Option(help="native or vllm (over --batch-sizes), vllm-server (over --max-concurrency; launched, or attached with --server).", show_default=BASE.backend)] = None,
    k: Annotated[Optional[str], typer.Option("--k", help="num_speculative_tokens values to measure, with 0.", show_default=shown(DEFAULTS["k"]))] = None,
    batch_size: Annotated[Optional[str], typer.Option("--batch-sizes", help="Offline backends: the loads, sequences decoded together (vLLM's max_num_seqs), one sweep each, e.g. 1,4,16 (sweep takes one, --batch-size).", show_default=shown(DEFAULT_LOADS["batch"]))] = None,
    concurrency: Annotated[Optional[str], typer.Option(*MAX_CONCURRENCY, help="vllm-server: the loads, requests in flight at most, one sweep each." + ALIAS_NOTE, show_default=shown(DEFAULT_LOADS["concurrency"]))] = None,
    mtp_layers: Annotated[Optional[int], typer.Option("--num-mtp-layers", help="MTP layers to draft with: the checkpoint's first N (its num_nextn_predict_layers as loaded; sweep takes a list, --mtp-layers).", show_default='all the checkpoint has')] = None,
    mode: Annotated[Optional[str], typer.Option(help="native backend: the drafting mode to tune, reuse (as vLLM's V1 drafts) or chain.", show_default='reuse')] = None,
    workload: Workload = Workload(),
    num_prompts: Annotated[Optional[int], typer.Option(help="Prompts per point.", show_default=f"{DEFAULTS['num_prompts']}, at least the largest batch")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Output tokens per prompt.", show_default=shown(DEFAULTS["max_tokens"]))] = None,
    repeats: Annotated[Optional[int], typer.Option(help="Timed runs every point gets, at least 3.", show_default=f"{DEFAULTS['repeats']}; on native, up to --max-repeats {ROUNDS['max_repeats']} for undecided points within --max-seconds {ROUNDS['max_seconds']:.0f} for the whole tune")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 = greedy; > 0 uses rejection sampling.", show_default=str(BASE.temperature))] = None,
    seed: Seed = None,
    dtype: Dtype = None,
    max_model_len: MaxModelLen = None,
    engine_arg: EngineArg = None,
    speculative_config: SpeculativeConfig = None,
    threads: Threads = None,
    parallel: Parallel = Parallel(),
    rounds: Rounds = Rounds(),
    runner: Runner = None,
    server: Annotated[Optional[list[str]], typer.Option(*SERVER, help=SERVER_HELP + "Here: one that drafts and the same model without drafting (the k = 0 baseline).")] = None,
    access: ServerAccess = ServerAccess(),
    reporting: Reporting = Reporting(),
    from_: Annotated[Optional[list[str]], typer.Option("--from", help="Read these sweep directories (or a tune's) instead of running sweeps (repeatable).")] = None,
    validate: Annotated[bool, typer.Option("--validate", help="Run the schedule (vLLM's dynamic speculative decoding on vllm and vllm-server) beside the best fixed k of each load and the best single k.")] = False,
    goodput: Goodput = None,
    schedule: Annotated[Optional[str], typer.Option(help="With --validate: validate these ranges instead of the chosen ones, e.g. '[[1,2,3],[3,16,1]]'.")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Profile name or .toml path (its sweep settings).")] = None,
    out: Annotated[str, typer.Option(*OUT, help="Output directory (--result-dir: vllm bench serve's name).")] = "tune",
    earlier: Earlier = Earlier(),
) -> None:
    """Choose the k to run at every load: measure k x load, choose with intervals, predict, write vLLM's schedule."""
    from mtpbench.config import resolve
    from mtpbench.tune.run import TuneConfig, run_tune

    slo = parse_goodput(goodput, model)
    model, profile = model_or_profile(model, profile)
    reach, header_values = connection_options(access)
    servers, spec = tuple(server or ()), speculative_overrides(speculative_config)
    set_threads(threads)
    try:
        cfg = resolve(dict(model=model, backend="vllm-server" if servers else backend, k=ints(k, "--k"),
                           mtp_layers=(mtp_layers,) if mtp_layers else None, mode=strs(mode, "--mode"), **workload.config(),
                           num_prompts=num_prompts, max_tokens=max_tokens, repeats=repeats, seed=seed, dtype=dtype,
                           temperature=temperature,
                           max_model_len=max_model_len, engine_args=engine_args(engine_arg), runner=runner,
                           speculative_config=spec, **reporting_options(reporting),
                           out=out, **asdict(parallel), **asdict(rounds), **reach), profile, defaults=DEFAULTS)
        cfg = with_rounds(replace(cfg, header_values=header_values, replace=earlier.replace_earlier, force=earlier.force, mode=cfg.mode if mode or cfg.backend != "native"
                                  else ("reuse",)))
        tc = TuneConfig(cfg, out=out, sources=tuple(from_ or ()), servers=servers, mode=cfg.mode[0]
                        if mode else None, validate=validate, schedule=parse_schedule(schedule), goodput=slo)
        tc = replace(tc, loads=loads_of(tc, batch_size, concurrency))
        result = with_progress("tune", run_tune, tc)
    except MtpBenchError as e:
        fail(str(e))
    show_result(result, out)


def loads_of(tc, batch_size: Optional[str], concurrency: Optional[str]) -> tuple[int, ...]:
    """The tune's loads: --max-concurrency on a served backend, --batch-sizes on the others (the other refused)."""
    served = tc.unit == "concurrency"
    if batch_size if served else concurrency:
        fail(f"--{'batch-sizes' if served else 'max-concurrency'} is the load of {'offline' if served else 'served'} "
             f"runs; {tc.sweep.backend} takes --{'max-concurrency' if served else 'batch-sizes'}")
    flag = "--max-concurrency" if served else "--batch-sizes"
    return ints(concurrency if served else batch_size, flag) or DEFAULT_LOADS[tc.unit]


def with_rounds(cfg):
    """The sequential rounds' defaults (ROUNDS) where none was given, on a backend that interleaves its repeats."""
    from mtpbench.backend_info import info

    if not info(cfg.backend).interleaves_repeats:
        return cfg
    return replace(cfg, **{k: v for k, v in ROUNDS.items() if getattr(cfg, k) is None})


def parse_goodput(pairs: Optional[list[str]], model: Optional[str]) -> Optional[dict]:
    """--goodput's SLO; a MODEL argument that is a KEY:VALUE pair is vLLM's unquoted syntax, which an option here
    cannot take (one value per --goodput)."""
    from mtpbench.tune.goodput import METRICS, parse

    if model and model.partition(":")[0] in METRICS and pairs:
        fail(f"--goodput takes its KEY:VALUE pairs quoted together or repeated (--goodput '{pairs[-1]} {model}'), "
             f"not as separate words: {model} was read as the model")
    try:
        return parse(pairs) if pairs else None
    except MtpBenchError as e:
        fail(str(e))


def parse_schedule(text: Optional[str]) -> Optional[tuple]:
    if text is None:
        return None
    value = json_value(text, "--schedule", "a JSON list of [start, end, k] ranges", list)
    return tuple(tuple(r) if isinstance(r, list) else r for r in value)


def show_result(result: dict, out: str) -> None:
    from mtpbench.tune.markdown import measured_table, schedule_ratio_text, why_not
    from mtpbench.tune.page import headline

    typer.echo(headline(result)[0] + "\n")  # the page's answer, first
    typer.echo("\n".join(measured_table(result)))
    p = result["prediction"]
    typer.echo(f"\nprediction: held-out error median {p['held_out_abs_error_median']:.1%}, worst "
               f"{p['held_out_abs_error_max']:.1%}; predicted best k = measured best k at {p['best_k_agrees']} of "
               f"{len(p['best_k'])} loads")
    reason = why_not(result)
    if reason:
        typer.echo(reason)
    spec = result["speculative_config"]
    typer.echo(f"\ndecision: {result['decision']}")
    if result.get("decision_note"):
        typer.echo(f"why: {result['decision_note']}")
    for said in result.get("sweep_disagreements") or []:  # where a sweep's own page answers otherwise (issue 55)
        typer.echo(f"where the sweep's own page answers otherwise: {said}")
    if result.get("unreliable_because"):  # the answer carries its noise
        typer.echo("not reliable: " + "; ".join(result["unreliable_because"]))
    typer.echo(f"--speculative-config '{json.dumps(spec)}'" if spec else "no --speculative-config: don't draft")
    if result.get("goodput"):
        show_goodput(result)
    for r in (result.get("validation") or {}).get("rows") or []:
        if r["verdict"]:
            typer.echo(f"validate: {result['unit']} {r['load']}: schedule / {r['arm']} (k = {r['k']}) = "
                       f"{schedule_ratio_text(r)}: {r['verdict']}")
    wrote(out, "schedule.json", "tune.json", "tune.md", "tune.csv", "tune.png", "report.html")


def show_goodput(result: dict) -> None:
    from mtpbench.tune.markdown import goodput_headline

    g = result["goodput"]
    rows = {(r["load"], r["k"]): r for r in result["rows"] if r["measured"]}
    by_tokps = {c["load"]: c["chosen"] for c in result["choices"]}
    for c in g["choices"]:
        r = rows[c["load"], c["chosen"]]
        typer.echo(f"goodput: {result['unit']} {c['load']}: k = {c['chosen']} by goodput ({r['goodput_rps']:.3g} req/s"
                   f" meeting the SLO), k = {by_tokps[c['load']]} by tokens/s")
    typer.echo(goodput_headline(result))
