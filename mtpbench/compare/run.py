"""``mtpbench compare A B``: is B's difference from A real? From the two sweeps' saved files alone.

What differs between A and B as a whole (their drafting modes, ``--force-spec-step-idx``, the backend or
the vLLM build, ...) is what is compared; points pair on every other grid dimension (k, MTP layers,
concurrency, request rate, and the mode when both sides swept the same modes), rows on the category, and
requests on the prompt. Per metric the output gives A, B, B - A, (B - A) / A, the interval of B - A at the
level of the rows judged together (``stats.judge``: 1 - 0.05 / the rows over all prompts, another family for the
per-category rows) and one word:

* acceptance (AL, draft acceptance rate, each per-position rate): a paired bootstrap over the prompts
  both runs measured (``stats.paired_ratio_diff_ci``);
* timings (tokens/s, TTFT p50, TPOT p50): the difference of each side's geometric mean over its repeats
  (``--repeats``), a Welch t interval by the delta method on the logs (``stats.judge.timing_difference``), from 3
  each; fewer: no interval;
* speedup (each run's point against its own k = 0): each side's ratio of geometric means of the repeats,
  from 3 each, and a Welch t interval on the logs around their difference (``stats.judge.speedup_difference``),
  each side over the rounds its sweep's row read;
* timings and speedups are never shown narrower than the runs' A/A noise floors (combined,
  ``stats.judge.combined_floor``): two sweeps whose machines could not tell a k from itself within 35 % do not
  call a 10 % difference of speedups real;
* ``better`` / ``worse``: the interval excludes 0 in the metric's good / bad direction; ``within noise``:
  it holds 0; ``no interval``: the data cannot tell (no per-request data, a single repeat).

Where a metric has an interval, A, B and B - A come from the same data as the interval (acceptance: the
requests both runs made of the same prompts, pooled; timings: the geometric means of the repeats, the figures
each sweep's table shows; speedup: the ratios of geometric means), so a
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

from dataclasses import asdict
from pathlib import Path

from mtpbench.compare.checks import check_same_workload, differences, drift_notes, execution_notes
from mtpbench.compare.pair import (  # noqa: F401  (the gate: re-exported where it was)
    CompareRow,
    _key,
    _modes,
    _side,
    check_pct,
    compare_points,
    duplicate_ids,
    finish,
    exit_code,
    unjudged_beyond,
    worse_beyond,
)
from mtpbench.compare.report import write
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import GridPoint, PointResult
from mtpbench.stats.noise import line as noise_line
from mtpbench.sweep.load import load_run, read_noise


def compare(a_dir: Path, b_dir: Path, out: Path | None = None, force: bool = False) -> dict:
    """Pair the two sweeps and write the comparison into ``out`` (nothing is written on an error)."""
    a_dir, b_dir = Path(a_dir), Path(b_dir)
    loaded_a, loaded_b = load_run(a_dir), load_run(b_dir)
    with_mode = _modes(loaded_a) == _modes(loaded_b)
    a, b = _side(loaded_a, a_dir, with_mode), _side(loaded_b, b_dir, with_mode)
    check_same_workload(a.run, b.run, force)
    noise = {"a": read_noise(a_dir, *loaded_a[:2]), "b": read_noise(b_dir, *loaded_b[:2])}
    floors = tuple((noise[side] or {}).get("floor") for side in ("a", "b"))
    pending = []
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
            pending += compare_points(name, pa, pb, ra, rb, base, floors)
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
    if not pending and not failed:
        raise MtpBenchError(f"{a_dir} and {b_dir} have no points that pair (same k, MTP layers and load)")
    rows: list[CompareRow] = finish(pending)
    drift = drift_notes(rows, a.run, b.run)
    said = [f"{side.upper()}: {line}" for side, n in noise.items() if (line := noise_line(n))]
    if a_dir.resolve() == b_dir.resolve():  # allowed (a smoke test of the gate), but it measures nothing
        said.insert(0, f"A and B are the same run ({a_dir}): every difference is 0 by construction, not a finding")
    result = {"a": str(a_dir), "b": str(b_dir), "differences": differences(a.run, b.run),
              "rows": [asdict(r) for r in rows], "failed": failed, "unpaired": unpaired, "missing_in_b": missing,
              "notes": drift + execution_notes(a.run, b.run) + duplicates + said, "timings_drifted": bool(drift),
              "noise": noise}
    if out is not None:
        from mtpbench.compare.page import page
        from mtpbench.html.pages import render

        write(Path(out), result, rows)
        render(page, Path(out))
    return result


def _row_key(r: PointResult, with_mode: bool) -> tuple:
    rate = float("inf") if r.request_rate is None and r.concurrency is not None else r.request_rate
    return _key(GridPoint(r.mode, r.k, r.mtp_layers, r.concurrency, rate, r.context_tokens), with_mode)
