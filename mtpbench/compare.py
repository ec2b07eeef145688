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
* ``better`` / ``worse``: the interval excludes 0 in the metric's good / bad direction; ``within noise``:
  it holds 0; ``no interval``: the data cannot tell (no per-request data, a single repeat).

Writes ``compare.csv``, ``compare.json``, ``compare.md`` (a summary to paste into a pull request) and
``compare.png`` (relative differences with their intervals).
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mtpbench import stats
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult, PointRun
from mtpbench.report import load_run, rows_from_points, write_json, write_text

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
    for key in ("vllm", "torch", "mtpbench_code"):
        va, vb = a["provenance"]["versions"].get(key), b["provenance"]["versions"].get(key)
        if va != vb:
            out.append(f"{key} version: {va} vs {vb}")
    return out


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
    if lo > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0:
        return "worse" if higher_is_better else "better"
    return "within noise"


def _row(point: str, k: int, cat: str, metric: str, a, b, ci, higher: bool, paired: int | None) -> CompareRow:
    diff = None if a is None or b is None else b - a
    rel = diff / a if diff is not None and a else (0.0 if diff == 0 else None)
    return CompareRow(point, k, cat, metric, a, b, None if diff is None else round(diff, 6),
                      None if rel is None else round(rel, 6), None if ci is None else round(ci[0], 6),
                      None if ci is None else round(ci[1], 6), _verdict(diff, ci, higher), higher, paired)


def _paired_requests(ra, rb, category: str):
    """Requests of both runs on the same prompts (by prompt id), with per-request counts on both sides."""
    def usable(requests):
        return {r.prompt_id: r for r in requests if r.prompt_id and r.num_drafts is not None
                and (category == "all" or r.category == category)}
    a, b = usable(ra.requests), usable(rb.requests)
    ids = sorted(set(a) & set(b))
    return [a[i] for i in ids], [b[i] for i in ids]


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
                va, vb = _metric(row_a, metric), _metric(row_b, metric)
                out.append(_row(name, ga.k, cat, metric, va, vb, ci, hib, n))
        if cat == "all":
            for metric, hib in TIMINGS:
                ta, tb = [r.get(metric) for r in ra.repeats], [r.get(metric) for r in rb.repeats]
                ci = stats.median_diff_ci(ta, tb) if len(ta) > 1 and len(tb) > 1 else None
                out.append(_row(name, ga.k, cat, metric, getattr(row_a, metric), getattr(row_b, metric), ci, hib,
                                None))
            if ga.k > 0 and base is not None:
                reps = [[r.get("output_tokens_per_sec") for r in x.repeats] for x in (ra, base[0], rb, base[1])]
                ci = stats.speedup_diff_ci(*reps)
                out.append(_row(name, ga.k, cat, "speedup", row_a.speedup, row_b.speedup, ci, True, None))
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
    unpaired, failed = [], []
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
        elif key in a.failures or key in b.failures:
            side = "A and B" if key in a.failures and key in b.failures else "A" if key in a.failures else "B"
            name, error = a.failures.get(key) or b.failures.get(key)
            failed.append({"point": name, "failed_in": side, "error": error[:300]})
        else:
            unpaired.append((pa or pb)[0].name + (" (only in A)" if pa else " (only in B)"))
    if not rows and not failed:
        raise MtpBenchError(f"{a_dir} and {b_dir} have no points that pair (same k, MTP layers and load)")
    result = {"a": str(a_dir), "b": str(b_dir), "differences": differences(a.run, b.run),
              "rows": [asdict(r) for r in rows], "failed": failed, "unpaired": unpaired,
              "notes": drift_notes(rows, a.run, b.run)}
    if out is not None:
        write(Path(out), result, rows)
    return result


def drift_notes(rows: list[CompareRow], a: dict, b: dict) -> list[str]:
    """The k = 0 baseline is a control when both runs made it the same way: if its tokens/s still moved
    beyond noise, the machine drifted between the runs, and raw timings of other points carry that drift."""
    same_baseline = not [d for d in differences(a, b) if not d.startswith(("mode:", "force_spec_step_idx:"))]
    out = []
    for r in rows:
        if r.k == 0 and r.category == "all" and r.metric == "output_tokens_per_sec" and same_baseline \
                and r.verdict in ("better", "worse"):
            out.append(f"the k = 0 baseline {r.point}, made the same way in both runs, moved {r.rel_diff * 100:+.1f} % beyond "
                       "its interval: timings drifted between the runs; read tokens/s, TTFT and TPOT through "
                       "'speedup' (each run against its own baseline) or rerun")
    return out


def _row_key(r: PointResult, with_mode: bool) -> tuple:
    rate = float("inf") if r.request_rate is None and r.concurrency is not None else r.request_rate
    return _key(GridPoint(r.mode, r.k, r.mtp_layers, r.concurrency, rate, r.context_tokens), with_mode)


def worse_beyond(result: dict, pct: float) -> list[str]:
    """What fails --fail-if-worse PCT: a point that ran in A and failed in B, and every metric over all
    prompts that is worse beyond noise by more than ``pct`` percent (per-category rows are left out: with
    13 categories some would cross by chance). When the k = 0 control shows drift between the runs, raw
    timings are not evidence (``speedup`` still is)."""
    drifted = {m for m, _ in TIMINGS} if result["notes"] else set()
    out = [f"{f['point']} failed in B" for f in result["failed"] if f["failed_in"] == "B"]
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
                    "-" if r["diff"] is None else f"{r['diff']:+.4g}", rel, ci, r["verdict"]])
    return out


HEADERS = ["point", "metric", "A", "B", "B - A", "(B - A) / A", "95 % CI of B - A", "verdict"]


def markdown(result: dict) -> str:
    rows = table_lines(result)
    words = [r[-1] for r in rows]
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
