"""The sweep's table (terminal and ``summary.csv``) from result rows."""

from __future__ import annotations


from mtpbench import files
from mtpbench.metrics import GridPoint, PointResult
from mtpbench.metrics.law import z_text
from mtpbench.stats.judge import end_text, interval_text, level_text

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


def csv_text(rows: list[PointResult]) -> str:
    return files.csv_text(PointResult.columns(), (r.to_csv() for r in rows))


def columns(rows: list[PointResult], latency: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """The table's (field, header) columns: the usual ones, and those only some sweeps have (see ``table``)."""
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
    if any(r.speedup_decision for r in rows):  # each point's timed runs and its speedup's decision (stats.judge)
        i = [name for name, _ in cols].index("speedup") + 1
        cols[i:i] = [("num_repeats", "n"), ("speedup_decision", "decided")]
    if any(r.runner for r in rows):
        cols[1:1] = [("runner", "vLLM runner")]
    if latency is not None:
        names = [name for name, _ in cols]
        i = names.index("ttft_ms_p50")
        cols = [c for c in cols if not c[0].startswith(("ttft_ms", "tpot_ms", "itl_ms"))]
        cols[i:i] = latency
    return cols


WIDTH = 120  # the terminal's table fits this many characters unless --wide
# the columns a first read can do without, dropped in this order until the table fits WIDTH (--wide and
# summary.csv keep every one)
DROP_FIRST = ("startup_s", "output_repetition", "greedy_numerical", "theoretical_speedup", "alpha",
              "peak_gpu_mem_bytes", "avg_power_w", "acceptance_rate_per_pos", "ttft_ms_p50", "tpot_ms_p99",
              "itl_ms_p50", "greedy_match_k0", "energy_j_per_token", "request_rate", "runner",
              "tpot_ms_p50")

# every column's meaning, printed under the table for the columns it shows (vLLM's names and formulas)
LEGEND = {
    "mode": "drafting: plain (k = 0), reuse (MTP layer 0 at every step), chain (step s runs layer s mod L), "
            "vllm (vLLM's own)",
    "k": "num_speculative_tokens", "mtp_layers": "MTP layers", "runner": "vLLM model runner and the drafter class",
    "context_tokens": "held-out tokens before each prompt", "concurrency": "requests in flight at most",
    "request_rate": "requests sent per second (inf: all at once)", "category": "prompt category (all: every prompt)",
    "acceptance_length": "acceptance length, 1 + accepted / drafts [95 % over prompts]",
    "acceptance_rate_per_pos": "share of drafts accepted at positions 1..k, each with all before it",
    "alpha": "per-token acceptance fitted to the counts, accepted / (accepted + rejections)",
    "output_tokens_per_sec": "output tokens per second, the geometric mean of the timed runs (as the speedup's) [95 %]",
    "speedup": "tok/s over k = 0's (ratio of geometric means) [interval at the level below]",
    "num_repeats": "timed runs", "speedup_decision": "faster / slower where the speedup's interval excludes 1, "
                                                     "else open",
    "theoretical_speedup": "(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), c the measured cost of a draft",
    "ttft_ms_p50": "median time to first token", "tpot_ms_p50": "median time per output token after the first",
    "tpot_ms_p99": "99th percentile time per output token", "itl_ms_p50": "median inter-token latency",
    "request_throughput_per_sec": "requests completed per second",
    "output_repetition": "share of 4-grams already earlier in the output",
    "greedy_match_k0": "share of prompts whose greedy output equals k = 0's",
    "greedy_numerical": "of the prompts that left k = 0's tokens, the share at numerical near-ties",
    "startup_s": "seconds to start the engine", "energy_j_per_token": "GPU energy per output token",
    "avg_power_w": "mean GPU power", "peak_gpu_mem_bytes": "peak GPU memory",
    "status": "ok, or failed (its error under the table)",
}


LATENCY = {"ttft": "time to first token", "tpot": "time per output token after the first",
           "itl": "inter-token latency", "e2el": "end-to-end latency of a request"}
STATISTIC = {"mean": "mean", "std": "standard deviation", "median": "median", "p50": "median"}


def meaning(name: str) -> str:
    """What a column holds: LEGEND's words, or for a latency statistic asked for with --percentile-metrics /
    --metric-percentiles (``ttft_ms_p95``) its metric and statistic, as vllm bench serve defines them."""
    if name in LEGEND:
        return LEGEND[name]
    metric, _, stat = name.partition("_ms_")
    said = STATISTIC.get(stat) or (f"{stat[1:]}th percentile" if stat.startswith("p") else stat)
    return f"{said} {LATENCY.get(metric, metric)} over requests"


# the columns the line on the speedup's interval already explains
EXPLAINED = ("speedup", "num_repeats", "speedup_decision")


def legend(cols: list[tuple[str, str]], width: int = WIDTH, explained: tuple[str, ...] = ()) -> str:
    """The legend of the columns shown (less those ``explained`` elsewhere), wrapped to ``width``."""
    text = "; ".join(f"{head}: {meaning(name)}" for name, head in cols if name not in explained)
    return wrap("columns: " + text, width)


def table(rows: list[PointResult], latency: list[tuple[str, str]] | None = None, width: int | None = None) -> str:
    """``latency``: the latency columns to show instead of the usual ones (``metrics.latency.columns``: what
    --percentile-metrics and --metric-percentiles ask for); ``width``: the terminal's table, its columns dropped in
    ``DROP_FIRST``'s order until it fits, every shown column in a legend under it and the dropped ones named (None:
    every column, no legend)."""
    dropped = []
    if width is not None and any(r.category != "all" for r in rows):  # the terminal's rows: all prompts
        rows = [r for r in rows if r.category == "all"]
        dropped.append("the rows of each prompt category")
    cols = columns(rows, latency)
    if width is not None:
        cols = [c for c in cols if c[0] != "category"]
    text, marked = _render(rows, cols)
    while width is not None and max(map(len, text.splitlines())) > width:
        name = next((n for n in DROP_FIRST if n in dict(cols)), None)
        if name is None:
            break
        dropped.append(dict(cols)[name])
        cols = [c for c in cols if c[0] != name]
        text, marked = _render(rows, cols)
    if marked:
        text += "\n" + wrap(f"* {NO_INTERVAL}", width)
    if any(r.speedup_decision for r in rows):
        levels = sorted({r.speedup_level for r in rows if r.speedup_level})
        text += f"\n{wrap(decided_legend(levels), width)}"
    if width is not None:
        text += "\n" + legend(cols, width, EXPLAINED if any(r.speedup_decision for r in rows) else ())
        if dropped:
            text += "\n" + wrap(f"more columns with --wide and in summary.csv: {', '.join(dropped)}", width)
    law = [wrap(law_line(r), width, "    ") for r in rows if r.law_verdict and r.category == "all"]
    if law:
        text += "\n\n" + "\n".join([wrap(LAW_HEAD, width)] + law)
    errors = [wrap(f"{row_label(r)}: {r.error}", width) for r in rows if r.error]
    notes = [wrap(n, width) for n in sorted({f"{row_label(r)}: {r.notes}" for r in rows
                                               if r.notes and r.category == "all"})]
    return text + ("\n\nnotes:\n" + "\n".join(notes) if notes else "") + \
        ("\n\nfailed points:\n" + "\n".join(errors) if errors else "")


# one line (within WIDTH): the points' lines follow it, their continuation lines indented further
LAW_HEAD = ("acceptance against its law (--law), per draft position: accepted share of the drafts reaching it, "
            "observed / expected")


def law_line(r: PointResult) -> str:
    """A point's acceptance against its law in one line (``metrics.law.law_lines``' numbers, from the row): the
    verdict, then per draft position observed / expected, its steps and z."""
    cells = []
    for i, n in enumerate(r.law_steps_per_pos):
        if n is None:
            cells.append(f"pos {i} no step")
            continue
        cells.append(f"pos {i} {r.law_observed_per_pos[i]:.3f} / {r.law_expected_per_pos[i]:.3f} "
                     f"({n} steps, {z_text(r.law_z_per_pos[i])})")
    return f"  {row_label(r)}: {r.law_verdict}" + (f"; {', '.join(cells)}" if cells else "")


def wrap(text: str, width: int | None = WIDTH, indent: str = "  ") -> str:
    """A line of the terminal's, wrapped to ``width`` with its continuation lines indented (None: as it is)."""
    import textwrap

    return text if width is None else textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False)


def _render(rows: list[PointResult], cols: list[tuple[str, str]]) -> tuple[str, bool]:
    """The tabulated columns, and whether a timing is shown without its interval (marked *)."""
    from tabulate import tabulate

    from mtpbench.runners import label

    def cell(name, v, r):
        if name == "runner":  # "V2 MultiModuleMTPSpeculator": the runner and the class that drafted
            return label(v, r.drafter) if v else "-"
        if name == "request_rate" and v is None and r.concurrency is not None:
            return "inf"
        if isinstance(v, tuple):
            return " ".join("-" if x is None else f"{x:.2f}" for x in v)
        ci = _interval(r, name)
        if v is not None and ci is None and unsure(r, name):
            marked.append(True)  # one measurement: a timing shown without an interval says so
            return number(name, v) + "*"
        if name == "speedup" and v is not None and ci is not None:  # never printed touching 1 where it excludes 1
            return f"{end_text(v, 1.0)} {interval_text(ci[0], ci[1], 1.0)}"
        if v is not None and ci is not None:  # 2.36 [2.28, 2.44]: the 95 % interval, asymmetric as it is
            return f"{number(name, v)} [{number(name, ci[0])}, {number(name, ci[1])}]"
        if isinstance(v, float):  # formatted here: a column with "-" cells is not reformatted by tabulate
            return number(name, v)
        return "-" if v is None else v

    marked: list[bool] = []
    body = [[cell(name, _value(r, name), r) for name, _ in cols] for r in rows]
    # 3 significant digits, but tokens/s in full (1823.4, not 1.82e+03)
    fmt = [".1f" if name == "output_tokens_per_sec" else ".3g" for name, _ in cols]
    return tabulate(body, headers=[h for _, h in cols], floatfmt=fmt), bool(marked)


# timings vary from run to run: one shown without an interval is marked (table: *, plots: a hollow marker)
TIMINGS = ("output_tokens_per_sec", "request_throughput_per_sec", "speedup", "ttft_ms_p50", "tpot_ms_p50",
           "itl_ms_p50", "e2el_ms_p50")
NO_INTERVAL = ("no interval: a timing from too few timed runs to tell its noise (--repeats 3 gives the intervals "
               "of speedup, tokens/s, req/s and the TTFT, TPOT, ITL and E2EL medians)")


def decided_legend(levels: list[float]) -> str:
    """The line under the table that says how ``decided`` and the speedup's interval were made."""
    at = " / ".join(level_text(x) for x in levels) or level_text(0.95)
    return (f"speedup: tokens/s over k = 0's, the ratio of geometric means of the timed runs (k = 0's over the rounds "
            f"the point was timed in; every timing of several runs is their geometric mean), its interval at {at} "
            f"(1 - 0.05 / (k > 0 points x looks the rounds allow)) never narrower than the A/A noise floor; decided: "
            f"faster or slower where that interval excludes 1, else open (stats.judge); n: its timed runs. A tune that "
            f"reads this sweep judges more comparisons at once, each at a higher level, and may leave open what this "
            f"sweep decides (its page then says so, with both intervals)")


def unsure(r: PointResult, name: str) -> bool:
    """A timing shown without its interval (the speedup of k = 0 is 1 by definition)."""
    if name not in TIMINGS or getattr(r, name) is None or (name == "speedup" and r.k == 0):
        return False
    return getattr(r, f"{name}_ci_low", None) is None


def number(name: str, v: float) -> str:
    """A figure as the table prints it: tokens/s and anything from 1000 up in full to one decimal (1823.4, not
    1.82e+03), the rest to 3 significant digits (scientific only below 1e-4, which no column of a sweep holds)."""
    return f"{v:.1f}" if name == "output_tokens_per_sec" or abs(v) >= 1000 else f"{v:.3g}"


def _value(r: PointResult, name: str):
    """A column's value: a field of the row, or a latency percentile asked for beyond the row's own columns."""
    return getattr(r, name) if hasattr(r, name) else r.latency_percentiles_ms.get(name)


def _interval(r: PointResult, name: str) -> tuple[float, float] | None:
    lo, hi = getattr(r, f"{name}_ci_low", None), getattr(r, f"{name}_ci_high", None)
    return None if lo is None or hi is None else (lo, hi)


def row_label(r: PointResult) -> str:
    rate = float("inf") if r.request_rate is None and r.concurrency is not None else r.request_rate
    return GridPoint(r.mode, r.k, r.mtp_layers, r.concurrency, rate, r.context_tokens).name
