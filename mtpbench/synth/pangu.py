"""openPangu Ultra MoE (``PanguUltraMoEForCausalLM``, model_type ``pangu_ultra_moe``) and its MTP
(``OpenPanguMTPModel``): DeepSeek-V3's layout (MLA, sigmoid-routed MoE with a correction bias, MTP layer i
= decoder layer n + i with enorm, hnorm, eh_proj, shared_head).

transformers has no config class for ``pangu_ultra_moe`` and vLLM registers none, so the checkpoint carries
a small configuration file (``auto_map``) and the engine runs with ``trust_remote_code``.

Two naming quirks come from vLLM's two loaders: the target's loader maps ``e_score_correction_bias`` to
``gate.e_score_correction_bias`` by substring, so target layers store ``mlp.e_score_correction_bias``,
while the MTP loader has no such mapping and needs ``mlp.gate.e_score_correction_bias``; and the MTP loader
reads ``embed_tokens`` only from the first MTP layer (later layers' copies are skipped), so only that layer
carries one.

On this vLLM build the drafter cannot run at all (on any device): OpenPanguMTP's layers inherit
DeepSeekMultiTokenPredictorLayer.forward, which reads ``self.mtp_block.use_sequence_parallel_moe``, an
attribute OpenPanguDecoderLayer never sets; the trace reports that crash as its verdict."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, deepseek_style_mtp, transformers_tensors, write_checkpoint

N = 2  # target decoder layers: one dense, one MoE
H = 128

# the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576
MLA = dict(q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)
MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
           first_k_dense_replace=1)

CONFIG_PY = '''"""openPangu Ultra MoE config (mtpbench synthetic checkpoint): every field passes through."""
from transformers import PretrainedConfig


class PanguUltraMoEConfig(PretrainedConfig):
    model_type = "pangu_ultra_moe"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
'''


def build(out: Path, n_mtp: int) -> None:
    common = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
                  rms_norm_eps=1e-6, hidden_act="silu", **MLA, **MOE)
    _, tensors = transformers_tensors("DeepseekV3Config", num_hidden_layers=N + n_mtp, n_group=1, topk_group=1,
                                      **common)
    out_t = {}
    for name, t in tensors.items():
        if name.endswith("mlp.gate.e_score_correction_bias"):
            layer = int(name.split("layers.")[1].split(".")[0])
            if layer < N:  # the target loader adds "gate." itself
                name = name.replace("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias")
        out_t[name] = t
    out_t = deepseek_style_mtp(out_t, N, n_mtp, H, embed_in_first=True)
    config = dict(common, model_type="pangu_ultra_moe", architectures=["PanguUltraMoEForCausalLM"],
                  auto_map={"AutoConfig": "configuration_openpangu_moe.PanguUltraMoEConfig"},
                  num_hidden_layers=N, num_nextn_predict_layers=n_mtp, routed_scaling_factor=2.5,
                  norm_topk_prob=True, router_enable_expert_bias=True, attention_bias=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    write_checkpoint(out, config, out_t)
    (out / "configuration_openpangu_moe.py").write_text(CONFIG_PY)


ARCHS = [
    Arch("openpangu", "OpenPanguMTPModel", "PanguUltraMoEForCausalLM", build,
         engine_args={"trust_remote_code": True},
         note="loads cleanly, but every draft call raises AttributeError: 'OpenPanguDecoderLayer' object has no "
              "attribute 'use_sequence_parallel_moe' (vLLM bug: the inherited DeepSeek MTP layer forward reads it)"),
]
