"""A sweep directory read back: its run.json and point files, and the result rows rebuilt from them (no model, no
GPU); greedy divergences reclassified from what was saved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult, PointRun, mean_call_s, summarize, without_timings
from mtpbench.metrics.law import row_fields
from mtpbench.metrics.records import AA_MODE
from mtpbench.stats import judge, noise
from mtpbench.stats.intervals import MIN_REPEATS_RATIO


def sort_key(p: dict) -> tuple:
    rate = p.get("request_rate")
    return (p["k"] != 0, p["mode"], p["mtp_layers"] or 0, p["k"], p.get("context_tokens") or 0,
            p.get("concurrency") or 0, float("inf") if rate is None else rate)


def load_run(out: Path) -> tuple[dict, list[dict], list[dict]]:
    out = Path(out)
    run_path = out / "run.json"
    if not out.exists():
        raise MtpBenchError(f"{out} does not exist")
    if not run_path.is_file():
        raise MtpBenchError(f"{out} holds no sweep (run.json missing)")
    run = read_json(run_path)
    points, failures = [], []
    for path in sorted(out.glob("*.json")):
        if path.name in ("run.json", "summary.json"):
            continue
        data = read_json(path)
        if not isinstance(data, dict) or not _belongs(data.get("fingerprint"), run):
            continue  # left over from a sweep with other settings or versions, or not ours
        if (data.get("point") or {}).get("mode") == AA_MODE:
            continue  # the A/A control is no point of the grid: read_noise reads it
        (failures if path.name.endswith(".failure.json") else points).append(data)
    return run, points, failures


def aa_runs(out: Path, run: dict, points: list[dict]) -> tuple[dict, list[dict], list[dict]] | None:
    """The sweep's A/A control (``aa-k0*.json``, sweep.rounds): the k = 0 point it copies, and the timed runs of
    both (the copy runs in its original's rounds); None where the sweep timed none."""
    for path in sorted(Path(out).glob("aa-k0*.json")):
        aa = read_json(path)
        if path.name.endswith(".failure.json") or not _belongs(aa.get("fingerprint"), run):
            continue
        k0 = next((d for d in points if d["point"]["k"] == 0 and _where(d) == _where(aa)), None)
        if k0 is None:
            continue
        a, b = ([t for t in d.get("repeats") or [] if t.get("output_tokens_per_sec")] for d in (k0, aa))
        return k0, a, b
    return None


def read_noise(out: Path, run: dict, points: list[dict]) -> dict | None:
    """The sweep's A/A control against the k = 0 point it copies, as ``stats.noise.summary`` gives it; None where
    the sweep timed none."""
    found = aa_runs(out, run, points)
    if found is None:
        return None
    k0, a, b = found
    n = min(len(a), len(b))
    # each drafting point's speedup reads the floor as it stood at the point's last look (``speedup_comparison``):
    # a point decided early keeps that look's, which can be narrower than the floor after the last round; only
    # points timed often enough for an interval count (one without an interval reads no floor)
    least = min((noise.floor_until((a, b), noise.last_round(d["repeats"])) for d in points
                 if d["point"]["k"] > 0
                 and sum(1 for v in noise.tokps(d.get("repeats") or []) if (v or 0) > 0) >= MIN_REPEATS_RATIO),
                default=None)
    return {**noise.summary(_timings(a[:n]), _timings(b[:n])), "point": k0["point"],
            "floor_least": noise.rounded(least), "floor_least_pct": noise.pct(least)}


def _timings(repeats: list[dict]) -> list[float]:
    return [t["output_tokens_per_sec"] for t in repeats]


def _belongs(fp, run: dict) -> bool:
    """Whether a point file's fingerprint is its sweep's: the one run.json records, or, for sweeps older
    than that record, the settings and versions the point itself wrote down (their list of settings has
    grown since, so it is not rebuilt from today's)."""
    if not isinstance(fp, dict):
        return False
    if "fingerprint" in run:
        return fp == run["fingerprint"]
    config = run["config"]
    return fp.get("versions") == run["provenance"]["versions"] and \
        all(config.get(key) == value for key, value in fp.items() if key != "versions")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise MtpBenchError(f"{path}: unreadable ({e})") from None


def rows_from_points(points: list[dict], failures: list[dict], noise_runs: tuple | None = None,
                     percentiles: tuple[float, ...] = (), family: int | None = None,
                     looks: int = 1) -> list[PointResult]:
    """The rows of a sweep's point files; ``noise_runs``: the A/A control's (k = 0 repeats, copy repeats)
    (``read_noise``), whose floor is the narrowest a speedup interval is shown; ``percentiles``: latency
    percentiles asked for beyond p50/p90/p99; ``family`` and ``looks``: the sweep's comparisons and the looks the
    rounds allowed (``judge_of``), the level of every speedup's interval (``stats.judge``)."""
    loaded = [(d, PointRun.from_json(d)) for d in sorted(points, key=lambda d: sort_key(d["point"]))]
    step_s = _target_step_s(loaded)
    plain = _greedy_k0_tokens(loaded)
    rows: list[PointResult] = []
    reps: dict[int, list] = {}  # each whole-point row's timed runs, for the speedup's comparison
    untimed: set[int] = set()  # rows whose clock measured Triton's interpreter (V2 on a CPU): timings null
    for data, run in loaded:
        mine = _point_rows(data, run, step_s, plain, tuple(percentiles))
        reps[id(mine[0])] = run.repeats
        if run.engine.get("interpreted"):
            untimed.update(id(r) for r in mine)
        rows += mine
    for f in sorted(failures, key=lambda d: sort_key(d["point"])):
        p = GridPoint.from_json(f["point"])
        rows.append(PointResult(f["point"]["backend"], p.mode, p.k, p.mtp_layers, "all", "failed",
                                runner=f.get("runner"), concurrency=p.concurrency, request_rate=f["point"].get("request_rate"),
                                context_tokens=p.context_tokens, error=f["error"]))
    if family is None:
        family = sum(r.k > 0 and r.category == "all" for r in rows)
    return _with_speedups(rows, reps, untimed, noise_runs, family, looks)


def partial(run: dict, points: list[dict], failures: list[dict]) -> dict | None:
    """Whether a sweep's folder is partial, and how: the points run.json planned (``planned``, saved before any was
    measured; a folder from before that: the points found), those measured, those that failed and those missing
    (planned, with neither a point file nor a failure: an interrupted run's). None where every planned point was
    measured."""
    measured = {GridPoint.from_json(d["point"]).name for d in points}
    failed = sorted({GridPoint.from_json(d["point"]).name for d in failures} - measured)
    planned = list(run.get("planned") or sorted(measured | set(failed)))
    missing = [n for n in planned if n not in measured and n not in failed]
    if not failed and not missing:
        return None
    return {"planned": len(planned), "measured": len([n for n in planned if n in measured]), "failed": failed,
            "missing": missing}


def partial_text(p: dict) -> str:
    """The words every page and the terminal put first: "partial: 5 of 7 points measured (missing: ...; failed:
    ...)"."""
    parts = [f"missing: {', '.join(p['missing'])}"] if p["missing"] else []
    parts += [f"failed: {', '.join(p['failed'])}"] if p["failed"] else []
    return f"partial: {p['measured']} of {p['planned']} points measured ({'; '.join(parts)})"


def judge_of(run: dict, points: list[dict], failures: list[dict]) -> tuple[int, int]:
    """A sweep's (family, looks) for ``stats.judge``: its k > 0 points, as run.json recorded them before any was
    measured (a sweep from before that: the k > 0 points found, failed or not), and the looks its rounds allowed
    (one after each round from --repeats to --max-repeats; 1 without sequential rounds)."""
    from mtpbench.stats.sequential import max_looks

    saved = run.get("judge") or {}
    family = saved.get("family")
    if family is None:
        family = sum(d["point"]["k"] > 0 for d in points + failures)
    looks = saved.get("looks")
    if looks is None:
        config = run.get("config") or {}
        repeats = config.get("repeats") or 1
        most = config.get("max_repeats") or repeats
        looks = max_looks(repeats, most) if most > repeats else 1
    return max(1, family), max(1, looks)


def _where(d: dict) -> tuple:
    """A point file's load and context: what its k = 0 baseline shares with it."""
    p = d["point"]
    return p.get("concurrency"), p.get("request_rate"), p.get("context_tokens")


def _target_step_s(loaded: list[tuple[dict, PointRun]]) -> dict:
    """The target's decode-step time at k = 0 of the same load and context, per category: the unit of the
    draft cost ratio c. Keys: (``_where``, category or "all")."""
    step_s = {}
    for d, run in loaded:
        batches = run.batches
        if d["point"]["k"] == 0:
            step_s[(_where(d), "all")] = mean_call_s(batches, "target")
            for b in batches:
                step_s.setdefault((_where(d), b.category),
                                  mean_call_s([x for x in batches if x.category == b.category], "target"))
    return step_s


def _greedy_k0_tokens(loaded: list[tuple[dict, PointRun]]) -> dict:
    """Greedy sweeps: each prompt's tokens at k = 0, per load and context, for the rows' greedy_match_k0."""
    return {_where(d): {r.prompt_id: r.output_token_ids for r in run.requests}
            for d, run in loaded if d["point"]["k"] == 0 and (d.get("fingerprint") or {}).get("temperature") == 0
            and all(r.prompt_id for r in run.requests)
            and len({r.prompt_id for r in run.requests}) == len(run.requests)}  # ids that pair requests


def _point_rows(data: dict, run: PointRun, step_s: dict, plain: dict, percentiles: tuple = ()) -> list[PointResult]:
    """One point file's rows: the whole point first, then one per category where it has several."""
    requests, batches = run.requests, run.batches
    point = GridPoint.from_json(data["point"])
    backend = data["point"]["backend"]
    cats = sorted({r.category for r in requests})
    ran = {"runner": run.engine.get("runner"), "drafter": run.engine.get("drafter")}
    law = row_fields(data.get("acceptance_law"), point.k)  # the whole point's: read over all its prompts
    rows = [_with_greedy(replace(summarize(backend, point, "all", requests, batches, data.get("startup_s"),
                                           step_s.get((_where(data), "all")), run.telemetry,
                                           run.mtp_weight_bytes, run.notes, run.repeats, percentiles), **ran, **law),
                         data, requests, plain)]
    if len(cats) > 1:
        for c in cats:
            bats = [b for b in batches if b.category == c]
            # a served window mixes categories in flight: its counters and time cannot be split by
            # category (acceptance then comes from the requests' own counts, where the server sent them)
            note = [] if bats else ["tokens/s of a concurrent window is not split by category"]
            mine = [r for r in requests if r.category == c]
            rows.append(_with_greedy(replace(summarize(backend, point, c, mine, bats, data.get("startup_s"),
                                                       step_s.get((_where(data), c)), notes=note,
                                                       percentiles=percentiles), **ran),
                                     data, mine, plain))
    return rows


def _with_greedy(row: PointResult, d: dict, requests, plain: dict) -> PointResult:
    """``row`` with the share of its prompts that kept the k = 0 tokens, and how many of the others left them
    within rounding (greedy sweeps with a k = 0 point of the same load and context)."""
    base = plain.get(_where(d)) if d["point"]["k"] > 0 else None
    pairs = [r.output_token_ids == base[r.prompt_id] for r in requests if base and r.prompt_id in base]
    if not pairs:
        return row
    differ = [(r.prompt_id, base[r.prompt_id], r.output_token_ids) for r in requests
              if r.prompt_id in base and r.output_token_ids != base[r.prompt_id]]
    count, note = greedy_numerical(d.get("greedy_divergences"), differ)
    return replace(row, greedy_match_k0=round(sum(pairs) / len(pairs), 4), greedy_numerical=count,
                   **({"notes": "; ".join(filter(None, [row.notes, note]))} if note else {}))


def speedup_comparison(point: list[dict], base: list[dict], noise_runs: tuple | None, family: int,
                       looks: int) -> judge.Comparison:
    """A point's speedup over its k = 0, as the rounds judged it at the point's last look: both points' timed runs
    up to the last round the point was timed in, the A/A floor as it stood then (``stats.judge.ratio``)."""
    last = noise.last_round(point)
    return judge.ratio(noise.tokps(point), noise.tokps(noise.until_round(base, last)),
                       noise.floor_until(noise_runs, last), family, looks)


def _with_speedups(rows: list[PointResult], reps: dict[int, list], untimed: set[int], noise_runs: tuple | None,
                   family: int, looks: int) -> list[PointResult]:
    """Each row's speedup over the k = 0 row of its load: for a whole point with timed runs, the judge's
    comparison (the ratio of geometric means, its interval at the sweep's level never narrower than the A/A
    floor, the adjusted p and the decision); a category's row, or a point timed too few times, the ratio of its
    tokens/s alone, with no interval. The timings of ``untimed`` rows are left null."""
    def load(r: PointResult) -> tuple:
        return r.backend, r.category, r.concurrency, r.request_rate, r.context_tokens

    base = {load(r): r for r in rows if r.k == 0 and r.status == "ok"}

    def with_speedup(r: PointResult) -> PointResult:
        b = base.get(load(r))
        if not (r.output_tokens_per_sec and b and b.output_tokens_per_sec):
            return r
        c = speedup_comparison(reps[id(r)], reps[id(b)], noise_runs, family, looks) \
            if r is not b and id(r) in reps and id(b) in reps else None
        if c is None or c.estimate is None:
            return replace(r, speedup=round(r.output_tokens_per_sec / b.output_tokens_per_sec, 4))
        low, high = judge.outward(c, 4)
        return replace(r, speedup=round(c.estimate, 4), speedup_ci_low=low, speedup_ci_high=high,
                       speedup_decision=judge.speed(c), speedup_p=judge.p_shown(c.p_value), speedup_level=c.level)

    return [without_timings(r) if id(r) in untimed else with_speedup(r) for r in rows]


def divergence_holds(rec: dict, k0: list[int], spec: list[int]) -> bool:
    """Whether a saved divergence record still describes these two token lists (a point measured again since
    may have other tokens)."""
    j = rec.get("position")
    if j is None:  # saved as a length difference: one list is a prefix of the other
        n = min(len(k0), len(spec))
        return k0[:n] == spec[:n] and k0 != spec
    return j < min(len(k0), len(spec)) and k0[:j] == spec[:j] and \
        (k0[j], spec[j]) == (rec.get("k0_token"), rec.get("spec_token"))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def greedy_numerical(saved: dict | None, differ: list[tuple[str, list[int], list[int]]]) -> tuple[int | None, str | None]:
    """Of the prompts whose k > 0 tokens left k = 0's (``differ``: prompt id, k = 0 tokens, k > 0 tokens), how
    many did so within rounding (``numerical``: the target's logit gap between the k = 0 token and the k > 0
    run's within the saved threshold, ``lossless.classify``), from the divergence records the sweep saved in the
    point file (``greedy_divergences``), and the row's note; the count is None where any of them is unknown.
    The class is taken again from the saved gap, not from the saved class: sweeps before issue 23 classed by
    the top-two margin, which says nothing about the token the k > 0 run emitted."""
    from mtpbench.lossless.verdict import NUMERICAL, classify

    if not differ:
        return None, None
    m = len(differ)
    head = ("whether the divergence from k = 0 is numerical is unknown: " if m == 1 else
            f"how many of the {m} divergences from k = 0 are numerical is unknown: ")
    if not saved:
        return None, head + "no logit gaps were saved (a sweep from before they were)"
    if saved.get("unavailable"):
        return None, head + saved["unavailable"]
    recs = {r["prompt_id"]: r for r in saved.get("records") or []}
    stale = [pid for pid, a, b in differ if pid not in recs or not divergence_holds(recs[pid], a, b)]
    if stale:
        return None, head + f"no saved logit gap for prompt(s) {', '.join(stale)} (run the sweep again to measure them)"
    length = [pid for pid, _, _ in differ if recs[pid].get("position") is None]
    if length:
        return None, head + f"prompt(s) {', '.join(length)} differ from k = 0 only in length, with no divergent token"
    if saved.get("threshold") is None:
        return None, head + (saved.get("unclassified") or "no numerical threshold")
    gapless = [pid for pid, _, _ in differ if recs[pid].get("logit_gap") is None]
    if gapless:
        return None, head + f"no logit gap saved for prompt(s) {', '.join(gapless)}: unclassified"
    n = sum(classify(recs[pid]["logit_gap"], saved["threshold"]) == NUMERICAL for pid, _, _ in differ)
    return n, (f"{n} of {_plural(m, 'divergence')} from k = 0 {'is' if n <= 1 else 'are'} numerical (|logit gap| "
               f"of the k = 0 token and the k > 0 run's <= {saved['threshold']:.2g}, "
               f"{saved.get('threshold_source') or 'the dtype floor'}; no A/A control in a sweep: check-lossless "
               "measures one)")
