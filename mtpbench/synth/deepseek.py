"""DeepSeek-V3: MTP layer i is decoder layer n + i plus enorm, hnorm, eh_proj and shared_head (the layout
GLM's models share, glm.py), with MLA attention and a sigmoid-routed MoE."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, deepseek_style_mtp, transformers_tensors, write_checkpoint

N = 2  # target decoder layers: one dense, one MoE
H = 128

# the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576
MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)
MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
           first_k_dense_replace=1, n_group=1, topk_group=1)


def _build(config_class: str, arch: str, extra: dict, config_extra: dict | None = None):
    config_extra = config_extra or {}
    def build(out: Path, n_mtp: int) -> None:
        kw = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False, **extra)
        config, tensors = transformers_tensors(config_class, num_hidden_layers=N + n_mtp, **kw)
        tensors = deepseek_style_mtp(tensors, N, n_mtp, H)
        config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, architectures=[arch], **config_extra)
        write_checkpoint(out, config, tensors)
    return build


ARCHS = [
    Arch("deepseek-v3", "DeepSeekMTPModel", "DeepseekV3ForCausalLM",
         _build("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(q_lora_rank=64, **MLA, **MOE),
                dict(topk_method="noaux_tc", scoring_func="sigmoid"))),
]
