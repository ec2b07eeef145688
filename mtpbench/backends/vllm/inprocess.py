"""Reaching into a vLLM engine whose core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the model
runner its ranks built and the MTP bytes they hold (through ``collective_rpc``, so at any parallel layout: the
methods are ``plugin``'s), its draft and target models where it has one worker, and prompts as it takes them."""

from __future__ import annotations

import os

from mtpbench.errors import MtpBenchError
from mtpbench.prompts import Prompt


def engine_worker(llm):
    """vLLM's worker of an in-process engine with one worker (VLLM_ENABLE_V1_MULTIPROCESSING=0, uniproc
    executor); at any other layout the engine's ranks are reached with ``llm.collective_rpc`` (``plugin``)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker
    except AttributeError:
        raise MtpBenchError("cannot reach vLLM's worker in this process: the engine runs several workers "
                            "(reach them with collective_rpc, mtpbench.backends.vllm.plugin)") from None


def engine_models(llm):
    """(draft model, target model) of an in-process engine with one worker (``plugin.worker_models``)."""
    from mtpbench.backends.vllm.plugin import worker_models

    draft, target = worker_models(engine_worker(llm))
    if draft is None:
        raise MtpBenchError("this vLLM engine has no draft model (is speculative decoding on?)")
    return draft, target


def engine_runner(llm, asked: str | None) -> dict:
    """The model runner the engine built and the class that drafts (``runners.observed``, asked of every rank:
    the drafting ranks must agree), whether its timings measure Triton's interpreter, and the notes a reader
    needs."""
    from mtpbench.runners import INTERPRETED_NOTE, label

    try:
        ranks = llm.collective_rpc("mtpbench_runner")
    except Exception as e:  # the first call of every op: a rank without the plugin fails it
        raise MtpBenchError(plugin_missing(f"{type(e).__name__}: {e}") or f"{type(e).__name__}: {e}") from None
    drafting = [r for r in ranks if r["drafter"]] or ranks
    ran = {"runner": drafting[0]["runner"], "drafter": drafting[0]["drafter"]}
    if any((r["runner"], r["drafter"]) != (ran["runner"], ran["drafter"]) for r in drafting):
        raise MtpBenchError("the engine's ranks built different model runners or drafters: " + ", ".join(
            f"rank {r['rank']} {label(r['runner'], r['drafter'])}" for r in ranks))
    ran["interpreted"] = ran["runner"] == "v2" and os.environ.get("TRITON_INTERPRET") == "1"
    # V2 verifies with its own sampler; V1's goes through the expand step, probed in the ranks (their start-up
    # registered the platform's kernel overrides)
    ran["sampler_fault"] = (next(filter(None, llm.collective_rpc("mtpbench_expand_fault")), None)
                            if ran["runner"] == "v1" and ran["drafter"] else None)
    notes = [INTERPRETED_NOTE] if ran["interpreted"] else []
    if asked and asked != ran["runner"]:
        notes.append(f"asked for vLLM model runner {asked.upper()}, the engine ran {label(ran['runner'])}")
    return {**ran, "notes": notes}


def plugin_missing(error: str) -> str | None:
    """What to do, in one line, where a rank answered a ``collective_rpc`` call as one without mtpbench's plugin
    (vLLM: "'CPUWorker' object has no attribute 'mtpbench_runner'", or "Method ... is not implemented"); None for
    any other error."""
    if "mtpbench_" not in error or not ("has no attribute" in error or "not implemented" in error):
        return None
    return ("a rank of the engine runs without mtpbench's vLLM plugin: install mtpbench in the Python that runs vLLM "
            "on every node, and where a node sets VLLM_PLUGINS, name mtpbench_trace in it (docs/sharding.md#ray); "
            f"vLLM said: {error[:300]}")


def held_mtp_bytes(llm) -> int | None:
    """Bytes of the MTP layers' parameters the engine holds, summed over its ranks (a tensor-parallel engine
    holds each rank's shard, and each rank its own copy of what is not sharded, such as norms); None: out of
    reach on some rank."""
    held = llm.collective_rpc("mtpbench_held_mtp_bytes")
    return None if None in held else sum(held)


def engine_prompts(llm, group: list[Prompt]) -> list:
    """Text prompts as they are; chat-templated ones as token ids encoded without special tokens (the
    template holds them already), as vLLM's own chat path does."""
    from vllm.inputs import TokensPrompt

    tok = llm.get_tokenizer() if any(p.templated for p in group) else None
    return [TokensPrompt(prompt_token_ids=tok.encode(p.text, add_special_tokens=False)) if p.templated else p.text
            for p in group]
