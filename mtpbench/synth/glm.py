"""Zhipu GLM with DeepSeek-V3's MTP layout (MTP layer i is decoder layer N + i plus enorm, hnorm, eh_proj,
shared_head): GLM-4.5 (Glm4Moe, GQA + MoE), GLM-4-MoE-Lite (GLM-4.7-Flash: MLA + MoE) and GLM-OCR (a dense
GLM-4 text model inside a vision-language wrapper)."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, deepseek_style_mtp, transformers_tensors, write_checkpoint

N = 2  # target decoder layers: one dense, one MoE (the MTP layers are MoE, as in the real checkpoints)
H = 128
MOE = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
           n_group=1, topk_group=1)
# the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576
MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, q_lora_rank=64)
BASE = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=256, max_position_embeddings=2048,
            tie_word_embeddings=False)


def _build_glm45(out: Path, n_mtp: int) -> None:
    # GLM-4.5: GQA with attention bias and half-rotary heads, layer 0 dense, the rest MoE
    config, tensors = transformers_tensors(
        "Glm4MoeConfig", num_hidden_layers=N + n_mtp, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, attention_bias=True, first_k_dense_replace=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
        **MOE, **BASE)
    tensors = deepseek_style_mtp(tensors, N, n_mtp, H)
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, architectures=["Glm4MoeForCausalLM"])
    write_checkpoint(out, config, tensors)


def _build_glm4_moe_lite(out: Path, n_mtp: int) -> None:
    # GLM-4.7-Flash: DeepSeek-V2-style MLA attention + MoE. transformers names the dense/MoE split by
    # mlp_layer_types; vLLM reads first_k_dense_replace.
    config, tensors = transformers_tensors(
        "Glm4MoeLiteConfig", num_hidden_layers=N + n_mtp, num_attention_heads=2, num_key_value_heads=2,
        mlp_layer_types=["dense"] + ["sparse"] * (N + n_mtp - 1), **MLA, **MOE, **BASE)
    # vLLM's Glm4MoeLiteMTP never reads model.embed_tokens: it loads the embedding from the first MTP
    # layer's own copy (and skips any later layer's), so only layer N carries one
    tensors = deepseek_style_mtp(tensors, N, n_mtp, H, embed_in_first=True)
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, first_k_dense_replace=1,
                  mlp_layer_types=config["mlp_layer_types"][:N], architectures=["Glm4MoeLiteForCausalLM"])
    write_checkpoint(out, config, tensors)


def _build_glm_ocr(out: Path, n_mtp: int) -> None:
    # GLM-OCR: a dense GLM-4 text model (sandwich norms, fused gate_up_proj) under model.language_model,
    # run text only: every modality is limited to 0, so vLLM never builds the vision tower and no vision
    # tensor is written. MTP layer i is text layer N + i plus DeepSeek-V3's extras.
    config, tensors = transformers_tensors(
        "GlmOcrConfig", "GlmOcrForConditionalGeneration",
        text_config=dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_hidden_layers=N + n_mtp,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=1, out_hidden_size=H),
        image_token_id=VOCAB - 6, video_token_id=VOCAB - 5, image_start_token_id=VOCAB - 4,
        image_end_token_id=VOCAB - 3, video_start_token_id=VOCAB - 2, video_end_token_id=VOCAB - 1,
        tie_word_embeddings=False)
    tensors = {n: t for n, t in tensors.items() if not n.startswith("model.visual.")}
    # GlmOcrMTP reads the embedding only from the first MTP layer's own copy (model.language_model.embed_tokens
    # is not among the names it loads)
    tensors = deepseek_style_mtp(tensors, N, n_mtp, H, prefix="model.language_model.", embed_in_first=True)
    tc = config["text_config"]
    tc.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, vocab_size=VOCAB, bos_token_id=0,
              eos_token_id=0, pad_token_id=0)
    config.update(num_nextn_predict_layers=n_mtp, architectures=["GlmOcrForConditionalGeneration"])
    write_checkpoint(out, config, tensors)


TEXT_ONLY = {"limit_mm_per_prompt": {"image": 0, "video": 0}}

ARCHS = [
    Arch("glm-4.5", "Glm4MoeMTPModel", "Glm4MoeForCausalLM", _build_glm45),
    Arch("glm-4-moe-lite", "Glm4MoeLiteMTPModel", "Glm4MoeLiteForCausalLM", _build_glm4_moe_lite),
    Arch("glm-ocr", "GlmOcrMTPModel", "GlmOcrForConditionalGeneration", _build_glm_ocr, engine_args=TEXT_ONLY,
         needs_torchvision_stub=True,
         note="text only (vision tower not built); vLLM's GLM-4V classes import transformers' image "
              "processors (torchvision)"),
]
