"""Build the built-in tiny MTP model: corpus, tokenizer, training, built-in prompts.

The corpus is the running interpreter's standard-library sources (no download). Files whose path hash
falls in the held-out bucket are never trained on; the built-in prompts are cut from them. MTP layer j
is trained as a DeepSeek-style chain to predict token t+j+2, in the geometry vLLM's draft loop uses:
layer j at position q gets (output of layer j-1 at q-1, or the target's hidden at q for j = 0) and token
x[q+1], and predicts x[q+2]. Output: a checkpoint directory plus ``train_log.json`` (seed, corpus, steps,
losses) and ``prompts.jsonl``.

``finetune_mtp`` makes ``builtin-glm``'s MTP layers: from a trained MiMo-format checkpoint, the target frozen, it
trains the MTP layers as the same chain in DeepSeek's convention (model.py's ``mtp_style``), in one thread with a
fixed seed, so the same interpreter and torch give the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from mtpbench.files import check_writable
from mtpbench.errors import MtpBenchError
from mtpbench.model import PRESETS, MiMoModel, ModelArgs, save_model

EOS = "<|endoftext|>"
HELDOUT_BUCKETS = 20  # 1 file in 20 is held out for prompts


def stdlib_files() -> tuple[list[Path], list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and not any(x.startswith("test") for x in p.parts[len(root.parts):]))
    train, held = [], []
    for p in files:
        h = int(hashlib.md5(str(p.relative_to(root)).encode()).hexdigest(), 16)
        (held if h % HELDOUT_BUCKETS == 0 else train).append(p)
    return train, held


def read_text(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


# Qwen2's pre-tokenizer split: transformers loads a ``model_type: qwen2`` tokenizer as Qwen2Tokenizer,
# which applies this pattern, so training with it makes our ids, transformers' and vLLM's identical.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def builtin_prompts(held: list[Path], n: int = 64, max_chars: int = 480) -> list[dict]:
    """Deterministic code prompts: the text before and including a ``def`` line of a held-out file."""
    out = []
    for p in held:
        lines = read_text(p).splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and i >= 3]
        for i in starts[:: max(1, len(starts) // 3)][:3]:
            text = "".join(lines[max(0, i - 8): i + 2])[-max_chars:]
            out.append({"prompt": text, "category": "code", "source": p.name})
        if len(out) >= n:
            break
    return out[:n]


def mtp_losses(m: MiMoModel, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Main next-token loss and one loss per MTP layer (layer j predicts x[q+2] at slot q >= j)."""
    B, T = x.shape
    pos = torch.arange(T, device=x.device).expand(B, T)
    target = m.target
    with torch.set_grad_enabled(torch.is_grad_enabled() and m.lm_head.weight.requires_grad):  # frozen: no graph
        h = target(x, pos)
    main = F.cross_entropy(target.compute_logits(h[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    emb = m.model.embed_tokens
    losses, prev = [], h[:, : T - 1]  # layer 0 reads the target hidden at its own slot q
    for j, layer in enumerate(m.model.mtp_layers):
        n = T - 1 - j  # slots j .. T-2
        if n <= 1:
            break
        hid = prev if j == 0 else prev[:, : n]  # layer j>0 reads layer j-1's output at q-1
        out = layer(emb(x[:, j + 1:]), pos[:, j: T - 1], hid)
        head_in = out[:, :-1] if layer.normed_output else layer.final_layernorm(out[:, :-1])  # DeepSeek: norm for logits
        logits = m.lm_head(head_in)  # slot q predicts x[q+2]; the last slot has no label
        losses.append(F.cross_entropy(logits.flatten(0, 1), x[:, j + 2:].flatten()))
        prev = out
    return main, losses


def make_model(out_dir: Path, steps: int = 900, batch: int = 16, seq_len: int = 256, seed: int = 0,
               lr: float = 3e-3, preset: str = "tiny", log=print) -> dict:
    """Train and write the checkpoint; the directory appears only once complete (written aside, renamed)."""
    final = Path(out_dir)
    if final.exists() and any(final.iterdir()):
        raise MtpBenchError(f"output directory already exists and is not empty: {final}")
    check_writable(final)
    for name, value, low in (("steps", steps, 1), ("batch", batch, 1), ("seq_len", seq_len, 8)):
        if value < low:
            raise MtpBenchError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    out_dir = final.with_name(final.name + ".partial")
    torch.manual_seed(seed)
    t0 = time.time()
    train_files, held = stdlib_files()
    texts = [t for t in (read_text(p) for p in train_files) if t]
    args: ModelArgs = PRESETS[preset]
    tok = train_tokenizer(texts, args.vocab_size)
    data = token_stream(tok, texts)
    log(f"corpus: {len(train_files)} files, {len(data)} tokens; tokenizer vocab {tok.get_vocab_size()}")

    m = MiMoModel(args)
    for p in m.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
    history = _pretrain(m, data, steps, batch, seq_len, seed, lr, t0, log)
    _write_checkpoint(out_dir, m, tok, held)
    info = {"seed": seed, "steps": steps, "batch": batch, "seq_len": seq_len, "lr": lr, "preset": preset,
            "corpus": {"source": "python stdlib sources", "python": sys.version.split()[0],
                       "train_files": len(train_files), "heldout_files": len(held),
                       "heldout_rule": f"md5(relative path) % {HELDOUT_BUCKETS} == 0",
                       "train_tokens": len(data)},
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "machine": platform.machine(),
            "train_seconds": round(time.time() - t0, 1), "history": history}
    (out_dir / "train_log.json").write_text(json.dumps(info, indent=2) + "\n")
    if final.exists():
        final.rmdir()  # empty, checked above
    os.replace(out_dir, final)
    return info


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """The texts' tokens in one stream, each text followed by EOS: what the model trains on."""
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids + [eos_id])
    return torch.tensor(ids, dtype=torch.long)


def log_step(log, step: int, main, mtp, t0: float) -> dict:
    """One training log row (the main and each MTP layer's loss, elapsed seconds), logged as JSON."""
    row = {"step": step, "loss_main": round(main.item(), 4), "loss_mtp": [round(v.item(), 4) for v in mtp],
           "elapsed_s": round(time.time() - t0, 1)}
    log(json.dumps(row))
    return row


def _pretrain(m: MiMoModel, data: torch.Tensor, steps: int, batch: int, seq_len: int, seed: int, lr: float,
              t0: float, log) -> list[dict]:
    """Train the target and the MTP chain together on random windows of ``data`` (AdamW, linear warm-up then
    cosine); returns the losses logged every 20 steps and at the last."""
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    history = []
    for step in range(steps):
        warm = min(1.0, (step + 1) / 30)
        for group in opt.param_groups:
            group["lr"] = lr * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=g)
        x = torch.stack([data[s: s + seq_len] for s in starts])
        main, mtp = mtp_losses(m, x)
        loss = main + sum(mtp) / len(mtp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            history.append(log_step(log, step, main, mtp, t0))
    return history


def _write_checkpoint(out_dir: Path, m: MiMoModel, tok, held: list[Path]) -> None:
    """The weights, config, tokenizer files, generation config and the built-in prompts (from the held-out
    files) in ``out_dir``."""
    eos_id = tok.token_to_id(EOS)
    save_model(m, out_dir)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS,
        "pad_token": EOS, "model_max_length": m.args.max_position_embeddings,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos_id, "bos_token_id": eos_id}, indent=2) + "\n")
    prompts = builtin_prompts(held)
    (out_dir / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))


# builtin-glm's fine-tune (mtpbench/assets/glm_mtp): short, one core, deterministic
FINETUNE = {"steps": 250, "batch": 8, "seq_len": 256, "seed": 0, "lr": 1e-3, "warmup_steps": 20}


@lru_cache(maxsize=2)
def corpus_ids(tokenizer_path: str) -> torch.Tensor:
    """The training files' tokens under a trained checkpoint's tokenizer, each file followed by EOS: the same
    stream make_model trained on."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    return token_stream(tok, [t for t in (read_text(p) for p in stdlib_files()[0]) if t])


def finetune_recipe(steps: int | None = None, **kw) -> dict:
    """What the fine-tune does, as recorded beside its tensors (the defaults: FINETUNE)."""
    return {**FINETUNE, **({"steps": steps} if steps is not None else {}), **kw, "mtp_style": "deepseek",
            "trained": "model.mtp_layers.* (target, embeddings and lm_head frozen)", "threads": 1,
            "optimizer": "AdamW betas (0.9, 0.95), weight decay 0.01, grad clip 1.0, linear warm-up then cosine",
            "loss": "mean of mtp_losses' per-layer losses (layer j predicts x[q+j+2])"}


def finetune_mtp(src: Path, steps: int | None = None, log=print) -> tuple[dict, dict]:
    """Fine-tune ``src``'s MTP layers as a DeepSeek-style chain (see the module docstring). Returns the MTP
    tensors (MiMo names, bf16, as the checkpoint stores them) and a log: recipe, losses, seconds."""
    from safetensors.torch import load_file

    from mtpbench.checkpoint import read_config

    recipe = finetune_recipe(steps)
    if recipe["steps"] < 1:
        raise MtpBenchError(f"--steps must be >= 1, got {recipe['steps']}")
    src = Path(src)
    if read_config(src).get("architectures") != ["MiMoForCausalLM"]:
        raise MtpBenchError(f"{src} is not a MiMo-format checkpoint to fine-tune")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # results differ with the thread count
    try:
        t0 = time.time()
        data = corpus_ids(str((src / "tokenizer.json").resolve()))
        args = dataclasses.replace(ModelArgs.from_config(read_config(src)), mtp_style="deepseek")
        m = MiMoModel(args)
        m.load_state_dict(load_file(str(src / "model.safetensors")))
        m = m.float()
        mtp = [p for name, p in m.named_parameters() if name.startswith("model.mtp_layers.")]
        for name, p in m.named_parameters():
            p.requires_grad_(name.startswith("model.mtp_layers."))
        torch.manual_seed(recipe["seed"])
        opt = torch.optim.AdamW(mtp, lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=0.01)
        g = torch.Generator().manual_seed(recipe["seed"])
        steps, seq_len, lr = recipe["steps"], recipe["seq_len"], recipe["lr"]
        history = []
        for step in range(steps):
            warm = min(1.0, (step + 1) / recipe["warmup_steps"])
            for group in opt.param_groups:
                group["lr"] = lr * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
            starts = torch.randint(0, len(data) - seq_len - 1, (recipe["batch"],), generator=g)
            x = torch.stack([data[s: s + seq_len] for s in starts])
            main, losses = mtp_losses(m, x)
            loss = sum(losses) / len(losses)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(mtp, 1.0)
            opt.step()
            if step % 20 == 0 or step == steps - 1:
                history.append(log_step(log, step, main, losses, t0))
    finally:
        torch.set_num_threads(threads)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in m.state_dict().items()
               if k.startswith("model.mtp_layers.")}
    info = {"recipe": recipe, "source": str(src), "torch": torch.__version__, "python": sys.version.split()[0],
            "machine": platform.machine(), "train_seconds": round(time.time() - t0, 1), "history": history}
    return tensors, info


def mtp_file_bytes(tensors: dict) -> bytes:
    """The MTP tensors as the safetensors bytes shipped in assets/glm_mtp/mtp.safetensors."""
    from safetensors.torch import save

    return save(tensors, metadata={"format": "pt"})


def ship_glm_mtp(out_dir: Path | None = None, log=print) -> dict:
    """Re-make mtpbench/assets/glm_mtp from the built-in model (how the shipped files were made)."""
    from mtpbench.paths import GLM_MTP_DIR
    from mtpbench.prompts import BUILTIN_MODEL_DIR

    out_dir = Path(out_dir or GLM_MTP_DIR)
    tensors, info = finetune_mtp(BUILTIN_MODEL_DIR, log=log)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mtp.safetensors").write_bytes(mtp_file_bytes(tensors))
    info["made_by"] = "python -c 'from mtpbench.train import ship_glm_mtp; ship_glm_mtp()' (torch threads 1)"
    info["source"] = "builtin"
    (out_dir / "finetune.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def make_glm(source: str, out_dir: Path, steps: int | None = None, log=print) -> dict:
    """``make-model --format glm``: fine-tune ``source``'s MTP layers (``finetune_mtp``) and write the checkpoint
    in GLM-4.5's format to ``out_dir``, a new or empty directory. Returns the fine-tune's log."""
    from safetensors.torch import load_file

    from mtpbench.builtin import resolve_model_dir, write_glm

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise MtpBenchError(f"output directory already exists and is not empty: {out_dir}")
    src = resolve_model_dir(source)
    tensors, info = finetune_mtp(src, steps=steps, log=log)
    state = {**load_file(str(src / "model.safetensors")), **tensors}
    write_glm(src, state, mtp_file_bytes(tensors), info["recipe"], out_dir)
    return info
