"""Tencent HY-V3 (``HYV3ForCausalLM``, transformers' ``hy_v3``) and its MTP (``HYV3MTPModel``): GQA attention
with q/k norms, a sigmoid-routed MoE (``mlp.router.gate``, ``mlp.expert_bias``, ``mlp.shared_mlp``), and MTP
layer i = decoder layer n + i plus enorm, hnorm, eh_proj and final_layernorm.

vLLM reads config fields transformers' ``HYV3Config`` does not define (``first_k_dense_replace``,
``expert_hidden_dim``, ``route_norm``, ``qk_norm``); they are added to config.json (the config keeps them as
extra attributes). The MTP loader takes the head only from ``lm_head.weight``, into the first MTP layer's
``shared_head.head``; it skips every ``model.layers.<n+i>.shared_head.*`` tensor, so with two MTP layers the
second layer's head is never written by the loader (vLLM's proposer then replaces every
``shared_head.head`` with the target's ``lm_head``, so the engine runs correctly)."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import Arch, ones, randn, transformers_tensors, write_checkpoint, VOCAB

N = 2  # target decoder layers: one dense, one MoE
H = 128
E_I = 64  # expert (and shared expert) intermediate size


def build(out: Path, n_mtp: int) -> None:
    config, tensors = transformers_tensors(
        "HYV3Config", vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_hidden_layers=N + n_mtp,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, num_experts=4, num_experts_per_tok=2,
        num_shared_experts=1, moe_intermediate_size=E_I, max_position_embeddings=2048, tie_word_embeddings=False)
    for i in range(N, N + n_mtp):
        p = f"model.layers.{i}."
        tensors[p + "enorm.weight"] = ones(H)
        tensors[p + "hnorm.weight"] = ones(H)
        tensors[p + "eh_proj.weight"] = randn(H, 2 * H)
        tensors[p + "final_layernorm.weight"] = ones(H)
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, mlp_layer_types=config["mlp_layer_types"][:N],
                  first_k_dense_replace=1, expert_hidden_dim=E_I, route_norm=True, qk_norm=True)
    write_checkpoint(out, config, tensors)


ARCHS = [
    Arch("hy-v3", "HYV3MTPModel", "HYV3ForCausalLM", build,
         note="vLLM's loader fills only the first MTP layer's shared_head.head; the proposer then shares the "
              "target's lm_head with every layer (the load check lists it under shared_after_load)"),
]
