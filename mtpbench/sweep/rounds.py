"""The sweep's scheduler of repeats, on backends whose one engine in this process serves every point (native):

1. a warm-up: ``--warmup`` runs of every point, timed and saved as the point's ``warmup``, never in its figures;
2. rounds: round r times every point still timed once, in a fresh random order drawn from (``--seed``, r) and
   recorded with each timing (``round``, ``slot``), so a drift of the machine falls on no point more than another;
3. the A/A control: the first k = 0 point timed a second time in the same rounds, as a point of its own
   (``aa-k0.json``, mode "aa"): the machine's noise floor (``stats.noise``);
4. sequential stopping (``--max-repeats`` above ``--repeats``): after each round from ``--repeats`` on, each k > 0
   point is judged against the k = 0 point of its load and context (``stats.judge.ratio``: Bonferroni over the
   sweep's k > 0 points and the looks the budget allows, never narrower than the A/A floor); a decided point stops, the others go on until
   ``--max-repeats`` rounds or ``--max-seconds``. A k = 0 point goes on while any of its points does, the A/A copy
   with its k = 0 point. Each k > 0 point saves its last look as ``sequential``.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, replace

from mtpbench.metrics import GridPoint
from mtpbench.metrics.records import AA_MODE
from mtpbench.stats import noise
from mtpbench.stats.intervals import MIN_REPEATS_RATIO
from mtpbench.stats import judge as judgement
from mtpbench.stats.sequential import judge, max_looks, next_step


def check(cfg) -> str | None:
    """Why the sequential options cannot apply to ``cfg`` (one line), or None."""
    if cfg.max_repeats is not None and cfg.max_repeats < cfg.repeats:
        return f"--max-repeats {cfg.max_repeats} is below --repeats {cfg.repeats} (the rounds every point gets)"
    if cfg.max_repeats is not None and cfg.max_repeats > cfg.repeats and cfg.repeats < MIN_REPEATS_RATIO:
        return (f"--max-repeats: the first look needs --repeats {MIN_REPEATS_RATIO} or more (a speedup interval "
                f"needs {MIN_REPEATS_RATIO} timings a side), got {cfg.repeats}")
    if cfg.max_seconds is not None and cfg.max_seconds <= 0:
        return f"--max-seconds must be > 0, got {cfg.max_seconds:g}"
    if cfg.warmup < 0:
        return f"--warmup must be >= 0, got {cfg.warmup}"
    return None


def sequential(cfg) -> bool:
    return (cfg.max_repeats or cfg.repeats) > cfg.repeats


def order(n: int, seed: int, r: int) -> list[int]:
    """Round r's order of n points: a permutation drawn afresh from (seed, r), the same on every rerun."""
    return random.Random(f"{seed}:{r}").sample(range(n), n)


def where(p: GridPoint) -> tuple:
    return p.concurrency, p.request_rate, p.context_tokens


def baselines(points: list[GridPoint]) -> dict[str, str]:
    """Each point's k = 0 point of the same load and context, by name (the A/A copy's is its original)."""
    k0 = {where(p): p.name for p in points if p.k == 0 and p.mode != AA_MODE}
    return {p.name: k0[where(p)] for p in points if where(p) in k0 and p.name != k0[where(p)]}


def with_aa(cfg, todo: list) -> list:
    """``todo`` with the A/A copy of its first k = 0 point, where the rounds give an interval (>= 3)."""
    first = next(((p, q) for p, q in todo if p.k == 0), None)
    if not cfg.aa_control or first is None or cfg.repeats < MIN_REPEATS_RATIO:
        return todo
    p, prompts = first
    return todo + [(replace(p, mode=AA_MODE), prompts)]


def family_of(points: list[GridPoint]) -> int:
    """The comparisons a sweep judges at once: its k > 0 points that have a k = 0 point of their load and context
    (fixed by the grid, before anything is timed)."""
    k0 = {where(p) for p in points if p.k == 0}
    return max(1, sum(p.k > 0 and where(p) in k0 for p in points))


def still_timed(timed: set[str], tokps: dict[str, list], partner: dict[str, str], aa: str | None, looks: int,
                alpha: float, family: int = 1) -> tuple[set[str], dict]:
    """After a look: the points to time in the next round, and the looks at the k > 0 points judged. A k > 0 point
    stays while its look is open (one without a timed baseline stops: nothing to judge it against); a k = 0 point
    while any k > 0 point of its load stays; the A/A copy while its original does."""
    floor = (noise.floor(tokps[partner[aa]], tokps[aa]) if aa and aa in tokps and partner[aa] in tokps else None) or 0.0
    seen, keep = {}, set()
    for name in timed:
        base = partner.get(name)
        if base is None or name == aa or base not in tokps:
            continue
        seen[name] = judge(tokps[name], tokps[base], alpha=alpha, looks=looks, floor=floor, family=family)
        if seen[name].state == "open":
            keep.add(name)
    keep |= {partner[n] for n in keep}
    if aa and partner.get(aa) in keep:
        keep.add(aa)
    return keep, {"floor": floor, "looks": seen}


class Timer:
    """Times points one run at a time (``measure(cfg, point, prompts)``: a PointRun, or None after the failure was
    written), keeping each point's first run with its later timings appended, its wall time and warm-up runs."""

    def __init__(self, cfg, todo: list, measure, on_point, total: int):
        self.one, self.measure, self.on_point, self.total = replace(cfg, repeats=1), measure, on_point, total
        self.live = {p.name: (p, q) for p, q in todo}  # failed points leave
        self.runs, self.wall, self.warm, self.done = {}, {}, {}, 0

    def time(self, name: str, label: str, timing: dict | None = None) -> None:
        """One run of ``name``: a warm-up (``timing`` None) or a timed run recorded with ``timing``."""
        if self.on_point:
            self.on_point(self.done, self.total, label)
        self.done += 1
        t0 = time.perf_counter()
        run = self.measure(self.one, *self.live[name])
        if run is None:  # failed: written, and left out of the later rounds
            self.live.pop(name)
            self.runs.pop(name, None)
            return
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0
        if timing is None:
            self.warm.setdefault(name, []).append(run.repeats[0])
        elif name not in self.runs:
            run.repeats = [{**run.repeats[0], **timing}]
            if run.telemetry is not None:  # the sampler spans this first timed run only
                run.telemetry = {**run.telemetry, "timed_runs": 1}
            self.runs[name] = run
        else:
            self.runs[name].repeats.append({**run.repeats[0], **timing})

    def tokps(self) -> dict[str, list]:
        return {n: [t.get("output_tokens_per_sec") for t in run.repeats] for n, run in self.runs.items()}


def run_rounds(cfg, todo: list, measure, save, on_point=None, family: int | None = None) -> None:
    """Warm-up, then rounds until every point is decided or the budget is spent; then ``save(point, run, wall_s,
    extra)`` of each point that did not fail. ``family``: the sweep's comparisons (``family`` of its whole grid; by
    default of ``todo``'s points)."""
    from mtpbench.stats.intervals import LEVEL

    todo = with_aa(cfg, todo)
    rounds = max(cfg.repeats, cfg.max_repeats or cfg.repeats)
    looks, alpha = max_looks(cfg.repeats, rounds) if sequential(cfg) else 1, 1.0 - LEVEL
    partner = baselines([p for p, _ in todo])
    family = family or family_of([p for p, _ in todo])
    aa = next((p.name for p, _ in todo if p.mode == AA_MODE), None)
    timer = Timer(cfg, todo, measure, on_point, len(todo) * (cfg.warmup + rounds))
    for _ in range(cfg.warmup):
        for name in list(timer.live):
            timer.time(name, f"{name} (warm-up)")
    last, timed, start, stopped = {}, set(timer.live), time.perf_counter(), "fixed"
    for r in range(rounds):
        began = time.perf_counter()
        names = [n for n in timer.live if n in timed]
        for slot, i in enumerate(order(len(names), cfg.seed, r)):
            timer.time(names[i], f"{names[i]} (round {r + 1}, up to {rounds})", {"round": r, "slot": slot})
        if r + 1 < cfg.repeats:
            continue
        keep, look = still_timed({n for n in timed if n in timer.runs}, timer.tokps(), partner, aa, looks, alpha,
                                 family)
        for n, lk in look["looks"].items():
            last[n] = {**{k: round(v, 5) if isinstance(v, float) else v for k, v in asdict(lk).items()},
                       "floor": round(look["floor"], 5), "looks": looks, "family": family,
                       "level": judgement.level(family, looks, alpha)}
        if not sequential(cfg):
            break
        now = time.perf_counter()
        step = next_step("open" if keep else "decided", r + 1, rounds, now - start, cfg.max_seconds, now - began)
        if step != "continue":
            stopped = step
            break
        timed = keep
    for name, (point, _) in timer.live.items():
        extra = {"warmup": timer.warm.get(name, [])}
        if name in last:
            extra["sequential"] = {**last[name], "stopped": stopped if last[name]["state"] == "open" else "decided"}
        save(point, timer.runs[name], timer.wall[name], extra)
