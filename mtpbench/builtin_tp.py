"""Attention heads that are exactly zero, appended so a model's heads divide by a tensor-parallel size, and taken
off again: ``builtin-glm-tp`` is ``builtin-glm`` (3 heads of 64: vLLM refuses tensor_parallel_size 2, "must be
divisible by tensor parallel size") with one such head in every attention block, target and MTP layers alike, so
4 heads of 64 divide by 1, 2 and 4.

A padded head has zero q, k and v rows (weights and biases) and zero o_proj columns: its scores are all 0, so its
softmax averages values that are all 0, and o_proj multiplies that 0 by columns that are 0: it adds exactly
nothing. The head size stays 64 (the config names it, ``head_dim``), so the scaling 1 / sqrt(64) and the rotary
angles of the real heads are unchanged. Only formats whose attention reads ``head_dim`` from the config can be
padded: GLM-4.5's does, MiMo's (Qwen2's attention: hidden_size / num_attention_heads) does not. The config key
``PAD_KEY`` says how many heads are padding, so a reader (the native engine) drops them after checking that
they are zero."""

from __future__ import annotations

from mtpbench.errors import MtpBenchError

PAD_KEY = "mtpbench_padded_heads"  # config.json: how many of the last heads are zero padding
TP_FORMAT_VERSION = 1  # bump when pad_heads or padded_config change what builtin-glm-tp holds
TP_PADDED_HEADS = 1  # builtin-glm's 3 heads + 1 = 4


def attention_blocks(cfg: dict) -> list[str]:
    """The attention prefix of every block of a GLM-4.5-format checkpoint: the target layers, then the MTP
    layers (GLM numbers them on, ``model.layers.{num_hidden_layers + j}``)."""
    n = cfg["num_hidden_layers"] + int(cfg.get("num_nextn_predict_layers") or 0)
    return [f"model.layers.{i}.self_attn." for i in range(n)]


def head_dim(cfg: dict) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def padded_config(cfg: dict, pad: int) -> dict:
    """``cfg`` with ``pad`` more attention (and key/value) heads of the same size, the size written out and
    the padding named under PAD_KEY. Multi-head attention only (one key/value head per query head): with
    grouped heads a zero query head would need a group of its own."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if cfg.get(PAD_KEY):
        raise MtpBenchError(f"the config has {cfg[PAD_KEY]} padded heads already ({PAD_KEY})")
    if kv != heads:
        raise MtpBenchError(f"only multi-head attention can be padded: {heads} query heads, {kv} key/value heads")
    if pad < 1:
        raise MtpBenchError(f"padded heads must be >= 1, got {pad}")
    return {**cfg, "num_attention_heads": heads + pad, "num_key_value_heads": kv + pad, "head_dim": head_dim(cfg),
            PAD_KEY: pad}


def unpadded_config(cfg: dict) -> dict:
    """The config before padded_config (``head_dim`` stays written): the model the padded one computes."""
    pad = padding(cfg)
    if not pad:
        return cfg
    out = {k: v for k, v in cfg.items() if k != PAD_KEY}
    out["num_attention_heads"] -= pad
    out["num_key_value_heads"] -= pad
    return out


def padding(cfg: dict, where: str = "config.json") -> int:
    """How many heads PAD_KEY names (0: none), checked: fewer than the heads, of multi-head attention."""
    pad = cfg.get(PAD_KEY, 0)
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if pad == 0:
        return 0
    if type(pad) is not int or not isinstance(heads, int) or not 0 < pad < heads or kv != heads:
        raise MtpBenchError(f"{where}: {PAD_KEY} is {pad!r}: it must be a count of heads below "
                            f"num_attention_heads ({heads!r}), with as many key/value heads ({kv!r})")
    return pad


def pad_heads(state: dict, cfg: dict, pad: int) -> dict:
    """``state`` (a GLM-4.5-format checkpoint's tensors, config ``cfg`` unpadded) with ``pad`` zero heads at the
    end of every attention block: zero rows under q/k/v_proj's weights and biases, zero columns right of
    o_proj's weight. Every other tensor as it is."""
    import torch

    rows = pad * head_dim(cfg)
    out = dict(state)
    for p in attention_blocks(cfg):
        for name in (f"{p}{c}_proj.{w}" for c in "qkv" for w in ("weight", "bias")):
            t = state[name]
            out[name] = torch.cat([t, t.new_zeros((rows, *t.shape[1:]))], dim=0)
        o = state[p + "o_proj.weight"]
        out[p + "o_proj.weight"] = torch.cat([o, o.new_zeros((o.shape[0], rows))], dim=1)
    return out


def unpad_heads(state: dict, cfg: dict, where: str = "checkpoint") -> tuple[dict, dict]:
    """The inverse of pad_heads for a config that names its padding (PAD_KEY; none: ``state`` and ``cfg`` as
    they are): the padded heads' slices checked to be exactly zero and dropped, with the unpadded config. A
    padded head that is not zero is an MtpBenchError naming its tensor: dropping it would change the model."""
    pad = padding(cfg, f"{where}/config.json")
    if not pad:
        return state, cfg
    hd = head_dim(cfg)
    keep, total = (cfg["num_attention_heads"] - pad) * hd, cfg["num_attention_heads"] * hd
    out = dict(state)
    try:
        for p in attention_blocks(cfg):
            for name in (f"{p}{c}_proj.{w}" for c in "qkv" for w in ("weight", "bias")):
                out[name] = kept(state[name], 0, keep, total, name, where)
            name = p + "o_proj.weight"
            out[name] = kept(state[name], 1, keep, total, name, where)
    except KeyError as e:
        raise MtpBenchError(f"{where}: checkpoint lacks {e.args[0]}") from None
    return out, unpadded_config(cfg)


def kept(t, dim: int, keep: int, total: int, name: str, where: str):
    """The first ``keep`` of ``total`` rows (dim 0) or columns (dim 1) of ``t``, the rest checked to be zero."""
    if t.shape[dim] != total:
        raise MtpBenchError(f"{where}: {name} has {t.shape[dim]} {'rows' if dim == 0 else 'columns'}, "
                            f"the padded config's heads make {total}")
    if t.narrow(dim, keep, total - keep).any():
        raise MtpBenchError(f"{where}: {name}'s padded head is not zero ({PAD_KEY}): it would change the model")
    return t.narrow(dim, 0, keep).contiguous()
