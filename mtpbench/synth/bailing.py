"""Ling / Ring (inclusionAI "Bailing") hybrid models with MTP: Bailing-MoE-V2.5 (``BailingMoeV2_5ForCausalLM``,
drafted by ``BailingMoeV25MTPModel``) and Bailing-MoE-V3 (``BailingMoeV3ForCausalLM``, drafted by
``BailingMoeV3MTPModel``).

Both are hybrids: linear attention (V2.5: lightning attention; V3: Kimi delta attention) with an MLA layer
every ``layer_group_size`` layers. Their linear-attention kernels are Triton, which has no CPU backend here,
so the targets are built with ``layer_group_size=1``: every target layer is an MLA layer (both models'
own rule, ``(i + 1) % layer_group_size == 0``). The MTP layers are MLA + MoE in both models anyway, so the
draft model is exactly the real class.

Neither transformers nor vLLM has a config class for ``bailing_hybrid``: the checkpoint carries a small
configuration file (``auto_map``) and the engine runs with ``trust_remote_code``.

Checkpoint names are Ling's (``model.word_embeddings``, ``attention.*``, ``attention.dense``); MTP layer i is
``model.layers.{n + i}`` with enorm, hnorm, eh_proj and final_layernorm; its ``shared_head.head`` is filled
from ``lm_head.weight`` by both MTP loaders. V2.5's loaders rename ``mlp.gate.e_score_correction_bias`` to
``mlp.gate.expert_bias``; V3's target loader has no such rename, so V3 stores ``mlp.gate.expert_bias``.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, write_checkpoint

N = 2  # target decoder layers: one dense, one MoE
H = 128
HEADS = 2
I_DENSE = 256
E, I_MOE, I_SHARED = 4, 64, 64
# head_dim is the linear-attention head size alone (the MLA layers size themselves from MLA below). With no
# linear-attention layer its state is empty: 0 gives it no bytes, so vLLM's hybrid block-size alignment has
# nothing to align. Otherwise that alignment raises MLA's block to 128, which CPU_MLA (the backend of CPUs
# without AMX, such as AMD EPYC) refuses: "Aligned KV cache block size 128 is not supported".
LINEAR_HEAD_DIM = 0
# the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576
MLA = dict(q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)

CONFIG_PY = '''"""Bailing hybrid config (mtpbench synthetic checkpoint): every field passes through."""
from transformers import PretrainedConfig


class BailingHybridConfig(PretrainedConfig):
    model_type = "bailing_hybrid"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
'''


def _mla(p: str) -> dict:
    q, kv, rope, nope, v = (MLA[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                            "qk_nope_head_dim", "v_head_dim"))
    a = p + "attention."
    return {a + "q_a_proj.weight": randn(q, H), a + "q_a_layernorm.weight": ones(q),
            a + "q_b_proj.weight": randn(HEADS * (nope + rope), q),
            a + "kv_a_proj_with_mqa.weight": randn(kv + rope, H), a + "kv_a_layernorm.weight": ones(kv),
            a + "kv_b_proj.weight": randn(HEADS * (nope + v), kv), a + "dense.weight": randn(H, HEADS * v)}


def _mlp(p: str, inter: int) -> dict:
    return {p + "gate_proj.weight": randn(inter, H), p + "up_proj.weight": randn(inter, H),
            p + "down_proj.weight": randn(H, inter)}


def _moe(p: str, bias_name: str) -> dict:
    t = {p + "gate.weight": randn(E, H), p + bias_name: randn(E)}
    for e in range(E):
        t.update(_mlp(f"{p}experts.{e}.", I_MOE))
    t.update(_mlp(p + "shared_experts.", I_SHARED))
    return t


def _build(arch: str, bias_name: str):
    def build(out: Path, n_mtp: int) -> None:
        t = {"model.word_embeddings.weight": randn(VOCAB, H), "model.norm.weight": ones(H),
             "lm_head.weight": randn(VOCAB, H)}
        for i in range(N + n_mtp):
            p = f"model.layers.{i}."
            t.update(_mla(p))
            t[p + "input_layernorm.weight"] = ones(H)
            t[p + "post_attention_layernorm.weight"] = ones(H)
            t.update(_mlp(p + "mlp.", I_DENSE) if i < 1 else _moe(p + "mlp.", bias_name))
            if i >= N:  # MTP layer
                t[p + "enorm.weight"] = ones(H)
                t[p + "hnorm.weight"] = ones(H)
                t[p + "eh_proj.weight"] = randn(H, 2 * H)
                t[p + "final_layernorm.weight"] = ones(H)
        config = dict(
            model_type="bailing_hybrid", architectures=[arch],
            auto_map={"AutoConfig": "configuration_bailing_hybrid.BailingHybridConfig"},
            hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=LINEAR_HEAD_DIM,
            intermediate_size=I_DENSE, num_experts=E, num_shared_experts=1, num_experts_per_tok=2,
            moe_intermediate_size=I_MOE, moe_shared_expert_intermediate_size=I_SHARED, first_k_dense_replace=1,
            n_group=1, topk_group=1, score_function="sigmoid", moe_router_enable_expert_bias=True,
            routed_scaling_factor=2.5, norm_topk_prob=True, router_dtype="fp32", use_bias=False,
            hidden_act="silu", rms_norm_eps=1e-6, layer_group_size=1, short_conv_kernel_size=4,
            max_position_embeddings=2048, tie_word_embeddings=False, num_hidden_layers=N,
            num_nextn_predict_layers=n_mtp, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **MLA)
        write_checkpoint(out, config, t)
        (out / "configuration_bailing_hybrid.py").write_text(CONFIG_PY)
    return build


# a hybrid with no linear-attention layer: prefix caching's "align" Mamba mode asserts it finds Mamba layers
ENGINE = {"trust_remote_code": True, "enable_prefix_caching": False}
NOTE = "targets built with layer_group_size=1 (all MLA): the linear-attention kernels are Triton-only"

ARCHS = [
    Arch("bailing-moe-v2.5", "BailingMoeV25MTPModel", "BailingMoeV2_5ForCausalLM",
         _build("BailingMoeV2_5ForCausalLM", "gate.e_score_correction_bias"),
         engine_args=ENGINE, note=NOTE),
    Arch("bailing-moe-v3", "BailingMoeV3MTPModel", "BailingMoeV3ForCausalLM",
         _build("BailingMoeV3ForCausalLM", "gate.expert_bias"),
         engine_args=ENGINE, note=NOTE),
]
