"""What a running server tells about itself (``probe``), and attaching to one the user runs.

Attached (``--server URL``): a server the user runs (one GPU, several, several nodes: vLLM's business).
mtpbench neither starts nor stops it; it reads the model from ``/v1/models``, the version from ``/version``
and k from ``/metrics`` (vLLM creates one ``num_accepted_tokens_per_pos`` counter per draft position at
start-up); what it cannot read (the MTP layer count) is taken from the options as given, and the row says
so. Its model runner cannot be observed from outside: rows say ``unknown``. check-lossless attaches to two:
``--server``, which must draft, and ``--baseline-server``, which must not (``attach_pair``)."""

from __future__ import annotations

import json
import socket
import urllib.error

from mtpbench.backends.vllm_server.counters import parse_metrics
from mtpbench.backends.vllm_server.http import Server, fetch
from mtpbench.config import SweepConfig
from mtpbench.errors import MtpBenchError

GENERIC_SERVERS = ("uvicorn", "hypercorn", "gunicorn", "nginx", "envoy", "caddy", "apache", "istio-envoy")


def engine_name(headers: dict, version_body: str) -> str | None:
    """What a server says it is: its ``Server`` header, unless that names only a web server or proxy, else
    the ``/version`` answer's name fields. None when it says nothing."""
    server = next((v for k, v in headers.items() if k.lower() == "server"), "") or ""
    if server and not server.lower().startswith(GENERIC_SERVERS):
        return server.strip()[:80]
    try:
        info = json.loads(version_body)
    except (json.JSONDecodeError, TypeError):
        return None
    if isinstance(info, dict):
        for key in ("engine", "name", "server", "model_server"):
            if isinstance(info.get(key), str):
                return info[key][:80]
    return None


def probe(target) -> dict:
    """What a running server tells about itself (``target``: a ``Connection``, or an open server's base URL);
    MtpBenchError, one line naming the reason, when it cannot be measured: out of reach, TLS, an API key wanted
    or refused, not the OpenAI API, not vLLM, or its /metrics out of reach."""
    from mtpbench.connection import as_connection

    conn = as_connection(target)
    url = conn.base_url
    try:
        status, text, _ = fetch(url + "/v1/models", conn)
    except (OSError, urllib.error.URLError) as e:
        reason = getattr(e, "reason", e)
        raise MtpBenchError(f"cannot reach a server at {url} ({reason})") from None
    if status in (401, 403):
        if conn.key_source:
            raise MtpBenchError(f"the server at {url} refused the API key from {conn.key_source} (HTTP {status}): "
                                "check its value, or a gateway header it wants (--header-env 'Name=VAR')")
        raise MtpBenchError(f"the server at {url} wants an API key (HTTP {status}); set OPENAI_API_KEY or "
                            "--api-key-env NAME")
    if 300 <= status < 400:
        raise MtpBenchError(f"the server at {url} redirects /v1/models (HTTP {status}), and mtpbench does not follow "
                            "redirects (they would carry the credentials elsewhere): give the URL it redirects to")
    models = []
    if status == 200:
        try:
            models = [m["id"] for m in json.loads(text).get("data", [])]
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            models = []
    if not models:
        raise MtpBenchError(f"{url} is not a vLLM server: it does not serve the OpenAI API (/v1/models answered HTTP {status}"
                            f"{'' if status != 200 else ' without a model list'})")
    version, version_body, v_headers = None, "", {}
    try:
        v_status, version_body, v_headers = fetch(url + "/version", conn)
        version = json.loads(version_body).get("version") if v_status == 200 else None
    except (OSError, json.JSONDecodeError, AttributeError):
        pass
    metrics = _probe_metrics(conn, v_headers, version_body if version is not None else "")
    return {"model": models[0], "models": models, "vllm": version, "metrics": metrics}


def _probe_metrics(conn, headers: dict, version_body: str) -> dict:
    """vLLM's counters at ``conn.metrics_url``, or MtpBenchError saying why acceptance cannot be read there."""
    from mtpbench.connection import origin

    where = conn.metrics_url
    elsewhere = origin(where) != origin(conn.base_url)
    offer = ("give another with --metrics-url URL" if elsewhere else
             "give the engine's own with --metrics-url URL (e.g. its port behind the gateway)")
    try:
        status, text, m_headers = fetch(where, conn)
    except (OSError, urllib.error.URLError) as e:
        status, text, m_headers, why = None, "", {}, f"unreachable: {getattr(e, 'reason', e)}"
    else:
        why = f"HTTP {status}"
    hint = ""
    if elsewhere and status in (401, 403) and conn.credentials and not conn.metrics_credentials:
        hint = " (no credentials were sent to that origin; --metrics-credentials sends them)"
    if status != 200:
        raise MtpBenchError(f"{conn.base_url} answers the OpenAI routes, but its /metrics at {where} cannot be read "
                            f"({why}){hint}: acceptance cannot be read through this URL; {offer}")
    try:
        metrics = parse_metrics(text)
    except MtpBenchError:
        raise MtpBenchError(f"{where} answered, but not with Prometheus text: acceptance cannot be read through this "
                            f"URL; {offer}") from None
    if not metrics["is_vllm"]:
        name = engine_name(headers, version_body) or engine_name(m_headers, "")
        says = f" (it says it is {name})" if name else ""
        raise MtpBenchError(f"{conn.base_url} serves the OpenAI API but is not vLLM{says}: no vllm: counters at "
                            f"{where}; if vLLM runs behind a gateway there, {offer}")
    return metrics


def attached_runner() -> dict:
    """An attached server's runner cannot be observed from outside (nor whether Triton interprets, nor its
    sampler: ``sampler_fault`` unknown)."""
    from mtpbench.runners import UNKNOWN

    return {"runner": UNKNOWN, "drafter": None, "interpreted": None, "sampler_fault": UNKNOWN, "notes": []}


def connection_facts(conn) -> dict:
    """What a result may keep about how a server was reached: names, never a value."""
    return {"tls_verified": None if not conn.base_url.startswith("https://") else not conn.insecure,
            "api_key_from": conn.key_source, "headers": sorted(conn.credentials), "metrics_url": conn.metrics_url,
            "credentials_to_metrics_url": conn.sends_credentials(conn.metrics_url)}


def attach(cfg: SweepConfig, conn) -> tuple[Server, dict]:
    """The attached ``--server`` (reached through ``conn``) and its facts: the model, vLLM version and k it
    runs, and where each came from. MtpBenchError when it cannot be measured or the options ask for a k or
    several MTP layer counts it does not run."""
    if len(cfg.mtp_layers) > 1:
        raise MtpBenchError("--server measures the server as it runs: give one --mtp-layers value or none "
                            f"(got {','.join(map(str, cfg.mtp_layers))})")
    url = cfg.server.rstrip("/")
    info = probe(conn)
    k_server = _server_k(cfg, url, info["metrics"])
    k = k_server if k_server is not None else cfg.k[0]
    facts = {"engine": "vllm-server", "attached": True, "server": cfg.server, "model": info["model"],
             "vllm": info["vllm"], "k": k, "k_source": "server /metrics" if k_server is not None else "--k as given",
             "mtp_layers": cfg.mtp_layers[0] if cfg.mtp_layers else None, "connection": connection_facts(conn)}
    if conn.insecure:
        facts["notes"] = conn.notes()
    return Server(url, info["model"], conn=conn), facts


def _server_k(cfg: SweepConfig, url: str, m: dict) -> int | None:
    """The k an attached server runs, read from its counters (0: it does not draft; None: it drafts but does
    not expose k, so ``--k`` is taken as given); MtpBenchError when ``--k`` disagrees or is missing."""
    k_server = m["num_positions"] if m["spec_decode"] else 0
    if m["spec_decode"] and not m["num_positions"]:
        k_server = None  # drafting, but k not exposed: the user's --k is taken as given
    given = set(cfg.k)
    if len(given) > 1:
        raise MtpBenchError("--server measures the server as it runs: give one --k value or none "
                            f"(got {','.join(map(str, cfg.k))})")
    if given and k_server is not None and given != {k_server}:
        if k_server == 0:
            raise MtpBenchError(f"the server at {url} runs without speculative decoding, "
                                f"but k = {cfg.k[0]} was asked for")
        raise MtpBenchError(f"the server at {url} runs num_speculative_tokens={k_server}, "
                            f"but k = {cfg.k[0]} was asked for")
    if k_server is None and not given:
        raise MtpBenchError(f"the server at {url} drafts but does not expose k: give it with --k (--num-speculative-tokens where one k runs)")
    return k_server


def drafting_first(conn, urls: tuple[str, str]) -> tuple[str, str]:
    """Two attached servers given as --server, in either order: (the one that drafts, the one that does not), told
    apart by their /metrics (vllm:spec_decode counters); MtpBenchError when both or neither draft. ``conn``: the
    connection to the first (the second gets the same credentials)."""
    drafts = [probe(c)["metrics"]["spec_decode"] for c in (conn, conn.for_server(urls[1].rstrip("/")))]
    if drafts == [True, False]:
        return urls
    if drafts == [False, True]:
        return urls[1], urls[0]
    both = "both draft" if drafts[0] else "neither drafts"
    raise MtpBenchError(f"the servers {urls[0]} and {urls[1]}: {both}; check-lossless takes one that drafts and the "
                        "same model served without drafting (its k = 0 arms)")


def attach_pair(conn, server_url: str, baseline_url: str) -> tuple[Server, dict]:
    """An attached check: the --server must draft and the --baseline-server must not. Returns the baseline
    server and its facts; MtpBenchError (nothing written yet) when either is out of reach or the wrong kind."""
    url, base = server_url.rstrip("/"), baseline_url.rstrip("/")
    m = probe(conn)["metrics"]
    if not m["spec_decode"]:
        raise MtpBenchError(f"the --server at {url} does not draft (no vllm:spec_decode counters at /metrics): "
                            "check-lossless needs it started with a --speculative-config; its twin without "
                            "drafting goes to --baseline-server")
    base_conn = conn.for_server(base)  # the same credentials: both servers are the user's
    try:
        info = probe(base_conn)
    except MtpBenchError as e:
        raise MtpBenchError(f"--baseline-server: {e}") from None
    if info["metrics"]["spec_decode"]:
        k = info["metrics"]["num_positions"] or "unknown"
        raise MtpBenchError(f"the --baseline-server at {base} drafts (num_speculative_tokens={k}): it must "
                            "serve the same model without a --speculative-config")
    facts = {"engine": "vllm-server", "attached": True, "server": base, "model": info["model"],
             "vllm": info["vllm"], "k": 0, "connection": connection_facts(base_conn), **attached_runner()}
    return Server(base, info["model"], conn=base_conn), facts


def is_local(url: str) -> bool:
    """Whether the server at ``url`` runs on this machine (so its GPU can be sampled here)."""
    from urllib.parse import urlparse

    from mtpbench.loadgen import is_loopback

    if is_loopback(url):
        return True
    host = urlparse(url).hostname or ""
    try:
        return host in (socket.gethostname(), socket.getfqdn()) or \
            socket.gethostbyname(host) == socket.gethostbyname(socket.gethostname())
    except OSError:
        return False
