"""trace-layers on a server, launched by mtpbench or already running: mtpbench's vLLM plugin
(``mtpbench.backends.vllm.plugin``) serves ``POST /v1/mtpbench/trace/start`` and ``.../stop``, which start and stop
the layer tracer on every rank of the engine; between them this module sends the prompts, greedy, over the
completions API, and reads the spec-decode counters from /metrics around them.

A server serves the trace when mtpbench is installed in its Python environment and ``VLLM_PLUGINS`` names
``mtpbench_trace`` (vLLM loads endpoint plugins only when named), and it sees the draft model's Python forwards
only when started with ``--enforce-eager`` (graph replay and compiled modules run none). A launched server gets
both; an attached one must have been started so. Its routes sit under ``/v1``, behind the server's ``--api-key``.
"""

from __future__ import annotations

from mtpbench.backends.vllm.plugin import LAW_START_ROUTE, LAW_STOP_ROUTE
from mtpbench.errors import MtpBenchError

ENABLE = ("start it with mtpbench installed in the server's Python environment and VLLM_PLUGINS=mtpbench_trace "
          "(added to any list already there) and --enforce-eager; docs/trace-layers.md, 'Tracing a server'")


def post(server, route: str, body: dict) -> dict:
    """One POST to the server's trace routes with its credentials; an MtpBenchError saying how to enable them
    where the server does not serve them."""
    from mtpbench.loadgen import post_all

    url = server.base_url + route
    [(answer, error)] = post_all(url, [body], 1, conn=server.conn)
    if error is not None and error.startswith(("HTTP 404", "HTTP 405")):
        raise MtpBenchError(f"the server at {server.base_url} does not serve mtpbench's trace (POST {route}: "
                            f"{error.split(':')[0]}): {ENABLE}")
    if error is not None:
        raise MtpBenchError(f"the server at {server.base_url} refused the trace (POST {route}): {error}")
    return answer


def trace_served(server, cfg, k: int, prompts, force: bool = False) -> dict:
    """One traced generation on every rank of a served engine: the trace data ``run_trace`` judges (as the
    offline backend's ``trace_point``), with each rank's records and the counters' delta over the window
    (traffic from other clients during it lands in both; the records say which calls ran, whoever sent them)."""
    from mtpbench.backends.vllm.counters import counter_delta
    from mtpbench.backends.vllm_server.counters import read_metrics, settled_metrics
    from mtpbench.backends.vllm_server.http import complete
    from mtpbench.prompts import batches
    from mtpbench.trace.records import CallRecord

    before = read_metrics(server.conn)
    post(server, "/v1/mtpbench/trace/start", {"force": force})
    law_started = start_law(server)
    crash = None
    try:
        for group in batches(prompts, cfg.batch_size):
            complete(server, [{"prompt": p.text, "max_tokens": cfg.max_tokens, "temperature": 0.0, "top_p": 1.0,
                               "top_k": -1, "ignore_eos": True} for p in group], len(group))
    except RuntimeError as e:  # a request failed: the draft model may have raised (the records say where)
        crash = str(e)[:2000]
    ranks = post(server, "/v1/mtpbench/trace/stop", {})["ranks"]
    law = stop_law(server, law_started)
    after, _ = settled_metrics(server.conn, before, len(prompts))
    drafting = [r for r in ranks if r.get("drafter") and r.get("records") is not None]
    if not drafting:
        raise MtpBenchError(f"no rank of the server at {server.base_url} holds a draft model (is it started with a "
                            "speculative config?)")
    delta = counter_delta(before, after, k)
    return {"records": [CallRecord(**{**rec, "rank": r["rank"]}) for r in drafting for rec in r["records"]],
            "ranks": ranks, "crash": crash, "crash_in_draft": any(r.get("draft_error") for r in drafting),
            "num_layers": drafting[0]["num_layers"], "structure": drafting[0]["structure"],
            "num_drafts": delta["num_drafts"], "num_accepted_tokens_per_pos": delta["num_accepted_tokens_per_pos"],
            "law": law}


def start_law(server) -> list | str:
    """Start recording acceptance against its law on every rank (the plugin's law routes): the ranks' answers, or
    why it cannot be (a server whose mtpbench plugin predates the routes: the trace still runs)."""
    try:
        return post(server, LAW_START_ROUTE, {})["ranks"]
    except MtpBenchError as e:
        return f"the drafter's and the target's laws are not observable on this server ({e})"


def stop_law(server, started: list | str) -> dict:
    """The law report of the first verifying rank (``metrics.law.law_report``), or why there is none."""
    from mtpbench.metrics.law import law_report

    if isinstance(started, str):
        return {"observable": False, "why": started}
    return law_report(started, post(server, LAW_STOP_ROUTE, {})["ranks"])
