"""Gemma 4 (``Gemma4ForCausalLM``, transformers' ``gemma4_text``) and its MTP drafter, the separate "assistant"
checkpoint (``gemma4_assistant``: ``Gemma4AssistantForCausalLM``), which vLLM loads as ``Gemma4MTPModel``
(speculative method ``mtp`` with ``speculative_config["model"]`` = the assistant; vllm/config/speculative.py
rewrites ``gemma4_assistant`` to ``gemma4_mtp``).

The assistant is a small decoder (pre_projection of [embedding, backbone hidden] -> its layers -> norm ->
post_projection back to the backbone width) whose attention layers have only Q projections: each reads K/V
from the last target layer of the same attention type (sliding or full) through cross-model KV sharing.
It runs *all* its layers in one forward call and produces one token per call, so the tracer reports
"multi-layer calls": its "MTP layers" are the assistant's decoder layers, not per-step modules.

Both models are built by transformers (the assistant's text config must have ``num_kv_shared_layers`` =
its layer count, no per-layer inputs, no MoE). The target has one sliding and one full-attention layer
(the full one with Gemma 4's larger ``global_head_dim``); the assistant has L layers, alternating
sliding / full with the last one full, so each finds a target layer to share with."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, transformers_tensors, write_checkpoint

H = 128
TEXT = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, global_head_dim=128, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
            sliding_window=64, max_position_embeddings=2048)


def _layer_types(n: int) -> list[str]:
    return ["full_attention" if (n - 1 - i) % 2 == 0 else "sliding_attention" for i in range(n)]


def build(out: Path, n_mtp: int) -> None:
    config, tensors = transformers_tensors("Gemma4TextConfig", num_hidden_layers=2, layer_types=_layer_types(2),
                                           **TEXT)
    write_checkpoint(out, config, tensors)
    draft_config, draft_tensors = transformers_tensors(
        "Gemma4AssistantConfig", backbone_hidden_size=H,
        text_config=dict(model_type="gemma4_text", num_hidden_layers=n_mtp, num_kv_shared_layers=n_mtp,
                         layer_types=_layer_types(n_mtp), **TEXT))
    write_checkpoint(out / "draft", draft_config, draft_tensors)


ARCHS = [
    Arch("gemma-4", "Gemma4MTPModel", "Gemma4ForCausalLM", build, method="mtp", separate_draft=True,
         note="separate assistant checkpoint (<out>/draft); all its layers run in every draft call"),
]
