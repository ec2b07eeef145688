"""``mtpbench trace-matrix``: every MTP architecture the installed vLLM can run here x {as vLLM drafts,
with ``--force-spec-step-idx``}, one verdict per cell.

Each architecture gets its synthetic checkpoint (``mtpbench.synth``, cached) and one engine in a worker
process (the vLLM backend's ``inspect``), which loads it under ``mtpbench.load_check``, traces a short
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.matrix.cells import DRAFTING, INTERRUPTED, Cell, cells_for
from mtpbench.matrix.report import write_matrix


class MatrixInterrupted(KeyboardInterrupt):
    """Ctrl-C during a matrix: the engines are stopped and the partial matrix is written."""

    def __init__(self, finished: int, total: int):
        super().__init__(f"interrupted after {finished} of {total} architectures")
        self.finished, self.total = finished, total


def run_arch(arch, k: int | None, max_tokens: int, cpus: list[int] | None, workers=None, runner: str | None = None,
             layout: dict | None = None) -> list[Cell]:
    """Build (or reuse), start, load-check and trace one architecture on one vLLM model runner (None: the
    one vLLM picks here), through the vLLM backend's ``inspect``; failures become cells. ``cpus``: one core a rank
    for the engine's threads (None: vLLM's or mtpbench's own binding); ``layout``: the parallel layout
    (``SweepConfig.parallel_layout``'s keys), every rank traced and load-checked; ``workers``: a
    ``procguard.Workers`` that can stop this architecture's engines (Ctrl-C)."""
    from mtpbench.backends import get_backend
    from mtpbench.checkpoint import drafter_layers, mtp_layer_bytes, num_hidden_layers, num_mtp_layers, one_k_for, read_config
    from mtpbench.config import SweepConfig, check_parallel_layout
    from mtpbench.prompts import prompt_set
    from mtpbench.runners import resolve
    from mtpbench.synth import cached

    runner = resolve(runner)
    L = arch.mtp_layers
    k = k or one_k_for(L)
    try:
        model = cached(arch)
    except Exception as e:  # a builder that fails is a cell, not a failed command
        return cells_for(arch, k, L, None, f"{type(e).__name__}: {e}"[:2000], "build failed", runner=runner)
    mtp_dir = model / "draft" if arch.separate_draft else model
    declared = drafter_layers(mtp_dir) if arch.separate_draft else num_mtp_layers(mtp_dir)
    prompts = prompt_set("builtin", 1, model, "none").prompts
    # the engine a `trace-layers --synthetic` run would start, with the same speculative config
    cfg = SweepConfig(model=str(model), backend="vllm", method=arch.method, dtype="bfloat16", max_model_len=512,
                      max_tokens=max_tokens, draft_model=str(mtp_dir) if arch.separate_draft else None,
                      engine_args={**arch.engine_args, "enforce_eager": True}, runner=runner, **(layout or {}))
    try:
        check_parallel_layout(cfg)  # heads or KV heads that do not divide: vLLM's refusal, in one line
    except MtpBenchError as e:
        return cells_for(arch, k, declared, None, str(e), "did not start", runner=runner)
    try:
        data = get_backend("vllm").inspect(cfg, k, prompts, [d == "forced" for d in DRAFTING], cpus=cpus,
                                           workers=workers)
    except Exception as e:  # RuntimeError from the worker, or a result that cannot be read
        return cells_for(arch, k, declared, None, f"{type(e).__name__}: {e}"[:2000], "did not start", runner=runner)
    data["layer_bytes"] = mtp_layer_bytes(mtp_dir, drafter=arch.separate_draft)
    hidden = num_hidden_layers(read_config(mtp_dir))
    return cells_for(arch, k, declared, data, "", "", hidden, runner)


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


def _checked_names(names: list[str] | None, table: dict, k: int | None, jobs: int | None, max_tokens: int) -> list[str]:
    """The architectures asked for (all by default), after checking every argument a user gave."""
    names = names or sorted(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise MtpBenchError(f"unknown architecture(s) {', '.join(unknown)}: choose from {', '.join(sorted(table))}")
    if k is not None and k < 1:
        raise MtpBenchError(f"--num-speculative-tokens must be >= 1, got {k}")
    if jobs is not None and jobs < 1:
        raise MtpBenchError(f"--jobs must be >= 1, got {jobs}")
    if max_tokens < 1:
        raise MtpBenchError(f"--max-tokens must be >= 1, got {max_tokens}")
    return names


def _failed(arch, k: int | None, runner: str | None, error: str, verdict: str) -> list[Cell]:
    """The cells of an architecture that produced no trace (``verdict`` says why, ``error`` what was raised)."""
    from mtpbench.checkpoint import one_k_for

    return cells_for(arch, k or one_k_for(arch.mtp_layers), arch.mtp_layers, None, error, verdict, runner=runner)


def _sharding(layout: dict | None, jobs: int | None) -> tuple[dict, int, int]:
    """The layout's given entries (checked as sweep checks them: one line for a size below 1, an unknown executor,
    offline data parallel), the ranks of each engine, and the engines side by side: a core a rank, so at most the
    cores divided by the ranks when sharded."""
    from mtpbench.config import SweepConfig, validate_serving

    layout = {key: value for key, value in (layout or {}).items() if value is not None}
    validate_serving(SweepConfig(backend="vllm", **layout))
    ranks = (layout.get("tensor_parallel_size") or 1) * (layout.get("pipeline_parallel_size") or 1)
    fit = max(1, len(usable_cpus()) // ranks)
    return layout, ranks, min(jobs, fit) if jobs and ranks > 1 else jobs or max(1, default_jobs() // ranks)


def run_matrix(names: list[str] | None, out: Path, k: int | None = None, jobs: int | None = None,
               max_tokens: int = 12, on_cell=None, runners: list[str | None] = (None,),
               layout: dict | None = None) -> list[Cell]:
    """Every named architecture's cells on every runner (None: the one vLLM picks here), written to ``out``.
    ``layout``: every engine's parallel layout (tensor parallel: each engine takes a core a rank). Ctrl-C stops
    the engines, writes the architectures that finished (the rest ``interrupted``) and raises
    ``MatrixInterrupted``."""
    from mtpbench.files import check_writable
    from mtpbench.environment import require_vllm
    from mtpbench.procguard import Workers
    from mtpbench.runners import resolve
    from mtpbench.synth import archs

    version = require_vllm()
    table = archs()
    names = _checked_names(names, table, k, jobs, max_tokens)
    runners = list(dict.fromkeys(resolve(r) for r in runners))  # decided here, before any engine has a shim
    layout, ranks, jobs = _sharding(layout, jobs)
    out = Path(out)
    check_writable(out)
    t0 = time.perf_counter()
    free = usable_cpus()
    lock = threading.Lock()
    workers = Workers()
    # the slowest first (V2 on a CPU runs Triton's interpreter), so the pool does not end on a long one
    tasks = sorted(((n, r) for n in names for r in runners), key=lambda t: (t[1] != "v2", names.index(t[0])))

    def one(name: str, runner: str) -> list[Cell]:
        with lock:  # side by side: a core a rank, taken from the free ones
            cpus = [free.pop(0) for _ in range(ranks)] if jobs > 1 and len(free) >= ranks else None
        try:
            cells = run_arch(table[name], k, max_tokens, cpus, workers, runner, layout)
        except Exception as e:  # whatever else goes wrong with one architecture is its cells, not the matrix's
            cells = _failed(table[name], k, runner, f"{type(e).__name__}: {e}"[:2000], "did not start")
        finally:
            if cpus is not None:
                with lock:
                    free.extend(cpus)
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
        cells = [c for (n, r) in order for c in done.get((n, r)) or _failed(table[n], k, r, "", INTERRUPTED)]
        write_matrix(out, cells, version, time.perf_counter() - t0, jobs, interrupted=True, layout=layout)
        raise MatrixInterrupted(sum(all((n, r) in done for r in runners) for n in names), len(names)) from None
    pool.shutdown()
    cells = [c for t in order for c in results[t]]
    write_matrix(out, cells, version, time.perf_counter() - t0, jobs, layout=layout)
    return cells
