"""Xiaomi MiMo: MiMo-7B (a Qwen2 target with ``model.mtp_layers.i``: token/hidden layernorms, input_proj, a Qwen2
decoder block and final_layernorm) and MiMo-V2-Flash (MoE target with hybrid full/sliding attention;
``model.mtp.layers.i``: enorm, hnorm, eh_proj, a dense SWA block, final_layernorm)."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, transformers_tensors, write_checkpoint

N = 2  # target decoder layers
H = 128


def _build_mimo(out: Path, n_mtp: int) -> None:
    """MiMo-7B: the MTP layers are Qwen2 decoder layers N + i, stored as model.mtp_layers.i (vLLM's MiMoMTP
    maps them back to N + i and wraps the block in ``mtp_block``)."""
    config, tensors = transformers_tensors(
        "Qwen2Config", vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_hidden_layers=N + n_mtp,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False)
    out_t = {}
    for name, t in tensors.items():
        if name.startswith("model.layers."):
            idx = int(name.split(".")[2])
            if idx >= N:
                rest = name.split(".", 3)[3]
                out_t[f"model.mtp_layers.{idx - N}.{rest}"] = t
                continue
        out_t[name] = t
    for i in range(n_mtp):
        p = f"model.mtp_layers.{i}."
        out_t[p + "token_layernorm.weight"] = ones(H)
        out_t[p + "hidden_layernorm.weight"] = ones(H)
        out_t[p + "input_proj.weight"] = randn(H, 2 * H)
        out_t[p + "final_layernorm.weight"] = ones(H)
    config.pop("layer_types", None)
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, architectures=["MiMoForCausalLM"],
                  max_window_layers=N)
    write_checkpoint(out, config, out_t)


# MiMo-V2-Flash: layer 0 full attention + dense MLP, layer 1 sliding-window attention + MoE. transformers'
# MiMoV2FlashConfig builds the tensors (SWA layers carry twice the KV heads and attention sinks); vLLM reads
# the checkpoint's own config keys (hybrid_layer_pattern, swa_*, moe_layer_freq, layernorm_epsilon), added
# here to match. head_dim = v_head_dim (a different V head size needs the DiffKV GPU backends).
HEADS, KV, HD = 4, 1, 64
SWA = 128


def _build_mimo_v2(out: Path, n_mtp: int, omni: bool = False) -> None:
    config, tensors = transformers_tensors(
        "MiMoV2FlashConfig", vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_hidden_layers=N,
        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, v_head_dim=HD,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, max_position_embeddings=2048,
        layer_types=["full_attention", "sliding_attention"], mlp_layer_types=["dense", "sparse"],
        sliding_window=SWA, tie_word_embeddings=False)
    out_t = dict(tensors)
    for i in range(n_mtp):
        p = f"model.mtp.layers.{i}."
        out_t[p + "enorm.weight"] = ones(H)
        out_t[p + "hnorm.weight"] = ones(H)
        out_t[p + "eh_proj.weight"] = randn(H, 2 * H)
        out_t[p + "input_layernorm.weight"] = ones(H)
        out_t[p + "self_attn.q_proj.weight"] = randn(HEADS * HD, H)
        out_t[p + "self_attn.k_proj.weight"] = randn(2 * KV * HD, H)
        out_t[p + "self_attn.v_proj.weight"] = randn(2 * KV * HD, H)
        out_t[p + "self_attn.o_proj.weight"] = randn(H, HEADS * HD)
        out_t[p + "self_attn.attention_sink_bias"] = randn(HEADS)
        out_t[p + "pre_mlp_layernorm.weight"] = ones(H)
        out_t[p + "mlp.gate_proj.weight"] = randn(256, H)
        out_t[p + "mlp.up_proj.weight"] = randn(256, H)
        out_t[p + "mlp.down_proj.weight"] = randn(H, 256)
        out_t[p + "final_layernorm.weight"] = ones(H)
    config.update(
        architectures=["MiMoV2FlashForCausalLM"], num_nextn_predict_layers=n_mtp,
        hybrid_layer_pattern=[0, 1], moe_layer_freq=[0, 1], layernorm_epsilon=config["rms_norm_eps"],
        swa_num_attention_heads=HEADS, swa_num_key_value_heads=2 * KV, swa_head_dim=HD, swa_v_head_dim=HD,
        sliding_window_size=SWA, add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False,
        rope_theta=5_000_000.0, swa_rope_theta=10_000.0, partial_rotary_factor=0.5,
        rope_parameters={t: {"rope_type": "default", "rope_theta": th, "partial_rotary_factor": 0.5}
                         for t, th in (("full_attention", 5_000_000.0), ("sliding_attention", 10_000.0))},
        scoring_func="sigmoid", topk_method="noaux_tc")
    if omni:
        # MiMo-V2-Omni: the same text model under MiMoV2OmniForCausalLM (the architecture name is what makes
        # vLLM pick MiMoV2OmniMTPModel for the drafter). The vision config is read while the tower is
        # constructed, but the tower is then dropped (every modality limited to 0): no vision tensors.
        vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=1, num_key_value_heads=1,
                      qk_channels=64, kv_channels=64, out_hidden_size=H, fullatt_block_indexes=[0], use_sink=False)
        config.update(architectures=["MiMoV2OmniForCausalLM"], vision_config=vision,
                      image_token_id=VOCAB - 3, video_token_id=VOCAB - 2)
    write_checkpoint(out, config, out_t)


def _build_mimo_v2_omni(out: Path, n_mtp: int) -> None:
    _build_mimo_v2(out, n_mtp, omni=True)


ARCHS = [
    Arch("mimo", "MiMoMTPModel", "MiMoForCausalLM", _build_mimo),
    Arch("mimo-v2", "MiMoV2MTPModel", "MiMoV2FlashForCausalLM", _build_mimo_v2,
         note="vLLM builds one MiMo-V2 MTP layer (_MIMO_V2_FLASH_NUM_MTP_LAYERS = 1) and skips the others "
              "at load"),
    Arch("mimo-v2-omni", "MiMoV2OmniMTPModel", "MiMoV2OmniForCausalLM", _build_mimo_v2_omni,
         engine_args={"limit_mm_per_prompt": {"image": 0, "video": 0, "audio": 0}}, needs_torchvision_stub=True,
         note="text only: the vision/audio towers are not built (every modality limited to 0); one MTP layer "
              "as for MiMo-V2; vLLM's class imports transformers' Qwen2-VL image processor (torchvision)"),
]
