"""A Qwen2 target model with MiMo-style MTP layers, in plain PyTorch.

The checkpoint format is vLLM's MiMo format (``MiMoForCausalLM``, ``model_type: qwen2``), so the same
directory loads here, in vLLM, and in transformers as ``Qwen2ForCausalLM`` (which ignores the MTP tensors).

``mtp_style`` picks which of the two MTP conventions the model computes (config.json ``"mtp_style"``, absent
= ``"mimo"``). MiMo: the target hands its MTP layer the hidden *before* its final norm, and an MTP layer ends
in ``final_layernorm``, whose output is both the next draft step's hidden and the logits' input. DeepSeek (GLM-4.5
and every DeepSeek-style class in vLLM): the target hands the *normed* hidden, an MTP layer hands the next step
its residual sum before any norm, and the layer's ``final_layernorm`` (GLM's ``shared_head.norm``) is applied
only for the logits, in ``compute_logits(hidden, spec_step_idx)``. ``builtin-glm`` is computed the second way.

The draft side keeps vLLM's three-level shape so that layer tracing sees the same structure in both
backends: ``MTPWrapper`` (like ``MiMoMTP``) -> ``MultiTokenPredictor`` (like ``MiMoMultiTokenPredictor``)
-> ``mtp_layers[j]`` (``MTPLayer``). The predictor picks its layer as ``spec_step_idx % num_mtp_layers``.

KV caches are addressed by absolute position: a forward writes keys at the positions it is given and
attends to cached keys with ``key_start <= key_pos <= query_pos``. Rows of a batch may sit at different
positions; stale entries past a row's frontier are never read before they are overwritten.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mtpbench.checkpoint import read_config
from mtpbench.errors import MtpBenchError


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int = 2048
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 3
    num_key_value_heads: int = 3
    num_nextn_predict_layers: int = 3
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    bos_token_id: int = 0
    eos_token_id: int = 0
    mtp_style: str = "mimo"  # or "deepseek" (see the module docstring)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelArgs":
        known = {f.name for f in fields(cls)}
        args = cls(**{k: v for k, v in cfg.items() if k in known})
        if args.mtp_style not in MTP_STYLES:
            raise MtpBenchError(f"config.json: mtp_style must be one of {', '.join(MTP_STYLES)}, got {args.mtp_style!r}")
        return args

    def to_config(self) -> dict:
        """The config.json vLLM (MiMo) and transformers (Qwen2) both read (``mtp_style`` only when not MiMo's:
        vLLM's MiMo class computes MiMo's convention whatever the key says)."""
        own = asdict(self)
        if own["mtp_style"] == "mimo":
            del own["mtp_style"]
        return {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "qwen2",
            **own,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "bfloat16",
        }


# Named presets, gpt-fast style. "tiny" is the built-in model.
PRESETS = {"tiny": ModelArgs()}
MTP_STYLES = ("mimo", "deepseek")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, T, D]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # neox-style rotate-half, as Qwen2 in transformers and vLLM
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@dataclass
class AttnContext:
    """What every layer of one model call shares: rotary tables and the attention mask."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None  # [B, 1, T, S] bool, or None for plain causal (training)
    num_keys: int

    @classmethod
    def make(cls, positions: torch.Tensor, a: "ModelArgs", dtype, cached: bool, key_start: int = 0):
        cos, sin = rope_cos_sin(positions, a.head_dim, a.rope_theta, dtype)
        if not cached:
            return cls(positions, cos, sin, None, 0)
        S = int(positions.max()) + 1
        if positions.shape == (1, 1) and key_start == 0:
            return cls(positions, cos, sin, None, S)  # one query at the frontier sees every key
        kpos = torch.arange(S, device=positions.device)
        mask = (kpos <= positions[:, :, None]) & (kpos >= key_start)
        return cls(positions, cos, sin, mask[:, None], S)


class KVCache:
    """Per-layer key/value store indexed by absolute position: [B, kv_heads, max_len, head_dim]."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, device, dtype):
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        # k: [B, H, T, D]; positions: [B, T]
        if k.shape[0] == 1:  # one row: positions are contiguous, a slice is cheaper than a scatter
            p0 = int(positions[0, 0])
            self.k[:, :, p0: p0 + k.shape[2]] = k
            self.v[:, :, p0: p0 + k.shape[2]] = v
            return
        b = torch.arange(k.shape[0], device=k.device)[:, None]
        self.k[b, :, positions] = k.transpose(1, 2)
        self.v[b, :, positions] = v.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.a = a
        hd = a.head_dim
        self.q_proj = nn.Linear(a.hidden_size, a.num_attention_heads * hd, bias=True)
        self.k_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * hd, bias=True)
        self.v_proj = nn.Linear(a.hidden_size, a.num_key_value_heads * hd, bias=True)
        self.o_proj = nn.Linear(a.num_attention_heads * hd, a.hidden_size, bias=False)
        self.qkv: tuple[torch.Tensor, torch.Tensor] | None = None  # fused copy for inference

    def fuse(self) -> None:
        self.qkv = (torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
                    torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))

    def forward(self, x, ctx: AttnContext, cache: KVCache | None = None):
        a, (B, T, _) = self.a, x.shape
        hd, nq, nkv = a.head_dim, a.num_attention_heads, a.num_key_value_heads
        if self.qkv is not None:
            q, k, v = F.linear(x, *self.qkv).split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = apply_rope(q.view(B, T, nq, hd).transpose(1, 2), ctx.cos, ctx.sin)
        k = apply_rope(k.view(B, T, nkv, hd).transpose(1, 2), ctx.cos, ctx.sin)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        if cache is None:
            # training / reference path: contiguous positions, plain causal attention
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nq != nkv)
        else:
            cache.write(k, v, ctx.positions)
            K, V = cache.k[:, :, : ctx.num_keys], cache.v[:, :, : ctx.num_keys]
            out = F.scaled_dot_product_attention(q, K, V, attn_mask=ctx.mask, enable_gqa=nq != nkv)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None

    def fuse(self) -> None:
        self.gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x):
        if self.gate_up is not None:
            g, u = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(g) * u)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, ctx: AttnContext, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Body(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(a) for _ in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        # MTP layers are stored under model.mtp_layers.{j} as in MiMo checkpoints
        self.mtp_layers = nn.ModuleList(MTPLayer(a) for _ in range(a.num_nextn_predict_layers))


class MTPLayer(nn.Module):
    """One MTP layer: h = input_proj([hidden_norm(h_prev), token_norm(e)]); block; then MiMo's final norm,
    or (DeepSeek style) the residual sum as it is, the final norm left to the logits."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.normed_output = a.mtp_style == "mimo"
        self.token_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hidden_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.input_proj = nn.Linear(2 * a.hidden_size, a.hidden_size, bias=False)
        # the decoder block's tensors sit directly under the layer (no mtp_block segment)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)
        self.final_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)

    def normed_inputs(self, e, previous_hidden_states):
        """(token_norm(e), hidden_norm(h_prev)): the two halves of the projection's input."""
        return self.token_layernorm(e), self.hidden_layernorm(previous_hidden_states)

    def forward(self, inputs_embeds, positions, previous_hidden_states, spec_step_idx: int = 0,
                cache: KVCache | None = None, key_start: int = 0):
        # as vLLM's MiMo layer: the token embedding is masked at position 0
        e = torch.where(positions[..., None] == 0, 0, inputs_embeds)
        e, h = self.normed_inputs(e, previous_hidden_states)
        h = self.input_proj(torch.cat([h, e], dim=-1))
        ctx = AttnContext.make(positions, self.self_attn.a, h.dtype, cache is not None, key_start)
        h = h + self.self_attn(self.input_layernorm(h), ctx, cache)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return self.final_layernorm(h) if self.normed_output else h


class TargetModel(nn.Module):
    """The target (verifier). forward returns hidden states *before* the final norm, as MiMoModel, or after
    it in DeepSeek style (as vLLM's DeepSeek and GLM models, whose compute_logits is the bare lm_head)."""

    def __init__(self, body: Qwen2Body, lm_head: nn.Linear):
        super().__init__()
        self.body, self.lm_head = body, lm_head
        self.returns_normed = body.args.mtp_style == "deepseek"

    def forward(self, input_ids, positions, caches: list[KVCache] | None = None):
        h = self.body.embed_tokens(input_ids)
        ctx = AttnContext.make(positions, self.body.args, h.dtype, caches is not None)
        for i, layer in enumerate(self.body.layers):
            h = layer(h, ctx, None if caches is None else caches[i])
        return self.body.norm(h) if self.returns_normed else h

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states if self.returns_normed else self.body.norm(hidden_states))


class MultiTokenPredictor(nn.Module):
    """Holds the MTP layers; chooses ``mtp_layers[spec_step_idx % num_mtp_layers]``."""

    def __init__(self, body: Qwen2Body, num_layers: int):
        super().__init__()
        self.embed_tokens = body.embed_tokens
        self.mtp_layers = body.mtp_layers[:num_layers]
        self.num_mtp_layers = num_layers

    def forward(self, input_ids, positions, previous_hidden_states, spec_step_idx: int = 0,
                caches: list[KVCache] | None = None):
        j = spec_step_idx % self.num_mtp_layers
        return self.mtp_layers[j](self.embed_tokens(input_ids), positions, previous_hidden_states,
                                  spec_step_idx, cache=None if caches is None else caches[j],
                                  key_start=j)


class MTPWrapper(nn.Module):
    """The draft model handed to the proposer, shaped like vLLM's ``MiMoMTP``.

    ``drop_spec_step_idx`` is a test-only fault switch: it reproduces a wrapper that takes the index
    (as ``**kwargs``) and never forwards it to the predictor.
    """

    def __init__(self, body: Qwen2Body, lm_head: nn.Linear, num_layers: int):
        super().__init__()
        self.model = MultiTokenPredictor(body, num_layers)
        self.lm_head = lm_head
        self.drop_spec_step_idx = False

    def forward(self, input_ids, positions, hidden_states, spec_step_idx: int = 0, caches=None):
        if self.drop_spec_step_idx:
            spec_step_idx = 0
        return self.model(input_ids, positions, hidden_states, spec_step_idx, caches)

    def compute_logits(self, hidden_states, spec_step_idx: int = 0):
        layer = self.model.mtp_layers[0 if self.drop_spec_step_idx else spec_step_idx % self.model.num_mtp_layers]
        # DeepSeek style: the layer's hidden is its residual sum, normed here by that layer (vLLM's shared_head)
        return self.lm_head(hidden_states if layer.normed_output else layer.final_layernorm(hidden_states))


class MiMoModel(nn.Module):
    """The whole checkpoint: ``model.*`` (body + mtp_layers) and ``lm_head``."""

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.model = Qwen2Body(a)
        self.lm_head = nn.Linear(a.hidden_size, a.vocab_size, bias=False)

    @property
    def target(self) -> TargetModel:
        return TargetModel(self.model, self.lm_head)

    def drafter(self, num_layers: int) -> MTPWrapper:
        return MTPWrapper(self.model, self.lm_head, num_layers)

    def fuse(self) -> "MiMoModel":
        """Fused q/k/v and gate/up weights for inference (fewer, larger matmuls); not saved."""
        for mod in self.modules():
            if isinstance(mod, (Attention, MLP)):
                mod.fuse()
        return self


def load_model(model_dir: Path, device="cpu", dtype=torch.float32) -> MiMoModel:
    """Load a MiMo-format checkpoint for inference (fused weights). A checkpoint without MTP layers
    loads too: it can still run k = 0. A GLM-4.5-format checkpoint written by mtpbench (``builtin-glm``)
    loads as the same tensors under MiMo's names, computed in DeepSeek style (see builtin.mimo_from_glm), with
    builtin-glm-tp's zero padded heads dropped (builtin_tp.unpad_heads)."""
    from safetensors.torch import load_file

    from mtpbench.builtin import GLM_ARCH, mimo_from_glm
    from mtpbench.builtin_tp import unpadded_config

    cfg = read_config(model_dir)
    glm = cfg.get("architectures") == [GLM_ARCH]
    m = MiMoModel(ModelArgs.from_config({**unpadded_config(cfg), "mtp_style": "deepseek"} if glm else cfg))
    try:
        state = load_file(str(Path(model_dir) / "model.safetensors"))
    except Exception as e:  # missing file, corrupt file
        raise MtpBenchError(f"{model_dir}: cannot load model.safetensors ({str(e).splitlines()[0][:200]})") from None
    if glm:
        state = mimo_from_glm(state, cfg, model_dir)
    try:
        missing, unexpected = m.load_state_dict(state, strict=False)
    except Exception as e:  # shapes that differ
        raise MtpBenchError(f"{model_dir}: cannot load model.safetensors ({str(e).splitlines()[0][:200]})") from None
    if missing or unexpected:
        raise MtpBenchError(f"{model_dir}: checkpoint tensors do not match config "
                            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    return m.to(device=device, dtype=dtype).eval().fuse()


def save_model(m: MiMoModel, model_dir: Path, dtype=torch.bfloat16) -> None:
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in m.state_dict().items()}
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(m.args.to_config(), indent=2) + "\n")
