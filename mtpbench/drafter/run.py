"""``mtpbench check-drafter``: capture a short greedy run's draft steps in the engine (native, or vLLM through
its worker and ``plugin``), recompute them with the reference, and write drafter.json and report.html."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mtpbench.checkpoint import read_config
from mtpbench.drafter.check import analyse
from mtpbench.drafter.compare import headline, tolerance, verdict
from mtpbench.drafter.families import STAGES, family_for
from mtpbench.drafter.reference import Reference
from mtpbench.errors import MtpBenchError


def reference_for(model_dir: Path) -> Reference:
    """The reference of a checkpoint, or an MtpBenchError naming what is missing (no MTP layers, no family)."""
    cfg = read_config(model_dir)
    # a multimodal checkpoint keeps its text model's fields (layer counts, norm epsilon) in text_config
    cfg = {**cfg, **(cfg.get("text_config") or {}), "architectures": cfg.get("architectures")}
    layers = cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0
    if not layers and (Path(model_dir) / "draft").is_dir():  # Gemma 4's assistant: a drafter of its own
        raise MtpBenchError(f"{model_dir}: its drafter is a separate checkpoint (draft/), not MTP layers of the "
                            "target: check-drafter has no reference of a separate drafter yet")
    if not layers:
        raise MtpBenchError(f"{model_dir}: the checkpoint has no MTP layers (config.json: num_nextn_predict_layers "
                            "is 0 or absent): there is no drafter to check")
    family = family_for(cfg)
    if family is None:
        raise MtpBenchError(f"{model_dir}: no reference of {', '.join(cfg.get('architectures') or ['?'])}'s MTP "
                            "block in mtpbench yet (check-drafter knows: "
                            f"{', '.join(sorted(a for f in _families() for a in f.architectures))})")
    ref = Reference(model_dir, family, cfg)
    missing = ref.missing()
    if missing:
        raise MtpBenchError(f"{model_dir}: the checkpoint lacks the MTP tensors the reference reads ({missing[0]}"
                            f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''})")
    return ref


def _families():
    from mtpbench.drafter.families import FAMILIES

    return FAMILIES.values()


def check(data: dict, ref: Reference, k: int) -> dict:
    """The summary of one capture (``backend.drafter_point``'s data)."""
    if not data["calls"]:
        raise MtpBenchError(f"the engine made no draft call in {len(data['sequences'])} requests: nothing to check "
                            "(is speculative decoding on? is --max-tokens above 1?)")
    tol = tolerance(data["dtype"])
    out = analyse(data["calls"], data["targets"], data["sequences"], ref, tol, k)
    measured = [a / data["num_drafts"] for a in data["num_accepted_tokens_per_pos"]] if data["num_drafts"] else []
    checked = [s for s in STAGES if out["errors"][s] is not None]
    decoder = ref.decoder(0)
    copies = ref.head_copies_that_differ()
    if copies:
        out["notes"][f"checkpoint: {copies[0]} differs from {ref.family.names['head']}; the architecture shares one "
                     f"output head, which the reference (and vLLM) take from {ref.family.names['head']}"] = len(copies)
    return {"family": ref.family.name, "dtype": data["dtype"], "tolerance": tol, "k": k, **out,
            "stages_checked": checked, "engine_counters_acceptance": measured,
            "decoder": "independent (mtpbench's reference)" if decoder is not None else ref.why_no_decoder,
            "verdict": verdict(out["errors"], tol),
            "headline": headline(out["first_difference"], checked, out["reference_acceptance"],
                                 out["engine_acceptance"], out["num_calls"], out["cause"])}


def write(out: Path, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafter.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def run_check(cfg, k: int, mode: str = "reuse", backend=None, plant=None) -> dict:
    """Capture, check, write ``cfg.out``/drafter.json and report.html; the summary. ``backend`` may be passed in
    started; ``plant`` (native only) plants a wiring fault in each generation (``drafter.faults``)."""
    from mtpbench.backends import get_backend
    from mtpbench.drafter.page import write_page
    from mtpbench.environment import provenance
    from mtpbench.prompts import prompt_set

    if k < 1:
        raise MtpBenchError(f"--num-speculative-tokens {k}: check-drafter needs draft steps (k >= 1)")
    ref = reference_for(cfg.model_dir)
    prompts = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template).prompts
    started = backend is None
    if started:
        backend = get_backend(cfg.backend)
    if backend.drafter_point is None:
        raise MtpBenchError(f"--backend {cfg.backend}: check-drafter runs the native engine or an offline vLLM one")
    modules = ref.family.modules.get(backend.drafter_engine)
    if not modules:
        raise MtpBenchError(f"no stage map of the {ref.family.name} family for the {backend.drafter_engine} "
                            "engine yet")
    if started:
        backend.start(cfg)
    t0 = time.perf_counter()
    try:
        data = backend.drafter_point(cfg, mode, k, ref.num_layers, prompts, modules, plant=plant)
    finally:
        if started:
            backend.close()
    t1 = time.perf_counter()
    summary = {"model": str(cfg.model), "backend": cfg.backend, "runner": _runner(data),
               "mode": mode, **check(data, ref, k), "config": cfg.to_json(), "provenance": provenance()}
    # the engine's run with the capture (its start included where this call started it), then the check alone
    summary["timing"] = {"capture_s": round(t1 - t0, 3), "check_s": round(time.perf_counter() - t1, 3)}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.save(data, out / "capture.pt")  # what the engine fed and produced: the check reruns from it
    write(out, summary)
    write_page(out, summary)
    return summary


def _runner(data: dict) -> str | None:
    engine = data.get("engine")
    return engine.get("runner") if isinstance(engine, dict) else None
