"""What one grid point measured, as the backends hand it over: the grid point, one record per request and per
batch, and a point's run; per-request acceptance in vLLM's terms (``row`` turns these into the result row)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


AA_MODE = "aa"  # the A/A control: a copy of a k = 0 point, the machine's noise


@dataclass(frozen=True)
class GridPoint:
    """One point of a sweep's grid. ``concurrency`` and ``request_rate`` are the load of a served run
    (``None`` for the offline backends, which batch with ``--batch-size``); ``request_rate`` ``inf``
    sends every request at once."""

    mode: str
    k: int
    mtp_layers: int | None
    concurrency: int | None = None
    request_rate: float | None = None
    context_tokens: int | None = None  # --context-tokens: held-out text before each prompt

    @property
    def name(self) -> str:
        layers = "" if self.mtp_layers is None else f"-L{self.mtp_layers}"  # None: a server's, unknown
        base = "k0" if self.k == 0 else f"{self.mode}{layers}-k{self.k}"
        if self.mode == AA_MODE:  # k = 0 timed a second time in the same rounds (sweep.rounds)
            base = "aa-k0"
        if self.context_tokens is not None:
            base += f"-ctx{self.context_tokens}"
        if self.concurrency is not None:
            base += f"-c{self.concurrency}"
        if self.request_rate is not None and math.isfinite(self.request_rate):
            base += f"-r{self.request_rate:g}"
        return base

    def to_json(self, backend: str) -> dict:
        rate = self.request_rate
        return {"backend": backend, "mode": self.mode, "k": self.k, "mtp_layers": self.mtp_layers,
                "concurrency": self.concurrency,
                "request_rate": None if rate is None or math.isinf(rate) else rate,
                "context_tokens": self.context_tokens}

    @classmethod
    def from_json(cls, d: dict) -> "GridPoint":
        rate = d.get("request_rate")
        if rate is None and d.get("concurrency") is not None:
            rate = math.inf  # a served point's null rate is "all at once"
        return cls(d["mode"], d["k"], d["mtp_layers"], d.get("concurrency"), rate, d.get("context_tokens"))


@dataclass
class RequestRecord:
    """One prompt's outcome. Times are seconds from when the request was sent (the offline backends
    send a batch at once: from the start of its batch)."""

    category: str
    num_prompt_tokens: int
    output_token_ids: list[int]
    ttft_s: float | None  # None: the engine did not report it
    latency_s: float | None
    # gaps between successive deliveries of tokens (a streamed chunk, or a decode round: with drafting
    # one delivery carries up to k+1 tokens), as ``vllm bench serve`` measures ITL; None: not observed
    itl_s: list[float] | None = None
    sent_s: float | None = None  # served runs: when the request was sent, from the start of the window
    # this request's own spec-decode counts (vLLM's names); None: the backend could not tell them apart
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    num_accepted_tokens_per_pos: list[int | None] | None = None
    # one [sequence length when the drafts were verified, drafts accepted] per verify step (None: unknown)
    draft_steps: list[list[int]] | None = None
    prompt_id: str = ""  # which prompt of the set: pairs a request with its twin in another run
    context_tokens: int = 0  # tokens of held-out text before the prompt (--context-tokens)

    @property
    def acceptance_length(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


def request_acceptance(k: int, accepted: list[int], drafted: list[int] | None = None,
                       first_position: int | None = None) -> dict:
    """A request's spec-decode counts from its verify steps' accepted-draft counts, in vLLM's names.

    ``drafted``: drafts proposed at each step (default k). ``first_position``: the sequence length at the
    first verify step (prompt + the prefill's token), from which each step's position follows."""
    drafted = drafted if drafted is not None else [k] * len(accepted)
    per_pos = [sum(a > i for a in accepted) for i in range(k)]
    steps = None
    if first_position is not None:
        steps, pos = [], first_position
        for a, d in zip(accepted, drafted):
            if d > 0:  # a step that proposed nothing is no draft (as in num_drafts), though it moves on
                steps.append([pos, a])
            pos += a + 1
    return {"num_drafts": sum(d > 0 for d in drafted), "num_draft_tokens": sum(drafted),
            "num_accepted_tokens": sum(accepted), "num_accepted_tokens_per_pos": per_pos, "draft_steps": steps}


def request_acceptance_from_histogram(k: int, histogram: list[int], num_draft_tokens: int) -> dict:
    """The same counts from vLLM's per-request histogram of accepted drafts per step (no positions)."""
    return {"num_drafts": sum(histogram), "num_draft_tokens": num_draft_tokens,
            "num_accepted_tokens": sum(j * n for j, n in enumerate(histogram)),
            "num_accepted_tokens_per_pos": [sum(histogram[i + 1:]) for i in range(k)], "draft_steps": None}


def check_requests_against_counters(requests: list[RequestRecord], batches: list[BatchRecord]) -> str | None:
    """None when the per-request counts add up to the engine's global counters, else what differs."""
    if not requests or any(r.num_drafts is None for r in requests):
        return None
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        mine, total = sum(getattr(r, name) for r in requests), sum(getattr(b, name) for b in batches)
        if mine != total:
            return f"per-request {name} add up to {mine}, the engine's counters to {total}"
    return None


@dataclass
class BatchRecord:
    """One generate call (one batch, one category): wall time and spec-decode counter deltas."""

    category: str
    wall_s: float
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # per draft position; None (or a shorter list): the engine did not report that position
    num_accepted_tokens_per_pos: list[int | None] = field(default_factory=list)
    draft_time_s: float | None = None  # summed draft-model call time (native backend only)
    num_draft_calls: int = 0
    # summed target call time: verify forwards, or decode steps at k = 0
    target_time_s: float | None = None
    num_target_calls: int = 0
    # served runs: requests the server finished in this window beyond ours (None: not known), and the
    # CPU seconds the load generator's process spent in the window
    foreign_requests: int | None = None
    client_cpu_s: float | None = None


@dataclass
class PointRun:
    """What a backend measured at one grid point: the raw records a point file keeps."""

    requests: list[RequestRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    startup_s: float | None = None
    engine: dict = field(default_factory=dict)
    telemetry: dict | None = None  # GPU samples of the measured window (mtpbench.telemetry)
    mtp_weight_bytes: int | None = None  # bytes of MTP-layer weights the engine holds
    notes: list[str] = field(default_factory=list)  # what a reader must know about this point's numbers
    repeats: list[dict] = field(default_factory=list)  # timing figures of every timed run (``timing``)
    # --law: the verify steps an untimed pass after the timed runs recorded against their law, as the backend hands
    # them over ({"observable": True, "steps": [...]} or {"observable": False, "why": ...}); the point file keeps
    # their summary (``metrics.law.law_block``), not the steps
    law: dict | None = None

    @classmethod
    def from_json(cls, d: dict) -> "PointRun":
        return cls([RequestRecord(**r) for r in d["requests"]], [BatchRecord(**b) for b in d["batches"]],
                   d.get("startup_s"), d.get("engine") or {}, d.get("telemetry"), d.get("mtp_weight_bytes"),
                   d.get("notes") or [], d.get("repeats") or [], d.get("law"))

    def add_repeat(self, requests: list["RequestRecord"], batches: list["BatchRecord"]) -> None:
        """Keep one timed run's figures; the first run's records are the point's own."""
        if not self.repeats:
            self.requests, self.batches = requests, batches
        self.repeats.append(timing(requests, batches))


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


def mean_call_s(batches: list[BatchRecord], kind: str) -> float | None:
    """Mean seconds per draft call (kind='draft') or target call (kind='target')."""
    timed = [b for b in batches if getattr(b, f"{kind}_time_s") is not None and getattr(b, f"num_{kind}_calls")]
    if not timed:
        return None
    return sum(getattr(b, f"{kind}_time_s") for b in timed) / sum(getattr(b, f"num_{kind}_calls") for b in timed)


def latency_ms(requests: list[RequestRecord]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT and E2EL, and every inter-token gap, in ms (vllm bench serve's definitions:
    TPOT = (latency - TTFT) / (output tokens - 1); ITL = gap between successive token deliveries; E2EL the whole
    request)."""
    ttft = [r.ttft_s * 1e3 for r in requests if r.ttft_s is not None]
    tpot = [(r.latency_s - r.ttft_s) / (len(r.output_token_ids) - 1) * 1e3 for r in requests
            if len(r.output_token_ids) > 1 and r.latency_s is not None and r.ttft_s is not None]
    itl = [x * 1e3 for r in requests for x in (r.itl_s or [])]
    e2el = [r.latency_s * 1e3 for r in requests if r.latency_s is not None]
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el}


def slo_latencies(requests: list[RequestRecord]) -> dict[str, list[float | None]]:
    """Each request's TTFT, TPOT and E2EL in ms, in request order, as ``vllm bench serve --goodput`` judges them: TPOT
    0 for a request of one output token or none (vLLM's rule for goodput), None where the engine did not report a
    time (that request's standing against a target is then unknown)."""
    def ms(x: float | None) -> float | None:
        return None if x is None else round(x * 1e3, 3)

    def tpot(r: RequestRecord) -> float | None:
        if len(r.output_token_ids) <= 1:
            return 0.0
        if r.latency_s is None or r.ttft_s is None:
            return None
        return ms((r.latency_s - r.ttft_s) / (len(r.output_token_ids) - 1))

    return {"request_ttft_ms": [ms(r.ttft_s) for r in requests], "request_tpot_ms": [tpot(r) for r in requests],
            "request_e2el_ms": [ms(r.latency_s) for r in requests]}


def timing(requests: list[RequestRecord], batches: list[BatchRecord]) -> dict:
    """The timing figures of one timed run: output tokens/s over its decode time, TTFT, TPOT, ITL and E2EL medians (the
    ITL median: a typical decode step, a round of drafts and their verification), the run's acceptance length, and
    what goodput at any SLO needs: the run's wall time (``wall_s``, the time tokens/s divides by) and each request's
    TTFT, TPOT and E2EL (``slo_latencies``); ``latency_ms``: the run's TTFT, TPOT, ITL and E2EL values as
    ``latency_ms`` counts them (mtpbench.metrics.latency's statistics of each run)."""
    wall = sum(b.wall_s for b in batches)
    lat = latency_ms(requests)
    out = sum(len(r.output_token_ids) for r in requests)
    drafts = sum(b.num_drafts or 0 for b in batches)
    accepted = sum(b.num_accepted_tokens or 0 for b in batches)
    return {"output_tokens_per_sec": out / wall if wall > 0 else None, "ttft_ms_p50": percentile(lat["ttft"], 0.5),
            "tpot_ms_p50": percentile(lat["tpot"], 0.5), "itl_ms_p50": percentile(lat["itl"], 0.5),
            "e2el_ms_p50": percentile(lat["e2el"], 0.5), "acceptance_length": 1 + accepted / drafts if drafts else None,
            "wall_s": wall, **slo_latencies(requests),
            "latency_ms": {m: [round(x, 3) for x in xs] for m, xs in lat.items()}}


# what ``run_rates`` gives a row of several timed runs
RATE_FIELDS = ("request_throughput_per_sec", "request_throughput_per_sec_ci_low", "request_throughput_per_sec_ci_high",
               "decode_time_s")


def run_rates(repeats: list[dict]) -> dict | None:
    """req/s (geometric mean, with its interval) and decode time (geometric mean of the windows) over the timed runs
    (``timing``'s), each from the run's own wall time and requests, as tokens/s is from its own tokens: the first
    run's beside the runs' typical tokens/s gave tokens per request that no request had (windows of 4, 1, 1 s: 80
    tok/s beside 2.0 req/s, 40 tokens a request where each had 10). Geometric means multiply: tokens/s x decode time
    is the runs' geometric mean of output tokens, req/s x decode time their requests. A run of no wall time has no
    rate (nor tokens/s) and is left out of all three. None where a run kept no wall time or requests (a point file
    from before ``timing`` kept them)."""
    from mtpbench import stats

    def r4(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    walls = [r.get("wall_s") for r in repeats]
    # one entry a request in a run's per-request times (``slo_latencies``), None where the time is unknown
    counts = [None if r.get("request_e2el_ms") is None else len(r["request_e2el_ms"]) for r in repeats]
    if None in walls or None in counts:
        return None
    rates = [n / w if w > 0 else None for n, w in zip(counts, walls)]
    ci = stats.gmean_ci(rates) or (None, None)
    return {"request_throughput_per_sec": r4(stats.gmean(rates)), "request_throughput_per_sec_ci_low": r4(ci[0]),
            "request_throughput_per_sec_ci_high": r4(ci[1]),
            "decode_time_s": r4(stats.gmean([w for w in walls if w > 0]))}


def position_count(records: list, i: int) -> int | None:
    """Accepted tokens at draft position ``i`` summed over batches (or requests); None when one of them
    lacks the count (an engine that did not report that position): unknown, never 0."""
    values = [(r.num_accepted_tokens_per_pos or [])[i:i + 1] for r in records]
    if any(not v or v[0] is None for v in values):
        return None
    return sum(v[0] for v in values)
