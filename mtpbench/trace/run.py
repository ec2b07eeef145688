"""``mtpbench trace-layers``: trace one short generation on a backend and write what the tracer saw.

Orchestration above the backends: it starts the backend, has it run a traced generation
(``mtpbench.trace.hooks``), judges the records (``mtpbench.trace.verdict``) and writes ``trace.csv``,
``trace.json`` and ``layers.png`` (``mtpbench.trace.report``) into ``cfg.out``.
"""

from __future__ import annotations

from mtpbench.backend_info import info
from mtpbench.errors import MtpBenchError
from mtpbench.trace.records import CallRecord, drafting_ranks
from mtpbench.trace.report import STEP_HEADERS, heatmap, model_label, provenance_versions, step_table, trace_csv
from mtpbench.trace.verdict import judge_ranks, layer_per_step, loaded_vs_checkpoint


EAGER_NOTE = ("eager (enforce_eager): compiled modules and replayed CUDA graphs, which Model Runner V2 uses by "
              "default on a GPU, run no Python forward, so a trace runs eagerly to see the wrappers")


def run_trace(cfg, k: int | None, mode: str = "reuse", backend=None) -> dict:
    """Trace one short generation and write trace.csv, trace.json and layers.png into ``cfg.out``. ``k`` None: an
    attached server's own (its /metrics).

    ``backend`` may be passed in already started (tests use it to set the native fault switches).
    """
    import json
    from pathlib import Path

    from mtpbench.backends import get_backend
    from mtpbench.checkpoint import mtp_layer_bytes
    from mtpbench.prompts import prompt_set

    cfg, L = _traceable(cfg, k)
    facts = info(cfg.backend)
    prompts = prompt_set(cfg.prompts, cfg.num_prompts, cfg.model_dir, cfg.chat_template).prompts
    started = backend is None
    if started:
        backend = get_backend(cfg.backend)
        backend.start(cfg)
    if k is None:
        k = backend.grid_k()
        if not k:
            raise MtpBenchError(f"the server at {cfg.server} does not expose num_speculative_tokens in /metrics: "
                                "give --num-speculative-tokens")
    mode = facts.drafting_mode or mode
    try:
        data = backend.trace_point(cfg, mode, k, L, prompts)
    except (RuntimeError, OSError) as e:  # the engine did not start (a crash while drafting is a verdict)
        raise MtpBenchError(f"the {cfg.backend} engine could not run the trace: {e}") from None
    finally:
        if started:  # a launched server stops here; an engine in a worker process has ended already
            backend.close()
    records: list[CallRecord] = data["records"]  # every drafting rank's (one rank: a process of its own)
    ranks = drafting_ranks(records, data.get("ranks"))
    data["records"] = ranks[min(ranks)] if ranks else []  # the reference rank's: the tables and the heatmap

    # weight bytes per layer as stored in the checkpoint: the same figure for every backend, whatever
    # form (dtype, prepacked) the engine keeps them in
    all_bytes = mtp_layer_bytes(cfg.mtp_dir, drafter=bool(cfg.draft_model))
    layer_bytes = (all_bytes + [0] * data["num_layers"])[: data["num_layers"]]
    v = judge_ranks(ranks, data["num_layers"], k, layer_bytes, data["crash"], data.get("crash_in_draft", True))
    # the layers asked of the engine (the derived checkpoint's L) against those it holds
    v.evidence += loaded_vs_checkpoint(L, data["num_layers"], all_bytes)
    out = Path(cfg.out)
    _write(out, cfg, _summary(cfg, k, mode, L, data, v), records)  # trace.csv: every rank's records
    return json.loads((out / "trace.json").read_text())


def _traceable(cfg, k: int):
    """The config with its runner, and the MTP layer count to trace; one line where tracing cannot run."""
    from mtpbench.config import validate, with_runner

    n_layers = cfg.num_mtp_layers()
    if k is not None and k < 1:
        raise MtpBenchError(f"--num-speculative-tokens must be >= 1 to trace drafting, got {k}")
    validate(cfg, n_layers)
    cfg = with_runner(cfg)
    facts = info(cfg.backend)
    if facts.served and cfg.force_spec_step_idx:
        raise MtpBenchError("--force-spec-step-idx changes what the engine computes: trace it offline (--backend "
                            "vllm), not on a server")
    return cfg, max(cfg.mtp_layers) if cfg.mtp_layers else n_layers


def _summary(cfg, k: int, mode: str, L: int, data: dict, v) -> dict:
    """trace.json's content."""
    from mtpbench.environment import provenance

    records, drafts = data["records"], data["num_drafts"]
    steps = layer_per_step(records)
    attribution = [{"position": i, "layer": steps.get(i), "num_accepted_tokens": n,
                    "acceptance_rate": round(n / drafts, 4) if drafts and n is not None else None}
                   for i, n in enumerate(data["num_accepted_tokens_per_pos"])]
    return {"verdict": v.verdict, "evidence": v.evidence, "backend": cfg.backend, "mode": mode, "k": k,
            "num_mtp_layers": data["num_layers"], "structure": data["structure"],
            "force_spec_step_idx": cfg.force_spec_step_idx, "num_draft_calls": len(records),
            "num_proposals": len({(r.batch, r.proposal) for r in records}),
            "unused_layers": v.unused_layers, "unused_layer_bytes": v.unused_layer_bytes,
            "checkpoint_mtp_layers": L, "dropped_at_load": list(range(data["num_layers"], L)),
            "runner": data.get("runner"), "drafter": data.get("drafter"),
            "execution": EAGER_NOTE if info(cfg.backend).vllm else "eager (PyTorch modules)",
            "notes": data.get("notes") or [],
            "crash": data["crash"], "per_step": [dict(zip(STEP_HEADERS, row)) for row in
                                                 step_table(records, data["num_layers"])],
            "acceptance_by_layer": attribution, "acceptance_law": _law(data.get("law"), cfg.model_dir),
            "num_drafts": drafts, "parallel": _layout(cfg, data.get("ranks")),
            "ranks": [{key: r.get(key) for key in ("rank", "tp_rank", "pp_rank", "drafter")}
                      | {"num_draft_calls": len(r["records"]) if r.get("records") is not None else None}
                      for r in data.get("ranks") or []],
            "config": cfg.to_json(), "provenance": provenance()}


def _law(law: dict | None, model_dir) -> dict:
    """Acceptance against its law over the traced generation (``metrics.law``): what the backend recorded, or
    why it could not (a crash that took the engine's workers down records none); the draft tokens classed by the
    model's tokenizer where it has a tokenizer.json."""
    from mtpbench.metrics.law import law_block, token_classifier

    classify = token_classifier(model_dir) if law and law.get("observable") else None
    return law_block(law, "the engine's workers did not answer after a crash", classify)


def _layout(cfg, ranks: list[dict] | None) -> dict:
    """The engine's parallel layout: as configured, or for an attached server as its ranks answered (the sizes
    counted from their tensor and pipeline parallel ranks; the rest unknown from outside)."""
    if not cfg.server:
        return cfg.parallel_layout()
    ranks = ranks or []
    return {"tensor_parallel_size": len({r.get("tp_rank") for r in ranks}) or None,
            "pipeline_parallel_size": len({r.get("pp_rank") for r in ranks}) or None,
            "data_parallel_size": None, "distributed_executor_backend": None, "from": "the server's ranks"}


def _write(out, cfg, summary: dict, records: list[CallRecord]) -> None:
    """trace.csv, trace.json and the layers.png heatmap."""
    from mtpbench import __version__
    from mtpbench.files import write_json, write_text
    from mtpbench.runners import label

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "trace.csv", trace_csv(records))
    write_json(out / "trace.json", summary)
    k, n, mode = summary["k"], summary["num_mtp_layers"], summary["mode"]
    engine = (f"vLLM {provenance_versions(summary)} {label(summary['runner'], summary['drafter'])}"
              if info(cfg.backend).vllm else f"mtpbench {__version__} native")
    heatmap(out / "layers.png", records, n, k, f"{model_label(cfg.model_dir)} on {engine} ({mode}, k={k}): "
            f"{summary['verdict']}")
    from mtpbench.html.pages import render
    from mtpbench.trace.page import page

    render(page, out)
