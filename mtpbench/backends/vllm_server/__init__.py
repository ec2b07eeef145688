"""The served backend: a vLLM OpenAI-compatible server under load, measured from outside.

``backend`` (``VllmServerBackend``: the sweep protocol and check-lossless's calls) over ``launch`` (one
``launch()`` for every server mtpbench starts, under ``mtpbench.procguard``), ``attach`` (``probe``: what a
running server tells about itself; a server the user runs), ``check`` (check-lossless's arms and scores on a
k = 0 server and a k = K one), ``counters`` (``/metrics``: vLLM's spec-decode counters and their deltas) and
``http`` (GETs with the connection's credentials and TLS, the completions client). The names tests and
benchmarks use are re-exported here.
"""

from mtpbench.backends.vllm_server.attach import attached_runner, connection_facts, engine_name, probe
from mtpbench.backends.vllm_server.backend import VllmServerBackend
from mtpbench.backends.vllm_server.check import arm_seed
from mtpbench.backends.vllm_server.counters import parse_metrics, read_metrics, settled_metrics
from mtpbench.backends.vllm_server.http import Server, fetch, http_get, wait_healthy
from mtpbench.backends.vllm_server.launch import (free_port, launched_runner, launched_sampler_fault, port_taken,
                                                  server_args, server_command, server_env)

__all__ = ["Server", "VllmServerBackend", "arm_seed", "attached_runner", "connection_facts", "engine_name", "fetch",
           "free_port", "http_get", "launched_runner", "launched_sampler_fault", "parse_metrics", "port_taken",
           "probe", "read_metrics", "server_args", "server_command", "server_env", "settled_metrics",
           "wait_healthy"]
