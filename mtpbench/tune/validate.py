"""``mtpbench tune --validate``: the schedule run as vLLM runs it, beside the best fixed k of each load and the best
single fixed k over every load (and, where vLLM runs the schedule at k = 0 beside drafting ranges, beside no
speculative config), in sweeps of their own under ``validate/``.

On ``vllm`` and a launched ``vllm-server`` the schedule is one engine with vLLM's dynamic speculative decoding
(``num_speculative_tokens_per_batch_size``), started at each load; its counters tell the drafts per step it really
made there. The native engine's batch is fixed for a run, so there the schedule is per batch size: at each load it
is the fixed k the schedule gives that load (said in the report)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mtpbench.backend_info import info
from mtpbench.stats import judge
from mtpbench.stats.noise import floor_until
from mtpbench.sweep.load import aa_runs, judge_of, load_run
from mtpbench.tune.choose import PLAIN, speculative_config
from mtpbench.tune.points import measured


@dataclass
class ValidationRow:
    """One arm at one load, and the schedule's tokens/s over it."""

    load: int
    arm: str  # "schedule", "best fixed k here", "best single k", "no speculative config" (choose.PLAIN)
    k: int  # the k the arm runs (the schedule: the k its ranges give this load)
    output_tokens_per_sec: float | None
    num_repeats: int
    drafts_per_step: float | None  # the engine's counters: num_draft_tokens / num_drafts (None: no drafts)
    # num_draft_tokens / output tokens: how much it drafted at all (a step at k = 0 drafts nothing and is no draft,
    # so drafts per step alone cannot show a load where the schedule stopped drafting)
    draft_tokens_per_output_token: float | None
    # the schedule's tokens/s over this arm's (stats.judge.ratio: the ratio of geometric means, its interval at
    # schedule_ratio_level, 1 - 0.05 / the validation's comparisons, never narrower than both sweeps' A/A floors)
    schedule_ratio: float | None = None
    schedule_ratio_ci_low: float | None = None
    schedule_ratio_ci_high: float | None = None
    schedule_ratio_level: float | None = None
    verdict: str | None = None  # "within noise", "schedule faster", "schedule slower"


def plan(result: dict, ranges: list[list[int]]) -> dict[int, dict[str, int]]:
    """Per load: the k of each arm. Where vLLM runs the schedule with k = 0 beside drafting ranges, one more arm,
    no speculative config at all (plain decoding): the schedule runs that load under its speculative config, which
    is not plain decoding, and only this comparison prices it (``analyse.schedule_measured``)."""
    k_of = {b: k for s, e, k in ranges for b in range(s, e + 1)}
    last = ranges[-1][2]
    under_config = dynamic(ranges) and info(result["backend"]).vllm
    arms = {}
    for c in result["choices"]:
        k = k_of.get(c["load"], last)
        arms[c["load"]] = {"schedule": k, "best fixed k here": c["fastest"], "best single k": result["best_single_k"],
                           **({PLAIN: 0} if under_config and k == 0 else {})}
    return arms


def dynamic(ranges: list[list[int]]) -> bool:
    """Whether running the schedule needs vLLM's dynamic speculative decoding (it has ranges of different k > 0 or a
    k = 0 range beside drafting ones)."""
    return len({k for *_, k in ranges}) > 1


def validation_configs(tc, out: Path, result: dict) -> list:
    """The validation sweeps: fixed k per load (and the whole dynamic schedule per load, or over every concurrency,
    on vLLM)."""
    ranges = [list(r) for r in tc.schedule] if tc.schedule else result["schedule"]
    arms = plan(result, ranges)
    base = replace(tc.sweep, description="mtpbench tune --validate")
    spec = speculative_config(ranges, base.method)
    run_schedule = dynamic(ranges) and info(base.backend).vllm
    configs = []

    def fixed(load: int) -> tuple[int, ...]:
        ks = {k for arm, k in arms[load].items() if arm != "schedule" or not run_schedule}
        return tuple(sorted(k for k in ks if k is not None))

    if tc.unit == "batch":
        for b in sorted(arms):
            configs.append(replace(base, batch_size=b, k=fixed(b), out=str(out / "validate" / f"b{b}" / "fixed")))
            if run_schedule:
                configs.append(replace(base, batch_size=b, k=(spec["num_speculative_tokens"],),
                                       engine_args={**base.engine_args, "speculative_config": spec},
                                       out=str(out / "validate" / f"b{b}" / "schedule")))
    else:
        loads = tuple(sorted(arms))
        ks = tuple(sorted({k for b in loads for k in fixed(b)}))
        configs.append(replace(base, concurrency=loads, k=ks, out=str(out / "validate" / "fixed")))
        if run_schedule:
            configs.append(replace(base, concurrency=loads, k=(spec["num_speculative_tokens"],),
                                   engine_args={**base.engine_args, "speculative_config": spec},
                                   out=str(out / "validate" / "schedule")))
    return configs


def run_validation(tc, out: Path, result: dict, on_point=None) -> None:
    from mtpbench.files import write_json
    from mtpbench.sweep import run_sweep

    configs = validation_configs(tc, out, result)
    ranges = [list(r) for r in tc.schedule] if tc.schedule else result["schedule"]
    write_json(out / "validate.json", {"schedule": ranges, "dynamic": dynamic(ranges) and info(tc.sweep.backend).vllm,
                                       "sweeps": [c.out for c in configs]})
    for i, cfg in enumerate(configs):
        label = str(Path(cfg.out).relative_to(out))
        run_sweep(cfg, on_point and (lambda j, n, name: on_point(j, n, f"{label} ({i + 1}/{len(configs)}): {name}")))


def _validation_points(out: Path) -> dict[tuple[int, str, int], tuple]:
    """(load, "schedule" or "fixed", k) -> (Measured, drafts per step) from the validation sweeps."""
    found = {}
    for run_path in sorted((out / "validate").glob("**/run.json")):
        d = run_path.parent
        run, points, _ = load_run(d)
        served = info(run["config"]["backend"]).served
        kind = "schedule" if d.name == "schedule" else "fixed"
        found_aa, looks = aa_runs(d, run, points), judge_of(run, points, [])[1]
        for data in points:
            load = data["point"]["concurrency"] if served else run["config"]["batch_size"]
            m = measured(d, data, load)
            m.looks, m.noise = looks, found_aa[1:] if found_aa else None
            drafted = sum(b.get("num_draft_tokens") or 0 for b in data.get("batches") or [])
            tokens = sum(len(r.get("output_token_ids") or []) for r in data.get("requests") or [])
            found[(load, kind, m.k)] = (m, drafted / m.num_drafts if m.num_drafts else None,
                                        drafted / tokens if tokens else None)
    return found


def read_validation(out: Path, result: dict) -> dict | None:
    """The validation's rows and its two answers (schedule against the best fixed k at each load, and against the
    best single k), or None where there was none."""
    import json

    path = out / "validate.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    arms = plan(result, saved["schedule"])
    found = _validation_points(out)
    rows, against = [], []
    for load, ks in sorted(arms.items()):
        sched = found.get((load, "schedule" if saved["dynamic"] else "fixed", ks["schedule"] if not saved["dynamic"]
                           else max(k for *_, k in saved["schedule"])))
        for arm, k in ks.items():
            got = sched if arm == "schedule" else found.get((load, "fixed", k))
            if got is None:
                continue
            m, per_step, per_token = got
            row = ValidationRow(load, arm, k, round(m.gmean, 2), len(m.tokps), None if per_step is None
                                else round(per_step, 3), None if per_token is None else round(per_token, 4))
            if sched is not None and arm != "schedule":
                row.schedule_ratio = round(sched[0].gmean / m.gmean, 4)  # the geometric means' ratio, as judged below
                against.append((row, sched[0], m))
            rows.append(row)
    for row, sched, m in against:  # one family: every comparison the validation makes
        floor = judge.combined_floor(floor_until(sched.noise, None), floor_until(m.noise, None), per_measure=True)
        c = judge.ratio(sched.tokps, m.tokps, floor, len(against), max(sched.looks, m.looks))
        if c.estimate is not None:
            row.schedule_ratio = round(c.estimate, 4)
            row.schedule_ratio_ci_low, row.schedule_ratio_ci_high = judge.outward(c, 4)
            row.schedule_ratio_level = c.level
            row.verdict = {judge.ABOVE: "schedule faster", judge.BELOW: "schedule slower"}.get(c.decision,
                                                                                            "within noise")
    return {"schedule": saved["schedule"], "dynamic": saved["dynamic"], "rows": [asdict(r) for r in rows],
            "per_batch_size": not info(result["backend"]).vllm}  # no dynamic speculative decoding there
