"""``mtpbench tune``: the k to run at every load, measured, chosen, predicted and (``--validate``) proven.

A tune directory::

    tune.json        the tune's settings, its answer (``analyse``) and the validation
    schedule.json    the schedule alone: vLLM's ranges and the ready ``--speculative-config`` object
    tune.md / tune.csv / tune.png   rebuilt from the sweeps by ``mtpbench report``
    sweeps/b<B>/     offline backends: one ordinary sweep per batch size B
    sweeps/served/   a launched server: one sweep over every concurrency (server-<i>/: attached servers)
    validate/...     --validate's sweeps: the schedule beside the best fixed k

Every sweep is an ordinary sweep directory: ``report`` and ``compare`` read it, and an interrupted tune resumes
where it stopped (its measured points are kept).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from mtpbench.backend_info import info
from mtpbench.config import SweepConfig
from mtpbench.errors import MtpBenchError
from mtpbench.files import make_out_dir, write_json
from mtpbench.tune.budget import budget_share, round_cost
from mtpbench.tune.points import MIN_REPEATS, read_sweeps

DEFAULT_LOADS = {"batch": (1, 2, 4, 8, 16), "concurrency": (1, 2, 4, 8)}


@dataclass(frozen=True)
class TuneConfig:
    sweep: SweepConfig  # what every sweep runs (its batch size or concurrency set per load)
    loads: tuple[int, ...] = ()  # batch sizes (offline) or concurrencies (served); (): DEFAULT_LOADS
    out: str = "tune"
    sources: tuple[str, ...] = ()  # --from: sweep directories to read instead of running sweeps
    servers: tuple[str, ...] = ()  # attached servers (one must run without drafting: the k = 0 baseline)
    mode: str | None = None  # the drafting mode chosen for (a native sweep runs one)
    validate: bool = False
    schedule: tuple | None = None  # --schedule: validate these ranges instead of the chosen ones
    goodput: dict | None = None  # --goodput: {"ttft"|"tpot"|"e2el": ms}, the SLO to choose k by beside tokens/s

    @property
    def unit(self) -> str:
        return "concurrency" if info(self.sweep.backend).served else "batch"

    def to_json(self) -> dict:
        return {"sweep": self.sweep.to_json(), "loads": list(self.loads), "out": self.out,
                "sources": list(self.sources), "servers": list(self.servers), "mode": self.mode,
                "validate": self.validate, "schedule": [list(r) for r in self.schedule] if self.schedule else None,
                "goodput": self.goodput}


def saved_config(config: dict) -> SweepConfig:
    """A sweep's run.json config back as the SweepConfig it was run with (lists as tuples, "inf" as infinity)."""
    import math
    from dataclasses import fields

    types = {f.name: f.type for f in fields(SweepConfig)}
    values = {}
    for name, v in config.items():
        if name not in types:
            continue
        if isinstance(v, list) and "tuple" in str(types[name]):
            v = tuple(math.inf if x == "inf" else x for x in v)
        values[name] = v
    return SweepConfig(**values)


def check_config(tc: TuneConfig) -> None:
    """Everything that can be refused before a file is written."""
    from mtpbench.tune.choose import check_schedule

    if tc.schedule is not None:
        problem = check_schedule([list(r) for r in tc.schedule], max((r[2] for r in tc.schedule
                                                                      if len(r) == 3), default=0))
        if problem:
            raise MtpBenchError(f"--schedule: vLLM would refuse it: {problem}")
        if not tc.validate:
            raise MtpBenchError("--schedule is a schedule to validate: it takes --validate")
    if tc.validate and tc.servers:
        raise MtpBenchError("--validate runs the schedule in engines mtpbench starts, not on attached --server: "
                            "restart your server with the schedule (schedule.json) and tune it again to see it")
    if tc.sources:
        return
    loads = sorted(set(tc.loads))
    if len(loads) < 2:
        raise MtpBenchError(f"tune chooses k across loads: give at least two {tc.unit} values, got "
                            f"{', '.join(map(str, loads)) or 'none'}")
    if loads[0] < 1:
        raise MtpBenchError(f"{tc.unit} values must be >= 1, got {loads[0]}")
    if not tc.servers and 0 not in tc.sweep.k:
        raise MtpBenchError("--k must include 0: tune measures every k against plain decoding at the same load")
    if any(k < 0 for k in tc.sweep.k):
        raise MtpBenchError(f"--k must be >= 0, got {min(tc.sweep.k)}")
    if not tc.servers and not any(k > 0 for k in tc.sweep.k):
        raise MtpBenchError("--k has no value above 0: nothing to choose")
    if tc.sweep.repeats < MIN_REPEATS:
        raise MtpBenchError(f"--repeats {tc.sweep.repeats}: tune needs {MIN_REPEATS} timed repeats per point to "
                            f"tell k apart beyond noise")
    if len(tc.sweep.mode) > 1 and not info(tc.sweep.backend).drafting_mode:
        raise MtpBenchError(f"tune chooses k for one drafting mode: give one --mode "
                            f"(got {', '.join(tc.sweep.mode)})")


def sweep_configs(tc: TuneConfig, out: Path, where: str = "sweeps") -> list[SweepConfig]:
    """The sweeps a tune runs: one per batch size offline, one over every concurrency served (one per attached
    server)."""
    base = replace(tc.sweep, description=tc.sweep.description or "mtpbench tune")
    if tc.unit == "batch":
        return [replace(base, batch_size=b, out=str(out / where / f"b{b}")) for b in sorted(set(tc.loads))]
    loads = tuple(sorted(set(tc.loads)))
    if tc.servers:
        return [replace(base, server=url, k=(), concurrency=loads, out=str(out / where / f"server-{i}"))
                for i, url in enumerate(tc.servers)]
    return [replace(base, concurrency=loads, out=str(out / where / "served"))]


def check_servers(tc: TuneConfig) -> None:
    """Attached servers: one without drafting (the k = 0 baseline) and at least one that drafts, read from the
    servers themselves before anything is written."""
    from mtpbench.backends import get_backend

    ks = {}
    for url in tc.servers:
        backend = get_backend("vllm-server")
        try:
            ks[url] = backend.start(replace(tc.sweep, server=url, k=())).get("k")
        finally:
            backend.close()
    if not any(k for k in ks.values()):
        raise MtpBenchError(f"the attached server{'s' if len(ks) > 1 else ''} {', '.join(ks)} "
                            f"{'do' if len(ks) > 1 else 'does'} not draft (no speculative config): nothing to tune")
    if 0 not in ks.values():
        raise MtpBenchError(f"no attached server runs without drafting ({', '.join(f'{u}: k = {k}' for u, k in ks.items())}"
                            f"): tune measures every k against plain decoding; attach the same model without a "
                            f"speculative config as another --server")


def run_tune(tc: TuneConfig, on_point: Callable[[int, int, str], None] | None = None,
             say: Callable[[str], None] | None = None) -> dict:
    """Run (or read) the sweeps, choose, predict, write; with ``validate``, run the schedule and report it.
    ``say``: where lines about --out's earlier results go (default: stderr)."""
    from mtpbench.sweep import run_sweep, store
    from mtpbench.tune.report import build

    check_config(tc)
    out = Path(tc.out)
    if tc.sources:
        sweeps = read_sweeps(tc.sources, tc.mode)  # refused here, before anything is written
        if tc.validate:  # the validation runs the workload the sweeps ran, on their backend
            if sweeps.run["config"].get("server"):
                raise MtpBenchError("--validate runs the schedule in engines mtpbench starts: these sweeps "
                                    "measured an attached server")
            tc = replace(tc, sweep=saved_config(sweeps.run["config"]),
                         loads=tuple(sorted({m.load for m in sweeps.points})))
    elif tc.servers:
        check_servers(tc)
    # before anything is written: a tune with other settings (or other files) in --out is refused, unless --replace
    if tc.sweep.replace and any(Path(x).resolve().is_relative_to(out.resolve()) for x in tc.sources):
        raise MtpBenchError(f"--replace would move the sweeps --from reads (they lie in --out {out}) aside: give "
                            f"another --out")
    held = store.claim_tune(out, tc.to_json(), tc.sweep.replace, tc.sweep.force)
    store.tell(held, tc.out, say)
    tc = replace(tc, sweep=replace(tc.sweep, replace=False))  # its sweeps start in a folder moved aside, or resume
    make_out_dir(out)
    write_json(out / "tune.json", {"config": tc.to_json()})
    if not tc.sources:
        # the cheapest sweeps first: what they leave of the budget goes to the costly ones (batch 1) after them
        configs, start = sorted(sweep_configs(tc, out), key=round_cost), time.perf_counter()
        for i, cfg in enumerate(configs):
            label = Path(cfg.out).name
            if cfg.max_seconds is not None:  # the whole tune's budget: what is left, shared by the sweeps to come
                left = cfg.max_seconds - (time.perf_counter() - start)
                cfg = replace(cfg, max_seconds=budget_share(left, [round_cost(c) for c in configs[i:]]))
            run_sweep(cfg, on_point and (lambda j, n, name: on_point(j, n, f"{label} ({i + 1}/{len(configs)}): "
                                                                           f"{name}")), say)
    result = build(out)
    if tc.validate:
        from mtpbench.tune.validate import run_validation

        run_validation(tc, out, result, on_point)
        result = build(out)
    return result
