"""The verdict on a sharded engine's trace (``trace/verdict.py``: ``judge_ranks``, ``rank_disagreement``), by property
over random per-rank record lists (copies of the lowest rank's, some with one planted difference), each expectation
an oracle written here from the rule, never computed by the code under test.

The rule: every tensor-parallel rank runs the same draft calls on its shard of each layer, so the ranks agree when
each recorded the same sequence of (batch, proposal, draft step, executed layer, layers run); nothing else a record
holds (the indices each module received, tokens, forced) counts. The lowest rank is the reference. No rank, or one:
exactly ``judge`` on its records. A crash ("crashed", "engine error") passes through as the lowest rank's ``judge``,
whatever the others recorded. Ranks that agree: the lowest rank's ``judge``, its evidence followed by "all N drafting
ranks (r0, r1, ...) recorded the same M draft calls, each running the same MTP layers". A rank that differs: "ranks
disagree", the unused layers and bytes still the lowest rank's, and two evidence lines: one sentence per differing
rank, in rank order, joined by "; " (the first call that differs on both, with how many of the calls both made
differ; or, where one rank's calls are the start of the other's, the two counts), then each rank's own verdict."""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.trace.records import ABSENT, CallRecord
from mtpbench.trace.verdict import Verdict, judge, judge_ranks, rank_disagreement

FAST = settings(max_examples=200, deadline=None)
CRASH = "AssertionError: only one step supported"
KEY = ("batch", "proposal", "draft_step", "executed_layer", "layers_run")
AGREE = "all {n} drafting ranks ({ranks}) recorded the same {m} draft calls, each running the same MTP layers"


def call(draw, L: int, k: int, kind: str, batch: int, proposal: int, s: int) -> CallRecord:
    """One draft call at step s: the layer its kind of drafter runs, now and then another, none or several."""
    ran = {"scheduled": s % L, "zero": 0}[kind] if kind != "any" else draw(st.sampled_from([None, -1, *range(L)]))
    idx = draw(st.sampled_from([ABSENT, 0, s]))
    return CallRecord(batch, proposal, s, wrapper_spec_step_idx=idx, predictor_spec_step_idx=draw(st.sampled_from(
        [ABSENT, 0, idx])), executed_layer=ran, expected_layer=s % L, num_tokens=draw(st.integers(1, 4)),
        layers_run=" ".join(map(str, range(L))) if ran == -1 else "")


@st.composite
def reference(draw):
    """(the lowest rank's records, L, k): a drafter that runs the schedule, layer 0 only, or anything; one or two
    batches of 0-3 proposals each, every step 0..k-1 or a prefix."""
    L, k = draw(st.sampled_from([1, 2, 3])), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["scheduled", "zero", "any"]))
    steps = list(range(draw(st.sampled_from([k, k, draw(st.integers(1, k))]))))
    records = [call(draw, L, k, kind, b, p, s) for b in range(1, draw(st.integers(1, 2)) + 1)
               for p in range(1, draw(st.integers(0, 3)) + 1) for s in steps]
    return records, L, k


def copy_of(draw, ref: list[CallRecord], rank: int) -> list[CallRecord]:
    """The reference's calls as another rank records them: the same keys, other values where a rank may differ
    (the indices its own modules received, its tokens, forced)."""
    out = copy.deepcopy(ref)
    for r in out:
        r.rank = rank
        if draw(st.integers(0, 3)) == 0:
            r.wrapper_spec_step_idx, r.predictor_spec_step_idx = draw(st.sampled_from([(ABSENT, ABSENT), (1, 0),
                                                                                        (2, 2)]))
            r.num_tokens, r.forced = draw(st.integers(1, 9)), draw(st.booleans())
    return out


PLANTS = ("layer", "missing", "extra", "layers_run", "step")


def plant(draw, recs: list[CallRecord], L: int, how: str) -> list[CallRecord]:
    """One difference in a rank's copy: another executed layer, a missing or an extra call, other layers run in a
    call, or a call at another step."""
    recs = list(recs)
    if how == "extra" or not recs:
        at = draw(st.integers(0, len(recs)))
        recs.insert(at, CallRecord(1, draw(st.integers(1, 3)), draw(st.integers(0, 3)),
                                   executed_layer=draw(st.sampled_from([None, 0, L - 1]))))
        return recs
    i = draw(st.integers(0, len(recs) - 1))
    r = recs[i] = copy.deepcopy(recs[i])
    if how == "missing":
        del recs[i]
    elif how == "layer":
        r.executed_layer = draw(st.sampled_from([x for x in (None, -1, *range(L)) if x != r.executed_layer]))
        r.layers_run = " ".join(map(str, range(L))) if r.executed_layer == -1 else ""
    elif how == "layers_run":
        r.layers_run = draw(st.sampled_from([x for x in ("0", "0 1", "1 0", "") if x != r.layers_run]))
    else:
        r.draft_step += draw(st.integers(1, 3))
    return recs


@st.composite
def sharded(draw):
    """(ranks -> records, L, k, layer bytes, crash, crash in the draft model): 1-4 global ranks (not always from 0,
    as a pipeline's last stage), each after the lowest a copy of its records, some with a planted difference."""
    ref, L, k = draw(reference())
    n = draw(st.sampled_from([1, 2, 2, 3, 4]))
    ids = sorted(draw(st.sets(st.integers(0, 7), min_size=n, max_size=n)))
    bad = draw(st.sampled_from([None, *ids[1:]]))  # a rank with a planted difference (others may have one too)
    ranks = {ids[0]: [replace(r, rank=ids[0]) for r in ref]}
    for rank in ids[1:]:
        mine = copy_of(draw, ref, rank)
        if rank == bad or bad is not None and draw(st.booleans()):
            mine = plant(draw, mine, L, draw(st.sampled_from(PLANTS)))
        ranks[rank] = mine
    if draw(st.booleans()):  # the order the ranks answered in is not their order
        ranks = dict(reversed(list(ranks.items())))
    crash = draw(st.sampled_from([None, None, None, None, CRASH]))
    return ranks, L, k, [10 ** j for j in range(L)], crash, draw(st.booleans())


def keys(recs: list[CallRecord]) -> list[tuple]:
    return [tuple(getattr(r, f) for f in KEY) for r in recs]


def ran(r: CallRecord) -> str:
    return f"layers {r.layers_run}" if r.executed_layer == -1 else (
        "no MTP layer" if r.executed_layer is None else f"layer {r.executed_layer}")


def disagreement(ranks: dict[int, list[CallRecord]]) -> str | None:
    """The rule's sentence: each rank whose keys differ from the lowest rank's, in rank order."""
    low = min(ranks)
    ref = ranks[low]
    parts = []
    for rank in sorted(ranks)[1:]:
        mine = ranks[rank]
        if keys(mine) == keys(ref):
            continue
        both = min(len(mine), len(ref))
        differ = [i for i in range(both) if keys(mine)[i] != keys(ref)[i]]
        if not differ:  # one rank's calls are the start of the other's
            parts.append(f"rank {rank} recorded {len(mine)} draft calls, rank {low} {len(ref)}")
            continue
        a, b = ref[differ[0]], mine[differ[0]]
        parts.append(f"rank {rank} ran {ran(b)} at batch {b.batch}, proposal {b.proposal}, step {b.draft_step} where "
                     f"rank {low} ran {ran(a)} at batch {a.batch}, proposal {a.proposal}, step {a.draft_step} "
                     f"({len(differ)} of {both} draft calls differ)")
    return "; ".join(parts) or None


@FAST
@given(sharded())
def test_the_verdict_on_every_rank_follows_the_rule(case):
    ranks, L, k, sizes, crash, in_draft = case
    v = judge_ranks(ranks, L, k, sizes, crash, in_draft)
    low = min(ranks)
    alone = judge(ranks[low], L, k, sizes, crash, in_draft)
    differ = any(keys(ranks[r]) != keys(ranks[low]) for r in ranks)
    if crash or len(ranks) == 1:
        assert v == alone
    elif differ:
        own = "; ".join(f"rank {r}: {judge(ranks[r], L, k, sizes).verdict}" for r in sorted(ranks))
        assert v.verdict == "ranks disagree"
        assert v.evidence == [disagreement(ranks), f"each rank on its own: {own}"]
        assert (v.unused_layers, v.unused_layer_bytes) == (alone.unused_layers, alone.unused_layer_bytes)
    else:
        line = AGREE.format(n=len(ranks), ranks=", ".join(map(str, sorted(ranks))), m=len(ranks[low]))
        assert (v.verdict, v.evidence, v.unused_layers, v.unused_layer_bytes) == (
            alone.verdict, alone.evidence + [line], alone.unused_layers, alone.unused_layer_bytes)


@FAST
@given(sharded())
def test_the_ranks_disagree_iff_some_ranks_calls_or_layers_differ(case):
    ranks, L, k, sizes, _, _ = case
    said = rank_disagreement(ranks)
    assert said == (disagreement(ranks) if len(ranks) > 1 else None)
    # each rank that differs is named once, in rank order, and no other
    named = [int(part.split()[1]) for part in said.split("; ")] if said else []
    assert named == [r for r in sorted(ranks)[1:] if keys(ranks[r]) != keys(ranks[min(ranks)])]


@FAST
@given(reference(), st.integers(0, 7), st.sampled_from(PLANTS), st.data())
def test_one_planted_difference_on_one_rank_is_found(case, extra, how, data):
    """A rank that ran another layer, made a call more or fewer, ran other layers in one call or drafted another
    step than its peers: "ranks disagree", that rank named, the others agreeing."""
    ref, L, k = case
    ids = [0, 1, 2, 3]
    bad = data.draw(st.sampled_from(ids[1:]))
    ranks = {r: copy_of(data.draw, ref, r) for r in ids}
    ranks[bad] = plant(data.draw, ranks[bad], L, how)
    v = judge_ranks(ranks, L, k, [1] * L)
    assert v.verdict == "ranks disagree"
    assert v.evidence[0].startswith(f"rank {bad} ") and "; " not in v.evidence[0]


@FAST
@given(reference(), st.sets(st.integers(0, 7), min_size=1, max_size=4), st.data())
def test_one_rank_is_judged_alone_and_no_rank_as_no_call(case, ids, data):
    ref, L, k = case
    crash = data.draw(st.sampled_from([None, CRASH]))
    rank = min(ids)
    assert judge_ranks({rank: ref}, L, k, [3] * L, crash) == judge(ref, L, k, [3] * L, crash)
    assert judge_ranks({}, L, k, [3] * L, crash) == judge([], L, k, [3] * L, crash)


# ---- the sentences, word for word --------------------------------------------------------------------------------

def calls(*layers, batch: int = 1, proposal: int = 1) -> list[CallRecord]:
    """One proposal's draft calls, step s running the s-th layer given (-1: layers 0 1 2 in one call)."""
    return [CallRecord(batch, proposal, s, executed_layer=j, expected_layer=s % 2,
                       layers_run="0 1 2" if j == -1 else "") for s, j in enumerate(layers)]


def test_the_first_difference_and_how_many_calls_differ_are_named():
    ref = calls(0, 0) + calls(0, 0, proposal=2)
    mine = calls(0, 1) + calls(0, 1, proposal=2)
    assert rank_disagreement({0: ref, 1: mine}) == (
        "rank 1 ran layer 1 at batch 1, proposal 1, step 1 where rank 0 ran layer 0 at batch 1, proposal 1, step 1 "
        "(2 of 4 draft calls differ)")


def test_a_rank_with_fewer_calls_than_the_reference_is_counted():
    ref = calls(0, 1) + calls(0, 1, proposal=2)
    assert rank_disagreement({0: ref, 1: ref[:3]}) == "rank 1 recorded 3 draft calls, rank 0 4"
    assert rank_disagreement({0: ref[:3], 1: ref}) == "rank 1 recorded 4 draft calls, rank 0 3"
    assert rank_disagreement({0: [], 1: ref[:1]}) == "rank 1 recorded 1 draft calls, rank 0 0"


def test_calls_of_different_counts_that_also_differ_are_counted_over_the_calls_both_made():
    ref = calls(0, 1, 0)
    assert rank_disagreement({0: ref, 1: calls(1, 1)}) == (
        "rank 1 ran layer 1 at batch 1, proposal 1, step 0 where rank 0 ran layer 0 at batch 1, proposal 1, step 0 "
        "(1 of 2 draft calls differ)")


def test_several_layers_in_a_call_and_no_layer_are_said_so():
    assert rank_disagreement({2: calls(-1), 5: calls(None)}) == (
        "rank 5 ran no MTP layer at batch 1, proposal 1, step 0 where rank 2 ran layers 0 1 2 at batch 1, proposal 1, "
        "step 0 (1 of 1 draft calls differ)")
    other = calls(-1)
    other[0].layers_run = "0 1"
    assert rank_disagreement({0: calls(-1), 1: other}) == (
        "rank 1 ran layers 0 1 at batch 1, proposal 1, step 0 where rank 0 ran layers 0 1 2 at batch 1, proposal 1, "
        "step 0 (1 of 1 draft calls differ)")


def test_a_call_at_another_place_is_a_difference_where_the_layers_are_the_same():
    ref = calls(0, 0)
    for field, value, where in (("batch", 2, "batch 2, proposal 1"), ("proposal", 3, "batch 1, proposal 3")):
        mine = calls(0, 0)
        setattr(mine[1], field, value)
        assert rank_disagreement({0: ref, 1: mine}) == (
            f"rank 1 ran layer 0 at {where}, step 1 where rank 0 ran layer 0 at batch 1, proposal 1, step 1 "
            "(1 of 2 draft calls differ)")


def test_every_differing_rank_is_named_against_the_lowest_in_rank_order():
    ref = calls(0, 0)
    assert rank_disagreement({3: calls(0, 1), 1: ref, 2: ref[:1], 4: calls(0, 0)}) == (
        "rank 2 recorded 1 draft calls, rank 1 2; rank 3 ran layer 1 at batch 1, proposal 1, step 1 where rank 1 ran "
        "layer 0 at batch 1, proposal 1, step 1 (1 of 2 draft calls differ)")


def test_what_a_rank_received_is_not_a_difference():
    ref = calls(0, 0)
    mine = calls(0, 0)
    mine[1].wrapper_spec_step_idx, mine[1].predictor_spec_step_idx, mine[1].num_tokens = 1, 0, 7
    mine[1].expected_layer, mine[1].forced = 0, True
    assert rank_disagreement({0: ref, 1: mine}) is None
    assert rank_disagreement({0: ref}) is None and rank_disagreement({}) is None


def test_ranks_that_disagree_keep_each_ranks_verdict_and_the_lowests_unused_layers():
    ref = calls(0, 0, 0, 0)  # k = 4 on 2 layers: layer-0 reuse, layer 1 unused
    v = judge_ranks({0: ref, 1: calls(0, 1, 0, 1)}, 2, 4, [5, 7])
    assert v.verdict == "ranks disagree"
    assert v.evidence == [
        "rank 1 ran layer 1 at batch 1, proposal 1, step 1 where rank 0 ran layer 0 at batch 1, proposal 1, step 1 "
        "(2 of 4 draft calls differ)", "each rank on its own: rank 0: layer-0 reuse; rank 1: multi-module"]
    assert (v.unused_layers, v.unused_layer_bytes) == ([1], 7)


def test_ranks_that_agree_add_one_line_to_the_lowests_evidence():
    ref = calls(0, 0, 0, 0)
    alone = judge(ref, 2, 4, [5, 7])
    v = judge_ranks({4: calls(0, 0, 0, 0), 2: ref, 3: calls(0, 0, 0, 0)}, 2, 4, [5, 7])
    assert (v.verdict, v.unused_layers, v.unused_layer_bytes) == ("layer-0 reuse", [1], 7)
    assert v.evidence == alone.evidence + [
        "all 3 drafting ranks (2, 3, 4) recorded the same 4 draft calls, each running the same MTP layers"]


def test_a_crash_passes_through_whatever_the_ranks_recorded():
    ranks = {0: calls(0, 0), 1: calls(0, 1)}
    assert judge_ranks(ranks, 2, 2, [1, 2], CRASH) == Verdict("crashed", [
        f"the draft model raised at draft step 1: {CRASH}"])
    assert judge_ranks(ranks, 2, 2, [1, 2], CRASH, crash_in_draft=False) == Verdict("engine error", [
        f"the engine raised outside the draft model (not a drafting verdict): {CRASH}"])



def test_a_drafting_rank_that_recorded_nothing_is_a_rank_that_disagrees():
    """A rank whose tracer never ran (records None) or recorded no call still counts: dropping it from the ranks
    would leave the others' verdict standing as if every rank agreed."""
    from mtpbench.trace.records import drafting_ranks

    ref = [CallRecord(1, 1, s, executed_layer=s % 2, expected_layer=s % 2, rank=0) for s in range(2)]
    answers = [{"rank": 0, "drafter": True, "records": []}, {"rank": 1, "drafter": True, "records": None},
               {"rank": 2, "drafter": False, "records": None}]
    ranks = drafting_ranks(ref, answers)
    assert ranks == {0: ref, 1: []}
    v = judge_ranks(ranks, 2, 2, [1, 1])
    assert v.verdict == "ranks disagree" and "rank 1 recorded 0 draft calls, rank 0 2" in v.evidence[0], v.evidence
    assert drafting_ranks(ref, None) == {0: ref} and drafting_ranks([], None) == {}
