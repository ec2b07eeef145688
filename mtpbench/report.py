"""``mtpbench report DIR``: rebuild the table, ``summary.csv``, ``summary.json`` and the PNG plots from
the saved point files alone (no model, no GPU).

Plots: ``acceptance_length.png`` (AL vs k, one line per mode x MTP-layer count [x load]),
``throughput.png`` (tokens/sec and speedup vs k, with the theoretical speedup dashed),
``per_position.png`` (vLLM's joint per-position acceptance at the largest k of each line), and for
served runs ``serving.png`` (tokens/sec vs k, one line per concurrency, best k marked; AL vs concurrency).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

from mtpbench import stats
# a point's fingerprint is derived from SweepConfig's fields, next to it (re-exported for the sweep)
from mtpbench.config import FINGERPRINT_KEYS, fingerprint  # noqa: F401
from mtpbench.errors import MtpBenchError
from mtpbench.files import write_json, write_text
from mtpbench.metrics import GridPoint, PointResult, PointRun, mean_call_s, summarize, without_timings


TABLE_COLUMNS = [
    ("mode", "mode"), ("k", "k"), ("mtp_layers", "L"), ("category", "category"),
    ("acceptance_length", "AL"), ("acceptance_rate_per_pos", "accept/pos (joint)"), ("alpha", "alpha"),
    ("output_tokens_per_sec", "tok/s"), ("speedup", "speedup"), ("theoretical_speedup", "theory"),
    ("ttft_ms_p50", "TTFT p50 ms"), ("tpot_ms_p50", "TPOT p50 ms"),
    ("output_repetition", "rep4"), ("startup_s", "startup s"), ("status", "status"),
]
# shown only when some row has them: the load of served runs, GPU telemetry
SERVED_COLUMNS = [("concurrency", "conc"), ("request_rate", "rate/s"), ("request_throughput_per_sec", "req/s"),
                  ("itl_ms_p50", "ITL p50 ms"), ("tpot_ms_p99", "TPOT p99 ms")]
TELEMETRY_COLUMNS = [("energy_j_per_token", "J/tok"), ("avg_power_w", "W"), ("peak_gpu_mem_bytes", "peak mem B")]


def _sort_key(p: dict) -> tuple:
    rate = p.get("request_rate")
    return (p["k"] != 0, p["mode"], p["mtp_layers"] or 0, p["k"], p.get("context_tokens") or 0,
            p.get("concurrency") or 0, float("inf") if rate is None else rate)


def load_run(out: Path) -> tuple[dict, list[dict], list[dict]]:
    out = Path(out)
    run_path = out / "run.json"
    if not run_path.is_file():
        raise MtpBenchError(f"{out} holds no sweep (run.json missing)")
    run = _read_json(run_path)
    points, failures = [], []
    for path in sorted(out.glob("*.json")):
        if path.name in ("run.json", "summary.json"):
            continue
        data = _read_json(path)
        if not isinstance(data, dict) or not _belongs(data.get("fingerprint"), run):
            continue  # left over from a sweep with other settings or versions, or not ours
        (failures if path.name.endswith(".failure.json") else points).append(data)
    return run, points, failures


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


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise MtpBenchError(f"{path}: unreadable ({e})") from None


def rows_from_points(points: list[dict], failures: list[dict]) -> list[PointResult]:
    rows: list[PointResult] = []
    tokps: dict[int, list] = {}  # each whole-point row's tokens/s per repeat, for the speedup's interval
    untimed: set[int] = set()  # rows whose clock measured Triton's interpreter (V2 on a CPU): timings null
    loaded = [(d, PointRun.from_json(d)) for d in sorted(points, key=lambda d: _sort_key(d["point"]))]
    # the target's decode-step time at k = 0 of the same load and context, per category: the unit of the
    # draft cost ratio c
    step_s = {}

    def where(d: dict) -> tuple:
        p = d["point"]
        return p.get("concurrency"), p.get("request_rate"), p.get("context_tokens")

    for d, run in loaded:
        batches = run.batches
        if d["point"]["k"] == 0:
            step_s[(where(d), "all")] = mean_call_s(batches, "target")
            for b in batches:
                step_s.setdefault((where(d), b.category),
                                  mean_call_s([x for x in batches if x.category == b.category], "target"))
    # greedy: each prompt's tokens at k = 0, per load and context, for the rows' greedy_match_k0
    plain = {where(d): {r.prompt_id: r.output_token_ids for r in run.requests}
             for d, run in loaded if d["point"]["k"] == 0 and (d.get("fingerprint") or {}).get("temperature") == 0
             and all(r.prompt_id for r in run.requests)
             and len({r.prompt_id for r in run.requests}) == len(run.requests)}  # ids that pair requests

    def match_k0(d: dict, requests) -> dict:
        base = plain.get(where(d)) if d["point"]["k"] > 0 else None
        pairs = [r.output_token_ids == base[r.prompt_id] for r in requests if base and r.prompt_id in base]
        if not pairs:
            return {}
        differ = [(r.prompt_id, base[r.prompt_id], r.output_token_ids) for r in requests
                  if r.prompt_id in base and r.output_token_ids != base[r.prompt_id]]
        count, note = greedy_numerical(d.get("greedy_divergences"), differ)
        return {"greedy_match_k0": round(sum(pairs) / len(pairs), 4), "greedy_numerical": count, "note": note}

    def with_greedy(row: PointResult, d: dict, requests) -> PointResult:
        g = match_k0(d, requests)
        note = g.pop("note", None)
        return replace(row, **g, **({"notes": "; ".join(filter(None, [row.notes, note]))} if note else {}))

    for data, run in loaded:
        requests, batches = run.requests, run.batches
        point = GridPoint.from_json(data["point"])
        backend = data["point"]["backend"]
        cats = sorted({r.category for r in requests})
        ran = {"runner": run.engine.get("runner"), "drafter": run.engine.get("drafter")}
        rows.append(with_greedy(replace(summarize(backend, point, "all", requests, batches, data.get("startup_s"),
                                                  step_s.get((where(data), "all")), run.telemetry,
                                                  run.mtp_weight_bytes, run.notes, run.repeats), **ran),
                                data, requests))
        tokps[id(rows[-1])] = [r.get("output_tokens_per_sec") for r in run.repeats]
        first = len(rows) - 1
        if len(cats) > 1:
            for c in cats:
                bats = [b for b in batches if b.category == c]
                # a served window mixes categories in flight: its counters and time cannot be split by
                # category (acceptance then comes from the requests' own counts, where the server sent them)
                note = [] if bats else ["tokens/s of a concurrent window is not split by category"]
                mine = [r for r in requests if r.category == c]
                rows.append(with_greedy(replace(summarize(backend, point, c, mine, bats, data.get("startup_s"),
                                                          step_s.get((where(data), c)), notes=note), **ran),
                                        data, mine))
        if run.engine.get("interpreted"):
            untimed.update(id(r) for r in rows[first:])
    for f in sorted(failures, key=lambda d: _sort_key(d["point"])):
        p = GridPoint.from_json(f["point"])
        rows.append(PointResult(f["point"]["backend"], p.mode, p.k, p.mtp_layers, "all", "failed",
                                runner=f.get("runner"), concurrency=p.concurrency, request_rate=f["point"].get("request_rate"),
                                context_tokens=p.context_tokens, error=f["error"]))

    def load(r: PointResult) -> tuple:
        return r.backend, r.category, r.concurrency, r.request_rate, r.context_tokens

    base = {load(r): r for r in rows if r.k == 0 and r.status == "ok"}

    def with_speedup(r: PointResult) -> PointResult:
        b = base.get(load(r))
        if not (r.output_tokens_per_sec and b and b.output_tokens_per_sec):
            return r
        ci = stats.median_ratio_ci(tokps.get(id(r), []), tokps.get(id(b), [])) if r is not b else None
        speedup = round(r.output_tokens_per_sec / b.output_tokens_per_sec, 4)
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
    from mtpbench.lossless import NUMERICAL, classify

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


def csv_text(rows: list[PointResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=PointResult.columns(), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r.to_csv())
    return buf.getvalue()


def table(rows: list[PointResult]) -> str:
    from tabulate import tabulate

    from mtpbench.runners import label

    def cell(name, v, r):
        if name == "runner":  # "V2 MultiModuleMTPSpeculator": the runner and the class that drafted
            return label(v, r.drafter) if v else "-"
        if name == "request_rate" and v is None and r.concurrency is not None:
            return "inf"
        if isinstance(v, tuple):
            return " ".join("-" if x is None else f"{x:.2f}" for x in v)
        half = _half_width(r, name)
        if v is not None and half is None and _unsure(r, name):
            marked.append(True)  # one measurement: a timing shown without an interval says so
            return (f"{v:.1f}" if name == "output_tokens_per_sec" else f"{v:.3g}") + "*"
        if v is not None and half is not None:  # 2.36 ± 0.08: the 95 % interval's half width
            return f"{v:.1f} ± {half:.1f}" if name == "output_tokens_per_sec" else f"{v:.3g} ± {half:.2g}"
        if isinstance(v, float):  # formatted here: a column with "-" cells is not reformatted by tabulate
            return f"{v:.1f}" if name == "output_tokens_per_sec" else f"{v:.3g}"
        return "-" if v is None else v

    marked: list[bool] = []
    cols = list(TABLE_COLUMNS)
    if any(r.context_tokens is not None for r in rows):
        cols[4:4] = [("context_tokens", "ctx")]
    if any(r.concurrency is not None for r in rows):
        cols[4:4] = SERVED_COLUMNS[:2]
        cols[-3:-3] = SERVED_COLUMNS[2:]
    if any(getattr(r, name) is not None for r in rows for name, _ in TELEMETRY_COLUMNS):
        cols[-1:-1] = TELEMETRY_COLUMNS
    if any(r.greedy_match_k0 is not None for r in rows):
        cols[-2:-2] = [("greedy_match_k0", "=k0")]
    if any(r.greedy_numerical is not None for r in rows):  # of the prompts that left k = 0's tokens: near-ties
        cols[-2:-2] = [("greedy_numerical", "numerical")]
    if any(r.runner for r in rows):
        cols[1:1] = [("runner", "vLLM runner")]
    body = [[cell(name, getattr(r, name), r) for name, _ in cols] for r in rows]
    # 3 significant digits, but tokens/s in full (1823.4, not 1.82e+03)
    fmt = [".1f" if name == "output_tokens_per_sec" else ".3g" for name, _ in cols]
    text = tabulate(body, headers=[h for _, h in cols], floatfmt=fmt)
    if marked:
        text += f"\n* {NO_INTERVAL}"
    errors = [f"{_label(r)}: {r.error}" for r in rows if r.error]
    notes = sorted({f"{_label(r)}: {r.notes}" for r in rows if r.notes and r.category == "all"})
    return text + ("\n\nnotes:\n" + "\n".join(notes) if notes else "") + \
        ("\n\nfailed points:\n" + "\n".join(errors) if errors else "")


# timings vary from run to run: one shown without an interval is marked (table: *, plots: a hollow marker)
TIMINGS = ("output_tokens_per_sec", "speedup", "ttft_ms_p50", "tpot_ms_p50")
NO_INTERVAL = ("no interval: a timing from too few timed runs to tell its noise (--repeats 3 gives speedup "
               "intervals, --repeats 6 also tokens/s, TTFT and TPOT)")


def _unsure(r: PointResult, name: str) -> bool:
    """A timing shown without its interval (the speedup of k = 0 is 1 by definition)."""
    if name not in TIMINGS or getattr(r, name) is None or (name == "speedup" and r.k == 0):
        return False
    return getattr(r, f"{name}_ci_low", None) is None


def _hollow(ax, rows: list[PointResult], xs: list, name: str, color) -> bool:
    """Redraw the points of ``rows`` whose ``name`` has no interval as hollow markers; whether any was."""
    bare = [(x, getattr(r, name)) for x, r in zip(xs, rows) if _unsure(r, name)]
    if bare:
        ax.plot([x for x, _ in bare], [y for _, y in bare], "o", markerfacecolor="white", color=color, zorder=3)
    return bool(bare)


def _half_width(r: PointResult, name: str) -> float | None:
    lo, hi = getattr(r, f"{name}_ci_low", None), getattr(r, f"{name}_ci_high", None)
    return None if lo is None or hi is None else (hi - lo) / 2


def _yerr(rows: list[PointResult], name: str):
    """Error bars (distances below and above) from each row's interval; None where no row has one."""
    lows = [getattr(r, f"{name}_ci_low", None) for r in rows]
    if all(x is None for x in lows):
        return None
    highs = [getattr(r, f"{name}_ci_high", None) for r in rows]
    values = [getattr(r, name) for r in rows]
    return [[0 if lo is None or v is None else v - lo for v, lo in zip(values, lows)],
            [0 if hi is None or v is None else hi - v for v, hi in zip(values, highs)]]


def _label(r: PointResult) -> str:
    rate = float("inf") if r.request_rate is None and r.concurrency is not None else r.request_rate
    return GridPoint(r.mode, r.k, r.mtp_layers, r.concurrency, rate, r.context_tokens).name


def notices(out: Path) -> list[str]:
    """Lines a reader needs under the table: what the prompts were, and why GPU telemetry is missing."""
    lines = []
    run = _read_json(Path(out) / "run.json")
    ps = run.get("prompts")
    if ps:
        lines.append(f"prompts: {ps['set']}, {ps['num_prompts']} in {len(ps['categories'])} "
                     f"categor{'y' if len(ps['categories']) == 1 else 'ies'}" + "".join(f"; {n}" for n in ps["notes"]))
    tel = telemetry_notice(out)
    return lines + ([tel] if tel else [])


def telemetry_notice(out: Path) -> str | None:
    """One line when no point of the sweep has GPU telemetry, saying why (from the point files)."""
    reasons = set()
    for path in Path(out).glob("*.json"):
        if path.name in ("run.json", "summary.json") or path.name.endswith(".failure.json"):
            continue
        tel = (_read_json(path) or {}).get("telemetry") or {}
        if not tel.get("unavailable"):
            return None
        reasons.add(tel["unavailable"])
    return f"GPU telemetry: none ({'; '.join(sorted(reasons))})" if reasons else None


def _line_label(mode: str, L, c, rate, ctx=None) -> str:
    label = f"{mode}, L={'?' if L is None else L}"
    if ctx is not None:
        label += f", ctx={ctx}"
    if c is not None:
        label += f", c={c}" + ("" if rate is None else f", {rate:g}/s")
    return label


def _lines(rows: list[PointResult]) -> dict[tuple, list[PointResult]]:
    """One line per (mode, layers, load, context); the k = 0 baseline of the same load and context starts
    every line."""
    ok = [r for r in rows if r.status == "ok" and r.category == "all"]
    lines: dict[tuple, list[PointResult]] = {}
    for r in ok:
        if r.k > 0:
            same = (r.concurrency, r.request_rate, r.context_tokens)
            base = [b for b in ok if b.k == 0 and (b.concurrency, b.request_rate, b.context_tokens) == same]
            lines.setdefault((r.mode, r.mtp_layers, r.concurrency, r.request_rate, r.context_tokens), base).append(r)
    return lines


def plots(out: Path, rows: list[PointResult]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _lines(rows)
    if not lines:
        return []
    paths = []
    order = sorted(lines, key=lambda key: tuple(-1 if x is None else x for x in key[1:]) + (key[0],))

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in order:
        pts = lines[key]
        ax.errorbar([r.k for r in pts], [r.acceptance_length for r in pts], yerr=_yerr(pts, "acceptance_length"),
                    marker="o", capsize=3, label=_line_label(*key))
    ks = sorted({r.k for pts in lines.values() for r in pts})
    ax.plot(ks, [k + 1 for k in ks], ":", color="grey", label="upper bound k+1")
    ax.set(xlabel="num_speculative_tokens k", ylabel="acceptance length",
           title="Acceptance length vs k (bars: 95 % CI over prompts)", xticks=ks)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / "acceptance_length.png", plt, rows))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    bare = []
    for key in order:
        pts, label = lines[key], _line_label(*key)
        line = a1.errorbar([r.k for r in pts], [r.output_tokens_per_sec for r in pts], capsize=3,
                           yerr=_yerr(pts, "output_tokens_per_sec"), marker="o", label=label).lines[0]
        a2.errorbar([r.k for r in pts], [r.speedup for r in pts], yerr=_yerr(pts, "speedup"), capsize=3,
                    marker="o", color=line.get_color(), label=f"{label} measured")
        bare += [_hollow(a, pts, [r.k for r in pts], name, line.get_color())
                 for a, name in ((a1, "output_tokens_per_sec"), (a2, "speedup"))]
        if any(r.theoretical_speedup is not None for r in pts if r.k):
            a2.plot([r.k for r in pts], [r.theoretical_speedup for r in pts], "--", color=line.get_color(),
                    label=f"{label} theoretical")
    a1.set(xlabel="k", ylabel="output tokens/sec", title="Throughput")
    a2.set(xlabel="k", ylabel="speedup vs k=0", title="Speedup (dashed: (1-a^(k+1))/((1-a)(kc+1)))")
    for a in (a1, a2):
        a.set_xticks(ks)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if any(bare):
        fig.suptitle("hollow markers: " + NO_INTERVAL, fontsize=7)
    paths.append(_save(fig, out / "throughput.png", plt, rows))

    fig, ax = plt.subplots(figsize=(7, 4))
    tops = [max((r for r in lines[key] if r.k > 0), key=lambda r: r.k) for key in order]
    width = 0.8 / len(tops)
    for i, r in enumerate(tops):
        xs = [p + i * width for p in range(len(r.acceptance_rate_per_pos))]
        err = None
        if r.acceptance_rate_per_pos_ci_low:
            err = [[0 if lo is None or v is None else v - lo for v, lo in zip(r.acceptance_rate_per_pos, r.acceptance_rate_per_pos_ci_low)],
                   [0 if hi is None or v is None else hi - v for v, hi in zip(r.acceptance_rate_per_pos, r.acceptance_rate_per_pos_ci_high)]]
        # a position the engine did not report has no bar, and a "?" where it would stand (not a 0 %)
        ax.bar(xs, [0 if v is None else v for v in r.acceptance_rate_per_pos], width=width, yerr=err,
               capsize=3,
               label=_line_label(r.mode, r.mtp_layers, r.concurrency, r.request_rate, r.context_tokens) + f", k={r.k}")
        for x, v in zip(xs, r.acceptance_rate_per_pos):
            if v is None:
                ax.text(x, 0.02, "?", ha="center", fontsize=12)
    npos = max(len(r.acceptance_rate_per_pos) for r in tops)
    ax.set(xlabel="draft position", ylabel="acceptance rate (joint: positions 0..i accepted)",
           title="Per-position acceptance", ylim=(0, 1), xticks=[p + width * (len(tops) - 1) / 2 for p in range(npos)],
           xticklabels=range(npos))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    paths.append(_save(fig, out / "per_position.png", plt, rows))
    if any(key[2] is not None for key in lines):
        paths.append(serving_plot(out, rows, plt))
    if any(r.position_bucket_start for r in rows if r.k > 0) or any(key[4] is not None for key in lines):
        paths.append(context_plot(out, rows, plt))
    return paths


def context_plot(out: Path, rows: list[PointResult], plt) -> Path:
    """AL vs the context before the prompt (the --context-tokens dimension), and AL vs the position in the
    sequence where the drafts were verified (inside every run, from per-request data)."""
    ok = [r for r in rows if r.status == "ok" and r.category == "all" and r.k > 0]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = sorted({(r.mode, r.mtp_layers, r.k, r.concurrency, r.request_rate) for r in ok},
                    key=lambda x: tuple(-1 if v is None else v for v in x[1:]) + (x[0],))
    for mode, L, k, c, rate in groups:
        pts = sorted((r for r in ok if (r.mode, r.mtp_layers, r.k, r.concurrency, r.request_rate) == (mode, L, k, c, rate)
                      and r.context_tokens is not None), key=lambda r: r.context_tokens)
        if pts:
            a1.errorbar([r.context_tokens_actual for r in pts], [r.acceptance_length for r in pts], capsize=3,
                        yerr=_yerr(pts, "acceptance_length"), marker="o",
                        label=_line_label(mode, L, c, rate) + f", k={k}")
    for r in ok:
        if r.position_bucket_start:
            err = [[0 if lo is None else v - lo for v, lo in zip(r.acceptance_length_by_position,
                                                                r.acceptance_length_by_position_ci_low)],
                   [0 if hi is None else hi - v for v, hi in zip(r.acceptance_length_by_position,
                                                                r.acceptance_length_by_position_ci_high)]]
            a2.errorbar(r.position_bucket_start, r.acceptance_length_by_position, yerr=err, capsize=2,
                        marker=".", label=_label(r))
    a1.set(xlabel="tokens of held-out text before the prompt (actual)", ylabel="acceptance length",
           title="AL vs context length (--context-tokens)")
    a2.set(xlabel="sequence position when the drafts were verified (bucket start)", ylabel="acceptance length",
           title="AL vs position inside each run")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    return _save(fig, out / "acceptance_vs_context.png", plt, rows)


def serving_plot(out: Path, rows: list[PointResult], plt) -> Path:
    """Served runs: tokens/s vs k, one line per load (best k starred); AL vs concurrency, one line per k."""
    ok = [r for r in rows if r.status == "ok" and r.category == "all" and r.concurrency is not None]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    bare = []
    loads = sorted({(r.concurrency, r.request_rate, r.mtp_layers) for r in ok if r.k > 0},
                   key=lambda x: tuple(-1 if v is None else v for v in x))
    for c, rate, L in loads:
        pts = sorted((r for r in ok if (r.concurrency, r.request_rate) == (c, rate) and r.mtp_layers in (L, 0)),
                     key=lambda r: r.k)
        label = f"c={c}" + ("" if rate is None else f", {rate:g}/s") + (f", L={L}" if len(loads) > 1 else "")
        line = a1.errorbar([r.k for r in pts], [r.output_tokens_per_sec for r in pts], capsize=3,
                           yerr=_yerr(pts, "output_tokens_per_sec"), marker="o", label=label).lines[0]
        best = max(pts, key=lambda r: r.output_tokens_per_sec or 0)
        a1.plot([best.k], [best.output_tokens_per_sec], marker="*", markersize=16, color=line.get_color(),
                linestyle="none")
        bare.append(_hollow(a1, pts, [r.k for r in pts], "output_tokens_per_sec", line.get_color()))
    for k, L, rate in sorted({(r.k, r.mtp_layers, r.request_rate) for r in ok if r.k > 0},
                             key=lambda x: tuple(-1 if v is None else v for v in x)):
        pts = sorted((r for r in ok if (r.k, r.mtp_layers, r.request_rate) == (k, L, rate)),
                     key=lambda r: r.concurrency)
        a2.errorbar([r.concurrency for r in pts], [r.acceptance_length for r in pts], capsize=3,
                    yerr=_yerr(pts, "acceptance_length"), marker="o",
                    label=f"k={k}, L={'?' if L is None else L}" + ("" if rate is None else f", {rate:g}/s"))
    ks = sorted({r.k for r in ok})
    conc = sorted({r.concurrency for r in ok})
    a1.set(xlabel="num_speculative_tokens k", ylabel="output tokens/sec (window)", xticks=ks,
           title="Served throughput vs k (star: best k)")
    a2.set(xlabel="concurrency", ylabel="acceptance length", xscale="log", xticks=conc, xticklabels=conc,
           title="Acceptance length vs concurrency")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    if any(bare):
        fig.suptitle("hollow markers: " + NO_INTERVAL, fontsize=7)
    return _save(fig, out / "serving.png", plt, rows)


def _save(fig, path: Path, plt, rows: list[PointResult] = ()) -> Path:
    try:
        fig.tight_layout()
        who = runner_caption(rows)
        if who:  # every picture of a vLLM run names the runner and the class that drafted
            fig.text(0.995, 0.003, who, ha="right", va="bottom", fontsize=6, color="dimgray")
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def runner_caption(rows: list[PointResult]) -> str:
    from mtpbench.runners import label

    labels = sorted({label(r.runner, r.drafter) for r in rows if r.runner and r.k > 0})
    return f"vLLM model runner: {', '.join(labels)}" if labels else ""


def build(out: Path) -> list[PointResult]:
    """Rebuild every summary file of a sweep directory from its point files; returns the rows."""
    out = Path(out)
    run, points, failures = load_run(out)
    rows = rows_from_points(points, failures)
    write_text(out / "summary.csv", csv_text(rows))
    write_json(out / "summary.json", {**run, "rows": [r.to_json() for r in rows]})
    plots(out, rows)
    al_histogram(out, points, rows)
    return rows


def histogram_panels(points: list[dict], rows: list[PointResult]) -> list[tuple[GridPoint, list[float], float | None]]:
    """Per drafting point: its requests' own acceptance lengths, and the AL the table reports for it
    (1 + accepted / drafts pooled: not the mean of the per-request ALs, which weighs a short request
    like a long one)."""
    reported = {_label(r): r.acceptance_length for r in rows if r.category == "all" and r.status == "ok"}
    out = []
    for d in sorted(points, key=lambda d: _sort_key(d["point"])):
        run = PointRun.from_json(d)
        als = [r.acceptance_length for r in run.requests if r.acceptance_length is not None]
        point = GridPoint.from_json(d["point"])
        if point.k > 0 and als:
            out.append((point, als, reported.get(point.name)))
    return out


def al_histogram(out: Path, points: list[dict], rows: list[PointResult]) -> Path | None:
    """Per-request acceptance length of every drafting point, one panel each, with a line at the
    reported AL (``al_histogram.png``)."""
    per_point = histogram_panels(points, rows)
    if not per_point:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(per_point))
    rows_n = -(-len(per_point) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax, (point, als, al) in zip(axes.flat, per_point):
        ax.hist(als, bins=min(20, max(5, len(als) // 2)), range=(1, point.k + 1), color="tab:blue", alpha=0.8)
        if al is not None:
            ax.axvline(al, color="black", lw=1, label=f"AL {al:.3g}")
            ax.legend(fontsize=7)
        ax.set(title=f"{point.name} ({len(als)} requests)", xlabel="acceptance length per request (line: AL)",
               ylabel="requests")
        ax.title.set_fontsize(8)
    for ax in list(axes.flat)[len(per_point):]:
        ax.axis("off")
    return _save(fig, out / "al_histogram.png", plt, rows)
