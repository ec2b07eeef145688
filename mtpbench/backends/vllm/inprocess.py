"""Reaching into an in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker): its draft and
target models, the model runner it built, the MTP bytes it holds, and prompts as it takes them."""

from __future__ import annotations

import os

from mtpbench.backends.vllm.expand import expand_kernel_fault
from mtpbench.errors import MtpBenchError
from mtpbench.prompts import Prompt


def engine_worker(llm):
    """vLLM's worker of an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker
    except AttributeError:
        raise MtpBenchError("cannot reach vLLM's worker: tracing needs the engine in-process "
                            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) and a single worker") from None


def engine_models(llm):
    """(draft model, target model) of an in-process engine. ``worker.get_draft_model()`` reaches the drafter
    on both runners: V1's ``model_runner.drafter.model``, V2's ``model_runner.speculator.model``."""
    worker = engine_worker(llm)
    runner = worker.model_runner
    draft = worker.get_draft_model() if hasattr(worker, "get_draft_model") else None
    if draft is None:
        draft = getattr(getattr(runner, "drafter", None) or getattr(runner, "speculator", None), "model", None)
    if draft is None:
        raise MtpBenchError("this vLLM engine has no draft model (is speculative decoding on?)")
    return draft, runner.get_model()


def engine_runner(llm, asked: str | None) -> dict:
    """The model runner the engine built and the class that drafts (``runners.observed``), whether its
    timings measure Triton's interpreter, and the notes a reader needs."""
    from mtpbench.runners import INTERPRETED_NOTE, label, observed

    ran = observed(engine_worker(llm).model_runner)
    ran["interpreted"] = ran["runner"] == "v2" and os.environ.get("TRITON_INTERPRET") == "1"
    # V2 verifies with its own sampler; V1's goes through the expand step (after the engine registered its
    # kernel overrides, as this in-process engine has)
    ran["sampler_fault"] = expand_kernel_fault() if ran["runner"] == "v1" and ran["drafter"] else None
    notes = [INTERPRETED_NOTE] if ran["interpreted"] else []
    if asked and asked != ran["runner"]:
        notes.append(f"asked for vLLM model runner {asked.upper()}, the engine ran {label(ran['runner'])}")
    return {**ran, "notes": notes}


def held_mtp_bytes(llm) -> int | None:
    """Bytes of the MTP layers' parameters in the engine's draft model (None: out of reach)."""
    from mtpbench.trace.hooks import discover

    try:
        draft, _ = engine_models(llm)
        layers = discover(draft).layers
    except MtpBenchError:
        return None
    return sum(t.numel() * t.element_size() for m in layers for t in m.parameters())


def engine_prompts(llm, group: list[Prompt]) -> list:
    """Text prompts as they are; chat-templated ones as token ids encoded without special tokens (the
    template holds them already), as vLLM's own chat path does."""
    from vllm.inputs import TokensPrompt

    tok = llm.get_tokenizer() if any(p.templated for p in group) else None
    return [TokensPrompt(prompt_token_ids=tok.encode(p.text, add_special_tokens=False)) if p.templated else p.text
            for p in group]
