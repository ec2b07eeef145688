"""The verdict on a trace: pure functions on ``CallRecord`` lists, no torch, no engine (tested on hand-made
records)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mtpbench.trace.records import ABSENT, CallRecord


@dataclass
class Verdict:
    verdict: str
    evidence: list[str] = field(default_factory=list)
    unused_layers: list[int] = field(default_factory=list)
    unused_layer_bytes: int = 0


VERDICTS = ("multi-module", "layer-0 reuse", "swallowed", "multi-layer calls", "mismatch", "inconclusive",
            "crashed", "engine error", "ranks disagree")


def _is_zero_or_absent(v) -> bool:
    return v == ABSENT or v == 0


def judge(records: list[CallRecord], num_layers: int, k: int, layer_bytes: list[int],
          crash: str | None = None, crash_in_draft: bool = True) -> Verdict:
    """The verdict and the evidence behind it (see docs/trace-layers.md for what each verdict means).

    Judged from what executed first (which layer ran at each step), then from what was passed. A layer
    counts as unused only if a correct schedule at this k (step s runs layer s mod L) would have run it.
    ``crash_in_draft``: the exception was raised inside the draft model's forward (else the engine's)."""
    if crash and crash_in_draft:
        step = next((r.draft_step for r in reversed(records)), None)
        where = f" at draft step {step}" if step is not None else ""
        return Verdict("crashed", [f"the draft model raised{where}: {crash}"])
    if crash:
        return Verdict("engine error", [f"the engine raised outside the draft model (not a drafting verdict): {crash}"])
    if not records:
        return Verdict("mismatch", ["no draft-model call was recorded: the wrapped forwards never ran "
                                    "(drafting off, or a compiled/graph-replayed draft model)"])
    # a call in which no MTP layer ran tells nothing about the schedule: judge from the calls that ran one
    silent = [r for r in records if r.executed_layer is None]
    if len(silent) == len(records):
        return Verdict("inconclusive", [
            f"none of the {len(records)} draft calls ran an MTP layer the tracer could see: the layers' "
            "forwards were skipped or replaced (a compiled or fused path, or a draft model that bypasses its "
            "layers), so which layer serves a draft step was not observed",
            "spec_step_idx received by the wrapper: " + ", ".join(sorted({str(r.wrapper_spec_step_idx)
                                                                          for r in records}))])
    v = _judge_observed([r for r in records if r.executed_layer is not None], num_layers, k, layer_bytes)
    if silent:
        v.evidence.append(f"{len(silent)} of {len(records)} draft calls (at step(s) "
                          f"{sorted({r.draft_step for r in silent})}) ran no MTP layer: judged from the others")
    return v


def _judge_observed(records: list[CallRecord], num_layers: int, k: int, layer_bytes: list[int]) -> Verdict:
    """The verdict from calls that each ran at least one MTP layer."""
    by_step: dict[int, Counter] = {}
    for r in records:
        by_step.setdefault(r.draft_step, Counter())[r.executed_layer if r.executed_layer != -1 else "all"] += 1
    steps = "; ".join(f"step {s}: " + ", ".join(f"layer {j} x{n}" for j, n in sorted(c.items(), key=str))
                      for s, c in sorted(by_step.items()))
    scheduled = sorted({s % num_layers for s in range(k)})  # what a correct schedule at this k runs
    ran = {r.executed_layer for r in records}
    unused = [j for j in scheduled if j not in ran and -1 not in ran]
    unused_bytes = sum(layer_bytes[j] for j in unused if j < len(layer_bytes))
    wrapper_seen = sorted({str(r.wrapper_spec_step_idx) for r in records})
    multi = [r for r in records if r.executed_layer == -1]
    if multi:
        return Verdict("multi-layer calls", [
            f"{len(multi)} of {len(records)} draft calls ran several MTP layers in one call (first: layers "
            f"{multi[0].layers_run} at step {multi[0].draft_step}): the drafter chains its layers inside one "
            "forward, so no step-to-layer schedule applies", f"layers run per step: {steps}"])
    if all(r.executed_layer == r.expected_layer for r in records):
        return _as_scheduled(records, num_layers, k, steps, wrapper_seen, unused, unused_bytes)
    if all(r.executed_layer == 0 for r in records):
        return _layer_zero_only(records, num_layers, k, steps, wrapper_seen, unused, unused_bytes)
    bad = next((r for r in records if r.executed_layer != r.expected_layer), records[0])
    return Verdict("mismatch", [
        f"proposal {bad.proposal}, step {bad.draft_step} ran layer {bad.executed_layer}, expected "
        f"{bad.expected_layer}", f"layers run per step: {steps}"], unused, unused_bytes)


def _as_scheduled(records: list[CallRecord], num_layers: int, k: int, steps: str, wrapper_seen: list[str],
                  unused: list[int], unused_bytes: int) -> Verdict:
    """Every call ran the layer a correct schedule picks (step s runs layer s mod L): multi-module, unless the
    steps called cannot tell it from reuse, or some scheduled layer never ran."""
    decisive = sorted({r.draft_step for r in records if r.draft_step % num_layers != 0})  # steps that tell
    if num_layers == 1:
        return Verdict("inconclusive", [
            f"with a single MTP layer every schedule runs layer 0: layer-0 reuse and multi-module coincide "
            f"({steps})", f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"])
    if not decisive:
        why = ("k = 1 drafts one step" if k == 1 else
               f"only draft step(s) {sorted({r.draft_step for r in records})} were called (k = {k})")
        return Verdict("inconclusive", [
            f"{why}, and every schedule runs layer 0 there ({steps}): trace with k >= {num_layers} "
            f"(k = {2 * num_layers} shows the wrap-around) to tell reuse from multi-module",
            f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"])
    if unused:
        return Verdict("mismatch", [
            f"the steps that were called ran layer s mod {num_layers} ({steps}), but layers {unused}, which "
            f"k = {k} schedules, never ran: the proposer made fewer than k draft calls per proposal"],
            unused, unused_bytes)
    ev = [f"every draft step s ran layer s mod {num_layers}: {steps}",
          f"spec_step_idx received by the wrapper: {', '.join(wrapper_seen)}"]
    if k < num_layers:
        ev.append(f"k = {k} < {num_layers} layers: layers {list(range(k, num_layers))} are not scheduled at "
                  f"this k (k >= {num_layers} exercises them all)")
    return Verdict("multi-module", ev, unused, unused_bytes)


def _layer_zero_only(records: list[CallRecord], num_layers: int, k: int, steps: str, wrapper_seen: list[str],
                     unused: list[int], unused_bytes: int) -> Verdict:
    """Every call ran layer 0 where the schedule wanted others: the index was swallowed on the way to the
    predictor, ignored by the model, or never passed (layer-0 reuse)."""
    swallowed = [r for r in records if isinstance(r.wrapper_spec_step_idx, int) and r.wrapper_spec_step_idx > 0
                 and _is_zero_or_absent(r.predictor_spec_step_idx)]
    if swallowed:
        r = swallowed[0]
        return Verdict("swallowed", [
            f"{len(swallowed)} call(s): the wrapper received spec_step_idx={r.wrapper_spec_step_idx} but the "
            f"predictor ({r.predictor or 'the layers holder'}) received {r.predictor_spec_step_idx} (first at "
            f"proposal {r.proposal}, step {r.draft_step}), so layer 0 ran", f"layers run per step: {steps}"],
            unused, unused_bytes)
    ignored = [r for r in records if isinstance(r.predictor_spec_step_idx, int)
               and r.predictor_spec_step_idx % num_layers != 0]
    if ignored:
        r = ignored[0]
        return Verdict("mismatch", [
            f"the predictor ({r.predictor or 'the layers holder'}) received spec_step_idx="
            f"{r.predictor_spec_step_idx} at proposal {r.proposal}, step {r.draft_step}, but layer 0 ran: the "
            f"model ignores the index it gets", f"layers run per step: {steps}"], unused, unused_bytes)
    never_reached = all(_is_zero_or_absent(r.wrapper_spec_step_idx) for r in records)
    ev = [f"every draft step ran layer 0: {steps}",
          f"spec_step_idx {'never reached the model' if never_reached else 'reached the predictor only as 0'} "
          f"(wrapper received: {', '.join(wrapper_seen)})"]
    if unused:
        ev.append(f"layers a correct schedule at k = {k} would run but never ran: {unused}, holding "
                  f"{unused_bytes} bytes of weights in the checkpoint")
    return Verdict("layer-0 reuse", ev, unused, unused_bytes)


def loaded_vs_checkpoint(checkpoint_layers: int, loaded_layers: int, layer_bytes: list[int]) -> list[str]:
    """A line naming the MTP layers the checkpoint declares but the engine did not load, with their bytes
    (or saying that the engine's blocks are finer than the checkpoint's MTP layers)."""
    if loaded_layers > checkpoint_layers:
        return [f"the draft model holds {loaded_layers} blocks for the checkpoint's {checkpoint_layers} MTP layer(s): "
                "an MTP layer is made of several blocks here (e.g. Nemotron-H's mtp_hybrid_override_pattern), so "
                "a 'layer' of this trace is one block"]
    if loaded_layers == checkpoint_layers:
        return []
    dropped = list(range(loaded_layers, checkpoint_layers))
    size = sum(layer_bytes[j] for j in dropped if j < len(layer_bytes))
    return [f"the checkpoint declares {checkpoint_layers} MTP layers but the engine loaded {loaded_layers}: "
            f"layers {dropped} ({size} bytes of weights) never reached memory"]


def layer_per_step(records: list[CallRecord]) -> dict[int, int | None]:
    """The layer that most often produced draft step s (the layer behind acceptance position s)."""
    out: dict[int, Counter] = {}
    for r in records:
        out.setdefault(r.draft_step, Counter())[r.executed_layer] += 1
    return {s: c.most_common(1)[0][0] for s, c in sorted(out.items())}


def rank_disagreement(ranks: dict[int, list[CallRecord]]) -> str | None:
    """Where the drafting ranks' traces differ, in words, or None. Every rank of a tensor-parallel engine runs the
    same draft calls on its shard of each layer, so they agree when each recorded the same draft calls (batch,
    proposal, draft step) running the same MTP layers; the lowest rank is the reference."""
    if len(ranks) < 2:
        return None
    ref_rank, *others = sorted(ranks)
    ref = ranks[ref_rank]

    def key(r: CallRecord) -> tuple:
        return r.batch, r.proposal, r.draft_step, r.executed_layer, r.layers_run

    found = []
    for rank in others:
        mine = ranks[rank]
        if [key(r) for r in mine] == [key(r) for r in ref]:
            continue
        diff = next((i for i, (a, b) in enumerate(zip(ref, mine)) if key(a) != key(b)), None)
        if diff is None:
            found.append(f"rank {rank} recorded {len(mine)} draft calls, rank {ref_rank} {len(ref)}")
            continue
        a, b = ref[diff], mine[diff]
        n = sum(key(x) != key(y) for x, y in zip(ref, mine))
        found.append(f"rank {rank} ran {_ran_words(b)} at batch {b.batch}, proposal {b.proposal}, step {b.draft_step} "
                     f"where rank {ref_rank} ran {_ran_words(a)} at batch {a.batch}, proposal {a.proposal}, step "
                     f"{a.draft_step} ({n} of {min(len(ref), len(mine))} draft calls differ)")
    return "; ".join(found) or None


def _ran_words(r: CallRecord) -> str:
    return {-1: f"layers {r.layers_run}", None: "no MTP layer"}.get(r.executed_layer, f"layer {r.executed_layer}")


def judge_ranks(ranks: dict[int, list[CallRecord]], num_layers: int, k: int, layer_bytes: list[int],
                crash: str | None = None, crash_in_draft: bool = True) -> Verdict:
    """``judge`` on a sharded engine's trace, one record list per drafting rank: the lowest rank's verdict where
    all ranks agree (said in the evidence), "ranks disagree" where one ran other layers or other calls than its
    peers (each rank's own verdict in the evidence), whatever each would be on its own."""
    if not ranks:
        return judge([], num_layers, k, layer_bytes, crash, crash_in_draft)
    first = min(ranks)
    v = judge(ranks[first], num_layers, k, layer_bytes, crash, crash_in_draft)
    if len(ranks) < 2 or v.verdict in ("crashed", "engine error"):
        return v
    diff = rank_disagreement(ranks)
    if diff is None:
        v.evidence.append(f"all {len(ranks)} drafting ranks ({', '.join(map(str, sorted(ranks)))}) recorded the same "
                          f"{len(ranks[first])} draft calls, each running the same MTP layers")
        return v
    own = "; ".join(f"rank {r}: {judge(ranks[r], num_layers, k, layer_bytes).verdict}" for r in sorted(ranks))
    return Verdict("ranks disagree", [diff, f"each rank on its own: {own}"], v.unused_layers, v.unused_layer_bytes)
