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
from mtpbench.paths import cache_dir


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


def one_k_for(layers: int) -> int:
    """--num-speculative-tokens' default where one k runs: 2L, twice the MTP layers drafted with, so that every layer
    drafts at two steps and step s's layer (s mod L) wraps once (cli/options.one_k; trace-matrix per architecture)."""
    return 2 * layers


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
    cache = cache or cache_dir("derived")
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
