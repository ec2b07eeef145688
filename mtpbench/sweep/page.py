"""A sweep's report.html, from summary.json and the plots: the best k and its speedup with its interval first,
then the figures, the whole table (every number a figure shows) and the provenance."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mtpbench.html.document import document, esc, figure, provenance, table, write
from mtpbench.html.law import law_section
from mtpbench.environment import load_change
from mtpbench.stats.intervals import MIN_REPEATS_RATIO
from mtpbench.stats.judge import end_text, interval_text, level_text
from mtpbench.stats.noise import line as noise_line

FIGURES = [("acceptance_length.png", "Acceptance length against k, with 95 % intervals", False),
           ("per_position.png", "Acceptance rate at each draft position (joint), with 95 % intervals", False),
           ("throughput.png", "Tokens/s and speedup against k, with the theory overlay", True),
           ("serving.png", "Served runs: throughput and latency against load", True),
           ("acceptance_vs_context.png", "Acceptance against context length, and against the position in each run",
            True),
           ("al_histogram.png", "Acceptance length per request", True)]


def label(r: dict) -> str:
    parts = ["plain decoding" if r["k"] == 0 else f"{r['mode']} k = {r['k']}"]
    if r["k"] and r.get("mtp_layers"):
        parts.append(f"{r['mtp_layers']} MTP layer{'s' if r['mtp_layers'] > 1 else ''}")
    if r.get("concurrency") is not None:
        parts.append(f"concurrency {r['concurrency']}")
    if r.get("context_tokens") is not None:
        parts.append(f"context {r['context_tokens']}")
    return ", ".join(parts)


def _interval(r: dict) -> tuple[float, float] | None:
    lo, hi = r.get("speedup_ci_low"), r.get("speedup_ci_high")
    return None if lo is None or hi is None else (lo, hi)


def _speed(r: dict, words: str = "") -> str:
    """A point's speedup as the headline shows it: "1.15x [99.17 %: 0.80 to 1.50]" (``words`` after the "x"), the
    interval at the level its decision was made at, or with "(no interval)"."""
    ci = _interval(r)
    x = end_text(r["speedup"], 1.0, 2, "f")
    if ci is None:
        return f"{x}x{words} (no interval)"
    lo, hi = (end_text(v, 1.0, 2, "f") for v in ci)
    return f"{x}x{words} [{level_text(r.get('speedup_level') or 0.95)}: {lo} to {hi}]"


PLAIN = " the speed of plain decoding"


def _al(r: dict) -> str:
    return "" if r.get("acceptance_length") is None else f", acceptance length {r['acceptance_length']:.2f}"


def _timed(timed: list[dict]) -> tuple[str, str]:
    """The headline over points with a speedup (see ``headline``)."""
    top = max(timed, key=lambda r: r["speedup"])
    faster = [r for r in timed if r.get("speedup_decision") == "faster"]
    if faster:
        b = max(faster, key=lambda r: r["speedup"])
        text = (f"Best: {label(b)} at {_speed(b, PLAIN)}{_al(b)}; faster than plain decoding "
                f"beyond noise at {len(faster)} of {len(timed)} timed points: {'; '.join(map(label, faster))}.")
        if top["speedup"] > b["speedup"]:
            text += f" {label(top)} has the highest speedup, {_speed(top)}, but is not faster beyond noise."
        return text, "good"
    if all(r.get("speedup_decision") == "slower" for r in timed):
        return (f"Drafting is slower here: every drafting point runs below plain decoding beyond noise; the highest "
                f"speedup, {label(top)}, runs at {_speed(top)}.", "bad")
    bare = [r for r in timed if r.get("speedup_decision") is None]
    if len(bare) == len(timed):  # nothing judged: what was measured, never "Best" (it may be below plain decoding)
        return (f"Not judged: no drafting point has an interval (a speedup needs {MIN_REPEATS_RATIO} repeats a side: "
                f"--repeats {MIN_REPEATS_RATIO} judges it); the highest speedup measured is {label(top)} at "
                f"{_speed(top, PLAIN)}{_al(top)}.", "plain")
    return (f"No k is faster than plain decoding beyond noise: the highest speedup, {label(top)}, runs at "
            f"{_speed(top)}{_al(top)}" + (f"; {len(bare)} of {len(timed)} timed points have no interval"
                                          if bare else "") + ".", "warn")


def headline(rows: list[dict]) -> tuple[str, str]:
    """(the answer in a sentence, its tone) from the rows of all prompts. Only finished drafting points count
    (status ok, k > 0); a point is faster (slower) than plain decoding beyond noise where its row's decision
    (``speedup_decision``, stats.judge: its interval at the sweep's level lies wholly above (below) 1) says so:
    the headline reads the row, never an interval of its own. Over the points with a speedup:

    * some point is faster beyond noise: "Best:" the fastest of those, every such point named, and the point of
      the highest speedup if it is not one of them (good);
    * every point is slower beyond noise: "Drafting is slower here" (bad);
    * no point has a decision (no interval): "Not judged", what would judge it, and the highest speedup measured,
      "(no interval)" (plain): never "Best", which a point below plain decoding could otherwise be called;
    * else: "No k is faster than plain decoding beyond noise", the highest speedup, and how many points have no interval
      (warn).

    Without any speedup: the highest acceptance length, or that nothing was drafted (plain); no drafting point
    finished: bad."""
    ok = [r for r in rows if r["status"] == "ok" and r["k"] > 0]
    timed = [r for r in ok if r.get("speedup") is not None]
    if timed:
        return _timed(timed)
    drafted = [r for r in ok if r.get("acceptance_length") is not None]
    if drafted:
        b = max(drafted, key=lambda r: r["acceptance_length"])
        return (f"Acceptance length peaks at {b['acceptance_length']:.2f} ({label(b)}); no speedup: no timings, or "
                f"no k = 0 point beside it (an engine whose timings are left null, e.g. V2 through Triton's "
                f"interpreter, or a sweep without --k 0).", "plain")
    if ok:
        return (f"Nothing was drafted at {', '.join(label(r) for r in ok)} (e.g. a batch-size schedule that gives "
                f"this load k = 0).", "plain")
    return "No drafting point finished: see the failed points below.", "bad"


def answer(summary: dict) -> tuple[str, str]:
    """The sweep's answer in a sentence and its tone, from its summary.json: what report.html's headline and the
    terminal's first line both print. Where the machine's noise drowns every difference (``drowned``), that,
    never a ranking; else ``headline`` over the rows of all prompts."""
    rows = [r for r in summary["rows"] if r["category"] == "all"]
    said = drowned(rows, summary.get("noise"), summary.get("provenance") or {})
    text, tone = (said, "bad") if said else headline(rows)
    if summary.get("partial"):  # issue 56: a folder with holes says so first
        from mtpbench.sweep.load import partial_text

        said = partial_text(summary["partial"])
        text, tone = f"{said[0].upper()}{said[1:]}. {text}", ("bad" if tone == "bad" else "warn")
    return text, tone


def drowned(rows: list[dict], noise: dict | None, prov: dict) -> str | None:
    """Where nothing can be told apart: the sweep timed an A/A control (k = 0 against itself), no drafting point
    is decided, and every timed drafting point's speedup s lies within its floor f (|log s| <= f: no interval,
    at any level, excludes 1 there). Says so, the floor, the speedups' range, the machine's load and what to do
    (None: the noise leaves something to tell)."""
    floor = (noise or {}).get("floor")
    timed = [r for r in rows if r["status"] == "ok" and r["k"] > 0 and r.get("speedup")]
    if floor is None or not timed or any(r.get("speedup_decision") in ("faster", "slower") for r in timed):
        return None
    if any(abs(math.log(r["speedup"])) > floor for r in timed):
        return None
    xs = sorted(r["speedup"] for r in timed)
    span = f"{xs[0]:.2f}x" if f"{xs[0]:.2f}" == f"{xs[-1]:.2f}" else f"{xs[0]:.2f}x to {xs[-1]:.2f}x"
    load, cores = prov.get("load_average"), (prov.get("hardware") or {}).get("cpus_usable")
    where = (f" The load average was {load[0]:.2f}" + (f" on {cores} usable cores" if cores else "") + "."
             if load else "")
    return (f"Nothing can be told apart here: two identical runs of plain decoding (the A/A control) differ by up "
            f"to {noise['floor_pct']:.1f} %, at least as much as any drafting point differs from plain decoding "
            f"({span}).{where} Stop other work and run again; more rounds (--max-repeats) narrow it only on a "
            f"steady machine.")


def _ci(r: dict, name: str, nd: int = 2, null: float | None = None) -> str:
    """A value and its interval, to ``nd`` decimals (an interval that excludes ``null`` never printed touching it)."""
    v, lo, hi = r.get(name), r.get(f"{name}_ci_low"), r.get(f"{name}_ci_high")
    if v is None:
        return "-"
    if lo is None or hi is None:  # a figure without its interval says so (the note under the table)
        by_definition = r.get("k") == 0 and name in ("speedup", "acceptance_length")  # 1 at k = 0: no interval due
        return f"{v:.{nd}f}" + ("*" if name in MARKED and not by_definition else "")
    if null is None:
        return f"{v:.{nd}f} [{lo:.{nd}f}, {hi:.{nd}f}]"
    return f"{v:.{nd}f} {interval_text(lo, hi, null, nd, 'f')}"


def _positions(r: dict) -> str:
    lo, hi = r.get("acceptance_rate_per_pos_ci_low") or (), r.get("acceptance_rate_per_pos_ci_high") or ()
    out = []
    for i, v in enumerate(r.get("acceptance_rate_per_pos") or ()):
        if v is None:
            out.append("-")
        elif i < len(lo) and lo[i] is not None:
            out.append(f"{v:.2f} [{lo[i]:.2f}, {hi[i]:.2f}]")
        else:
            out.append(f"{v:.2f}")
    return "; ".join(out)


# the figures whose missing interval is marked with "*" (too few prompts or timed runs to give one)
MARKED = ("acceptance_length", "output_tokens_per_sec", "speedup", "ttft_ms_p50", "tpot_ms_p50")
# the page's first table fits a 1280 px window: these columns; every column is in the table under "All columns"
COMPACT = ("point", "AL [95 %]", "tokens/s [95 %]", "speedup", "TPOT p50 ms", "status")
NO_INTERVAL_NOTE = ("* no interval: too few prompts (AL) or timed runs (tokens/s, speedup, TTFT, TPOT) to give one "
                    "(--repeats 3 gives speedup intervals, 6 the timings')")


def rows_table(rows: list[dict], compact: bool = False) -> str:
    """The rows as a table: every column, or (``compact``) those of ``COMPACT``; a note under it where a figure
    is shown without its interval."""
    levels = sorted({r["speedup_level"] for r in rows if r.get("speedup_level")})
    at = " / ".join(level_text(x) for x in levels) or "95 %"
    headers = ["point", "category", "runner", "AL [95 %]", "acceptance per position (joint) [95 %]", "alpha",
               "tokens/s [95 %]", f"speedup [{at}]", "theory", "TTFT p50 ms", "TPOT p50 ms", "=k0", "status"]
    body = [[label(r), r["category"], r.get("runner") or "-", _ci(r, "acceptance_length"), _positions(r),
             "-" if r.get("alpha") is None else f"{r['alpha']:.3f}", _ci(r, "output_tokens_per_sec", 1),
             _ci(r, "speedup", 3, 1.0) + (f" {r['speedup_decision']}, n = {r['num_repeats']}"
                                          if r.get("speedup_decision") else ""), "-" if r.get("theoretical_speedup") is None else f"{r['theoretical_speedup']:.3f}",
             _ci(r, "ttft_ms_p50", 1), _ci(r, "tpot_ms_p50", 2),
             "-" if r.get("greedy_match_k0") is None else f"{r['greedy_match_k0']:.2f}",
             r["status"] + (f": {r['error']}" if r.get("error") else "")] for r in rows]
    if compact:
        keep = [i for i, h in enumerate(headers) if h.split(" [")[0] in [c.split(" [")[0] for c in COMPACT]]
        headers, body = [headers[i] for i in keep], [[row[i] for i in keep] for row in body]
    marked = any(str(c).endswith("*") or "* " in str(c) for row in body for c in row)
    return table(headers, body) + (f'<p class="note">{esc(NO_INTERVAL_NOTE)}</p>' if marked else "")


def law_tables(blocks: list[dict]) -> str:
    """--law: each k > 0 point's acceptance against its law (summary.json's ``acceptance_law``, from the point
    files), a table a point as trace-layers' page shows it; nothing without --law."""
    if not blocks:
        return ""
    return ("<h2>Acceptance against its law</h2><p>Read in an untimed pass over each point's prompts after its "
            "timed runs (--law).</p>" + "".join(law_section(b, label(b["point"]), 3) for b in blocks))


def page(out: Path) -> Path:
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["rows"]
    every = [r for r in rows if r["category"] == "all"]
    first, tone = answer(summary)
    cfg = summary.get("config") or {}
    figs = '<div class="figs">' + "".join(figure(out / n, caption, wide) for n, caption, wide in FIGURES) + "</div>"
    notes = sorted({f"{label(r)}: {r['notes']}" for r in every if r.get("notes")})
    said = [x for x in [noise_line(summary.get("noise"))] + load_change(summary.get("provenance") or {}) if x]
    body = (f"<h2>Figures</h2>{figs}<h2>All prompts</h2>{rows_table(every, compact=True)}"
            + f"<details><summary>All columns</summary>{rows_table(every)}</details>"
            + "".join(f'<p class="note">{esc(x)}</p>' for x in said)
            + law_tables(summary.get("acceptance_law") or [])
            + (f"<h2>By category</h2>{rows_table([r for r in rows if r['category'] != 'all'])}"
               if len(every) < len(rows) else "")
            + ("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else "")
            + provenance(summary.get("provenance"), {"fingerprint": json.dumps(summary.get("fingerprint"))[:2000]}))
    sub = (f"{cfg.get('model')} on {cfg.get('backend')}: k {cfg.get('k')}, {cfg.get('num_prompts') or 'default'} "
           f"prompts of {cfg.get('prompts')}, {cfg.get('max_tokens')} tokens, temperature {cfg.get('temperature')}, "
           f"batch {cfg.get('batch_size')}, {repeats_text(cfg)}.")
    return write(out / "report.html", document(f"mtpbench sweep: {out.name}", "sweep", first, tone, body, sub))


def repeats_text(cfg: dict) -> str:
    most = cfg.get("max_repeats") or cfg.get("repeats")
    if most and most > (cfg.get("repeats") or 1):
        return f"{cfg.get('repeats')} to {most} repeats, a point stopping once decided"
    return f"{cfg.get('repeats')} repeat(s)"
