"""Sweep directories read back as ``tune``'s measured points: one ``Measured`` per (load, k), where the load is
an offline sweep's batch size (one sweep per batch size) or a served point's concurrency; with the checks that
make a set of sweeps something a k can be chosen from (one line each, before anything is written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mtpbench.backend_info import info
from mtpbench.errors import MtpBenchError
from mtpbench.sweep.load import aa_runs, judge_of, load_run
from mtpbench.tune.model import Measured

MIN_REPEATS = 3  # the fewest timed repeats per point from which a ratio of tokens/s has an interval


@dataclass
class Sweeps:
    """The measured points of a tune and what they were measured with."""

    points: list[Measured]
    backend: str
    unit: str  # "batch" (offline: tune's --batch-sizes) or "concurrency" (served)
    mode: str | None
    mtp_layers: int | None
    dirs: list[str]
    run: dict  # the first sweep's run.json: config, provenance, engine
    failed: list[str] = field(default_factory=list)  # "<dir>/<point>: error" of points that failed


def sweep_dirs(paths) -> list[Path]:
    """Each path is a sweep directory (it holds run.json) or holds sweeps one or two levels down (a tune's
    ``sweeps/``); a validation's sweeps are never read as measurements."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "run.json").is_file():
            found.append(p)
            continue
        if not p.is_dir():
            raise MtpBenchError(f"{p}: no such directory")
        below = sorted(r.parent for pattern in ("*/run.json", "*/*/run.json") for r in p.glob(pattern)
                       if "validate" not in r.relative_to(p).parts)
        if not below:
            raise MtpBenchError(f"{p} holds no sweep (no run.json in it or its subdirectories)")
        found += below
    return found


def read_sweeps(paths, mode: str | None = None) -> Sweeps:
    dirs = sweep_dirs(paths)
    points: dict[tuple[int, int], tuple[Measured, Path]] = {}
    first, backends, modes, layers, failed = None, set(), set(), set(), []
    for d in dirs:
        run, saved, failures = load_run(d)
        found = aa_runs(d, run, saved)
        family, looks = judge_of(run, saved, failures)
        first = first or run
        backend = run["config"]["backend"]
        backends.add(backend)
        failed += [f"{d}/{f['point'].get('k')}: {f.get('error', '')[:200]}" for f in failures]
        for data in saved:
            p = data["point"]
            if p.get("context_tokens") is not None or p.get("request_rate") is not None:
                raise MtpBenchError(f"{d}: tune measures closed-loop load without context (this sweep has "
                                    f"--context-tokens or --request-rate)")
            if p["k"] > 0:
                modes.add(p["mode"])
                layers.add(p["mtp_layers"])
            load = p["concurrency"] if info(backend).served else run["config"]["batch_size"]
            m = measured(d, data, load)
            m.looks, m.noise, m.sweep_family, m.sweep = looks, found[1:] if found else None, family, str(d)
            key = (m.load, m.k, p["mode"] if p["k"] else "plain", p["mtp_layers"])
            if key in points:
                raise MtpBenchError(f"two sweeps measure {load_unit(backend)} {load} at k = {m.k}: "
                                    f"{points[key][1]} and {d}")
            points[key] = (m, d)
    if len(backends) > 1:
        raise MtpBenchError(f"the sweeps come from different backends ({', '.join(sorted(backends))})")
    if not points:
        raise MtpBenchError(f"{', '.join(map(str, dirs))}: no measured point")
    backend = backends.pop()
    mode = pick(mode, modes, "mode", "--mode")
    L = pick(None, layers, "MTP layer count", "--mtp-layers") if len(layers) > 1 else next(iter(layers), None)
    chosen = [m for (b, k, md, lay), (m, _) in points.items() if k == 0 or (md == mode and lay == L)]
    sweeps = Sweeps(sorted(chosen, key=lambda m: (m.load, m.k)), backend, load_unit(backend), mode, L,
                    list(map(str, dirs)), first, failed)
    check(sweeps)
    return sweeps


def pick(asked, found: set, what: str, option: str):
    if asked is not None:
        if asked not in found:
            raise MtpBenchError(f"{option} {asked}: the sweeps have {what} {', '.join(map(str, sorted(found)))}")
        return asked
    if len(found) > 1:
        raise MtpBenchError(f"the sweeps have several values of {what} ({', '.join(map(str, sorted(found)))}): "
                            f"pick one with {option}")
    return next(iter(found), None)


def load_unit(backend: str) -> str:
    return "concurrency" if info(backend).served else "batch"


def measured(d: Path, data: dict, load: int) -> Measured:
    """One point file as a ``Measured``: its repeats' tokens/s and its batches' counters."""
    p = data["point"]
    tokps = [r.get("output_tokens_per_sec") for r in data.get("repeats") or []]
    if not tokps or any(t is None for t in tokps):
        raise MtpBenchError(f"{d}: point k = {p['k']} has no timings (an engine whose timings are left null, "
                            f"e.g. V2 through Triton's interpreter): tune needs timed points")
    k = p["k"]
    per_pos = [0] * k
    for b in data.get("batches") or []:
        for i, n in enumerate((b.get("num_accepted_tokens_per_pos") or [])[:k]):
            per_pos[i] += n or 0
    drafts = sum(b.get("num_drafts") or 0 for b in data.get("batches") or [])
    return Measured(load, k, tokps, drafts, per_pos, data.get("repeats") or [])


def check(s: Sweeps) -> None:
    """What makes the points something to choose k from: several loads, k = 0 and a k > 0 at each, repeats."""
    loads = sorted({m.load for m in s.points})
    where = ", ".join(s.dirs) if len(s.dirs) < 4 else f"{s.dirs[0]} and {len(s.dirs) - 1} more"
    if len(loads) < 2:
        flag = "--max-concurrency" if s.unit == "concurrency" else "--batch-sizes"
        raise MtpBenchError(f"{where}: covers one load only ({s.unit} {loads[0]}); tune chooses k across loads "
                            f"(run it with {flag} 1,2,4,8, or give sweeps at several)")
    for b in loads:
        ks = {m.k for m in s.points if m.load == b}
        if 0 not in ks:
            raise MtpBenchError(f"{where}: no k = 0 point at {s.unit} {b}; tune measures every k against plain "
                                f"decoding at the same load")
    if not any(m.k > 0 for m in s.points):
        raise MtpBenchError(f"{where}: no k > 0 point: nothing drafted, nothing to choose")
    if not any(m.k > 0 and m.num_drafts for m in s.points):
        raise MtpBenchError(f"{where}: no k > 0 point drafted (num_drafts 0 at every k > 0: the engine counted no "
                            f"drafts); tune fits each k's cost from its drafts")
    few = [m for m in s.points if len(m.tokps) < MIN_REPEATS]
    if few:
        raise MtpBenchError(f"{where}: {len(few[0].tokps)} timed repeat(s) at {s.unit} {few[0].load}, k = {few[0].k};"
                            f" tune needs {MIN_REPEATS} per point to tell k apart beyond noise (--repeats "
                            f"{MIN_REPEATS})")
