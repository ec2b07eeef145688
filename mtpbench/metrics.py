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

from dataclasses import asdict, dataclass, field, fields


@dataclass
class RequestRecord:
    """One prompt's outcome; times are seconds from the start of its batch."""

    category: str
    num_prompt_tokens: int
    output_token_ids: list[int]
    ttft_s: float | None  # None: the engine did not report it
    latency_s: float | None


@dataclass
class BatchRecord:
    """One generate call (one batch, one category): wall time and spec-decode counter deltas."""

    category: str
    wall_s: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    draft_time_s: float | None = None  # summed draft-model call time (native backend only)
    num_draft_calls: int = 0
    # summed target call time: verify forwards, or decode steps at k = 0
    target_time_s: float | None = None
    num_target_calls: int = 0


@dataclass
class PointRun:
    """What a backend measured at one grid point: the raw records a point file keeps."""

    requests: list[RequestRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    startup_s: float | None = None
    engine: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "PointRun":
        return cls([RequestRecord(**r) for r in d["requests"]], [BatchRecord(**b) for b in d["batches"]],
                   d.get("startup_s"), d.get("engine") or {})


@dataclass(frozen=True)
class PointResult:
    """One row: a grid point (mode, k, mtp_layers) over one category of prompts, or 'all'."""

    backend: str
    mode: str
    k: int
    mtp_layers: int
    category: str
    status: str
    num_prompts: int | None = None
    num_output_tokens: int | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    num_accepted_tokens_per_pos: tuple[int, ...] = ()
    acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    acceptance_rate_per_pos: tuple[float, ...] = ()  # joint, as vLLM reports it
    conditional_acceptance_per_pos: tuple[float | None, ...] = ()
    alpha: float | None = None
    draft_cost_ratio: float | None = None
    theoretical_tokens_per_step: float | None = None
    theoretical_speedup: float | None = None
    output_tokens_per_sec: float | None = None
    speedup: float | None = None
    ttft_ms_median: float | None = None
    ttft_ms_p90: float | None = None
    tpot_ms_median: float | None = None
    tpot_ms_p90: float | None = None
    decode_time_s: float | None = None
    startup_s: float | None = None
    output_repetition: float | None = None
    error: str | None = None

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def to_csv(self) -> dict:
        return {k: ";".join("" if x is None else _fmt(x) for x in v) if isinstance(v, (tuple, list))
                else ("" if v is None else _fmt(v)) for k, v in self.to_json().items()}


def _fmt(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    i = (len(xs) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def repetition(tokens: list[int], n: int = 4) -> tuple[int, int]:
    """(repeated n-grams, n-grams): an n-gram is repeated if it already occurred earlier in the text."""
    seen, rep = set(), 0
    grams = [tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)]
    for g in grams:
        rep += g in seen
        seen.add(g)
    return rep, len(grams)


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def mean_call_s(batches: list[BatchRecord], kind: str) -> float | None:
    """Mean seconds per draft call (kind='draft') or target call (kind='target')."""
    timed = [b for b in batches if getattr(b, f"{kind}_time_s") is not None and getattr(b, f"num_{kind}_calls")]
    if not timed:
        return None
    return sum(getattr(b, f"{kind}_time_s") for b in timed) / sum(getattr(b, f"num_{kind}_calls") for b in timed)


def summarize(backend: str, mode: str, k: int, mtp_layers: int, category: str,
              requests: list[RequestRecord], batches: list[BatchRecord], startup_s: float | None,
              target_step_s: float | None = None) -> PointResult:
    """Aggregate the records of one category (or all of them) into a result row.

    ``target_step_s``: the target's decode-step time from the k = 0 point, if the sweep has one."""
    drafts = sum(b.num_drafts for b in batches)
    drafted = sum(b.num_draft_tokens for b in batches)
    accepted = sum(b.num_accepted_tokens for b in batches)
    per_pos = [sum(b.num_accepted_tokens_per_pos[i] for b in batches if i < len(b.num_accepted_tokens_per_pos))
               for i in range(k)]
    wall = sum(b.wall_s for b in batches)
    out_tokens = sum(len(r.output_token_ids) for r in requests)
    rep = [repetition(r.output_token_ids) for r in requests]
    ngrams = sum(t for _, t in rep)
    tpot = [(r.latency_s - r.ttft_s) / (len(r.output_token_ids) - 1) * 1e3 for r in requests
            if len(r.output_token_ids) > 1 and r.latency_s is not None and r.ttft_s is not None]
    ttft = [r.ttft_s * 1e3 for r in requests if r.ttft_s is not None]

    al = dar = alpha = tps = c = None
    joint: list[float] = []
    cond: list[float | None] = []
    if k > 0 and drafts:
        al = 1 + accepted / drafts
        dar = accepted / drafted if drafted else None
        joint = [p / drafts for p in per_pos]
        cond = [joint[0]] + [(per_pos[i] / per_pos[i - 1]) if per_pos[i - 1] else None for i in range(1, k)]
        rejections = drafts - per_pos[-1]  # drafts that stopped before accepting all k
        alpha = accepted / (accepted + rejections) if accepted + rejections else None
        if alpha is not None:
            tps = float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        draft_s, step_s = mean_call_s(batches, "draft"), target_step_s or mean_call_s(batches, "target")
        if draft_s is not None and step_s:
            c = draft_s / step_s
    theo = tps / (k * c + 1) if (tps is not None and c is not None) else (1.0 if k == 0 else None)
    return PointResult(
        backend=backend, mode=mode, k=k, mtp_layers=mtp_layers, category=category, status="ok",
        num_prompts=len(requests), num_output_tokens=out_tokens,
        num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
        num_accepted_tokens_per_pos=tuple(per_pos),
        acceptance_length=_round(al) if k else 1.0, draft_acceptance_rate=_round(dar),
        acceptance_rate_per_pos=tuple(_round(x) for x in joint),
        conditional_acceptance_per_pos=tuple(_round(x) for x in cond),
        alpha=_round(alpha), draft_cost_ratio=_round(c),
        theoretical_tokens_per_step=_round(tps) if k else 1.0, theoretical_speedup=_round(theo),
        output_tokens_per_sec=_round(out_tokens / wall, 2) if wall > 0 else None,
        ttft_ms_median=_round(percentile(ttft, 0.5), 3), ttft_ms_p90=_round(percentile(ttft, 0.9), 3),
        tpot_ms_median=_round(percentile(tpot, 0.5), 3), tpot_ms_p90=_round(percentile(tpot, 0.9), 3),
        decode_time_s=_round(wall), startup_s=_round(startup_s, 3),
        output_repetition=_round(sum(r for r, _ in rep) / ngrams) if ngrams else None,
    )
