"""Build the built-in tiny MTP model: corpus, tokenizer, training, built-in prompts.

The corpus is the running interpreter's standard-library sources (no download). Files whose path hash
falls in the held-out bucket are never trained on; the built-in prompts are cut from them. MTP layer j
is trained as a DeepSeek-style chain to predict token t+j+2, in the geometry vLLM's draft loop uses:
layer j at position q gets (output of layer j-1 at q-1, or the target's hidden at q for j = 0) and token
x[q+1], and predicts x[q+2]. Output: a checkpoint directory plus ``train_log.json`` (seed, corpus, steps,
losses) and ``prompts.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mtpbench.config import check_writable
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
        logits = m.lm_head(out[:, :-1])  # slot q predicts x[q+2]; the last slot has no label
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
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids + [eos_id])
    data = torch.tensor(ids, dtype=torch.long)
    log(f"corpus: {len(train_files)} files, {len(data)} tokens; tokenizer vocab {tok.get_vocab_size()}")

    m = MiMoModel(args)
    for p in m.parameters():
        if p.dim() >= 2:
            torch.nn.init.normal_(p, std=0.02)
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
            row = {"step": step, "loss_main": round(main.item(), 4),
                   "loss_mtp": [round(v.item(), 4) for v in mtp], "elapsed_s": round(time.time() - t0, 1)}
            history.append(row)
            log(json.dumps(row))

    save_model(m, out_dir)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": EOS,
        "pad_token": EOS, "model_max_length": args.max_position_embeddings,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos_id, "bos_token_id": eos_id}, indent=2) + "\n")
    prompts = builtin_prompts(held)
    (out_dir / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
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
