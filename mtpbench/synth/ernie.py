"""ERNIE-4.5 (MoE): target Ernie4_5_MoeForCausalLM, drafter vllm ernie_mtp.py ErnieMTP. The checkpoint keeps
the MTP layer i in flat blocks ``model.mtp_emb_norm.<i>``, ``model.mtp_hidden_norm.<i>``,
``model.mtp_linear_proj.<i>`` (2H -> H, over [norm(embed), norm(hidden)]) and ``model.mtp_block.<i>`` (a
Llama-style dense decoder layer); embed_tokens and lm_head are the target's. vLLM's mapper rewrites only
the ``.0.`` blocks (to ``model.layers.<num_hidden_layers>``), and ErnieMTP.forward asserts
spec_step_idx == 0: one MTP layer.
"""

from __future__ import annotations

from pathlib import Path

from mtpbench.synth.common import VOCAB, Arch, ones, randn, transformers_tensors, write_checkpoint

N = 2  # target decoder layers: one dense, one MoE
H = 128


def build(out: Path, n_mtp: int) -> None:
    import torch

    # layers N.. are dense (past moe_layer_end_index) and become the MTP blocks
    config, tensors = transformers_tensors(
        "Ernie4_5_MoeConfig", vocab_size=VOCAB, hidden_size=H, intermediate_size=256, num_attention_heads=2,
        num_key_value_heads=2, num_hidden_layers=N + n_mtp, max_position_embeddings=2048,
        tie_word_embeddings=False, moe_intermediate_size=64, moe_num_experts=4, moe_k=2,
        moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=N - 1, moe_layer_interval=1)
    out_t = {}
    for name, t in tensors.items():
        t = t.to(torch.bfloat16)  # transformers keeps the router (gate, moe_statics) in float32
        for i in range(n_mtp):
            p = f"model.layers.{N + i}."
            if name.startswith(p):
                name = f"model.mtp_block.{i}." + name[len(p):]
        out_t[name] = t
    for i in range(n_mtp):
        out_t[f"model.mtp_emb_norm.{i}.weight"] = ones(H)
        out_t[f"model.mtp_hidden_norm.{i}.weight"] = ones(H)
        out_t[f"model.mtp_linear_proj.{i}.weight"] = randn(H, 2 * H)
    config.update(num_hidden_layers=N, num_nextn_predict_layers=n_mtp, architectures=["Ernie4_5_MoeForCausalLM"])
    write_checkpoint(out, config, out_t)


ARCHS = [
    Arch("ernie-4.5", "ErnieMTPModel", "Ernie4_5_MoeForCausalLM", build, mtp_layers=1, max_mtp_layers=1,
         note="vLLM maps only the .0. MTP blocks: with 2 the load fails (\"There is no module or parameter "
              "named 'model.mtp_block' in ErnieMTP\"), and ErnieMTP.forward asserts spec_step_idx == 0"),
]
