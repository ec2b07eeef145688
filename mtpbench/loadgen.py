"""The load generator for served runs: an asyncio/aiohttp client streaming from a vLLM OpenAI server.

``run_load`` sends every prompt once to ``/v1/completions`` (or ``/v1/chat/completions`` with
``api="chat"``), streaming, and records per request what ``vllm bench serve`` records: TTFT (send to
first token), the gaps between token deliveries (ITL; with drafting a delivery carries up to k+1 tokens),
latency (send to last token) and the output tokens (their ids, which vLLM returns with
``return_token_ids``; the count from the final ``usage`` block). Load is ``vllm bench serve``'s:
``concurrency`` requests in flight at most (closed loop) and arrivals spaced by a Poisson process of
``request_rate`` per second (``inf``: all at once), drawn from a seeded generator. A request arrives when
the arrival process releases it (``arrival_s``) and is sent when the concurrency gate lets it through
(``sent_s``, from which TTFT and latency count, as in ``vllm bench serve``).

The window runs from the first arrival to the last completion. The client's own cost is measured in the
same window as the CPU seconds of the event loop's thread (``client_cpu_s``), so a reader can see whether the
client could have been the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp

from mtpbench.config import APIS
from mtpbench.metrics import RequestRecord, request_acceptance, request_acceptance_from_histogram
from mtpbench.prompts import Prompt

REQUEST_TIMEOUT_S = 6 * 3600  # a whole request
IDLE_TIMEOUT_S = 600  # no byte from the server for this long: the request failed


@dataclass
class LoadResult:
    requests: list[RequestRecord]  # in prompt order
    wall_s: float
    client_cpu_s: float
    errors: list[str] = field(default_factory=list)
    # when the arrival process released each request (before the concurrency gate), from the window's start
    arrival_s: list[float] = field(default_factory=list)


def sampling_fields(top_p: float = 1.0, top_k: int = 0) -> dict:
    """A request's top_p and top_k, always sent (a server fills what a request leaves out from the model's
    generation_config.json); top_k off as -1, which every vLLM takes (0.32 prefers 0, older ones refuse it)."""
    return {"top_p": top_p, "top_k": top_k if top_k > 0 else -1}


def payload(api: str, model: str, prompt: Prompt, max_tokens: int, temperature: float, seed: int | None,
            top_p: float = 1.0, top_k: int = 0) -> dict:
    text = prompt.text
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, **sampling_fields(top_p, top_k),
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "return_token_ids": True}
    if prompt.templated:  # rendered through the chat template: it holds its special tokens already
        body["add_special_tokens"] = False
    if seed is not None and temperature > 0:
        body["seed"] = seed
    if api == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _session(url: str, conn, **kwargs) -> aiohttp.ClientSession:
    """A session for requests to ``url``'s server: ``conn``'s TLS context (``mtpbench.connection``); its
    headers go per request (``conn.headers``), so they reach that server's origin only."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60,
                                     ssl=conn.ssl_context if conn is not None and conn.ssl_context else True)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_read=IDLE_TIMEOUT_S)
    # the environment's proxy for a remote server, as any HTTP client; never aiohttp's trust_env, which also
    # reads ~/.netrc and then refuses every request that carries the API key ("Cannot combine AUTHORIZATION ...")
    return aiohttp.ClientSession(connector=connector, timeout=timeout, proxy=env_proxy(url), **kwargs)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``https_proxy``, ``http_proxy``, ``no_proxy``), None for a
    loopback server or none named. urllib's opener in ``vllm_server.fetch`` asks the same."""
    import urllib.request

    host = urlparse(url).hostname or ""
    if is_loopback(url) or urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(urlparse(url).scheme)


def _headers(url: str, conn) -> dict:
    return conn.headers(url) if conn is not None else {}


async def _request(session, url: str, body: dict, prompt: Prompt, t0: float,
                   headers: dict | None = None) -> tuple[RequestRecord | None, str | None]:
    tokens: list[int] = []
    usage_tokens = prompt_tokens = spec = None
    ttft = last = None
    itl: list[float] = []
    st = time.perf_counter()
    try:
        # redirects are not followed: they would carry the credentials to wherever the server says
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as resp:
            if resp.status != 200:
                return None, f"HTTP {resp.status}: {(await resp.text())[:300]}"
            async for raw in resp.content:  # one SSE line at a time
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":  # read on to the stream's end, so the connection goes back to the pool
                    continue  # (breaking out closes it: every request would open a new one; vllm bench reuses)
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    return None, f"unexpected stream item: {data[:200]!r}"
                if chunk.get("error"):  # vLLM reports a failure inside the stream
                    return None, f"server error in the stream: {str(chunk['error'])[:300]}"
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                    prompt_tokens = chunk["usage"].get("prompt_tokens")
                    spec = (chunk.get("metrics") or {}).get("speculative_decoding")
                for choice in chunk.get("choices") or []:
                    ids = choice.get("token_ids") or []
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if not ids and not text:
                        continue  # role-only or empty deltas carry no token
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - st
                    else:
                        itl.append(now - last)
                    last = now
                    tokens.extend(ids)
    except (aiohttp.ClientError, OSError, ValueError, asyncio.TimeoutError) as e:  # ValueError: bad JSON, oversized line
        return None, f"{type(e).__name__}: {e}"
    if usage_tokens is None:
        return None, "the stream ended without its usage block: the request did not complete"
    if len(tokens) != usage_tokens:
        return None, (f"the server returned {len(tokens)} token ids for {usage_tokens} completion tokens: "
                      "is this a vLLM server (return_token_ids)?")
    return RequestRecord(prompt.category, prompt_tokens or 0, tokens, ttft,
                         (last - st) if last is not None else None, itl, st - t0,
                         **served_acceptance(spec, prompt_tokens or 0), prompt_id=prompt.id,
                         context_tokens=prompt.context_tokens), None


def served_acceptance(spec: dict | None, prompt_tokens: int) -> dict:
    """A request's spec-decode counts from the response's ``metrics.speculative_decoding`` (vLLM servers
    started with ``--per-request-spec-decode-metrics``); empty when the server sends none."""
    if not spec or not spec.get("num_spec_tokens"):
        return {}
    k = spec["num_spec_tokens"]
    if spec.get("per_step_accepted"):
        return request_acceptance(k, spec["per_step_accepted"], spec.get("per_step_drafted"), prompt_tokens + 1)
    return request_acceptance_from_histogram(k, spec["acceptance_histogram"], spec["num_draft_tokens"])


async def _run(base_url, api, model, prompts, max_tokens, temperature, seed, concurrency, request_rate, conn=None,
               law=(1.0, 0)):
    url = base_url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    headers = _headers(url, conn)
    async with _session(base_url, conn, read_bufsize=2 ** 22) as session:
        async def one(p: Prompt):
            async with gate:
                return await _request(session, url, payload(api, model, p, max_tokens, temperature, seed, *law), p, t0,
                                      headers)

        # the event loop's thread is the client: its CPU time, not the process's (a GPU sampler runs beside)
        cpu0, t0 = time.thread_time(), time.perf_counter()
        tasks, arrivals = [], []
        for i, p in enumerate(prompts):
            arrivals.append(time.perf_counter() - t0)  # the arrival, not the send: the gate may hold it
            tasks.append(asyncio.create_task(one(p)))
            if math.isfinite(request_rate) and i < len(prompts) - 1:
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    records = [r for r, _ in results]
    errors = [e for _, e in results if e]
    return LoadResult(records, wall, cpu, errors, arrivals)


async def _post_all(url: str, bodies: list[dict], concurrency: int,
                    conn=None) -> list[tuple[dict | None, str | None]]:
    gate = asyncio.Semaphore(concurrency)
    headers = _headers(url, conn)
    async with _session(url, conn) as session:
        async def one(body: dict):
            async with gate:
                try:
                    async with session.post(url, json=body, headers=headers, allow_redirects=False) as resp:
                        text = await resp.text()
                        if resp.status != 200:
                            return None, f"HTTP {resp.status}: {text[:300]}"
                        data = json.loads(text)
                        return (data, None) if isinstance(data, dict) else (None, f"unexpected answer: {text[:200]}")
                except (aiohttp.ClientError, OSError, ValueError, asyncio.TimeoutError) as e:
                    return None, f"{type(e).__name__}: {e}"

        return await asyncio.gather(*(one(b) for b in bodies))


def post_all(url: str, bodies: list[dict], concurrency: int = 1,
             conn=None) -> list[tuple[dict | None, str | None]]:
    """POST each JSON body to ``url`` (not streamed), at most ``concurrency`` in flight; per body, in order,
    (the answer's JSON, None) or (None, what went wrong). check-lossless's requests to a server: token-id
    prompts, n continuations, teacher-forced prompt log-probs; nothing is timed. ``conn``: the server's
    ``mtpbench.connection.Connection`` (headers, TLS), None for an open one."""
    return asyncio.run(_post_all(url, bodies, max(1, concurrency), conn))


def run_load(base_url: str, model: str, prompts: list[Prompt], *, api: str = "completions", max_tokens: int,
             temperature: float = 0.0, seed: int = 0, concurrency: int = 1,
             request_rate: float = math.inf, conn=None, top_p: float = 1.0, top_k: int = 0) -> LoadResult:
    """Send every prompt once under the given load; see the module docstring. ``conn``: the server's
    ``mtpbench.connection.Connection`` (headers, TLS), None for an open one."""
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}")
    return asyncio.run(_run(base_url, api, model, prompts, max_tokens, temperature, seed, max(1, concurrency),
                            request_rate, conn, (top_p, top_k)))
