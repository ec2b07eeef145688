"""The tracer's record of one draft-model forward; plain data, no torch, read by the verdict and the tables."""

from __future__ import annotations

from dataclasses import dataclass

ABSENT = "absent"


@dataclass
class CallRecord:
    """One draft-model forward."""

    batch: int  # which generate call of the traced run
    proposal: int  # target forwards seen before this call: one proposal per verify step
    draft_step: int
    wrapper_spec_step_idx: int | str = ABSENT
    predictor_spec_step_idx: int | str = ABSENT
    layer_spec_step_idx: int | str = ABSENT
    logits_spec_step_idx: int | str = ABSENT
    executed_layer: int | None = None  # -1: several layers ran in this one call
    expected_layer: int = 0
    num_tokens: int = 0
    forced: bool = False  # --force-spec-step-idx put the step into this call
    predictor: str = ""  # the module between wrapper and layers whose forward ran (its path)
    layers_run: str = ""  # every layer that ran in this call, in order ("0 1 2"), when there were several
    rank: int = 0  # the engine's global rank that recorded it (every tensor-parallel rank runs each draft call)


def by_rank(records: list[CallRecord]) -> dict[int, list[CallRecord]]:
    """The records of each rank, in the order recorded."""
    out: dict[int, list[CallRecord]] = {}
    for r in records:
        out.setdefault(r.rank, []).append(r)
    return out


def rank_records(trace: dict) -> list[CallRecord]:
    """Every drafting rank's records of one engine's trace (``backends.vllm.worker.trace``), each with its rank:
    from ``ranks`` where the ranks answered, else the reference rank's ``records`` (after a crash no rank may)."""
    ranks = [r for r in trace.get("ranks") or [] if r.get("records") is not None]
    return ([CallRecord(**{**rec, "rank": r["rank"]}) for r in ranks for rec in r["records"]] if ranks
            else [CallRecord(**r) for r in trace["records"]])


def drafting_ranks(records: list[CallRecord], ranks: list[dict] | None) -> dict[int, list[CallRecord]]:
    """Each drafting rank's records, lowest rank first: by the records' ranks, and an empty list for a rank that
    holds a drafter but recorded nothing (its tracer never ran), so the rank agreement sees it."""
    out = by_rank(records)
    for r in ranks or []:
        if r.get("drafter"):
            out.setdefault(r["rank"], [])
    return dict(sorted(out.items()))
