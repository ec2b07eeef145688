"""A server's counters at ``/metrics``: vLLM's spec-decode and request counters (``vllm:spec_decode_*_total``,
``vllm:request_success_total``, ...) summed over engines and label sets, parsed with ``prometheus_client``,
read once the window's requests are counted, and what the deltas around a window say about traffic that was
not ours. Acceptance from the deltas is the offline backend's ``counter_delta``, as ``vllm bench serve``
computes it."""

from __future__ import annotations

import time

from mtpbench.backends.vllm_server.http import http_get
from mtpbench.errors import MtpBenchError

COUNTER_SETTLE_S = 10.0  # how long to wait for /metrics to count the window's last requests


def parse_metrics(text: str) -> dict:
    """vLLM's spec-decode and request counters from Prometheus text, summed over every label set.

    Returns the offline backend's counter dict (``num_drafts``, ``num_draft_tokens``,
    ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``) plus ``num_requests_finished``,
    ``spec_decode`` (the server drafts), ``num_positions`` (its num_speculative_tokens) and ``is_vllm``."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_requests_finished": 0,
           "num_generation_tokens": 0, "num_requests_in_flight": 0, "spec_decode": False, "is_vllm": False}
    per_pos: dict[int, float] = {}
    scalar = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
              "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
              "vllm:request_success": "num_requests_finished", "vllm:generation_tokens": "num_generation_tokens"}
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise MtpBenchError(f"/metrics is not Prometheus text ({e})") from None
    for fam in families:
        out["is_vllm"] |= fam.name.startswith("vllm:")
        if fam.name == "vllm:spec_decode_num_drafts":
            out["spec_decode"] = True
        for s in fam.samples:
            if fam.name in gauges and s.name == fam.name:
                out["num_requests_in_flight"] += s.value
            if not s.name.endswith("_total"):  # _created samples are timestamps, not counts
                continue
            if fam.name in scalar:
                out[scalar[fam.name]] += s.value
            elif fam.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0) + s.value
    for key in (*scalar.values(), "num_requests_in_flight"):
        out[key] = int(out[key])
    # a position missing between reported ones is unknown (None), not 0
    out["num_accepted_tokens_per_pos"] = [int(per_pos[i]) if i in per_pos else None
                                          for i in range(max(per_pos, default=-1) + 1)]
    out["num_positions"] = len(out["num_accepted_tokens_per_pos"])
    return out


def read_metrics(target) -> dict:
    """The counters at a server's /metrics (``target``: a ``Connection``, or an open server's base URL)."""
    from mtpbench.connection import as_connection

    conn = as_connection(target)
    status, text = http_get(conn.metrics_url, conn=conn)
    if status != 200:
        raise RuntimeError(f"{conn.metrics_url} answered HTTP {status}")
    return parse_metrics(text)


def settled_metrics(target, before: dict, sent: int) -> tuple[dict, str | None]:
    """/metrics once ``vllm:request_success_total`` has counted the ``sent`` requests finished since
    ``before`` (the stat logger may count the last ones a moment after their final chunk went out), and
    what a reader must know when it had not within ``COUNTER_SETTLE_S`` (None when it had)."""
    after = read_metrics(target)
    end = time.monotonic() + COUNTER_SETTLE_S
    while after["num_requests_finished"] - before["num_requests_finished"] < sent and time.monotonic() < end:
        time.sleep(0.05)
        after = read_metrics(target)
    end = time.monotonic() + 1.0  # the running/waiting gauges may trail the counter by a step
    while after["num_requests_in_flight"] and time.monotonic() < end:
        time.sleep(0.05)
        after = read_metrics(target)
    counted = after["num_requests_finished"] - before["num_requests_finished"]
    if counted >= sent:
        return after, None
    return after, (f"/metrics had counted {counted} of the {sent} finished requests after {COUNTER_SETTLE_S:g} s "
                   "of waiting: the counters read may miss the last steps (acceptance, foreign traffic)")


def window_traffic(before: dict, after: dict, sent: int, ours: int) -> tuple[int | None, list[str]]:
    """What the counters read around a window of ``sent`` requests that generated ``ours`` tokens say of the
    rest of the server's traffic: the requests of others active in the window (None when the counters are
    short of ours, so unknown), and the notes a reader needs. RuntimeError when a counter went backwards."""
    if any(after[c] < before[c] for c in ("num_requests_finished", "num_drafts", "num_generation_tokens")):
        raise RuntimeError("the server's counters went backwards during the window: was it restarted?")
    finished = after["num_requests_finished"] - before["num_requests_finished"]
    tokens = after["num_generation_tokens"] - before["num_generation_tokens"]
    # requests of others active in the window: those that finished in it, and those still in flight
    foreign = finished - sent + after["num_requests_in_flight"]
    extra_tokens = tokens - ours
    notes = []
    if foreign > 0 or extra_tokens > 0:
        notes.append(f"the server served {max(foreign, 0)} request(s) and {max(extra_tokens, 0)} token(s) "
                     "that were not ours during the window: its counters (acceptance) include them")
    if foreign < 0 or extra_tokens < 0:  # fewer than we saw finish: the counters are short, not the traffic
        notes.append(f"the server's counters show {finished} finished request(s) and {tokens} token(s) in the "
                     f"window, fewer than our {sent} and {ours}: they are incomplete, and other traffic in the "
                     "window is unknown")
        return None, notes
    return foreign, notes
