"""``mtpbench sweep``: run a grid of (mode, k, MTP layers[, load]) points and save one JSON per point.

Output directory layout::

    run.json                  resolved config, provenance, engine facts
    k0.json                   the plain-decoding baseline (k = 0)
    <mode>-L<layers>-k<k>.json     raw records of one point: per-request tokens and times, per-batch counters
                              and with --law its acceptance against its law (``acceptance_law``, untimed)
    ...-c<concurrency>[-r<rate>]   served runs: one point per load (concurrency x request rate)
    <mode>-L<layers>-k<k>.server.log   a launched vLLM server's log (served runs)
    <point>.requests.jsonl    one line per request of the point's first timed run: TTFT, TPOT, E2EL, ITL (ms), drafts
    <point>.failure.json      a point that failed, with the error; the sweep goes on
    summary.csv / summary.json / *.png    rebuilt from the files above by ``mtpbench report``

A point whose file already exists for the same settings is skipped and said so, so an interrupted sweep resumes
(not against an attached server, which may have changed since); other settings into a sweep's folder are refused
unless --replace moves it aside (sweep/store.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from mtpbench.backend_info import info
from mtpbench.backends import get_backend
from mtpbench.backends.vllm.known_faults import known_fault
from mtpbench.config import SweepConfig, execution, validate, with_runner
from mtpbench.environment import environment, provenance
from mtpbench.errors import MtpBenchError
from mtpbench.files import make_out_dir
from mtpbench.files import write_json, write_text
from mtpbench.metrics import GridPoint, PointResult, check_requests_against_counters
from mtpbench.metrics.latency import request_lines
from mtpbench.prompts import run_prompts
from mtpbench.sweep import store
from mtpbench.sweep.load import divergence_holds
from mtpbench.sweep.report import build
from mtpbench.stats.judge import ALPHA, law_family, law_levels
from mtpbench.stats.sequential import max_looks
from mtpbench.sweep.rounds import family_of, run_rounds, sequential


def grid(cfg: SweepConfig, checkpoint_layers: int | None, attached_k: int | None = None) -> list[GridPoint]:
    """The sweep's points in run order. Served runs vary the load innermost, so one server start
    serves every load of its (k, L); an attached server's k is its own."""
    # vLLM's drafting is whatever the engine does (trace-layers tells which), not a mode we choose
    backend = info(cfg.backend)
    modes = (backend.drafting_mode,) if backend.drafting_mode else cfg.mode
    if cfg.server:
        ks, layers = (attached_k,), (cfg.mtp_layers[0] if cfg.mtp_layers else None,)
    else:
        ks, layers = tuple(cfg.k), cfg.mtp_layers or (checkpoint_layers,)
    loads = [(c, r) for c in cfg.concurrency for r in cfg.request_rate] if backend.served else [(None, None)]
    contexts = sorted(set(cfg.context_tokens)) or [None]
    points = [GridPoint("plain", 0, 0, c, r, x) for x in contexts for c, r in loads] if 0 in ks else []
    for k in sorted(set(ks) - {0}):
        points += [GridPoint(mode, k, L, c, r, x) for L in layers for mode in modes for x in contexts
                   for c, r in loads]
    return points


def run_sweep(cfg: SweepConfig, on_point: Callable[[int, int, str], None] | None = None,
              say: Callable[[str], None] | None = None, backend=None) -> list[PointResult]:
    """Measure the sweep's points into ``cfg.out`` and build its files; its rows. ``say``: where a line about the
    folder's earlier results goes (sweep/store.py; default: stderr). ``backend``: one made beforehand, started
    here (tests plant the native engine's faults in it first, as trace-layers' do)."""
    n_layers = None if cfg.server else cfg.num_mtp_layers()  # an attached server's model is remote
    validate(cfg, n_layers)
    check_rounds(cfg)
    cfg = with_runner(cfg)  # the runner each engine is asked for, recorded in run.json and every point
    pset = run_prompts(cfg)
    psets = {x: run_prompts(cfg, x) if x else pset for x in sorted(set(cfg.context_tokens)) or [None]}
    out = Path(cfg.out)
    prov = provenance()
    prompts_info = pset.describe()  # as in the set, without context
    fp = store.sweep_fingerprint(cfg.to_json(), prov["versions"], prompts_info["sha256"])
    held = claim_out(cfg, n_layers, fp, say)
    if held is None:  # every point measured before with these settings: no engine, no file touched
        if on_point:
            on_point(1, 1, "report")
        return build(out)
    t0 = time.perf_counter()
    backend = backend or get_backend(cfg.backend)  # imports the engine (torch for native)
    engine = backend.start(cfg)  # may raise MtpBenchError (e.g. vLLM not installed) before any write
    engine["engine_start_s"] = round(time.perf_counter() - t0, 3)
    try:
        points = grid(cfg, n_layers, engine.get("k"))
        make_out_dir(out)
        family = family_of(points)
        law_fam = law_family(p.k for p in points) if cfg.law else None  # one family across the points' law tests
        looks = max_looks(cfg.repeats, cfg.max_repeats) if sequential(cfg) else 1
        write_json(out / "run.json", {"config": cfg.to_json(), "provenance": prov, "engine": engine,
                                      "prompts": prompts_info, "fingerprint": fp,
                                      "planned": [p.name for p in points],  # what a partial folder lacks (issue 56)
                                      "execution": execution(cfg.to_json()),
                                      "judge": {"family": family, "looks": looks, "alpha": ALPHA,
                                                **({"law_family": law_fam} if law_fam else {})}})
        window = context_window(cfg)
        todo = []
        for point in points:
            prompts = psets[point.context_tokens].prompts
            too_long = window_problem(cfg, prompts, window)
            if too_long:  # said for this point, the others still run
                write_json(out / f"{point.name}.failure.json",
                           {"point": point.to_json(cfg.backend), "fingerprint": fp, "error": too_long})
            elif point.name not in held.reused:
                todo.append((point, prompts))
        measure_all(cfg, backend, todo, out, fp, on_point, family, law_fam)
        if cfg.temperature == 0:  # while the engine is still up: the report never runs a model
            save_greedy_divergences(cfg, backend, engine, points, psets, out, fp)
        run = json.loads((out / "run.json").read_text())
        run["provenance"]["load_average_end"] = environment()["load_average"]
        write_json(out / "run.json", run)
    finally:
        backend.close()  # a launched server goes down here, also on Ctrl-C
    if on_point:
        on_point(1, 1, "report")
    return build(out)


def measure_all(cfg: SweepConfig, backend, todo: list, out: Path, fp: dict, on_point, family: int,
                law_fam: int | None = None) -> None:
    """Measure and save ``todo``'s (point, prompts): in rounds where one engine in this process serves every point
    (``sweep.rounds``), else a point after the other (``run_one``). --law's pass comes after a point's timed runs,
    its tests one family (``law_fam``) across the sweep's points."""
    if info(cfg.backend).interleaves_repeats and (cfg.repeats > 1 or cfg.warmup or sequential(cfg)):
        prompts_of = {p.name: q for p, q in todo}  # the A/A copy (k = 0) reads no law

        def save(p, run, wall, extra):  # after every round: the law's pass is never timed
            law = point_law(cfg, backend, p, prompts_of.get(p.name), run, on_point, law_fam)
            save_point(cfg, p, run, out, fp, wall, {**extra, **law})

        run_rounds(cfg, todo, lambda c, p, q: measure(c, backend, p, q, out, fp), save, on_point, family)
        return
    for i, (point, prompts) in enumerate(todo):
        if on_point:
            on_point(i, len(todo), point.name)
        run_one(cfg, backend, point, prompts, out, fp, on_point, law_fam)


def claim_out(cfg: SweepConfig, n_layers: int | None, fp: dict, say) -> store.Claim | None:
    """Before the engine starts and before any write: reuse, refuse or move aside what --out holds (said); None
    where every point of the grid was measured there before with these settings."""
    out = Path(cfg.out)
    names = [] if cfg.server else [p.name for p in grid(cfg, n_layers)]
    held = store.claim(out, fp, names, cfg.replace, attached=bool(cfg.server), force=cfg.force)
    store.tell(held, cfg.out, say)
    return None if names and set(held.reused) == set(names) and (out / "run.json").is_file() else held


def check_rounds(cfg: SweepConfig) -> None:
    """The rounds' options, refused in one line before an engine starts: sequential stopping and the warm-up
    need a backend that interleaves its repeats (one engine in this process serves every point)."""
    from mtpbench.sweep.rounds import check

    problem = check(cfg)
    if problem:
        raise MtpBenchError(problem)
    if sequential(cfg) and not info(cfg.backend).interleaves_repeats:
        raise MtpBenchError(f"--max-repeats: the {cfg.backend} backend times each point's repeats in one go, "
                            f"so no point can stop early; it takes --repeats alone (the native backend interleaves)")


def context_window(cfg: SweepConfig) -> tuple[int, str] | None:
    """The positions the engine can hold and where that limit comes from (None: unknown here)."""
    if cfg.server:
        return None  # an attached server's model and tokenizer are not here to count with
    if cfg.max_model_len and info(cfg.backend).vllm:
        return cfg.max_model_len, "max_model_len"
    from mtpbench.checkpoint import read_config

    c = read_config(cfg.model_dir)
    n = c.get("max_position_embeddings") or (c.get("text_config") or {}).get("max_position_embeddings")
    return (int(n), "the model's max_position_embeddings") if n else None


def window_problem(cfg: SweepConfig, prompts, window) -> str | None:
    """Why a point's longest prompt (with its context) plus its output does not fit the model's context
    window, if it does not: said in one line, instead of an engine error or positions the model never saw."""
    if window is None:
        return None
    from mtpbench.prompts import load_tokenizer, token_ids

    longest = max(len(ids) for ids in token_ids(load_tokenizer(cfg.model_dir), prompts))
    need = longest + cfg.max_tokens + max(cfg.k, default=0)  # the verify step reaches k positions past the output
    limit, source = window
    if need > limit:
        what = "with its context " if any(p.context_tokens for p in prompts) else ""
        return (f"context window: the longest prompt {what}is {longest} tokens; with {cfg.max_tokens} output "
                f"tokens it needs {need} positions, {source} is {limit}")
    return None


def check_per_request(run) -> None:
    """Per-request acceptance is kept only where it adds up to the engine's own counters (a server's
    counters also hold others' requests when it had foreign traffic: there they cannot be compared)."""
    if any(r.num_drafts is None for r in run.requests):
        run.notes.append("per-request acceptance is not available from this engine: no intervals over prompts")
        return
    if any(b.foreign_requests for b in run.batches):
        return
    problem = check_requests_against_counters(run.requests, run.batches)
    if problem:
        run.notes.append(f"per-request acceptance dropped: {problem}")
        for r in run.requests:
            r.num_drafts = r.num_draft_tokens = r.num_accepted_tokens = None
            r.num_accepted_tokens_per_pos = r.draft_steps = None


def measure(cfg: SweepConfig, backend, point: GridPoint, prompts, out: Path, fp: dict):
    """One call of the backend at one point: its PointRun, or None after writing why it failed."""
    try:
        return backend.run_point(cfg, point, prompts)
    except MtpBenchError:
        raise
    except Exception as e:  # one broken point must not end the sweep (a crash inside vLLM is a finding)
        runner = f" (vLLM model runner {cfg.runner.upper()})" if cfg.runner else ""
        error = f"{type(e).__name__}: {e}".strip()
        why = known_fault(error, cfg.temperature, cfg.top_k, cfg.top_p) if point.k else None
        write_json(out / f"{point.name}.failure.json", {"point": point.to_json(cfg.backend), "fingerprint": fp,
                                                         "runner": cfg.runner, "error": error[:1900] + runner
                                                         + (f" [{why}]" if why else "")})
        return None


def run_one(cfg: SweepConfig, backend, point: GridPoint, prompts, out: Path, fp: dict, on_point=None,
            law_fam: int | None = None) -> None:
    """Measure one point, all its repeats, into ``<name>.json``, or record why it failed."""
    t0 = time.perf_counter()
    run = measure(cfg, backend, point, prompts, out, fp)
    if run is not None:
        wall = time.perf_counter() - t0
        save_point(cfg, point, run, out, fp, wall, point_law(cfg, backend, point, prompts, run, on_point, law_fam))


def point_law(cfg: SweepConfig, backend, point: GridPoint, prompts, run, on_point=None,
              law_fam: int | None = None) -> dict:
    """--law at a k > 0 point: ``{"acceptance_law": block}`` (``metrics.law.law_block``, as trace.json's) of the
    verify steps the backend recorded in an untimed pass after the point's timed runs (``PointRun.law``, or the
    backend's ``read_law``), or of why it could not; empty without --law or at k = 0. A failed pass leaves the
    point's timings standing and says why in the block. ``on_point``: the pass is shown as a step of its own (it
    reruns the point's prompts: minutes on a slow engine). ``law_fam``: the sweep's law tests, one family
    (``stats.judge.law_family``): a sweep of six correct drafting points is called out no more often than one point."""
    if not cfg.law or point.k == 0:
        return {}
    from mtpbench.metrics.law import failed_pass, law_block, token_classifier

    report = run.law
    if report is None and backend.read_law is None:
        report = {"observable": False, "why": f"the {cfg.backend} backend does not read the verifier's law"}
    elif report is None:
        if on_point:
            on_point(0, 1, f"{point.name}: the law's untimed pass")
        try:
            report = backend.read_law(cfg, point, prompts)
        except MtpBenchError:
            raise
        except Exception as e:
            report = failed_pass(e)
    # the draft tokens classed by the model's tokenizer, where it is here (an attached server's model is not)
    classify = token_classifier(cfg.model_dir) if report.get("observable") and not cfg.server else None
    return {"acceptance_law": law_block(report, "not recorded", classify, law_levels(family=law_fam))}


def save_point(cfg: SweepConfig, point: GridPoint, run, out: Path, fp: dict, wall_s: float,
               extra: dict | None = None) -> None:
    """A measured point's file; ``extra``: what the rounds add (warm-up timings, the sequential look)."""
    (out / f"{point.name}.failure.json").unlink(missing_ok=True)
    if point.k > 0:
        check_per_request(run)
    write_json(out / f"{point.name}.json",
               {"point": point.to_json(cfg.backend), "fingerprint": fp, "wall_s": round(wall_s, 3),
                "startup_s": run.startup_s, "engine": run.engine, "mtp_weight_bytes": run.mtp_weight_bytes,
                "notes": run.notes, "telemetry": run.telemetry, "repeats": run.repeats,
                "requests": [asdict(r) for r in run.requests], "batches": [asdict(b) for b in run.batches],
                "label": cfg.label or None, "metadata": cfg.metadata, **(extra or {})})
    write_text(out / f"{point.name}.requests.jsonl", "".join(
        json.dumps({"point": point.name, "label": cfg.label or None, **line}) + "\n" for line in request_lines(run.requests)))


def greedy_dtype(cfg: SweepConfig, backend, engine: dict) -> str | None:
    """The dtype the target ran in: the engine's own word (``backend.dtype_name``: the vLLM backend reads it from
    the k = 0 engine that measured the margins), else the one asked for; None for an ``auto`` that no engine
    resolved (vLLM's may cast a float32 checkpoint to a 16-bit type)."""
    for name in (backend.dtype_name, engine.get("dtype"), cfg.dtype):
        if name and name != "auto":
            return name
    return None


def save_greedy_divergences(cfg: SweepConfig, backend, engine: dict, points: list[GridPoint], psets: dict,
                            out: Path, fp: dict) -> None:
    """Greedy sweeps: for each prompt whose tokens at a k > 0 point left the k = 0 point's (same load and
    context), the target's logit gap at the first divergent token (its logit of the k = 0 token minus that of
    the k > 0 run's) and its top-two margin, from the backend's k = 0 pass (``greedy_divergences``, one call for
    the whole sweep), classified by the gap against the dtype's rounding floor (``lossless.classify``,
    ``lossless.dtype_floor``; a sweep has no A/A control), saved into the point file as
    ``greedy_divergences``. Records still true of a resumed sweep's tokens are kept, not measured again."""
    from mtpbench.lossless.verdict import dtype_floor

    todo = _divergences_to_measure(points, out, fp)
    if not todo:
        return
    why = None
    if backend.greedy_divergences is None:
        why = f"the {cfg.backend} backend has no k = 0 pass to read the target's logits from"
    elif info(cfg.backend).served and cfg.api == "chat":
        why = "--api chat: the server applied its own chat template, so the token ids the margins need are not known"
    if why:
        for p, d, _ in todo:
            write_json(out / f"{p.name}.json", {**d, "greedy_divergences": {"unavailable": why}})
        return
    ids = {}  # (context, prompt id) -> the token ids the engine saw
    for ctx in {p.context_tokens for p, _, _ in todo}:
        prompts = psets[ctx].prompts
        ids.update({(ctx, q.id): x for q, x in zip(prompts, backend.encode(prompts))})
    rows = [(p, pid, a, b) for p, _, differ in todo for pid, a, b in differ]
    try:
        found = backend.greedy_divergences([ids[(p.context_tokens, pid)] for p, pid, _, _ in rows],
                                           [a for _, _, a, _ in rows], [b for _, _, _, b in rows])
    except Exception as e:  # the margins are an addition to the points: their failure is said, not fatal
        found, why = None, f"the k = 0 pass for the margins failed ({type(e).__name__}: {e})"[:500]
    dtype = greedy_dtype(cfg, backend, engine)
    threshold = dtype_floor(dtype) if dtype else None
    records = _divergence_records(rows, found or [], threshold)
    for p, d, _ in todo:
        if found is None:
            entry = {"unavailable": why}
        else:
            entry = {"dtype": dtype, "threshold": threshold,
                     "threshold_source": f"the {dtype} floor" if dtype else None, "records": records[p.name]}
            if dtype is None:
                entry["unclassified"] = ("the engine's dtype is unknown (--dtype auto): logit gaps saved, not "
                                         "classified")
        write_json(out / f"{p.name}.json", {**d, "greedy_divergences": entry})


def _divergences_to_measure(points: list[GridPoint], out: Path, fp: dict) -> list[tuple]:
    """(point, its file, the differing prompts: prompt id, k = 0 tokens, k > 0 tokens) for every k > 0 point
    whose tokens left its k = 0 point's and has no saved record still true of them."""

    def load(point: GridPoint) -> dict | None:
        path = out / f"{point.name}.json"
        if not path.exists():
            return None  # failed
        d = json.loads(path.read_text())
        return d if d.get("fingerprint") == fp else None

    def where(p: GridPoint) -> tuple:
        return p.concurrency, p.request_rate, p.context_tokens

    base = {where(p): d for p in points if p.k == 0 and (d := load(p))}
    todo = []
    for p in points:
        d = load(p) if p.k > 0 and where(p) in base else None
        if d is None:
            continue
        k0 = {r.get("prompt_id"): r["output_token_ids"] for r in base[where(p)]["requests"] if r.get("prompt_id")}
        differ = [(r["prompt_id"], k0[r["prompt_id"]], r["output_token_ids"]) for r in d["requests"]
                  if r.get("prompt_id") in k0 and r["output_token_ids"] != k0[r["prompt_id"]]]
        saved = {r["prompt_id"]: r for r in (d.get("greedy_divergences") or {}).get("records") or []}
        if differ and not all(pid in saved and divergence_holds(saved[pid], a, b) for pid, a, b in differ):
            todo.append((p, d, differ))
    return todo


def _divergence_records(rows: list[tuple], found: list, threshold: float | None) -> dict[str, list]:
    """Per point name, one record per differing prompt: where and by how much it diverged, and its class."""
    from mtpbench.lossless.verdict import classify

    records: dict[str, list] = {}
    for (p, pid, _, _), div in zip(rows, found):
        rec = {"prompt_id": pid, "position": None, "margin": None, "k0_token": None, "spec_token": None,
               "logit_gap": None, "class": None}
        if div is not None:  # None: the tokens differ in length only
            rec.update(asdict(div), **{"class": classify(div.logit_gap, threshold)})
        records.setdefault(p.name, []).append(rec)
    return records
