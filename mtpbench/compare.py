"""``mtpbench compare A B``: is B's difference from A real? From the two sweeps' saved files alone.

What differs between A and B as a whole (their drafting modes, ``--force-spec-step-idx``, the backend or
the vLLM build, ...) is what is compared; points pair on every other grid dimension (k, MTP layers,
concurrency, request rate, and the mode when both sides swept the same modes), rows on the category, and
requests on the prompt. Per metric the output gives A, B, B - A, (B - A) / A, the 95 % interval of
B - A and one word:

* acceptance (AL, draft acceptance rate, each per-position rate): a paired bootstrap over the prompts
  both runs measured (``stats.paired_ratio_diff_ci``);
* timings (tokens/s, TTFT p50, TPOT p50): a bootstrap of the difference of medians over each side's
  repeats (``--repeats``); a point timed once has no interval;
* speedup (each run's point against its own k = 0): each side's ratio of geometric means of the repeats,
  from 3 each, and a Welch t interval on the logs around their difference (``stats.speedup_diff``);
* ``better`` / ``worse``: the interval excludes 0 in the metric's good / bad direction; ``within noise``:
  it holds 0; ``no interval``: the data cannot tell (no per-request data, a single repeat).

Where a metric has an interval, A, B and B - A come from the same data as the interval (acceptance: the
requests both runs made of the same prompts, pooled; timings: the medians of the repeats; speedup: the
ratios of geometric means, so it can differ a little from the sweep table's ratio of medians), so a
verdict never contradicts the sign of B - A and B - A lies inside its interval, also when a server's
counters held foreign traffic or the prompt sets only overlap; each row says where its values come from
(``values_from``).

How the engines executed (eager or compiled graphs, and vLLM's model runner) is a difference between
the runs as a whole: vLLM with ``--force-spec-step-idx`` runs every point eagerly, k = 0 included. Then
the k = 0 baseline is no control for machine drift, and raw timings stay evidence for ``--fail-if-worse``.

Writes ``compare.csv``, ``compare.json``, ``compare.md`` (a summary to paste into a pull request) and
``compare.png`` (relative differences with their intervals).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mtpbench import stats
from mtpbench.config import execution
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult, PointRun
from mtpbench.files import write_json, write_text
from mtpbench.report import load_run, rows_from_points

# metric, higher is better
ACCEPTANCE = (("acceptance_length", True), ("draft_acceptance_rate", True))
TIMINGS = (("output_tokens_per_sec", True), ("ttft_ms_p50", False), ("tpot_ms_p50", False))
# settings that make two runs incomparable unless --force: the model and what it was asked
SAME_WORKLOAD = ("model", "prompts", "num_prompts", "chat_template", "max_tokens", "temperature", "seed")


@dataclass(frozen=True)
class CompareRow:
    point: str  # the paired point, A's name (B's when it differs: "chain-L3-k3 vs reuse-L3-k3")
    k: int
    category: str
    metric: str
    a: float | None
    b: float | None
    diff: float | None
    rel_diff: float | None
    ci_low: float | None  # 95 % interval of B - A
    ci_high: float | None
    verdict: str
    higher_is_better: bool
    paired_prompts: int | None  # prompts paired for acceptance; None for timings
    # where A, B and B - A come from: the data of the interval ("paired prompts": the requests both runs
    # made of the same prompts, pooled; "repeats": medians of each side's timed runs; "repeats (geometric
    # means)": a speedup's ratio of geometric means of both points' timed runs), or, with no
    # interval, "each run's table" (engine counters, which a server's foreign traffic also feeds)
    values_from: str = ""

    def to_csv(self) -> dict:
        return {k: "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Side:
    run: dict
    rows: list[PointResult]
    points: dict[tuple, tuple[GridPoint, PointRun]]  # pairing key -> point
    failures: dict[tuple, str]


def _side(loaded: tuple[dict, list[dict], list[dict]], out: Path, with_mode: bool) -> Side:
    run, points, failures = loaded
    rows = rows_from_points(points, failures)
    keyed = {}
    for d in points:
        point = GridPoint.from_json(d["point"])
        key = _key(point, with_mode)
        if key in keyed:
            raise MtpBenchError(f"{out}: two points pair as {key}: compare runs with one drafting mode each, "
                                "or the same modes on both sides")
        keyed[key] = (point, PointRun.from_json(d))
    fails = {_key(GridPoint.from_json(f["point"]), with_mode): (GridPoint.from_json(f["point"]).name, f["error"])
             for f in failures}
    return Side(run, rows, keyed, fails)


def _key(point: GridPoint, with_mode: bool) -> tuple:
    mode = point.mode if with_mode or point.k == 0 else None
    return (mode, point.k, point.mtp_layers, point.concurrency, point.request_rate, point.context_tokens)


def _modes(loaded: tuple[dict, list[dict], list[dict]]) -> set[str]:
    _, points, failures = loaded
    return {d["point"]["mode"] for d in points + failures if d["point"]["k"] > 0}


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two runs as a whole: settings, and engine versions."""
    out = []
    for key in sorted(set(a["config"]) | set(b["config"])):
        if key in ("out", "description"):
            continue
        va, vb = a["config"].get(key), b["config"].get(key)
        if va != vb:
            out.append(f"{key}: {va} vs {vb}")
    ea, eb = run_execution(a), run_execution(b)
    if ea != eb:
        out.append(f"execution: {describe_execution(ea)} vs {describe_execution(eb)}")
    for key in ("vllm", "torch", "mtpbench_code"):
        va, vb = a["provenance"]["versions"].get(key), b["provenance"]["versions"].get(key)
        if va != vb:
            out.append(f"{key} version: {va} vs {vb}")
    return out


def run_execution(run: dict) -> dict:
    """How a run's engine executed its points: as the run recorded it, else as its settings tell."""
    return run.get("execution") or execution(run["config"])


def describe_execution(e: dict) -> str:
    graphs = e.get("graphs") or "unknown graphs"
    return graphs + (f", runner {e['runner']}" if e.get("runner") else "")


def check_same_workload(a: dict, b: dict, force: bool) -> None:
    pa, pb = (a.get("prompts") or {}).get("sha256"), (b.get("prompts") or {}).get("sha256")
    # where both runs recorded their prompts' texts, those decide, not how the prompts were asked for
    keys = [k for k in SAME_WORKLOAD if not (pa and pb and k in ("prompts", "num_prompts", "chat_template"))]
    problems = [f"{k} ({a['config'].get(k)!r} vs {b['config'].get(k)!r})" for k in keys
                if a["config"].get(k) != b["config"].get(k)]
    if pa and pb and pa != pb:
        problems.insert(0, f"prompts ({a['config'].get('prompts')!r} vs {b['config'].get('prompts')!r}: "
                           "other prompt texts)")
    if problems and not force:
        raise MtpBenchError(f"A and B differ in {', '.join(problems)}: their numbers do not pair "
                            "(--force compares them anyway)")


def _verdict(diff: float | None, ci: tuple[float, float] | None, higher_is_better: bool) -> str:
    if diff == 0:
        return "within noise"  # no difference is within any noise, interval or not
    if ci is None or diff is None:
        return "no interval"
    lo, hi = ci
    # an interval beyond 0 on the side opposite to B - A (a skewed bootstrap can do that) is no evidence
    if lo > 0 and diff > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0 and diff < 0:
        return "worse" if higher_is_better else "better"
    return "within noise"


def _row(point: str, k: int, cat: str, metric: str, a, b, ci, higher: bool, paired: int | None,
         values_from: str) -> CompareRow:
    diff = None if a is None or b is None else b - a
    rel = diff / a if diff is not None and a else (0.0 if diff == 0 else None)
    return CompareRow(point, k, cat, metric, _r6(a), _r6(b), _r6(diff), _r6(rel), None if ci is None else _r6(ci[0]),
                      None if ci is None else _r6(ci[1]), _verdict(diff, ci, higher), higher, paired, values_from)


def _r6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


TABLE = "each run's table"
GEOMETRIC = "repeats (geometric means)"  # speedup: each run's ratio of geometric means over its repeats


def _by_prompt(requests, category: str) -> dict[tuple[str, int], object]:
    """A run's requests with per-request counts, keyed by (prompt id, occurrence): a prompt id that a set
    holds twice (a JSONL file with a repeated id) pairs its n-th request in A with its n-th in B."""
    out, seen = {}, Counter()
    for r in requests:
        if r.prompt_id and r.num_drafts is not None and (category == "all" or r.category == category):
            out[(r.prompt_id, seen[r.prompt_id])] = r
            seen[r.prompt_id] += 1
    return out


def duplicate_ids(requests) -> list[str]:
    counts = Counter(r.prompt_id for r in requests if r.prompt_id)
    return sorted(i for i, n in counts.items() if n > 1)


def _paired_requests(ra, rb, category: str):
    """Requests of both runs on the same prompts (by prompt id), with per-request counts on both sides."""
    a, b = _by_prompt(ra.requests, category), _by_prompt(rb.requests, category)
    ids = sorted(set(a) & set(b))
    return [a[i] for i in ids], [b[i] for i in ids]


def _pooled(metric: str, num: list[int], den: list[int]) -> float | None:
    """The metric over a set of requests, pooled as the sweep's table pools it (a ratio of sums)."""
    if not sum(den):
        return None
    return (1 if metric == "acceptance_length" else 0) + sum(num) / sum(den)


def compare_points(name: str, pa: tuple[GridPoint, PointRun], pb: tuple[GridPoint, PointRun],
                   rows_a: list[PointResult], rows_b: list[PointResult],
                   base: tuple[PointRun, PointRun] | None = None) -> list[CompareRow]:
    """Rows for one pair of points; ``base``: both runs' k = 0 points of the same load (for speedup)."""
    (ga, ra), (_, rb) = pa, pb
    out = []
    for row_a in rows_a:
        row_b = next((r for r in rows_b if r.category == row_a.category), None)
        if row_b is None:
            continue
        cat = row_a.category
        if ga.k > 0:
            qa, qb = _paired_requests(ra, rb, cat)
            n = len(qa) if len(qa) >= 2 else None
            specs = [(m, hib, [r.num_accepted_tokens for r in qa], [r.num_drafts if m == "acceptance_length"
                                                                    else r.num_draft_tokens for r in qa],
                      [r.num_accepted_tokens for r in qb], [r.num_drafts if m == "acceptance_length"
                                                            else r.num_draft_tokens for r in qb])
                     for m, hib in ACCEPTANCE]
            specs += [(f"acceptance_rate_per_pos[{i}]", True, [r.num_accepted_tokens_per_pos[i] for r in qa],
                       [r.num_drafts for r in qa], [r.num_accepted_tokens_per_pos[i] for r in qb],
                       [r.num_drafts for r in qb]) for i in range(ga.k)]
            for metric, hib, na, da, nb, db in specs:
                ci = stats.paired_ratio_diff_ci(na, da, nb, db) if n else None
                if ci is not None:  # A, B and B - A from the very requests the interval resamples
                    out.append(_row(name, ga.k, cat, metric, _pooled(metric, na, da), _pooled(metric, nb, db), ci,
                                    hib, n, "paired prompts"))
                else:
                    out.append(_row(name, ga.k, cat, metric, _metric(row_a, metric), _metric(row_b, metric), None,
                                    hib, n, TABLE))
        if cat == "all":
            for metric, hib in TIMINGS:
                ta, tb = [r.get(metric) for r in ra.repeats], [r.get(metric) for r in rb.repeats]
                ci = stats.median_diff_ci(ta, tb) if len(ta) > 1 and len(tb) > 1 else None
                if ci is not None:
                    out.append(_row(name, ga.k, cat, metric, stats.median(ta), stats.median(tb), ci, hib, None,
                                    "repeats"))
                else:
                    out.append(_row(name, ga.k, cat, metric, getattr(row_a, metric), getattr(row_b, metric), None,
                                    hib, None, TABLE))
            if ga.k > 0 and base is not None:
                reps = [[r.get("output_tokens_per_sec") for r in x.repeats] for x in (ra, base[0], rb, base[1])]
                est = stats.speedup_diff(*reps)
                if est is not None:  # A, B and B - A: the ratios of geometric means the interval is centred on
                    sa, sb, ci = est
                    out.append(_row(name, ga.k, cat, "speedup", sa, sb, ci, True, None, GEOMETRIC))
                else:
                    out.append(_row(name, ga.k, cat, "speedup", row_a.speedup, row_b.speedup, None, True, None, TABLE))
    return out


def _metric(row: PointResult, metric: str):
    if metric.startswith("acceptance_rate_per_pos["):
        i = int(metric[len("acceptance_rate_per_pos["):-1])
        return row.acceptance_rate_per_pos[i] if i < len(row.acceptance_rate_per_pos) else None
    return getattr(row, metric)


def compare(a_dir: Path, b_dir: Path, out: Path | None = None, force: bool = False) -> dict:
    """Pair the two sweeps and write the comparison into ``out`` (nothing is written on an error)."""
    a_dir, b_dir = Path(a_dir), Path(b_dir)
    loaded_a, loaded_b = load_run(a_dir), load_run(b_dir)
    with_mode = _modes(loaded_a) == _modes(loaded_b)
    a, b = _side(loaded_a, a_dir, with_mode), _side(loaded_b, b_dir, with_mode)
    check_same_workload(a.run, b.run, force)
    rows: list[CompareRow] = []
    unpaired, failed, missing, duplicates = [], [], [], []
    for key in sorted(set(a.points) | set(b.points) | set(a.failures) | set(b.failures),
                      key=lambda x: tuple(-1 if v is None else v for v in x[1:]) + (str(x[0]),)):
        pa, pb = a.points.get(key), b.points.get(key)
        if pa and pb:
            name = pa[0].name if pa[0].name == pb[0].name else f"{pa[0].name} vs {pb[0].name}"
            ra = [r for r in a.rows if _row_key(r, with_mode) == key and r.status == "ok"]
            rb = [r for r in b.rows if _row_key(r, with_mode) == key and r.status == "ok"]
            k0 = ("plain", 0, 0, *key[3:])
            base = (a.points[k0][1], b.points[k0][1]) if k0 in a.points and k0 in b.points else None
            rows += compare_points(name, pa, pb, ra, rb, base)
            for side, (_, run) in (("A", pa), ("B", pb)) if pa[0].k > 0 else ():  # k = 0 pairs no prompts
                ids = duplicate_ids(run.requests)
                if ids:
                    duplicates.append(f"{name}: prompt id{'s' if len(ids) > 1 else ''} "
                                      f"{', '.join(map(repr, ids[:5]))}{' ...' if len(ids) > 5 else ''} "
                                      f"{'occur' if len(ids) > 1 else 'occurs'} more than once in {side}: paired by order of appearance (the n-th with the n-th)")
        elif key in a.failures or key in b.failures:
            side = "A and B" if key in a.failures and key in b.failures else "A" if key in a.failures else "B"
            name, error = a.failures.get(key) or b.failures.get(key)
            failed.append({"point": name, "failed_in": side, "error": error[:300]})
        else:
            unpaired.append((pa or pb)[0].name + (" (only in A)" if pa else " (only in B)"))
            if pa:
                missing.append(pa[0].name)
    if not rows and not failed:
        raise MtpBenchError(f"{a_dir} and {b_dir} have no points that pair (same k, MTP layers and load)")
    drift = drift_notes(rows, a.run, b.run)
    result = {"a": str(a_dir), "b": str(b_dir), "differences": differences(a.run, b.run),
              "rows": [asdict(r) for r in rows], "failed": failed, "unpaired": unpaired, "missing_in_b": missing,
              "notes": drift + execution_notes(a.run, b.run) + duplicates, "timings_drifted": bool(drift)}
    if out is not None:
        write(Path(out), result, rows)
    return result


# differences between two runs that leave the k = 0 baseline as it was: it drafts nothing. (Under vLLM
# --force-spec-step-idx also runs k = 0 eagerly: that shows as an "execution" difference, which counts.)
NOT_BASELINE = ("mode:", "force_spec_step_idx:", "draft_model:", "method:", "k:", "mtp_layers:")


def drift_notes(rows: list[CompareRow], a: dict, b: dict) -> list[str]:
    """The k = 0 baseline is a control when both runs made it the same way: if its tokens/s still moved
    beyond noise, the machine drifted between the runs, and raw timings of other points carry that drift."""
    same_baseline = not [d for d in differences(a, b) if not d.startswith(NOT_BASELINE)]
    out = []
    for r in rows:
        if r.k == 0 and r.category == "all" and r.metric == "output_tokens_per_sec" and same_baseline \
                and r.verdict in ("better", "worse"):
            out.append(f"the k = 0 baseline {r.point}, made the same way in both runs, moved {r.rel_diff * 100:+.1f} % beyond "
                       "its interval: timings drifted between the runs; read tokens/s, TTFT and TPOT through "
                       "'speedup' (each run against its own baseline) or rerun")
    return out


def execution_notes(a: dict, b: dict) -> list[str]:
    """A difference in how the engines executed (eager vs compiled graphs, the model runner) is one of the
    whole runs, k = 0 included: the baseline is then no control for machine drift."""
    ea, eb = run_execution(a), run_execution(b)
    if ea == eb:
        return []
    return [f"A ran {describe_execution(ea)}, B {describe_execution(eb)}, every point alike, k = 0 included: raw "
            "tokens/s, TTFT and TPOT differences hold the execution's difference too (they still count for "
            "--fail-if-worse), and the k = 0 baseline tells nothing about machine drift; 'speedup' reads each "
            "run against its own baseline"]


def _row_key(r: PointResult, with_mode: bool) -> tuple:
    rate = float("inf") if r.request_rate is None and r.concurrency is not None else r.request_rate
    return _key(GridPoint(r.mode, r.k, r.mtp_layers, r.concurrency, rate, r.context_tokens), with_mode)


def worse_beyond(result: dict, pct: float) -> list[str]:
    """What fails --fail-if-worse PCT: a point that ran in A and failed in B or is missing from B (a B
    sweep stopped halfway), and every metric over all prompts that is worse beyond noise by more than
    ``pct`` percent (per-category rows are left out: with 13 categories some would cross by chance).
    When the k = 0 control shows machine drift between the runs, raw timings are not evidence
    (``speedup`` still is); a difference in execution is no drift, and raw timings then count."""
    drifted = {m for m, _ in TIMINGS} if result.get("timings_drifted") else set()
    out = [f"{f['point']} failed in B" for f in result["failed"] if f["failed_in"] == "B"]
    out += [f"{name} missing in B" for name in result.get("missing_in_b", [])]
    out += [f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %" for r in result["rows"]
            if r["category"] == "all" and r["verdict"] == "worse" and r["rel_diff"] is not None
            and abs(r["rel_diff"]) * 100 > pct and r["metric"] not in drifted]
    return out


def unjudged_beyond(result: dict, pct: float) -> list[str]:
    """Metrics over all prompts that moved by more than ``pct`` percent but carry no interval."""
    return [f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %" for r in result["rows"]
            if r["category"] == "all" and r["verdict"] == "no interval" and r["rel_diff"] is not None
            and abs(r["rel_diff"]) * 100 > pct]


def write(out: Path, result: dict, rows: list[CompareRow]) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MtpBenchError(f"output directory is not writable: {out} ({e.strerror})") from None
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in fields(CompareRow)], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r.to_csv())
    write_text(out / "compare.csv", buf.getvalue())
    write_json(out / "compare.json", result)
    write_text(out / "compare.md", markdown(result))
    plot(out / "compare.png", rows, result)


def _fmt(v, metric: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if metric == "output_tokens_per_sec" else f"{v:.4g}"


def table_lines(result: dict, category: str = "all") -> list[list[str]]:
    out = []
    for r in result["rows"]:
        if r["category"] != category:
            continue
        ci = "-" if r["ci_low"] is None else f"[{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]"
        rel = "-" if r["rel_diff"] is None else f"{r['rel_diff'] * 100:+.2f} %"
        out.append([r["point"], r["metric"], _fmt(r["a"], r["metric"]), _fmt(r["b"], r["metric"]),
                    "-" if r["diff"] is None else f"{r['diff']:+.4g}", rel, ci, r["verdict"],
                    r.get("values_from") or TABLE])
    return out


HEADERS = ["point", "metric", "A", "B", "B - A", "(B - A) / A", "95 % CI of B - A", "verdict", "values from"]


def markdown(result: dict) -> str:
    rows = table_lines(result)
    words = [r[7] for r in rows]
    lines = [f"## mtpbench compare: A = `{result['a']}`, B = `{result['b']}`", "",
             "What differs between the runs: " + ("; ".join(f"`{d}`" for d in result["differences"])
                                                  or "nothing in their settings or versions") + ".", "",
             f"{words.count('better')} better, {words.count('worse')} worse, {words.count('within noise')} within "
             f"noise, {words.count('no interval')} without an interval (all prompts; intervals: 95 %, paired "
             "bootstrap over prompts for acceptance, over repeats for timings).", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if result["notes"]:
        lines += [""] + [f"Note: {n}." for n in result["notes"]]
    if result["failed"]:
        lines += ["", "Failed points:"] + [f"- {f['point']}: failed in {f['failed_in']}: {f['error']}"
                                           for f in result["failed"]]
    if result["unpaired"]:
        lines += ["", "Not paired: " + ", ".join(result["unpaired"])]
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[CompareRow], result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.category == "all" and r.rel_diff is not None and r.a]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * max(len(shown), 1)))
    colors = {"better": "tab:green", "worse": "tab:red", "within noise": "tab:grey", "no interval": "tab:grey"}
    for i, r in enumerate(shown):
        y = len(shown) - 1 - i
        if r.ci_low is not None:
            ax.plot([r.ci_low / r.a * 100, r.ci_high / r.a * 100], [y, y], color=colors[r.verdict], lw=2)
        ax.plot([r.rel_diff * 100], [y], "o", color=colors[r.verdict])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([f"{r.point}: {r.metric}" for r in reversed(shown)], fontsize=7)
    ax.set(xlabel="(B - A) / A, % (line: 95 % interval)", title=f"B = {Path(result['b']).name} vs A = {Path(result['a']).name}")
    ax.grid(alpha=0.3, axis="x")
    runner = next((d for d in result["differences"] if d.startswith("runner: ")), None)
    if runner:  # V1 against V2: the picture says which runner each side ran
        fig.text(0.995, 0.003, f"vLLM model runner (A vs B): {runner.removeprefix('runner: ')}", ha="right",
                 va="bottom", fontsize=6, color="dimgray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
