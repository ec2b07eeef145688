"""compare's outputs: compare.csv, compare.json, compare.md and compare.png, from the compared rows."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from mtpbench.compare.pair import TABLE, CompareRow
from mtpbench.files import csv_text, make_out_dir
from mtpbench.files import write_json, write_text
from mtpbench.stats.judge import end_text, level_text


def write(out: Path, result: dict, rows: list[CompareRow]) -> None:
    make_out_dir(out)
    write_text(out / "compare.csv", csv_text([f.name for f in fields(CompareRow)], (r.to_csv() for r in rows)))
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
        ci = "-" if r["ci_low"] is None else (
            f"[{end_text(r['ci_low'], 0.0, 4)}, {end_text(r['ci_high'], 0.0, 4)}] at {level_text(r['level'])}"
            if r.get("level") else f"[{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]")
        rel = "-" if r["rel_diff"] is None else f"{r['rel_diff'] * 100:+.2f} %"
        out.append([r["point"], r["metric"], _fmt(r["a"], r["metric"]), _fmt(r["b"], r["metric"]),
                    "-" if r["diff"] is None else f"{r['diff']:+.4g}", rel, ci, r["verdict"],
                    r.get("values_from") or TABLE])
    return out

HEADERS = ["point", "metric", "A", "B", "B - A", "(B - A) / A", "interval of B - A", "verdict", "values from"]

# the terminal's table leaves "values from" to the legend (the interval tells it) and says the intervals' level once
LEGEND = ("interval: of B - A, at the level in its header (1 - 0.05 / the rows judged together); a timing's or "
          "speedup's interval never narrower than the runs' A/A noise. verdict: better or worse where that interval "
          "excludes 0, else within noise. Timings and speedups: the geometric means of each run's timed runs (the "
          "delta method's t interval); acceptance: the same prompts paired across the runs (a bootstrap over them) "
          "where an interval is shown, else each run's own table (compare.csv's values_from says which)")


def terminal_table(result: dict) -> str:
    """The table the terminal prints (all prompts), within 120 columns: without "values from" (the legend says
    what an interval, or its absence, means), the level of the intervals, one for the rows judged together, in the
    header; its legend under it."""
    from tabulate import tabulate

    from mtpbench.sweep.table import wrap

    rows = [r[:-1] for r in table_lines(result)]
    levels = {r["level"] for r in result["rows"] if r["category"] == "all" and r.get("level")}
    headers = HEADERS[:-1]
    if len(levels) == 1:
        at = f" at {level_text(levels.pop())}"
        headers[6] = "interval" + at
        rows = [[*r[:6], r[6].removesuffix(at), *r[7:]] for r in rows]
    return (tabulate(rows, headers=headers, disable_numparse=True) + "\n"
            + wrap(LEGEND))


def markdown(result: dict) -> str:
    from mtpbench.compare.page import headline  # the page's answer, so the two never disagree

    rows = table_lines(result)
    lines = [f"## mtpbench compare: A = `{result['a']}`, B = `{result['b']}`", "",
             "What differs between the runs: " + ("; ".join(f"`{d}`" for d in result["differences"])
                                                  or "nothing in their settings or versions") + ".", "",
             headline(result)[0] + " All prompts; intervals at 1 - 0.05 / the rows judged together (the chance of "
             "any false better or worse at most 5 %), a paired bootstrap over prompts for acceptance, over repeats "
             "for timings, never narrower than the runs' A/A noise floors for timings.", "",
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
    ax.set(xlabel="(B - A) / A, % (line: its interval at the rows' level)", title=f"B = {Path(result['b']).name} vs A = {Path(result['a']).name}")
    ax.grid(alpha=0.3, axis="x")
    runner = next((d for d in result["differences"] if d.startswith("runner: ")), None)
    if runner:  # V1 against V2: the picture says which runner each side ran
        fig.text(0.995, 0.003, f"vLLM model runner (A vs B): {runner.removeprefix('runner: ')}", ha="right",
                 va="bottom", fontsize=6, color="dimgray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
