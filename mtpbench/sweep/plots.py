"""The sweep's PNG plots from result rows: AL, throughput and speedup, per-position acceptance, serving, context,
and the AL histogram."""

from __future__ import annotations

from pathlib import Path

from mtpbench.metrics import GridPoint, PointResult, PointRun
from mtpbench.sweep.load import sort_key
from mtpbench.sweep.table import NO_INTERVAL, row_label, unsure


def _hollow(ax, rows: list[PointResult], xs: list, name: str, color) -> bool:
    """Redraw the points of ``rows`` whose ``name`` has no interval as hollow markers; whether any was."""
    bare = [(x, getattr(r, name)) for x, r in zip(xs, rows) if unsure(r, name)]
    if bare:
        ax.plot([x for x, _ in bare], [y for _, y in bare], "o", markerfacecolor="white", color=color, zorder=3)
    return bool(bare)


def _yerr(rows: list[PointResult], name: str):
    """Error bars (distances below and above) from each row's interval; None where no row has one."""
    lows = [getattr(r, f"{name}_ci_low", None) for r in rows]
    if all(x is None for x in lows):
        return None
    highs = [getattr(r, f"{name}_ci_high", None) for r in rows]
    values = [getattr(r, name) for r in rows]
    return [[0 if lo is None or v is None else v - lo for v, lo in zip(values, lows)],
            [0 if hi is None or v is None else hi - v for v, hi in zip(values, highs)]]


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
    order = sorted(lines, key=lambda key: tuple(-1 if x is None else x for x in key[1:]) + (key[0],))
    paths = [acceptance_plot(out, rows, lines, order, plt), throughput_plot(out, rows, lines, order, plt),
             per_position_plot(out, rows, lines, order, plt)]
    if any(key[2] is not None for key in lines):
        paths.append(serving_plot(out, rows, plt))
    if any(r.position_bucket_start for r in rows if r.k > 0) or any(key[4] is not None for key in lines):
        paths.append(context_plot(out, rows, plt))
    return paths


def _ks(lines: dict[tuple, list[PointResult]]) -> list[int]:
    return sorted({r.k for pts in lines.values() for r in pts})


def acceptance_plot(out: Path, rows: list[PointResult], lines: dict[tuple, list[PointResult]], order: list[tuple],
                    plt) -> Path:
    """AL vs k, one line per ``_lines`` key in ``order``, with the k + 1 upper bound."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in order:
        pts = lines[key]
        ax.errorbar([r.k for r in pts], [r.acceptance_length for r in pts], yerr=_yerr(pts, "acceptance_length"),
                    marker="o", capsize=3, label=_line_label(*key))
    ks = _ks(lines)
    ax.plot(ks, [k + 1 for k in ks], ":", color="grey", label="upper bound k+1")
    ax.set(xlabel="num_speculative_tokens k", ylabel="acceptance length",
           title="Acceptance length vs k (bars: 95 % CI over prompts)", xticks=ks)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out / "acceptance_length.png", plt, rows)


def throughput_plot(out: Path, rows: list[PointResult], lines: dict[tuple, list[PointResult]], order: list[tuple],
                    plt) -> Path:
    """Tokens/s vs k, and the measured and theoretical speedup vs k; hollow markers where there is no interval."""
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
    clipped = [clip_whiskers(a, [r.output_tokens_per_sec for key in order for r in lines[key]]) for a in (a1,)]
    clipped += [clip_whiskers(a2, [r.speedup for key in order for r in lines[key]] +
                              [r.theoretical_speedup for key in order for r in lines[key]])]
    a1.set(xlabel="k", ylabel="output tokens/sec", title="Throughput")
    a2.set(xlabel="k", ylabel="speedup vs k=0", title="Speedup (dashed: (1-a^(k+1))/((1-a)(kc+1)))")
    for a in (a1, a2):
        a.set_xticks(_ks(lines))
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    said = (["hollow markers: " + NO_INTERVAL] if any(bare) else []) + \
        (["a triangle at the edge: an interval that runs past the axis (every end is in the table)"] if any(clipped)
         else [])
    if said:
        fig.suptitle("\n".join(said), fontsize=7)
    return _save(fig, out / "throughput.png", plt, rows)


def clip_whiskers(ax, values: list) -> bool:
    """Axis limits that show the points, not the widest interval: the points' range with a margin of at least
    half of it (and 5 % of the largest); an interval running past an edge is cut there and marked by a triangle
    at that edge. Whether any was."""
    vs = [v for v in values if v is not None]
    if not vs:
        return False
    lo, hi = min(vs), max(vs)
    pad = max((hi - lo) / 2, 0.05 * max(abs(lo), abs(hi)), 1e-9)
    bottom, top = lo - pad, hi + pad
    cut = False
    for line in ax.get_lines():  # the whiskers' ends are the caps: a cap beyond an edge marks it
        xs, ys = line.get_xdata(), line.get_ydata()
        if line.get_marker() != "_" or not len(ys):
            continue
        for x, y in zip(xs, ys):
            if y > top or y < bottom:
                cut = True
                ax.plot([x], [top if y > top else bottom], marker="^" if y > top else "v", color=line.get_color(),
                        markersize=6, clip_on=False, zorder=5)
    ax.set_ylim(bottom, top)
    return cut


def per_position_plot(out: Path, rows: list[PointResult], lines: dict[tuple, list[PointResult]], order: list[tuple],
                      plt) -> Path:
    """The joint acceptance rate per draft position of each line's largest k, as grouped bars."""
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
    return _save(fig, out / "per_position.png", plt, rows)


def context_plot(out: Path, rows: list[PointResult], plt) -> Path:
    """AL vs the context before the prompt (the --context-tokens dimension), and AL vs the position in the
    sequence where the drafts were verified (inside every run, from per-request data)."""
    ok = [r for r in rows if r.status == "ok" and r.category == "all" and r.k > 0]
    with_context = any(r.context_tokens is not None for r in ok)
    with_position = any(r.position_bucket_start for r in ok)
    if with_context and with_position:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    else:  # one panel only: never an empty one beside it
        fig, ax = plt.subplots(figsize=(11, 4))
        a1, a2 = (ax, None) if with_context else (None, ax)
    groups = sorted({(r.mode, r.mtp_layers, r.k, r.concurrency, r.request_rate) for r in ok},
                    key=lambda x: tuple(-1 if v is None else v for v in x[1:]) + (x[0],))
    for mode, L, k, c, rate in groups:
        pts = sorted((r for r in ok if (r.mode, r.mtp_layers, r.k, r.concurrency, r.request_rate) == (mode, L, k, c, rate)
                      and r.context_tokens is not None), key=lambda r: r.context_tokens)
        if pts and a1 is not None:
            a1.errorbar([r.context_tokens_actual for r in pts], [r.acceptance_length for r in pts], capsize=3,
                        yerr=_yerr(pts, "acceptance_length"), marker="o",
                        label=_line_label(mode, L, c, rate) + f", k={k}")
    for r in ok:
        if r.position_bucket_start and a2 is not None:
            err = [[0 if lo is None else v - lo for v, lo in zip(r.acceptance_length_by_position,
                                                                r.acceptance_length_by_position_ci_low)],
                   [0 if hi is None else hi - v for v, hi in zip(r.acceptance_length_by_position,
                                                                r.acceptance_length_by_position_ci_high)]]
            a2.errorbar(r.position_bucket_start, r.acceptance_length_by_position, yerr=err, capsize=2,
                        marker=".", label=row_label(r))
    if a1 is not None:
        a1.set(xlabel="tokens of held-out text before the prompt (actual)", ylabel="acceptance length",
               title="AL vs context length (--context-tokens)")
    if a2 is not None:
        a2.set(xlabel="sequence position when the drafts were verified (bucket start)", ylabel="acceptance length",
               title="AL vs position inside each run")
    for a in (x for x in (a1, a2) if x is not None):
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
        # a load at which the server drafted nothing (a dynamic schedule's k = 0 range) has no AL to draw
        pts = sorted((r for r in ok if (r.k, r.mtp_layers, r.request_rate) == (k, L, rate)
                      and r.acceptance_length is not None), key=lambda r: r.concurrency)
        if not pts:
            continue
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
        if a.get_legend_handles_labels()[0]:
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


def histogram_panels(points: list[dict], rows: list[PointResult]) -> list[tuple[GridPoint, list[float], float | None]]:
    """Per drafting point: its requests' own acceptance lengths, and the AL the table reports for it
    (1 + accepted / drafts pooled: not the mean of the per-request ALs, which weighs a short request
    like a long one)."""
    reported = {row_label(r): r.acceptance_length for r in rows if r.category == "all" and r.status == "ok"}
    out = []
    for d in sorted(points, key=lambda d: sort_key(d["point"])):
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
    fig, axes = plt.subplots(rows_n, cols, figsize=(11, 3.2 * rows_n), squeeze=False)  # the page's full width
    for ax, (point, als, al) in zip(axes.flat, per_point):
        ax.hist(als, bins=min(20, max(5, len(als) // 2)), range=(1, point.k + 1), color="tab:blue", alpha=0.8)
        if al is not None:
            ax.axvline(al, color="black", lw=1, label=f"AL {al:.3g}")
            ax.legend(fontsize=7)
        ax.set(title=f"{point.name} ({len(als)} requests)", xlabel="acceptance length per request (line: AL)",
               ylabel="requests")
        ax.title.set_fontsize(9)
    for ax in list(axes.flat)[len(per_point):]:
        ax.axis("off")
    return _save(fig, out / "al_histogram.png", plt, rows)
