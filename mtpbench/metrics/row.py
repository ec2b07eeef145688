"""What one grid point measured, and the one result row every table, CSV and JSON is made from.

Names and formulas follow vLLM's spec-decode metrics:
``acceptance_length = 1 + num_accepted_tokens / num_drafts``, ``draft_acceptance_rate =
num_accepted_tokens / num_draft_tokens``, and the per-position rate ``num_accepted_tokens_per_pos[i] /
num_drafts``, which is *joint* (positions 0..i all accepted). The *conditional* rate at i is
``per_pos[i] / per_pos[i-1]``. ``alpha`` is the per-token acceptance probability fitted to the counts
(accepted / (accepted + rejections)); the theoretical speedup is ``(1-alpha^(k+1)) / ((1-alpha)(k*c+1))``
(Leviathan et al.) with ``c`` = mean draft-model call time / mean target decode-step time. The target
step is timed at the k = 0 point of the same sweep; without one, the point's own verify calls stand in
(they cost more than a decode step, so c comes out lower).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from mtpbench.metrics.records import (
    BatchRecord,
    GridPoint,
    RATE_FIELDS,
    RequestRecord,
    mean_call_s,
    position_count,
    repetition,
    run_rates,
)
from mtpbench.metrics.latency import statistics
from mtpbench.telemetry import summarize_samples


@dataclass(frozen=True)
class PointResult:
    """One row: a grid point (mode, k, mtp_layers, load) over one category of prompts, or 'all'."""

    backend: str
    mode: str
    k: int
    mtp_layers: int | None  # None: a server's layer count that it does not expose
    category: str
    status: str
    runner: str | None = None  # vLLM's model runner that ran the point: v1, v2, unknown (attached server)
    drafter: str | None = None  # the class that drafted: EagleProposer, MultiModuleMTPSpeculator, ...
    concurrency: int | None = None  # served runs: requests in flight at most
    request_rate: float | None = None  # served runs: Poisson arrivals per second; null = all at once
    context_tokens: int | None = None  # --context-tokens asked for
    context_tokens_actual: float | None = None  # mean tokens of held-out text the prompts really got
    num_prompts: int | None = None
    num_output_tokens: int | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    num_accepted_tokens_per_pos: tuple[int | None, ...] = ()  # None: the engine did not report that position
    acceptance_length: float | None = None
    acceptance_length_ci_low: float | None = None  # 95 % bootstrap over prompts (per-request data)
    acceptance_length_ci_high: float | None = None
    draft_acceptance_rate: float | None = None
    draft_acceptance_rate_ci_low: float | None = None
    draft_acceptance_rate_ci_high: float | None = None
    acceptance_rate_per_pos: tuple[float | None, ...] = ()  # joint, as vLLM reports it
    acceptance_rate_per_pos_ci_low: tuple[float | None, ...] = ()
    acceptance_rate_per_pos_ci_high: tuple[float | None, ...] = ()
    conditional_acceptance_per_pos: tuple[float | None, ...] = ()
    alpha: float | None = None
    draft_cost_ratio: float | None = None
    theoretical_tokens_per_step: float | None = None
    theoretical_speedup: float | None = None
    num_repeats: int = 1  # timed runs of the point; with several, timings are their geometric mean
    output_tokens_per_sec: float | None = None
    output_tokens_per_sec_ci_low: float | None = None  # 95 % t interval on the logs of the geometric mean
    output_tokens_per_sec_ci_high: float | None = None
    request_throughput_per_sec: float | None = None
    request_throughput_per_sec_ci_low: float | None = None  # of the geometric mean over the repeats, as tokens/s's
    request_throughput_per_sec_ci_high: float | None = None
    # tokens/s over the k = 0 point's: the ratio of geometric means of both points' timed runs (stats.judge.ratio),
    # its interval at speedup_level (1 - 0.05 / (the sweep's k > 0 points x the rounds' looks)), never narrower
    # than the A/A noise floor; faster, slower or open as that interval says; the same test's p-value adjusted for
    # the family and the looks (decided exactly where it is below 0.05)
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    speedup_decision: str | None = None
    speedup_p: float | None = None
    speedup_level: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p50_ci_low: float | None = None
    ttft_ms_p50_ci_high: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p50_ci_low: float | None = None
    tpot_ms_p50_ci_high: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p50_ci_low: float | None = None
    itl_ms_p50_ci_high: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2el_ms_p50: float | None = None  # end-to-end latency of a request (vllm bench serve's E2EL)
    e2el_ms_p50_ci_low: float | None = None
    e2el_ms_p50_ci_high: float | None = None
    e2el_ms_p90: float | None = None
    e2el_ms_p99: float | None = None
    # mean and standard deviation (ddof 0, as vLLM) of each, and any other percentile asked for (metrics.latency)
    ttft_ms_mean: float | None = None
    ttft_ms_std: float | None = None
    tpot_ms_mean: float | None = None
    tpot_ms_std: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_std: float | None = None
    e2el_ms_mean: float | None = None
    e2el_ms_std: float | None = None
    latency_percentiles_ms: dict = field(default_factory=dict)  # e.g. {"ttft_ms_p95": 12.5}: --metric-percentiles
    decode_time_s: float | None = None
    startup_s: float | None = None
    output_repetition: float | None = None
    # greedy sweeps: the share of this row's prompts whose tokens equal the k = 0 point's (same load and context);
    # below 1, drafting changed what the model said (mtpbench check-lossless tells a near-tie from a bug)
    greedy_match_k0: float | None = None
    # of this row's prompts that left k = 0's tokens, how many did so within rounding (the target's logit of the
    # k = 0 token minus that of the k > 0 run's within the dtype's rounding floor: ``numerical``); None where the
    # share is 1 or unknown, or the gaps were not measured (a backend without a k = 0 pass to read them from, a
    # sweep older than this)
    greedy_numerical: int | None = None
    # acceptance by where in the sequence the drafts were verified (per-request data): bucket starts in
    # tokens, and per bucket the drafts and the acceptance length
    position_bucket_start: tuple[int, ...] = ()
    num_drafts_by_position: tuple[int, ...] = ()
    acceptance_length_by_position: tuple[float, ...] = ()
    acceptance_length_by_position_ci_low: tuple[float | None, ...] = ()
    acceptance_length_by_position_ci_high: tuple[float | None, ...] = ()
    # --law, the whole point's row: acceptance against its exact law (the point file's ``acceptance_law``,
    # metrics.law.row_fields): the verdict ("follows the law", "over-accepts at position i", ..., "not observable
    # (why)"), and per draft position the verify steps that reached it, the share of them accepted, the share the
    # law expects and z (null: certain steps with a departure, or no step reached the position)
    law_verdict: str | None = None
    law_steps_per_pos: tuple[int | None, ...] = ()
    law_observed_per_pos: tuple[float | None, ...] = ()
    law_expected_per_pos: tuple[float | None, ...] = ()
    law_z_per_pos: tuple[float | None, ...] = ()
    energy_j_per_token: float | None = None
    energy_method: str | None = None  # nvml_energy_counter or integrated_power
    avg_power_w: float | None = None
    peak_gpu_mem_bytes: int | None = None
    mtp_weight_bytes: int | None = None
    foreign_requests: int | None = None
    client_cpu_ms_per_request: float | None = None
    notes: str | None = None
    error: str | None = None
    label: str | None = None  # --label and --metadata KEY=VALUE of the run, in every file it writes
    metadata: tuple[str, ...] = ()

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def to_csv(self) -> dict:
        def cell(v):
            if isinstance(v, dict):  # latency_percentiles_ms: "ttft_ms_p95=12.5;..."
                return ";".join(f"{k}={'' if x is None else _fmt(x)}" for k, x in v.items())
            if isinstance(v, (tuple, list)):
                return ";".join("" if x is None else _fmt(x) for x in v)
            return "" if v is None else _fmt(v)
        return {k: cell(v) for k, v in self.to_json().items()}


# what a row measures in time: left null where the clock measured something else (Model Runner V2 through
# Triton's interpreter on a CPU), never reported as if it were the engine's speed
TIMING_FIELDS = ("draft_cost_ratio", "theoretical_speedup", "output_tokens_per_sec", "output_tokens_per_sec_ci_low",
                 "output_tokens_per_sec_ci_high", "request_throughput_per_sec", "request_throughput_per_sec_ci_low",
                 "request_throughput_per_sec_ci_high", "speedup", "speedup_ci_low", "speedup_ci_high",
                 "speedup_decision", "speedup_p", "speedup_level",
                 "ttft_ms_p50", "ttft_ms_p50_ci_low", "ttft_ms_p50_ci_high", "ttft_ms_p90",
                 "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p50_ci_low", "tpot_ms_p50_ci_high", "tpot_ms_p90",
                 "tpot_ms_p99", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "decode_time_s", "startup_s",
                 "itl_ms_p50_ci_low", "itl_ms_p50_ci_high", "e2el_ms_p50", "e2el_ms_p50_ci_low", "e2el_ms_p50_ci_high",
                 "e2el_ms_p90", "e2el_ms_p99", "ttft_ms_mean", "ttft_ms_std", "tpot_ms_mean", "tpot_ms_std",
                 "itl_ms_mean", "itl_ms_std", "e2el_ms_mean", "e2el_ms_std",
                 "energy_j_per_token", "energy_method", "avg_power_w")


def without_timings(row: PointResult) -> PointResult:
    return replace(row, **{name: None for name in TIMING_FIELDS}, latency_percentiles_ms={})


def _fmt(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


POSITION_BUCKETS = 8


def acceptance_by_position(requests: list[RequestRecord]) -> dict:
    """Drafts and AL (with its 95 % bootstrap interval over requests) per bucket of the sequence position
    at which the drafts were verified: at most ``POSITION_BUCKETS`` buckets of a power-of-two width."""
    from mtpbench import stats

    steps = [(i, p, a) for i, r in enumerate(requests) for p, a in (r.draft_steps or [])]
    if not steps:
        return {}
    lo, hi = min(p for _, p, _ in steps), max(p for _, p, _ in steps)
    width = 16
    while (hi - lo // width * width) // width + 1 > POSITION_BUCKETS:
        width *= 2
    start = lo // width * width
    buckets: dict[int, dict[int, list[int]]] = {}  # bucket -> request -> accepted counts
    for i, p, a in steps:
        buckets.setdefault(start + (p - start) // width * width, {}).setdefault(i, []).append(a)
    keys = sorted(buckets)
    als, lows, highs, counts = [], [], [], []
    for b in keys:
        per_req = buckets[b].values()
        acc, n = [sum(v) for v in per_req], [len(v) for v in per_req]
        als.append(_round(1 + sum(acc) / sum(n)))
        ci = stats.ratio_ci(acc, n)
        lows.append(_round(1 + ci[0]) if ci else None)
        highs.append(_round(1 + ci[1]) if ci else None)
        counts.append(sum(n))
    return {"position_bucket_start": tuple(keys), "num_drafts_by_position": tuple(counts),
            "acceptance_length_by_position": tuple(als), "acceptance_length_by_position_ci_low": tuple(lows),
            "acceptance_length_by_position_ci_high": tuple(highs)}


def acceptance_intervals(requests: list[RequestRecord], k: int) -> dict:
    """95 % bootstrap intervals over prompts of AL, draft acceptance rate and each per-position rate;
    empty without per-request data."""
    from mtpbench import stats

    if k == 0 or len(requests) < 2 or any(r.num_drafts is None for r in requests):
        return {}
    drafts = [r.num_drafts for r in requests]
    acc = [r.num_accepted_tokens for r in requests]
    al = stats.ratio_ci(acc, drafts)
    dar = stats.ratio_ci(acc, [r.num_draft_tokens for r in requests])
    # a position some request lacks has no interval (a bootstrap would resample around the holes)
    counts = [[position_count([r], i) for r in requests] for i in range(k)]
    pos = [stats.ratio_ci(c, drafts) if None not in c else None for c in counts]
    if al is None:
        return {}
    return {"acceptance_length_ci_low": _round(1 + al[0]), "acceptance_length_ci_high": _round(1 + al[1]),
            "draft_acceptance_rate_ci_low": _round(dar[0]) if dar else None,
            "draft_acceptance_rate_ci_high": _round(dar[1]) if dar else None,
            "acceptance_rate_per_pos_ci_low": tuple(_round(c[0]) if c else None for c in pos),
            "acceptance_rate_per_pos_ci_high": tuple(_round(c[1]) if c else None for c in pos)}


def repeat_intervals(repeats: list[dict]) -> dict:
    """The geometric mean of each timing figure over the repeats, with its t interval on the logs (only for two or
    more; the interval from ``MIN_REPEATS_RATIO``): tokens/s, req/s and decode time each the geometric mean of the
    runs' own figure, over the same runs (``run_rates``), the statistic the speedup is a ratio of (issue 55)."""
    from mtpbench import stats

    if len(repeats) < 2:
        return {}
    out = {"num_repeats": len(repeats), **(run_rates(repeats) or dict.fromkeys(RATE_FIELDS))}
    for name, nd in (("output_tokens_per_sec", 2), ("ttft_ms_p50", 3), ("tpot_ms_p50", 3), ("itl_ms_p50", 3),
                     ("e2el_ms_p50", 3)):
        values = [r.get(name) for r in repeats]
        if all(v is None for v in values):  # not observed, or not kept by an older mtpbench: the run's own stands
            continue
        ci = stats.gmean_ci(values)
        out[name] = _round(stats.gmean(values), nd)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = (_round(ci[0], nd), _round(ci[1], nd)) if ci else (None, None)
    return out


def summarize(backend: str, point: GridPoint, category: str, requests: list[RequestRecord],
              batches: list[BatchRecord], startup_s: float | None, target_step_s: float | None = None,
              telemetry: dict | None = None, mtp_weight_bytes: int | None = None,
              notes: list[str] = (), repeats: list[dict] = (), percentiles: tuple[float, ...] = ()) -> PointResult:
    """Aggregate the records of one category (or all of them) into a result row.

    ``target_step_s``: the target's decode-step time from the k = 0 point, if the sweep has one.
    ``telemetry``: the energy/power/memory summary of the measured window (whole point only). ``percentiles``:
    latency percentiles asked for beyond the p50, p90 and p99 every row has (``--metric-percentiles``)."""
    k = point.k
    # the engine's counters of these batches; a category of a concurrent window has none of its own,
    # and then its requests' own counts stand in where the engine gave them
    per_request = bool(requests) and all(r.num_drafts is not None for r in requests)
    counted = batches or (requests if per_request else [])
    acceptance, missing = _acceptance_fields(k, counted, batches, target_step_s)
    if missing:
        notes = [*notes, unknown_positions_note(missing, k)]
    wall = sum(b.wall_s for b in batches)
    out_tokens = sum(len(r.output_token_ids) for r in requests)
    rep = [repetition(r.output_token_ids) for r in requests]
    ngrams = sum(t for _, t in rep)
    energy, telemetry_note = _telemetry_fields(telemetry, out_tokens, repeats)
    if telemetry_note:
        notes = [*notes, telemetry_note]
    if len(repeats) > 1 and run_rates(list(repeats)) is None:
        notes = [*notes, f"req/s and decode time unknown: tokens/s is the geometric mean of {len(repeats)} timed runs, and "
                         "this point file (an older mtpbench) kept no wall time per run to take theirs from"]
    foreign = [b.foreign_requests for b in batches if b.foreign_requests is not None]
    cpu = [b.client_cpu_s for b in batches if b.client_cpu_s is not None]
    row = PointResult(
        backend=backend, mode=point.mode, k=k, mtp_layers=point.mtp_layers, category=category, status="ok",
        concurrency=point.concurrency,
        request_rate=None if point.request_rate is None or math.isinf(point.request_rate) else point.request_rate,
        context_tokens=point.context_tokens,
        context_tokens_actual=_round(sum(r.context_tokens for r in requests) / len(requests), 1)
        if point.context_tokens is not None and requests else None,
        num_prompts=len(requests), num_output_tokens=out_tokens,
        **acceptance,
        **_speed_fields(requests, wall, out_tokens), **statistics(requests, percentiles, repeats),
        decode_time_s=_round(wall), startup_s=_round(startup_s, 3),
        output_repetition=_round(sum(r for r, _ in rep) / ngrams) if ngrams else None,
        **energy,
        mtp_weight_bytes=mtp_weight_bytes,
        foreign_requests=sum(foreign) if foreign else None,
        client_cpu_ms_per_request=_round(sum(cpu) / len(requests) * 1e3, 3) if cpu and requests else None,
        notes="; ".join(notes) or None,
    )
    joint = row.acceptance_rate_per_pos
    intervals = acceptance_intervals(requests, k)
    if intervals and None in joint:  # an interval where the engine's own count is unknown would stand alone
        for side in ("low", "high"):
            name = f"acceptance_rate_per_pos_ci_{side}"
            intervals[name] = tuple(None if v is None else x for v, x in zip(joint, intervals[name]))
    return replace(row, **intervals, **repeat_intervals(list(repeats)), **acceptance_by_position(requests))


def _acceptance_fields(k: int, counted: list, batches: list[BatchRecord],
                       target_step_s: float | None) -> tuple[dict, list[int]]:
    """The row's draft counts and what follows from them: AL, the joint and conditional per-position rates,
    alpha, the draft cost ratio c and the theoretical speedup; and the draft positions the engine gave no
    count for."""
    drafts = sum(b.num_drafts for b in counted)
    drafted = sum(b.num_draft_tokens for b in counted)
    accepted = sum(b.num_accepted_tokens for b in counted)
    per_pos = [position_count(counted, i) for i in range(k)]
    al = dar = alpha = tps = c = None
    joint: list[float | None] = []
    cond: list[float | None] = []
    missing: list[int] = []
    if k > 0 and drafts:
        al = 1 + accepted / drafts
        dar = accepted / drafted if drafted else None
        joint = [None if p is None else p / drafts for p in per_pos]
        cond = [joint[0]] + [per_pos[i] / per_pos[i - 1] if per_pos[i] is not None and per_pos[i - 1] else None
                             for i in range(1, k)]
        missing = [i for i, p in enumerate(per_pos) if p is None]
        if per_pos[-1] is not None:
            rejections = drafts - per_pos[-1]  # drafts that stopped before accepting all k
            alpha = accepted / (accepted + rejections) if accepted + rejections else None
        if alpha is not None:
            tps = float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        draft_s, step_s = mean_call_s(batches, "draft"), target_step_s or mean_call_s(batches, "target")
        if draft_s is not None and step_s:
            c = draft_s / step_s
    theo = tps / (k * c + 1) if (tps is not None and c is not None) else (1.0 if k == 0 else None)
    return {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": tuple(per_pos),
            "acceptance_length": _round(al) if k else 1.0, "draft_acceptance_rate": _round(dar),
            "acceptance_rate_per_pos": tuple(_round(x) for x in joint),
            "conditional_acceptance_per_pos": tuple(_round(x) for x in cond),
            "alpha": _round(alpha), "draft_cost_ratio": _round(c),
            "theoretical_tokens_per_step": _round(tps) if k else 1.0, "theoretical_speedup": _round(theo)}, missing


def _speed_fields(requests: list[RequestRecord], wall: float, out_tokens: int) -> dict:
    """Throughput over the batches' wall time (the latency statistics: ``metrics.latency``)."""
    return {"output_tokens_per_sec": _round(out_tokens / wall, 2) if wall > 0 else None,
            "request_throughput_per_sec": _round(len(requests) / wall) if wall > 0 else None}


def _telemetry_fields(telemetry: dict | None, out_tokens: int, repeats: list[dict]) -> tuple[dict, str | None]:
    """Energy per token, power and peak memory of the measured window; and a note when the telemetry could
    not be narrowed to the engine's GPUs."""
    tel = summarize_samples(telemetry) if telemetry else {}
    note = None
    if tel and telemetry.get("selection") == "all visible":
        note = "GPU telemetry covers every GPU visible here (the engine's processes were not found on any)"
    energy = tel.get("energy_j")
    return {
        # the sampler spans every repeat (a served point: its first window only, ``timed_runs``), each of
        # which generates the same tokens
        "energy_j_per_token": _round(energy / (out_tokens * (telemetry.get("timed_runs") or max(len(repeats), 1))), 6)
        if energy is not None and out_tokens else None,
        "energy_method": tel.get("energy_method") if energy is not None and out_tokens else None,
        "avg_power_w": _round(tel.get("avg_power_w"), 2), "peak_gpu_mem_bytes": tel.get("peak_gpu_mem_bytes"),
    }, note


def unknown_positions_note(missing: list[int], k: int) -> str:
    what = "the joint and conditional rates there"
    if k - 1 in missing:
        what += ", alpha and the theoretical speedup"
    return (f"the engine reported no accepted-token count for draft position(s) {', '.join(map(str, missing))} "
            f"of 0..{k - 1}: {what} are unknown")
