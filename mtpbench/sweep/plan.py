"""``mtpbench sweep --dry-run``: what a sweep would run, and about how long, without loading a model or writing a
file: the grid's points, the engines it starts, the timed runs and the tokens they generate; and a time estimated
from an earlier sweep in the same --out (its tokens/s and engine start-up), the only measured rate there is to take:
none is guessed.

``estimate`` is pure: it takes an earlier sweep's rows (summary.json) and the plan's counts."""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.backend_info import info
from mtpbench.config import SweepConfig, validate
from mtpbench.metrics import GridPoint
from mtpbench.stats.intervals import median


def plan(cfg: SweepConfig) -> dict:
    """The grid and its counts, after the checks a sweep makes before it starts (an error is one line)."""
    from mtpbench.prompts import run_prompts
    from mtpbench.sweep.rounds import with_aa
    from mtpbench.sweep.run import check_rounds, grid

    from mtpbench.config import local_model_dir, with_runner
    from mtpbench.environment import provenance, require_vllm
    from mtpbench.sweep import store

    attached = bool(cfg.server or cfg.servers)
    backend = info(cfg.backend)
    if backend.vllm and not attached:
        require_vllm()  # as the run would, before it plans anything: an engine here needs vLLM here
    here = attached or local_model_dir(cfg.model) is not None
    n_layers = cfg.num_mtp_layers() if here and not cfg.server else None
    validate(cfg, n_layers)
    check_rounds(cfg)
    points = grid(cfg, n_layers, -1)  # an attached server's k is read when the sweep starts: -1 here
    held, pset = store.Claim(), run_prompts(cfg) if here else None
    if here:  # what --out holds: points saved with the same settings are not run again (refused: other settings)
        fp = store.sweep_fingerprint(with_runner(cfg).to_json(), provenance()["versions"], pset.describe()["sha256"])
        held = store.claim(Path(cfg.out), fp, [] if attached else [p.name for p in points], cfg.replace, attached,
                           dry_run=True, force=cfg.force)
    points = [p for p in points if p.name not in held.reused]
    if backend.interleaves_repeats and cfg.repeats > 1:
        points = [p for p, _ in with_aa(cfg, [(p, None) for p in points])]
    names = [_name(p) for p in points]
    if cfg.servers:  # each server's points
        points, names = points * len(cfg.servers), [f"{n} at {url}" for url in cfg.servers for n in names]
    prompts = len(pset.prompts) if here else count_prompts(cfg)
    most = cfg.max_repeats or cfg.repeats
    runs = len(points) * (cfg.warmup * backend.interleaves_repeats + cfg.repeats)
    # the native engine is one for every point; vLLM one per (k, L); an attached server is started by nobody here
    engines = 0 if cfg.server else 1 if not backend.vllm else len({(p.k, p.mtp_layers) for p in points})
    return {"points": names, "model_here": here, "reused": list(held.reused), "replaced": held.moved_to,
            "engine_starts": engines,
            "prompts": prompts,
            "timed_runs": runs, "timed_runs_at_most": len(points) * (cfg.warmup * backend.interleaves_repeats + most),
            "output_tokens": runs * prompts * cfg.max_tokens, "max_seconds": cfg.max_seconds}


def count_prompts(cfg: SweepConfig) -> int:
    """The prompts a run of a model not here would send: --num-prompts of vLLM's random dataset (the built-in
    set's count without it), or the named set's, counted without a tokenizer."""
    from mtpbench.prompts import BUILTIN_DEFAULT_PROMPTS, prompt_set

    if cfg.prompts == "random":
        return cfg.num_prompts or BUILTIN_DEFAULT_PROMPTS
    return len(prompt_set(cfg.prompts, cfg.num_prompts, None, "none").prompts)


def _name(p: GridPoint) -> str:
    return p.name.replace("k-1", "k(server's)")


def earlier_rows(out: Path, cfg: SweepConfig) -> list[dict]:
    """The whole-point rows of an earlier sweep in ``out`` on the same backend and model (its summary.json)."""
    path = Path(out) / "summary.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    config = data.get("config") or {}
    if config.get("backend") != cfg.backend or config.get("model") != cfg.model:
        return []
    return [r for r in data.get("rows") or [] if r.get("category") == "all" and r.get("status") == "ok"]


def estimate(rows: list[dict], counts: dict) -> dict | None:
    """Seconds the plan would take at the earlier rows' median tokens/s and engine start-up: the plan's output
    tokens over that rate, plus one start-up per engine (None: no earlier row with a rate)."""
    rates = [r["output_tokens_per_sec"] for r in rows if r.get("output_tokens_per_sec")]
    if not rates:
        return None
    startup = median([r.get("startup_s") for r in rows]) or 0.0
    seconds = counts["output_tokens"] / median(rates) + counts["engine_starts"] * startup
    return {"seconds": seconds, "tokens_per_sec": median(rates), "startup_s": startup}


def lines(counts: dict, guess: dict | None, out: str) -> list[str]:
    """The dry run as printed."""
    reused, replaced = counts.get("reused") or [], counts.get("replaced")
    text = [] if counts.get("model_here", True) else [
        "model: not on this machine, so the plan counts without it: its MTP layers are unknown (no L in the point "
        "names; --mtp-layers names them), its prompts are counted, not tokenized; the run needs its files here"]
    text += ([f"reused: {len(reused)} point{'s' * (len(reused) != 1)} measured before in {out} with the same settings, not run again: "
             f"{', '.join(reused)} (--replace measures them anew)"] if reused else [])
    text += [f"--replace: the earlier results in {out} would be moved to {replaced}"] if replaced else []
    text += [f"grid: {len(counts['points'])} points: {', '.join(counts['points']) or 'none'}",
            f"engine starts: {counts['engine_starts']}; prompts per run: {counts['prompts']}",
            f"timed runs: {counts['timed_runs']}" + (f" (up to {counts['timed_runs_at_most']} with --max-repeats)"
                                                     if counts["timed_runs_at_most"] > counts["timed_runs"] else ""),
            f"output tokens: {counts['output_tokens']}"]
    if guess is None:
        text.append(f"time: no estimate (no earlier sweep of this backend and model in {out} to take a rate from; "
                    f"a short sweep there first, e.g. --k 0 --repeats 1, gives one)")
    else:
        text.append(f"time: about {guess['seconds'] / 60:.1f} min at {guess['tokens_per_sec']:.1f} tokens/s and "
                    f"{guess['startup_s']:.1f} s per engine start (the earlier sweep in {out}); more rounds, if "
                    f"--max-repeats gives them, add to it")
    return text + ["dry run: nothing was loaded, run or written"]
