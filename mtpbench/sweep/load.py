"""A sweep directory read back: its run.json and point files, and the result rows rebuilt from them (no model, no
GPU); greedy divergences reclassified from what was saved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mtpbench import stats
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult, PointRun, mean_call_s, summarize, without_timings
from mtpbench.metrics.records import AA_MODE
from mtpbench.stats import noise


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


def read_noise(out: Path, run: dict, points: list[dict]) -> dict | None:
    """The sweep's A/A control (``aa-k0*.json``, sweep.rounds) against the k = 0 point it copies, as
    ``stats.noise.summary`` gives it; None where the sweep timed none."""
    for path in sorted(Path(out).glob("aa-k0*.json")):
        aa = read_json(path)
        if path.name.endswith(".failure.json") or not _belongs(aa.get("fingerprint"), run):
            continue
        k0 = next((d for d in points if d["point"]["k"] == 0 and _where(d) == _where(aa)), None)
        if k0 is None:
            continue
        a, b = (_timings(d) for d in (k0, aa))
        n = min(len(a), len(b))  # the copy runs in its original's rounds
        return {**noise.summary(a[:n], b[:n]), "point": k0["point"]}
    return None


def _timings(d: dict) -> list[float]:
    return [t["output_tokens_per_sec"] for t in d.get("repeats") or [] if t.get("output_tokens_per_sec")]


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


def rows_from_points(points: list[dict], failures: list[dict], floor: float = 0.0,
                     percentiles: tuple[float, ...] = ()) -> list[PointResult]:
    """The rows of a sweep's point files; ``floor``: the A/A noise floor (log ratio, ``read_noise``), the
    narrowest a speedup interval is shown; ``percentiles``: latency percentiles asked for beyond p50/p90/p99."""
    loaded = [(d, PointRun.from_json(d)) for d in sorted(points, key=lambda d: sort_key(d["point"]))]
    step_s = _target_step_s(loaded)
    plain = _greedy_k0_tokens(loaded)
    rows: list[PointResult] = []
    tokps: dict[int, list] = {}  # each whole-point row's tokens/s per repeat, for the speedup's interval
    untimed: set[int] = set()  # rows whose clock measured Triton's interpreter (V2 on a CPU): timings null
    for data, run in loaded:
        mine = _point_rows(data, run, step_s, plain, tuple(percentiles))
        mine[0] = replace(mine[0], speedup_decision=(data.get("sequential") or {}).get("state"))
        tokps[id(mine[0])] = [r.get("output_tokens_per_sec") for r in run.repeats]
        if run.engine.get("interpreted"):
            untimed.update(id(r) for r in mine)
        rows += mine
    for f in sorted(failures, key=lambda d: sort_key(d["point"])):
        p = GridPoint.from_json(f["point"])
        rows.append(PointResult(f["point"]["backend"], p.mode, p.k, p.mtp_layers, "all", "failed",
                                runner=f.get("runner"), concurrency=p.concurrency, request_rate=f["point"].get("request_rate"),
                                context_tokens=p.context_tokens, error=f["error"]))
    return _with_speedups(rows, tokps, untimed, floor)


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
    rows = [_with_greedy(replace(summarize(backend, point, "all", requests, batches, data.get("startup_s"),
                                           step_s.get((_where(data), "all")), run.telemetry,
                                           run.mtp_weight_bytes, run.notes, run.repeats, percentiles), **ran),
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


def _with_speedups(rows: list[PointResult], tokps: dict[int, list], untimed: set[int],
                   floor: float = 0.0) -> list[PointResult]:
    """Each row's speedup over the k = 0 row of its load, with the interval of the ratio of medians, never
    narrower than ``floor`` each side (log ratio: the A/A noise floor); the timings of ``untimed`` rows left
    null."""
    def load(r: PointResult) -> tuple:
        return r.backend, r.category, r.concurrency, r.request_rate, r.context_tokens

    base = {load(r): r for r in rows if r.k == 0 and r.status == "ok"}

    def with_speedup(r: PointResult) -> PointResult:
        b = base.get(load(r))
        if not (r.output_tokens_per_sec and b and b.output_tokens_per_sec):
            return r
        ci = stats.median_ratio_ci(tokps.get(id(r), []), tokps.get(id(b), [])) if r is not b else None
        speedup = round(r.output_tokens_per_sec / b.output_tokens_per_sec, 4)
        if ci and floor:
            ci = noise.widen(ci[0], ci[1], speedup, floor)
        # the interval holds the ratio of medians (stats.median_ratio_ci); min / max keep the shown speedup,
        # a ratio of the rounded medians, inside it after rounding too
        return replace(r, speedup=speedup, speedup_ci_low=min(round(ci[0], 4), speedup) if ci else None,
                       speedup_ci_high=max(round(ci[1], 4), speedup) if ci else None)

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
