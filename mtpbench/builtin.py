"""The built-in models and what a model name means: ``resolve_model_dir`` (a name of ``BUILTIN_MODELS``, a local
directory, or a hub id already in the local cache), and ``builtin-glm``, the built-in model in GLM-4.5's
checkpoint format: the config and tensor names vLLM's ``Glm4MoeMTP`` loads, written from the built-in MiMo-style
target and the shipped fine-tuned MTP tensors, and read back into MiMo's names for the native engine
(``mimo_from_glm``); ``builtin-glm-tp``, builtin-glm with a zero fourth attention head in every block, so that
tensor parallel 2 and 4 can shard it (``builtin_tp``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mtpbench.builtin_tp import PAD_KEY, TP_FORMAT_VERSION, TP_PADDED_HEADS, pad_heads, padded_config, unpad_heads
from mtpbench.checkpoint import read_config
from mtpbench.errors import MtpBenchError
from mtpbench.paths import BUILTIN_MODEL_DIR, GLM_MTP_DIR, cache_dir

# the model names mtpbench builds itself (every other name is a directory or a hub id)
BUILTIN_MODELS = ("builtin", "builtin-glm", "builtin-glm-tp")


def resolve_model_dir(model: str) -> Path:
    """A name of BUILTIN_MODELS, a local directory, or a hub id already in the local Hugging Face cache."""
    if model == "builtin":
        return BUILTIN_MODEL_DIR
    if model == "builtin-glm":
        return builtin_glm_dir()
    if model == "builtin-glm-tp":
        return builtin_glm_tp_dir()
    path = Path(model)
    if path.is_dir() or model.count("/") != 1 or path.exists():
        return path
    if model.startswith(("/", ".", "~")):  # a path, not a hub id (org/name): it is simply not there
        raise MtpBenchError(f"model directory not found: {model}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not cached, or huggingface_hub missing: say what to do
        raise MtpBenchError(f"model {model!r} is not a local directory nor in the Hugging Face cache: "
                            f"download it first (hf download {model}) or give a local path") from None



# The built-in model in GLM-4.5's format (``builtin-glm``): vLLM's MiMo MTP class asserts spec_step_idx == 0, so
# Model Runner V2, which drafts step s with MTP layer s mod L, cannot run the built-in checkpoint at k >= 2.
# Glm4MoeMTP honours the index. Every tensor of builtin-glm is a built-in one under GLM's names, copied bit for bit:
# - the target: the built-in target as it is. GLM's model returns the hidden after the final norm and its logits are
#   lm_head(hidden); MiMo's returns it before the norm and norms in compute_logits: the same numbers either way.
# - the MTP layers cannot be MiMo's: GLM (like every DeepSeek-style class) feeds MTP layer 0 the target's *normed*
#   hidden and hands the next layer the residual sum *before* the layer's final norm, which sits in shared_head and
#   only makes logits; MiMo's layer 0 reads the hidden before the target's norm and passes final_layernorm(h) on.
#   No rescaling of MiMo's tensors gives GLM's chain exactly (a per-token scalar is left). So builtin-glm's MTP
#   layers are the built-in ones fine-tuned as a chain in DeepSeek's convention (target frozen; mtpbench.train.
#   finetune_mtp, model.py's mtp_style "deepseek"), shipped as mtpbench/assets/glm_mtp (MTP tensors only) and
#   rebuilt bit for bit by ``make-model --format glm``.
# - concat order: MiMo projects [hidden, embedding], GLM [embedding, hidden]: eh_proj is input_proj, halves swapped.
# - final_layernorm is shared_head.norm and lm_head is every layer's shared_head.head (vLLM maps lm_head onto layer
#   0's), so the logits are the same expression on the same tensors.
# - Glm4MoeForCausalLM and Glm4MoeMTP each need one MoE layer: the last target layer and the MTP blocks are MoE
#   whose shared expert is the original MLP and whose two routed experts are all zeros (they add exactly 0).
# The native engine loads the GLM directory itself (mimo_from_glm, the inverse), so both backends read one file.
GLM_ARCH = "Glm4MoeForCausalLM"
GLM_FORMAT_VERSION = 3  # bump when glm_tensors, glm_config or the shipped MTP tensors change what is written
GLM_MOE_INTERMEDIATE = 32  # routed expert width; the shared expert is GLM_MOE_INTERMEDIATE * n_shared_experts
GLM_ROUTED_EXPERTS = 2  # vLLM's CPU grouped top-k takes the top 2 of each group
BLOCK_PARTS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
               *(f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")))


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
        "architectures": [GLM_ARCH],
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


def glm_names(cfg: dict) -> list[tuple[str, str]]:
    """(MiMo name, GLM name) of every tensor GLM holds as a copy; lm_head is also each MTP layer's head.
    Left out: eh_proj (input_proj, halves swapped) and the zero-routed MoE parts (glm_zero_moe)."""
    n, m = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    first_moe = glm_config(cfg)["first_k_dense_replace"]
    pairs = [(name, name) for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")]

    def block(src: str, dst: str, moe: bool) -> None:
        pairs.extend((src + part, dst + part) for part in BLOCK_PARTS)
        mlp = "mlp.shared_experts." if moe else "mlp."
        pairs.extend((f"{src}mlp.{p}_proj.weight", f"{dst}{mlp}{p}_proj.weight") for p in ("gate", "up", "down"))

    for i in range(n):
        block(f"model.layers.{i}.", f"model.layers.{i}.", i >= first_moe)
    for j in range(m):
        src, dst = f"model.mtp_layers.{j}.", f"model.layers.{n + j}."
        block(src, dst, True)
        pairs += [(src + "token_layernorm.weight", dst + "enorm.weight"),
                  (src + "hidden_layernorm.weight", dst + "hnorm.weight"),
                  (src + "final_layernorm.weight", dst + "shared_head.norm.weight"),
                  ("lm_head.weight", dst + "shared_head.head.weight")]
    return pairs


def glm_zero_moe(cfg: dict, dtype) -> dict:
    """The router and routed experts of every MoE layer: zeros, so each MoE adds exactly its shared expert."""
    import torch

    h, n, m = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    out = {}
    for i in range(glm_config(cfg)["first_k_dense_replace"], n + m):
        dst = f"model.layers.{i}.mlp."
        out[dst + "gate.weight"] = torch.zeros(GLM_ROUTED_EXPERTS, h, dtype=dtype)
        out[dst + "gate.e_score_correction_bias"] = torch.zeros(GLM_ROUTED_EXPERTS, dtype=torch.float32)
        for e in range(GLM_ROUTED_EXPERTS):
            for p, shape in (("gate", (GLM_MOE_INTERMEDIATE, h)), ("up", (GLM_MOE_INTERMEDIATE, h)),
                             ("down", (h, GLM_MOE_INTERMEDIATE))):
                out[f"{dst}experts.{e}.{p}_proj.weight"] = torch.zeros(shape, dtype=dtype)
    return out


def swap_halves(proj):
    """input_proj [hidden | embedding] <-> eh_proj [embedding | hidden] (its own inverse)."""
    import torch

    h = proj.shape[1] // 2
    return torch.cat([proj[:, h:], proj[:, :h]], dim=1).contiguous()


def glm_tensors(state: dict, cfg: dict) -> dict:
    """The GLM-4.5 tensors for a MiMo-named state dict whose MTP layers compute DeepSeek's convention
    (see the notes above): every tensor copied, none rescaled."""
    n = cfg["num_hidden_layers"]
    out = {g: state[s] for s, g in glm_names(cfg)}
    for j in range(cfg["num_nextn_predict_layers"]):
        out[f"model.layers.{n + j}.eh_proj.weight"] = swap_halves(state[f"model.mtp_layers.{j}.input_proj.weight"])
    out.update(glm_zero_moe(cfg, state["model.embed_tokens.weight"].dtype))
    return out


def mimo_from_glm(state: dict, cfg: dict, where: Path | str = "checkpoint") -> dict:
    """The inverse of glm_tensors, for the native engine: a GLM-4.5 checkpoint that mtpbench wrote (its config is
    glm_config's, its routed experts zero, every MTP head the lm_head) as MiMo-named tensors; builtin-glm-tp's
    padded heads are checked to be zero and dropped first. Anything else is an MtpBenchError: the native engine
    has no MoE routing."""
    state, cfg = unpad_heads(state, cfg, str(where))
    want = glm_config(cfg)
    bad = next((k for k in want if cfg.get(k) != want[k]), None)
    if bad is not None:
        raise MtpBenchError(f"{where}: a GLM-4.5 checkpoint the native engine cannot run ({bad} is "
                            f"{cfg.get(bad)!r}, mtpbench writes {want[bad]!r}); only mtpbench's own (builtin-glm) load")
    n, out = cfg["num_hidden_layers"], {}
    try:
        for s, g in glm_names(cfg):
            if s in out:
                if not out[s].equal(state[g]):
                    raise MtpBenchError(f"{where}: {g} differs from {s}; the native engine shares one")
            else:
                out[s] = state[g]
        for j in range(cfg["num_nextn_predict_layers"]):
            out[f"model.mtp_layers.{j}.input_proj.weight"] = swap_halves(state[f"model.layers.{n + j}.eh_proj.weight"])
        zero = glm_zero_moe(cfg, None)
        for g in zero:
            if state[g].any():
                raise MtpBenchError(f"{where}: {g} is not zero; the native engine has no MoE routing")
    except KeyError as e:
        raise MtpBenchError(f"{where}: GLM-4.5 checkpoint lacks {e.args[0]}") from None
    extra = set(state) - {g for _, g in glm_names(cfg)} - set(zero) - {
        f"model.layers.{n + j}.eh_proj.weight" for j in range(cfg["num_nextn_predict_layers"])}
    if extra:
        raise MtpBenchError(f"{where}: GLM-4.5 checkpoint holds tensors mtpbench does not write: {sorted(extra)[:3]}")
    return out


def builtin_glm_source() -> tuple[dict, bytes, dict]:
    """The built-in MiMo-format state with the shipped fine-tuned MTP tensors in place of its own, those tensors'
    file bytes, and the fine-tune's recipe (assets/glm_mtp/finetune.json)."""
    from safetensors.torch import load, load_file

    mtp_bytes = (GLM_MTP_DIR / "mtp.safetensors").read_bytes()
    state = load_file(str(BUILTIN_MODEL_DIR / "model.safetensors"))
    mtp = load(mtp_bytes)
    if set(mtp) != {k for k in state if k.startswith("model.mtp_layers.")}:
        raise MtpBenchError(f"{GLM_MTP_DIR}/mtp.safetensors does not hold exactly the built-in MTP tensors")
    recipe = json.loads((GLM_MTP_DIR / "finetune.json").read_text())["recipe"]
    return {**state, **mtp}, mtp_bytes, recipe


def write_model_dir(out: Path, tensors: dict, config: dict, copy_from: Path, provenance: dict) -> Path:
    """Write a checkpoint directory atomically (aside, then renamed): ``tensors``, ``config``, the tokenizer and
    data files of ``copy_from``, and ``provenance`` as derived_from.json. The same inputs give the same bytes."""
    import shutil

    from safetensors.torch import save_file

    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "prompts.jsonl",
                 "train_log.json"):
        if (copy_from / name).exists():
            shutil.copyfile(copy_from / name, tmp / name)
    (tmp / "derived_from.json").write_text(json.dumps(provenance, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def write_glm(src: Path, state: dict, mtp_bytes: bytes, recipe: dict, out: Path) -> Path:
    """Write the GLM-4.5 form of ``state`` (MiMo-named, DeepSeek-style MTP layers fine-tuned from ``src``'s by
    ``recipe``) to ``out``, atomically. The same inputs give the same bytes."""
    src, out = Path(src), Path(out)
    cfg = read_config(src)
    return write_model_dir(out, glm_tensors(state, cfg), glm_config(cfg), src, {
        "format": "glm4_moe", "format_version": GLM_FORMAT_VERSION,
        "target": "the source's target tensors, copied (MiMo-format checkpoint)",
        "source_model_safetensors_sha256": hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
        "mtp_layers": "the source's MTP layers fine-tuned as a chain in DeepSeek's convention, target frozen "
                      "(mtpbench.train.finetune_mtp)",
        "mtp_safetensors_sha256": hashlib.sha256(mtp_bytes).hexdigest(), "finetune": recipe,
        "rule": "mtpbench.checkpoint.glm_tensors"})


def write_glm_tp(src: Path, out: Path, pad: int = TP_PADDED_HEADS) -> Path:
    """Write ``src`` (a GLM-4.5 directory mtpbench wrote, unpadded) with ``pad`` zero attention heads in every
    block (builtin_tp.pad_heads) to ``out``, atomically. The same inputs give the same bytes."""
    from safetensors.torch import load_file

    src, out = Path(src), Path(out)
    cfg = read_config(src)
    provenance = {
        "format": "glm4_moe", "format_version": GLM_FORMAT_VERSION, "tp_format_version": TP_FORMAT_VERSION,
        "source": "builtin-glm (mtpbench.builtin.builtin_glm_dir): every tensor copied, the attention ones padded",
        "source_model_safetensors_sha256": hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
        "padded_heads": pad, "config_key": PAD_KEY,
        "padding": f"{pad} attention head(s) of zeros appended to every attention block, target and MTP layers: "
                   "zero q/k/v_proj rows (weights and biases) and zero o_proj columns, head_dim kept, so "
                   f"num_attention_heads = num_key_value_heads {cfg['num_attention_heads']} -> "
                   f"{cfg['num_attention_heads'] + pad} divide by the tensor-parallel size and the outputs stay "
                   "the source's (a zero head adds exactly 0)",
        "rule": "mtpbench.builtin_tp.pad_heads",
        "source_derived_from": json.loads((src / "derived_from.json").read_text())}
    return write_model_dir(out, pad_heads(load_file(str(src / "model.safetensors")), cfg, pad),
                           padded_config(cfg, pad), src, provenance)


def builtin_glm_dir(cache: Path | None = None) -> Path:
    """``builtin-glm``: the built-in target and the shipped fine-tuned MTP layers in GLM-4.5's format, derived once
    and cached under ``~/.cache/mtpbench/builtin-glm-<key>`` (the key follows the built-in files, the shipped MTP
    files and GLM_FORMAT_VERSION)."""
    stamp = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                     for d in (BUILTIN_MODEL_DIR, GLM_MTP_DIR) for p in sorted(d.iterdir()))
    key = hashlib.sha256(f"{GLM_FORMAT_VERSION}|{BUILTIN_MODEL_DIR.resolve()}|{stamp}".encode()).hexdigest()[:16]
    cache = cache or cache_dir()
    out = cache / f"builtin-glm-{key}"
    if (out / "config.json").exists():
        return out
    try:
        return write_glm(BUILTIN_MODEL_DIR, *builtin_glm_source(), out)
    except OSError:  # another process finished the same directory first
        if (out / "config.json").exists():
            return out
        raise


def builtin_glm_tp_dir(cache: Path | None = None) -> Path:
    """``builtin-glm-tp``: builtin-glm with a zero fourth attention head in every block (its 4 heads divide by a
    tensor-parallel size of 2 or 4), derived from builtin-glm once and cached under
    ``~/.cache/mtpbench/builtin-glm-tp-<key>`` (the key follows builtin-glm's, TP_FORMAT_VERSION and the padding)."""
    glm = builtin_glm_dir(cache)
    key = hashlib.sha256(f"{TP_FORMAT_VERSION}|{TP_PADDED_HEADS}|{glm.name}".encode()).hexdigest()[:16]
    out = glm.parent / f"builtin-glm-tp-{key}"
    if (out / "config.json").exists():
        return out
    try:
        return write_glm_tp(glm, out)
    except OSError:  # another process finished the same directory first
        if (out / "config.json").exists():
            return out
        raise
