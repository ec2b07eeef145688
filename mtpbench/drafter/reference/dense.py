"""The dense decoder layer of the built-in models (Qwen2's: pre-norm attention with q/k/v biases, neox rotary,
grouped heads, then a SiLU-gated MLP), written from its definition. It keeps, like an engine's KV cache, the keys
and values last written at each position, so a draft call's queries attend to what the engine's earlier calls
wrote (the engine's inputs, not a rerun of the target). builtin-glm's layer is the same with GLM's names: its
routed experts are zero (checked) and its shared experts are the MLP."""

from __future__ import annotations

import math

import torch


class DenseBlock:
    def __init__(self, w: dict[str, torch.Tensor], cfg: dict, eps: float, mlp: str):
        self.w, self.eps, self.mlp = w, eps, mlp
        self.head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        self.nq = w["self_attn.q_proj.weight"].shape[0] // self.head_dim
        self.nkv = w["self_attn.k_proj.weight"].shape[0] // self.head_dim
        rot = int(self.head_dim * float(cfg.get("partial_rotary_factor", 1.0)))
        theta = float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)
        self.keys: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # position -> (k, v) [heads, head_dim]

    def reset(self) -> None:
        self.keys.clear()

    def _norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rot = 2 * self.inv_freq.numel()
        ang = positions.float()[:, None] * self.inv_freq  # [T, rot/2]
        cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
        r, rest = x[..., :rot], x[..., rot:]
        r1, r2 = r.chunk(2, dim=-1)
        return torch.cat([r * cos + torch.cat([-r2, r1], -1) * sin, rest], -1)

    def _lin(self, x, name, bias=True):
        b = self.w.get(name.replace("weight", "bias")) if bias else None
        return x @ self.w[name].T + (0 if b is None else b)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, writes: int | None = None) -> torch.Tensor:
        """x [T, hidden] at ``positions`` [T] (one request): the layer's output, its residual included. Only the
        first ``writes`` rows (default all) write their keys: an engine's padding rows write none."""
        x, positions = x.float(), positions.long().reshape(-1)
        h = self._norm(x, "input_layernorm.weight")
        T, hd = h.shape[0], self.head_dim
        q = self._rope(self._lin(h, "self_attn.q_proj.weight").view(T, self.nq, hd), positions)
        k = self._rope(self._lin(h, "self_attn.k_proj.weight").view(T, self.nkv, hd), positions)
        v = self._lin(h, "self_attn.v_proj.weight").view(T, self.nkv, hd)
        for i, p in enumerate(positions.tolist()[:writes]):
            self.keys[p] = (k[i], v[i])
        out = torch.empty(T, self.nq, hd)
        group = self.nq // self.nkv
        for i, p in enumerate(positions.tolist()):
            seen = sorted(q_ for q_ in self.keys if q_ <= p) or [p]
            if p not in self.keys:  # a padding row's query: its own key, unwritten
                self.keys[p] = (k[i], v[i])
            K = torch.stack([self.keys[s][0] for s in seen])  # [S, nkv, hd]
            V = torch.stack([self.keys[s][1] for s in seen])
            K, V = K.repeat_interleave(group, 1), V.repeat_interleave(group, 1)
            att = torch.einsum("hd,shd->hs", q[i], K) / math.sqrt(hd)
            out[i] = torch.einsum("hs,shd->hd", att.softmax(-1), V)
        x = x + self._lin(out.reshape(T, -1), "self_attn.o_proj.weight", bias=False)
        h = self._norm(x, "post_attention_layernorm.weight")
        m = self.mlp
        g, u = self._lin(h, f"{m}.gate_proj.weight", False), self._lin(h, f"{m}.up_proj.weight", False)
        return x + self._lin(torch.nn.functional.silu(g) * u, f"{m}.down_proj.weight", False)


def dense_block(family, tensors, cfg: dict, j: int, eps: float) -> tuple[DenseBlock | None, str]:
    """(the block, "") where the family's layer is dense attention + MLP with these names, else (None, why)."""
    if family.block is None:
        return None, f"no independent {family.name} decoder layer in mtpbench: the engine's own is used"
    prefix = family.layer_prefix.format(j=j, n_j=cfg.get("num_hidden_layers", 0) + j)
    w = tensors.under(prefix)
    if "self_attn.q_proj.weight" not in w:
        return None, f"{prefix}: no q_proj (not multi-head attention, e.g. MLA): the engine's decoder layer is used"
    if family.block == "qwen2":
        return DenseBlock(w, cfg, eps, "mlp"), ""
    routed = [k for k in w if k.startswith("mlp.experts.")]
    if "mlp.shared_experts.gate_proj.weight" not in w or any(w[k].any() for k in routed):
        return None, f"{prefix}: routed experts that are not zero (MoE routing): the engine's decoder layer is used"
    return DenseBlock(w, cfg, eps, "mlp.shared_experts"), ""
