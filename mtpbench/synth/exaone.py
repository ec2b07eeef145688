"""EXAONE's MTP layout (vllm exaone_moe_mtp.py, shared by exaone4_5_mtp.py): the draft's tensors live under
``mtp.`` - ``mtp.fc`` (2H -> H, over [norm(embed), norm(hidden)]), ``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, ``mtp.layers.<i>`` (an ordinary dense decoder layer of the target, indexed from
0) and ``mtp.norm``; embed_tokens and lm_head are the target's.

- EXAONE-MoE (K-EXAONE): target ExaoneMoeForCausalLM; the MTP layers are ExaoneMoeDecoderLayer(is_mtp=True),
  always a dense MLP of ``intermediate_size``.
- EXAONE-4.5: target Exaone4_5_ForConditionalGeneration (Qwen2.5-VL-style vision tower + Exaone4 text
  model); the MTP layers are Exaone4DecoderLayer of the text config.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, transformers_tensors, write_checkpoint

N = 2  # target decoder layers (EXAONE-MoE: one dense, one MoE)
H = 128
ATTN = dict(hidden_size=H, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=2048, tie_word_embeddings=False)


def _mtp_head(tensors: dict, n_mtp: int, src: str) -> dict:
    """Move the decoder layers ``{src}.layers.{N + i}`` to ``mtp.layers.{i}`` and add the MTP head tensors."""
    out = {}
    for name, t in tensors.items():
        moved = False
        for i in range(n_mtp):
            p = f"{src}.layers.{N + i}."
            if name.startswith(p):
                out[f"mtp.layers.{i}." + name[len(p):]] = t
                moved = True
        if not moved:
            out[name] = t
    out["mtp.fc.weight"] = randn(H, 2 * H)
    out["mtp.pre_fc_norm_embedding.weight"] = ones(H)
    out["mtp.pre_fc_norm_hidden.weight"] = ones(H)
    out["mtp.norm.weight"] = ones(H)
    return out


def build_exaone_moe(out: Path, n_mtp: int) -> None:
    # the target: layer 0 dense, layer 1 MoE; the extra layers N.. are dense and become the MTP layers.
    # Global attention only: in a model this small, sliding + global layers put the two MTP layers in
    # different KV-cache groups and vLLM refuses ("All drafting layers should belong to the same kv cache
    # group"); the real model's 3:1 pattern with one MTP layer does not hit it.
    n = N + n_mtp
    layer_types = ["full_attention"] * n
    mlp_types = ["dense", "sparse"] + ["dense"] * n_mtp
    config, tensors = transformers_tensors(
        "ExaoneMoeConfig", vocab_size=VOCAB, num_hidden_layers=n, layer_types=layer_types,
        mlp_layer_types=mlp_types, moe_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, num_shared_experts=1, n_group=1, topk_group=1, **ATTN)
    tensors = _mtp_head(tensors, n_mtp, "model")
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, layer_types=layer_types[:N],
                  mlp_layer_types=mlp_types[:N], mtp_layer_types=layer_types[N:],
                  architectures=["ExaoneMoeForCausalLM"])
    write_checkpoint(out, config, tensors)


def build_exaone_4_5(out: Path, n_mtp: int) -> None:
    # global attention only, for the same KV-cache-group reason as EXAONE-MoE (the MTP layer i takes
    # text_config.layer_types[i])
    n = N + n_mtp
    text = dict(vocab_size=VOCAB, num_hidden_layers=n, layer_types=["full_attention"] * n, **ATTN)
    vision = dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, num_key_value_heads=1,
                  out_hidden_size=H, fullatt_block_indexes=[0])
    config, tensors = transformers_tensors("Exaone4_5_Config", "Exaone4_5_ForConditionalGeneration",
                                   text_config=text, vision_config=vision)
    # text-only engine (limit_mm_per_prompt 0): vLLM builds no vision tower and leaves its tensors unread,
    # so the checkpoint carries none (the config keeps vision_config, which the class reads)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("model.visual.")}
    tensors = _mtp_head(tensors, n_mtp, "model.language_model")
    config["text_config"].update(num_hidden_layers=N, layer_types=["full_attention"] * N)
    config.update(num_nextn_predict_layers=n_mtp, architectures=["Exaone4_5_ForConditionalGeneration"])
    write_checkpoint(out, config, tensors)


ARCHS = [
    Arch("exaone-moe", "ExaoneMoeMTP", "ExaoneMoeForCausalLM", build_exaone_moe),
    Arch("exaone-4.5", "Exaone4_5_MTP", "Exaone4_5_ForConditionalGeneration", build_exaone_4_5,
         engine_args={"limit_mm_per_prompt": {"image": 0, "video": 0}}, needs_torchvision_stub=True,
         note="text-only: vision tower disabled (limit_mm_per_prompt 0) and not in the checkpoint; "
              "the torchvision shim must provide torchvision.io and torchvision.transforms(.v2)(.functional)"),
]
