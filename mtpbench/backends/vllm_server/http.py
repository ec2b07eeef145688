"""HTTP to a vLLM OpenAI-compatible server: a GET with the connection's credentials and TLS (``fetch``), the
server handle the rest of the backend passes around (``Server``), waiting for ``/health``, and the
``/v1/completions`` client of check-lossless (``complete``). The sweep's streamed load is ``mtpbench.loadgen``'s."""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.request

from mtpbench.errors import MtpBenchError

HTTP_TIMEOUT_S = 10.0


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


class Server:
    """One launched server, or an attached one (``guard`` None)."""

    def __init__(self, base_url: str, model: str, guard=None, conn=None):
        from mtpbench.connection import Connection

        self.base_url, self.model, self.guard = base_url, model, guard
        self.conn = conn or Connection.open(base_url)  # a launched server: open, on loopback

    def stop(self) -> None:
        if self.guard is not None:
            self.guard.stop()


class LogprobsCapped(MtpBenchError):
    """The k = 0 server refused whole-vocabulary prompt log-probs (its max_logprobs)."""


def complete(server: Server, bodies: list[dict], concurrency: int) -> list[dict]:
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
