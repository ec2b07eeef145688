"""A point's latency statistics as ``vllm bench serve`` reports them, from its per-request times: per metric (TTFT,
TPOT, ITL, E2EL, in ms) the mean, the standard deviation (numpy's, ddof 0, as vLLM), the p50, p90 and p99 every row
has a column for, and any other percentile ``--metric-percentiles`` asks for (``latency_percentiles_ms``, keyed like
the columns: ``ttft_ms_p95``). Definitions (vLLM's): TTFT from the request's send to its first token; TPOT =
(E2EL - TTFT) / (output tokens - 1); ITL every gap between successive token deliveries; E2EL the whole request.

``--percentile-metrics`` and ``--metric-percentiles`` choose what the table shows (``columns``); every statistic is
in summary.json and summary.csv whatever they say."""

from __future__ import annotations

import math

from mtpbench.metrics.records import RequestRecord, latency_ms, percentile

METRICS = ("ttft", "tpot", "itl", "e2el")
FIXED = (50.0, 90.0, 99.0)  # percentiles every row has a column for
TABLE_DEFAULTS = (("ttft", "tpot", "itl"), (99.0,))  # vllm bench serve's, once either option is given
NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def key(metric: str, q: float) -> str:
    """The column (or ``latency_percentiles_ms`` key) of a metric's q-th percentile: ``ttft_ms_p99``, ``itl_ms_p99.9``."""
    return f"{metric}_ms_p{q:g}"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def statistics(requests: list[RequestRecord], percentiles=(), repeats=()) -> dict:
    """The row's latency fields: mean, std and the fixed percentiles of every metric, and the other asked-for
    percentiles in ``latency_percentiles_ms``; None where a metric has no value. With two or more timed runs that
    kept their values (``repeats``, ``timing``'s ``latency_ms``), each field is the geometric mean over the runs of
    that run's own figure, as the p50 columns and their intervals are (``stats.gmean``, what the judge compares):
    p50 <= p90 <= p99 holds as it does in each run (the point's requests are its first run's only)."""
    runs = [r.get("latency_ms") for r in repeats]
    if len(runs) < 2 or any(run is None for run in runs):
        return run_statistics(latency_ms(requests), percentiles)
    each = [run_statistics(run, percentiles) for run in runs]
    out = {name: _over_runs([e[name] for e in each]) for name in each[0] if name != "latency_percentiles_ms"}
    out["latency_percentiles_ms"] = {name: _over_runs([e["latency_percentiles_ms"][name] for e in each])
                                     for name in each[0]["latency_percentiles_ms"]}
    return out


def _over_runs(values: list[float | None]) -> float | None:
    """The geometric mean of the runs that have the figure (a metric a run did not observe is left out); None if
    none has."""
    from mtpbench.stats.intervals import gmean

    return _round(gmean(values))


def run_statistics(values: dict[str, list[float]], percentiles=()) -> dict:
    """One run's fields from its values in ms per metric (``records.latency_ms``)."""
    out: dict = {}
    for m in METRICS:
        xs = values.get(m) or []
        mean = sum(xs) / len(xs) if xs else None
        out[f"{m}_ms_mean"] = _round(mean)
        out[f"{m}_ms_std"] = _round(math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))) if xs else None
        for q in FIXED:
            out[key(m, q)] = _round(percentile(xs, q / 100))
    out["latency_percentiles_ms"] = {key(m, q): _round(percentile(values.get(m) or [], q / 100))
                                     for m in METRICS for q in sorted(set(percentiles)) if q not in FIXED}
    return out


def check(metrics: tuple[str, ...], percentiles: tuple[float, ...]) -> str | None:
    """What is wrong with --percentile-metrics / --metric-percentiles, in one line; None when nothing is."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        return f"--percentile-metrics: unknown metric {unknown[0]!r} (choose from {', '.join(METRICS)})"
    bad = [q for q in percentiles if not 0 <= q <= 100]
    if bad:
        return f"--metric-percentiles takes percentiles from 0 to 100, got {bad[0]:g}"
    return None


def columns(metrics: tuple[str, ...], percentiles: tuple[float, ...]) -> list[tuple[str, str]] | None:
    """The table's latency columns (field or key, header) for the options given: each metric's mean and each
    percentile; None when neither option was given (the table's usual columns)."""
    if not metrics and not percentiles:
        return None
    metrics, percentiles = metrics or TABLE_DEFAULTS[0], percentiles or TABLE_DEFAULTS[1]
    out = []
    for m in metrics:
        out.append((f"{m}_ms_mean", f"{NAMES[m]} mean ms"))
        out += [(key(m, q), f"{NAMES[m]} p{q:g} ms") for q in percentiles]
    return out


def request_lines(requests: list[RequestRecord]) -> list[dict]:
    """One record per request for ``<point>.requests.jsonl`` (the point's first timed run), vllm bench serve's
    per-request fields in ms beside the request's own spec-decode counts."""
    out = []
    for r in requests:
        n = len(r.output_token_ids)
        tpot = (r.latency_s - r.ttft_s) / (n - 1) * 1e3 if n > 1 and r.latency_s is not None and r.ttft_s is not None \
            else None
        out.append({"prompt_id": r.prompt_id, "category": r.category, "num_prompt_tokens": r.num_prompt_tokens,
                    "context_tokens": r.context_tokens, "num_output_tokens": n,
                    "sent_s": r.sent_s, "ttft_ms": _ms(r.ttft_s), "tpot_ms": _round(tpot), "e2el_ms": _ms(r.latency_s),
                    "itl_ms": None if r.itl_s is None else [_ms(x) for x in r.itl_s],
                    "num_drafts": r.num_drafts, "num_draft_tokens": r.num_draft_tokens,
                    "num_accepted_tokens": r.num_accepted_tokens, "acceptance_length": r.acceptance_length})
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)
