"""Checkpoint facts, in one place: reading config.json, where the MTP layer count is declared, which
tensors belong to which MTP layer under each family's names, how many bytes each layer holds, and the
derived checkpoint directory that makes vLLM load fewer MTP layers.

Derived checkpoints: vLLM has no speculative-config field for the MTP layer count, so a count L below the
checkpoint's runs on a directory whose ``config.json`` declares L (the key vLLM reads), whose shards leave
out the tensors of MTP layers >= L, and whose other files are links, not copies. They are cached under
``~/.cache/mtpbench/derived`` (``$XDG_CACHE_HOME``), keyed by the source's path, files and sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mtpbench.errors import MtpBenchError
from mtpbench.prompts import BUILTIN_MODEL_DIR


def resolve_model_dir(model: str) -> Path:
    """'builtin', 'builtin-glm', a local directory, or a hub id already in the local Hugging Face cache."""
    if model == "builtin":
        return BUILTIN_MODEL_DIR
    if model == "builtin-glm":
        return builtin_glm_dir()
    path = Path(model)
    if path.is_dir() or model.count("/") != 1 or path.exists():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not cached, or huggingface_hub missing: say what to do
        raise MtpBenchError(f"model {model!r} is not a local directory nor in the Hugging Face cache: "
                            f"download it first (huggingface-cli download {model}) or give a local path") from None


def read_config(model_dir: Path) -> dict:
    """The checkpoint's config.json, as a dict."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise MtpBenchError(f"model directory not found: {model_dir}")
    if not path.is_file():
        raise MtpBenchError(f"{model_dir} has no config.json")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MtpBenchError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise MtpBenchError(f"{path} is not a JSON object")
    return cfg


MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # DeepSeek/MiMo/GLM; Qwen3.5


def mtp_layer_field(cfg: dict) -> tuple[dict, str]:
    """Where the checkpoint's config declares its MTP layer count: (the dict holding it, the key).

    Looked for as vLLM does: at the top level, then in ``text_config``. Absent: the top level and
    ``num_nextn_predict_layers``."""
    for holder in (cfg, cfg.get("text_config")):
        if isinstance(holder, dict):
            for key in MTP_LAYER_KEYS:
                if holder.get(key) is not None:
                    return holder, key
    return cfg, MTP_LAYER_KEYS[0]


def num_hidden_layers(cfg: dict) -> int:
    holder = cfg if "num_hidden_layers" in cfg else cfg.get("text_config") or {}
    return int(holder.get("num_hidden_layers") or 0)


def num_mtp_layers(model_dir: Path) -> int:
    """How many MTP layers the checkpoint declares."""
    holder, key = mtp_layer_field(read_config(model_dir))
    value = holder.get(key) or 0
    if not isinstance(value, int) or value < 0:
        raise MtpBenchError(f"{model_dir}/config.json: {key} must be a non-negative integer")
    return value


def drafter_layers(model_dir: Path) -> int:
    """The MTP layers of a drafter in a checkpoint of its own (Gemma 4's assistant): the count it declares,
    else all its decoder layers."""
    n = num_mtp_layers(model_dir)
    return n or num_hidden_layers(read_config(model_dir))


def no_mtp_layers(model_dir: Path) -> MtpBenchError:
    return MtpBenchError(f"{model_dir} has no MTP layers (num_nextn_predict_layers is 0 or missing)")


def mtp_layer_of(name: str, num_hidden_layers: int) -> int | None:
    """Which MTP layer a checkpoint tensor belongs to, across the naming schemes MTP models use."""
    parts = name.split(".")
    for prefix in (["model", "mtp_layers"], ["mtp", "layers"], ["model", "mtp", "layers"],  # MiMo, Qwen, MiMo-V2
                   ["model", "mtp_block"], ["model", "mtp_emb_norm"], ["model", "mtp_hidden_norm"],  # ERNIE-4.5
                   ["model", "mtp_linear_proj"]):
        n = len(prefix)
        if parts[:n] == prefix and len(parts) > n and parts[n].isdigit():
            return int(parts[n])
    for prefix in (["model", "layers"], ["model", "language_model", "layers"]):  # DeepSeek-V3, GLM-4.5; GLM-OCR
        n = len(prefix)
        if parts[:n] == prefix and len(parts) > n and parts[n].isdigit():
            i = int(parts[n])
            return i - num_hidden_layers if i >= num_hidden_layers else None
    return None


def checkpoint_shards(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if not index.exists():
        return [model_dir / "model.safetensors"]
    return sorted({model_dir / f for f in json.loads(index.read_text())["weight_map"].values()})


def mtp_layer_bytes(model_dir: Path, drafter: bool = False) -> list[int]:
    """Bytes each MTP layer's tensors take in the checkpoint files (read from the safetensors headers).
    ``drafter``: a separate draft checkpoint, whose decoder layers are its MTP layers."""
    import struct

    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    holder, key = mtp_layer_field(cfg)
    sizes = [0] * (drafter_layers(model_dir) if drafter else int(holder.get(key) or 0))
    offset = 0 if drafter else num_hidden_layers(cfg)
    for shard in checkpoint_shards(model_dir):
        if not shard.is_file():  # e.g. a .bin checkpoint: sizes stay unknown (0)
            continue
        with open(shard, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, meta in header.items():
            j = mtp_layer_of(name, offset) if name != "__metadata__" else None
            if j is not None and j < len(sizes):
                start, end = meta["data_offsets"]
                sizes[j] += end - start
    return sizes


def derived_checkpoint(model_dir: Path, layers: int, cache: Path | None = None) -> Path:
    """A checkpoint directory that vLLM reads as having ``layers`` MTP layers (see module docstring)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir = Path(model_dir).resolve()
    cfg = read_config(model_dir)
    holder, count_key = mtp_layer_field(cfg)
    have = int(holder.get(count_key) or 0)
    if layers == have:
        return model_dir
    stamp = "|".join(f"{p.name}:{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in sorted(model_dir.iterdir()))
    key = hashlib.sha256(f"{model_dir}|{layers}|{stamp}".encode()).hexdigest()[:16]
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtpbench" / "derived"
    out = cache / f"{model_dir.name}-mtp{layers}-{key}"
    if (out / "config.json").exists():
        return out
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    n_hidden = num_hidden_layers(cfg)
    drop = lambda name: (j := mtp_layer_of(name, n_hidden)) is not None and j >= layers  # noqa: E731
    index_path = model_dir / "model.safetensors.index.json"
    shards = checkpoint_shards(model_dir)
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            names = list(f.keys())
            if not any(drop(n) for n in names):
                os.symlink(shard, tmp / shard.name)
                continue
            save_file({n: f.get_tensor(n) for n in names if not drop(n)}, str(tmp / shard.name),
                      metadata={"format": "pt"})
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["weight_map"] = {n: f for n, f in index["weight_map"].items() if not drop(n)}
        (tmp / index_path.name).write_text(json.dumps(index, indent=1))
    holder[count_key] = layers  # the same key vLLM reads (num_nextn_predict_layers, or Qwen3.5's mtp_num_hidden_layers)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    done = {s.name for s in shards} | {"config.json", index_path.name}
    for p in model_dir.iterdir():
        if p.name not in done:
            os.symlink(p, tmp / p.name)
    os.replace(tmp, out)
    return out


# The built-in weights in GLM-4.5's format (``builtin-glm``): vLLM's MiMo MTP class asserts spec_step_idx == 0,
# so Model Runner V2, which drafts step s with MTP layer s mod L, cannot run the built-in checkpoint at k >= 2.
# Glm4MoeMTP honours the index. The derivation maps every tensor; what GLM computes differently is folded in:
# - concat order: MiMo projects [hidden, embedding], GLM [embedding, hidden]: eh_proj swaps input_proj's halves.
# - the target's hidden: MiMo hands its MTP layer the hidden *before* the final norm, GLM the normed one. The
#   final norm's weight moves into lm_head (columns scaled: a bf16 x bf16 product is exact in f32), the norm keeps
#   weight 1, and the MTP layer re-normalizes a unit-RMS vector: equal up to the norm's eps (~1e-6 relative).
# - MiMo's layer ends in final_layernorm, GLM's in the residual sum with the norm moved to shared_head (logits
#   only): shared_head.norm takes final_layernorm (divided by the target norm's weight for layer 0, whose head is
#   the scaled lm_head). Logits are exact; the hidden fed to the next layer is not normed in GLM. Layer j >= 1's
#   hnorm takes hidden_layernorm_j * final_layernorm_{j-1} / rms(final_layernorm_{j-1}), which is MiMo's input
#   up to one scalar per token, rms(final_layernorm_{j-1} * unit(h)) / rms(final_layernorm_{j-1}). That scalar
#   is the one difference left on the chain (V2); on V1, which feeds layer 0 its own output, the elementwise
#   final_layernorm_0 is missing too.
# - Glm4MoeForCausalLM and Glm4MoeMTP each need one MoE layer: the last target layer and the MTP blocks are MoE
#   whose shared expert is the original MLP and whose two routed experts are all zeros (they add exactly 0).
GLM_FORMAT_VERSION = 2  # bump when glm_tensors or glm_config changes what they write
GLM_MOE_INTERMEDIATE = 32  # routed expert width; the shared expert is GLM_MOE_INTERMEDIATE * n_shared_experts
GLM_ROUTED_EXPERTS = 2  # vLLM's CPU grouped top-k takes the top 2 of each group


def glm_config(cfg: dict) -> dict:
    """GLM-4.5 (``Glm4MoeForCausalLM``) config.json for a MiMo-format config (see the notes above)."""
    n, inter = cfg["num_hidden_layers"], cfg["intermediate_size"]
    if inter % GLM_MOE_INTERMEDIATE:
        raise MtpBenchError(f"intermediate_size {inter} is not a multiple of {GLM_MOE_INTERMEDIATE}")
    theta = float(cfg.get("rope_theta", 10000.0))
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "num_nextn_predict_layers", "max_position_embeddings", "rms_norm_eps",
            "bos_token_id", "eos_token_id")
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        **{k: cfg[k] for k in keep},
        "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
        "hidden_act": "silu",
        "attention_bias": True,  # Qwen2's q/k/v biases
        "use_qk_norm": False,
        "partial_rotary_factor": 1.0,  # GLM's default is 0.5; Qwen2 rotates the whole head (neox style)
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 1.0},
        "first_k_dense_replace": n - 1,  # the last target layer and every MTP layer are (zero-routed) MoE
        "n_routed_experts": GLM_ROUTED_EXPERTS,
        "num_experts_per_tok": 1,
        "n_shared_experts": inter // GLM_MOE_INTERMEDIATE,
        "moe_intermediate_size": GLM_MOE_INTERMEDIATE,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def glm_tensors(state: dict, cfg: dict) -> dict:
    """The GLM-4.5 tensors for a MiMo-format state dict (names as in the checkpoint; see the notes above)."""
    import torch

    n, m = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    h = cfg["hidden_size"]
    f32 = lambda t: t.to(torch.float32)  # noqa: E731
    w_norm = state["model.norm.weight"]
    head = f32(state["lm_head.weight"]) * f32(w_norm)  # exact: 8-bit x 8-bit mantissas fit in f32's 24
    out = {"model.embed_tokens.weight": state["model.embed_tokens.weight"],
           "model.norm.weight": torch.ones_like(w_norm), "lm_head.weight": head}

    def block(src: str, dst: str, moe: bool) -> None:
        for part in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
                     *(f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias"))):
            out[dst + part] = state[src + part]
        mlp = "mlp.shared_experts." if moe else "mlp."
        for p in ("gate", "up", "down"):
            out[f"{dst}{mlp}{p}_proj.weight"] = state[f"{src}mlp.{p}_proj.weight"]
        if moe:
            dt = state[src + "mlp.gate_proj.weight"].dtype
            out[dst + "mlp.gate.weight"] = torch.zeros(GLM_ROUTED_EXPERTS, h, dtype=dt)
            out[dst + "mlp.gate.e_score_correction_bias"] = torch.zeros(GLM_ROUTED_EXPERTS, dtype=torch.float32)
            for e in range(GLM_ROUTED_EXPERTS):
                for p, shape in (("gate", (GLM_MOE_INTERMEDIATE, h)), ("up", (GLM_MOE_INTERMEDIATE, h)),
                                 ("down", (h, GLM_MOE_INTERMEDIATE))):
                    out[f"{dst}mlp.experts.{e}.{p}_proj.weight"] = torch.zeros(shape, dtype=dt)

    first_moe = glm_config(cfg)["first_k_dense_replace"]
    for i in range(n):
        block(f"model.layers.{i}.", f"model.layers.{i}.", i >= first_moe)
    for j in range(m):
        src, dst = f"model.mtp_layers.{j}.", f"model.layers.{n + j}."
        block(src, dst, True)
        proj = state[src + "input_proj.weight"]
        out[dst + "eh_proj.weight"] = torch.cat([proj[:, h:], proj[:, :h]], dim=1).contiguous()
        out[dst + "enorm.weight"] = state[src + "token_layernorm.weight"]
        final = state[src + "final_layernorm.weight"]
        if j == 0:
            out[dst + "hnorm.weight"] = state[src + "hidden_layernorm.weight"]
            out[dst + "shared_head.norm.weight"] = f32(final) / f32(w_norm)
            out[dst + "shared_head.head.weight"] = head
        else:
            prev = f32(state[f"model.mtp_layers.{j - 1}.final_layernorm.weight"]).double()
            out[dst + "hnorm.weight"] = (f32(state[src + "hidden_layernorm.weight"]).double() * prev
                                         / prev.pow(2).mean().sqrt()).float()
            out[dst + "shared_head.norm.weight"] = final
            out[dst + "shared_head.head.weight"] = state["lm_head.weight"]
    return out


def derive_glm(src: Path, out: Path) -> Path:
    """Write the GLM-4.5 form of MiMo-format checkpoint ``src`` to ``out`` (atomically: aside, then renamed).
    Deterministic: the same source gives the same bytes."""
    import shutil

    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    cfg = read_config(src)
    if cfg.get("architectures") != ["MiMoForCausalLM"]:
        raise MtpBenchError(f"{src} is not a MiMo-format checkpoint (architectures {cfg.get('architectures')})")
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    weights = src / "model.safetensors"
    tensors = {k: v.contiguous().clone() for k, v in glm_tensors(load_file(str(weights)), cfg).items()}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(glm_config(cfg), indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "prompts.jsonl",
                 "train_log.json"):
        if (src / name).exists():
            shutil.copyfile(src / name, tmp / name)
    (tmp / "derived_from.json").write_text(json.dumps({
        "format": "glm4_moe", "format_version": GLM_FORMAT_VERSION, "source": "MiMo-format checkpoint",
        "source_model_safetensors_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "rule": "mtpbench.checkpoint.glm_tensors"}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def builtin_glm_dir(cache: Path | None = None) -> Path:
    """``builtin-glm``: the built-in weights in GLM-4.5's format, derived once and cached under
    ``~/.cache/mtpbench/builtin-glm-<key>`` (the key follows the built-in files and GLM_FORMAT_VERSION)."""
    src = BUILTIN_MODEL_DIR
    stamp = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(src.iterdir()))
    key = hashlib.sha256(f"{GLM_FORMAT_VERSION}|{src.resolve()}|{stamp}".encode()).hexdigest()[:16]
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mtpbench"
    out = cache / f"builtin-glm-{key}"
    if (out / "config.json").exists():
        return out
    try:
        return derive_glm(src, out)
    except OSError:  # another process finished the same directory first
        if (out / "config.json").exists():
            return out
        raise
