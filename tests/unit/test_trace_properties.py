"""The trace verdicts (``trace/verdict.py``: ``judge``, ``layer_per_step``, ``loaded_vs_checkpoint``) and the
trace-matrix's check against vLLM (``matrix/cells.py``: ``vllm_check``), by property over random per-step layer
records, each expectation an oracle written here from the rule in docs/trace-layers.md, never computed by the code
under test.

The rule of ``judge``: a crash inside the draft model is "crashed", one outside it "engine error"; no draft call
recorded is "mismatch"; calls that ran no MTP layer tell nothing (all of them: "inconclusive"), the rest are judged:
any call that ran several layers: "multi-layer calls"; every call at step s ran layer s mod L: "inconclusive" when
L = 1 or every step called is a multiple of L (reuse and multi-module coincide there), "mismatch" when a layer that
k schedules (some s mod L, s < k) never ran, else "multi-module"; every call ran layer 0: "swallowed" when the
wrapper got an index > 0 and the predictor 0 or none, "mismatch" when the predictor got an index that is no multiple
of L (the model ignores it), else "layer-0 reuse"; anything else: "mismatch". Unused layers: those k schedules that
no call ran (none once a call ran several), with their bytes."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.matrix.cells import _steps, load_verdict, vllm_check
from mtpbench.trace.records import ABSENT, CallRecord
from mtpbench.trace.verdict import judge, layer_per_step, loaded_vs_checkpoint

FAST = settings(max_examples=250, deadline=None)
CRASH = "AssertionError: only one step supported"


def idx(s: int, L: int, path: str):
    """The indices (wrapper's, predictor's) of a call at step s, by how the trace passes them on."""
    fixed = {"passed": (s, s), "swallowed": (s, 0), "never passed": (ABSENT, ABSENT), "wrapped": (s, 2 * s),
             "multiple": (s, L * s)}
    if path in fixed:
        return st.just(fixed[path])
    return st.tuples(*[st.sampled_from([ABSENT, 0, s, s % L, s + L, 1])] * 2)


@st.composite
def traces(draw):
    """(records, L, k, layer bytes, crash, crash in the draft model): a drafter that runs the schedule, one that
    runs layer 0 only, or one that runs anything, each call now and then another layer, none or several; the
    steps called all of 0..k-1, a prefix of them, or step 0 alone; the index passed on, swallowed, never passed
    or anything, now and then another."""
    L, k = draw(st.sampled_from([1, 2, 2, 3, 4])), draw(st.integers(1, 6))
    noise = draw(st.sampled_from([0, 0, 8]))  # a trace whose calls are, one in ``noise``, off their pattern
    kind = draw(st.sampled_from(["scheduled", "zero", "zero", "any"]))
    path = draw(st.sampled_from(["passed", "swallowed", "never passed", "wrapped", "multiple", "any"]))
    prefix = list(range(draw(st.integers(1, k))))
    steps = draw(st.sampled_from([list(range(k)), prefix, prefix, [0], [s for s in range(k) if s % L == 0]]))
    layers = [None, -1, *range(L)]
    records = []
    for p in range(1, draw(st.sampled_from([0, 1, 1, 2, 3])) + 1):
        for s in steps:
            ran = {"scheduled": s % L, "zero": 0}.get(kind) if kind != "any" else draw(st.sampled_from(layers))
            if noise and draw(st.integers(1, noise)) == 1:
                ran = draw(st.sampled_from(layers))
            wrapper, predictor = draw(idx(s, L, "any" if noise and draw(st.integers(1, noise)) == 1 else path))
            records.append(CallRecord(1, p, s, wrapper_spec_step_idx=wrapper, predictor_spec_step_idx=predictor,
                                      executed_layer=ran, expected_layer=s % L,
                                      predictor=draw(st.sampled_from(["", "model"])),
                                      layers_run=" ".join(map(str, range(L))) if ran == -1 else ""))
    crash = draw(st.sampled_from([None, None, None, None, None, CRASH]))
    sizes = [10 ** j for j in range(draw(st.sampled_from([L, L, L, 0, max(L - 1, 0)])))]  # bytes of some unknown
    return records, L, k, sizes, crash, draw(st.booleans())


def steps_text(seen: list[CallRecord]) -> str:
    by_step: dict[int, Counter] = {}
    for r in seen:
        by_step.setdefault(r.draft_step, Counter())["all" if r.executed_layer == -1 else r.executed_layer] += 1
    return "; ".join(f"step {s}: " + ", ".join(f"layer {j} x{n}" for j, n in sorted(c.items(), key=str))
                     for s, c in sorted(by_step.items()))


def oracle(records, L, k, crash, in_draft) -> tuple[str, list[int]]:
    if crash:
        return ("crashed" if in_draft else "engine error"), []
    seen = [r for r in records if r.executed_layer is not None]
    if not seen:
        return ("mismatch" if not records else "inconclusive"), []
    ran = {r.executed_layer for r in seen}
    if -1 in ran:
        return "multi-layer calls", []
    unused = [j for j in sorted({s % L for s in range(k)}) if j not in ran]
    if all(r.executed_layer == r.draft_step % L for r in seen):
        if L == 1 or all(r.draft_step % L == 0 for r in seen):
            return "inconclusive", []
        return ("mismatch" if unused else "multi-module"), unused
    if ran == {0}:
        if any(isinstance(r.wrapper_spec_step_idx, int) and r.wrapper_spec_step_idx > 0
               and r.predictor_spec_step_idx in (ABSENT, 0) for r in seen):
            return "swallowed", unused
        if any(isinstance(r.predictor_spec_step_idx, int) and r.predictor_spec_step_idx % L for r in seen):
            return "mismatch", unused
        return "layer-0 reuse", unused
    return "mismatch", unused


@FAST
@given(traces())
def test_the_verdict_and_the_unused_layers_follow_the_rule(case):
    records, L, k, sizes, crash, in_draft = case
    v = judge(records, L, k, sizes, crash, in_draft)
    verdict, unused = oracle(records, L, k, crash, in_draft)
    known = sum(sizes[j] for j in unused if j < len(sizes))
    assert (v.verdict, v.unused_layers, v.unused_layer_bytes) == (verdict, unused, known)


@FAST
@given(traces())
def test_multi_module_iff_every_step_s_ran_layer_s_mod_l_and_that_tells(case):
    records, L, k, sizes, _, _ = case
    v = judge(records, L, k, sizes)
    seen = [r for r in records if r.executed_layer is not None]
    scheduled = {s % L for s in range(k)}
    assert (v.verdict == "multi-module") == (
        bool(seen) and all(r.executed_layer == r.draft_step % L for r in seen)
        and any(r.draft_step % L for r in seen) and scheduled <= {r.executed_layer for r in seen})
    # layer-0 reuse is never said where a call ran another layer, or where the steps cannot tell
    if v.verdict in ("layer-0 reuse", "swallowed"):
        assert {r.executed_layer for r in seen} == {0} and any(r.draft_step % L for r in seen)


@FAST
@given(traces())
def test_the_evidence_names_what_decided(case):
    records, L, k, sizes, crash, in_draft = case
    v = judge(records, L, k, sizes, crash, in_draft)
    seen = [r for r in records if r.executed_layer is not None]
    steps = steps_text(seen)
    wrapper = ", ".join(sorted({str(r.wrapper_spec_step_idx) for r in (seen or records)}))
    if crash:
        where = f" at draft step {records[-1].draft_step}" if records else ""
        assert v.evidence == ([f"the draft model raised{where}: {crash}"] if in_draft else
                              [f"the engine raised outside the draft model (not a drafting verdict): {crash}"])
        return
    if not records:
        assert v.evidence == ["no draft-model call was recorded: the wrapped forwards never ran (drafting off, or a "
                              "compiled/graph-replayed draft model)"]
        return
    if not seen:
        assert v.evidence == [
            f"none of the {len(records)} draft calls ran an MTP layer the tracer could see: the layers' forwards were "
            "skipped or replaced (a compiled or fused path, or a draft model that bypasses its layers), so which "
            "layer serves a draft step was not observed", f"spec_step_idx received by the wrapper: {wrapper}"]
        return
    silent = [r for r in records if r.executed_layer is None]
    if silent:
        assert v.evidence[-1] == (f"{len(silent)} of {len(records)} draft calls (at step(s) "
                                  f"{sorted({r.draft_step for r in silent})}) ran no MTP layer: judged from the others")
    first = v.evidence[0]
    if v.verdict == "multi-layer calls":
        multi = [r for r in seen if r.executed_layer == -1]
        assert first == (f"{len(multi)} of {len(seen)} draft calls ran several MTP layers in one call (first: layers "
                         f"{multi[0].layers_run} at step {multi[0].draft_step}): the drafter chains its layers inside "
                         "one forward, so no step-to-layer schedule applies")
        assert v.evidence[1] == f"layers run per step: {steps}"
    elif v.verdict == "multi-module":
        assert v.evidence[:2] == [f"every draft step s ran layer s mod {L}: {steps}",
                                  f"spec_step_idx received by the wrapper: {wrapper}"]
        assert len(v.evidence) == 2 + (k < L) + bool(silent)
        if k < L:
            assert v.evidence[2].startswith(f"k = {k} < {L} layers: layers {list(range(k, L))} are not scheduled")
    elif v.verdict == "inconclusive":
        if L == 1:
            assert first == (f"with a single MTP layer every schedule runs layer 0: layer-0 reuse and multi-module "
                             f"coincide ({steps})")
        else:
            why = ("k = 1 drafts one step" if k == 1 else
                   f"only draft step(s) {sorted({r.draft_step for r in seen})} were called (k = {k})")
            assert first == (f"{why}, and every schedule runs layer 0 there ({steps}): trace with k >= {L} (k = "
                             f"{2 * L} shows the wrap-around) to tell reuse from multi-module")
        assert v.evidence[1] == f"spec_step_idx received by the wrapper: {wrapper}"
    elif v.verdict == "swallowed":
        hits = [r for r in seen if isinstance(r.wrapper_spec_step_idx, int) and r.wrapper_spec_step_idx > 0
                and r.predictor_spec_step_idx in (ABSENT, 0)]
        r = hits[0]
        assert first == (f"{len(hits)} call(s): the wrapper received spec_step_idx={r.wrapper_spec_step_idx} but the "
                         f"predictor ({r.predictor or 'the layers holder'}) received {r.predictor_spec_step_idx} (first "
                         f"at proposal {r.proposal}, step {r.draft_step}), so layer 0 ran")
        assert v.evidence[1] == f"layers run per step: {steps}"
    elif v.verdict == "layer-0 reuse":
        assert first == f"every draft step ran layer 0: {steps}"
        never = all(r.wrapper_spec_step_idx in (ABSENT, 0) for r in seen)
        assert v.evidence[1] == (f"spec_step_idx {'never reached the model' if never else 'reached the predictor only as 0'} "
                                 f"(wrapper received: {wrapper})")
        assert (v.unused_layers != []) == any(e.startswith("layers a correct schedule at k = ") for e in v.evidence)
        if v.unused_layers:
            assert v.evidence[2] == (f"layers a correct schedule at k = {k} would run but never ran: {v.unused_layers}, "
                                     f"holding {v.unused_layer_bytes} bytes of weights in the checkpoint")
    elif v.verdict == "mismatch":
        if all(r.executed_layer == r.draft_step % L for r in seen):
            assert first == (f"the steps that were called ran layer s mod {L} ({steps}), but layers {v.unused_layers}, "
                             f"which k = {k} schedules, never ran: the proposer made fewer than k draft calls per "
                             "proposal")
        elif {r.executed_layer for r in seen} == {0}:
            r = next(r for r in seen if isinstance(r.predictor_spec_step_idx, int) and r.predictor_spec_step_idx % L)
            assert first == (f"the predictor ({r.predictor or 'the layers holder'}) received spec_step_idx="
                             f"{r.predictor_spec_step_idx} at proposal {r.proposal}, step {r.draft_step}, but layer 0 "
                             "ran: the model ignores the index it gets")
            assert v.evidence[1] == f"layers run per step: {steps}"
        else:
            bad = next(r for r in seen if r.executed_layer != r.draft_step % L)
            assert first == (f"proposal {bad.proposal}, step {bad.draft_step} ran layer {bad.executed_layer}, "
                             f"expected {bad.draft_step % L}")
            assert v.evidence[1] == f"layers run per step: {steps}"


@FAST
@given(st.integers(2, 4), st.integers(2, 6), st.data())
def test_a_proposer_that_stops_short_of_k_is_a_mismatch_where_a_scheduled_layer_never_ran(L, k, data):
    """Each proposal drafts steps 0..m-1 only, each at its scheduled layer: what k schedules beyond them is
    missing (mismatch, naming it), unless the steps made ran every scheduled layer (multi-module), or only step
    0 ran (inconclusive)."""
    m = data.draw(st.integers(1, k - 1))
    recs = [CallRecord(1, p, s, executed_layer=s % L, expected_layer=s % L) for p in (1, 2) for s in range(m)]
    v = judge(recs, L, k, [7, 70, 700, 7000][:L])
    unused = sorted({s % L for s in range(k)} - {s % L for s in range(m)})
    want = "inconclusive" if m == 1 else "mismatch" if unused else "multi-module"
    assert (v.verdict, v.unused_layers) == (want, unused if want == "mismatch" else [])
    assert v.unused_layer_bytes == (sum([7, 70, 700, 7000][j] for j in unused) if want == "mismatch" else 0)
    if want == "mismatch":
        assert v.evidence == [f"the steps that were called ran layer s mod {L} ({steps_text(recs)}), but layers "
                              f"{unused}, which k = {k} schedules, never ran: the proposer made fewer than k draft "
                              "calls per proposal"]


def test_a_crash_is_the_draft_models_unless_said_otherwise():
    recs = [CallRecord(1, 1, 0, executed_layer=0), CallRecord(1, 1, 1, executed_layer=1, expected_layer=1)]
    assert judge(recs, 2, 2, [1, 2], crash=CRASH).verdict == "crashed"
    assert judge(recs, 2, 2, [1, 2], crash=CRASH).evidence == [f"the draft model raised at draft step 1: {CRASH}"]
    assert judge(recs, 2, 2, [1, 2], crash="").verdict == "multi-module"  # an empty message is no crash


def test_a_swallowed_index_and_an_ignored_one_are_told_apart_at_the_boundary():
    # the predictor got 2 with two layers: a multiple of L, so layer 0 is the model's own rule, not ignorance
    recs = [CallRecord(1, 1, s, wrapper_spec_step_idx=s, predictor_spec_step_idx=2 * s, executed_layer=0,
                       expected_layer=s % 2) for s in range(2)]
    assert judge(recs, 2, 2, [1, 2]).verdict == "layer-0 reuse"
    recs[1].predictor_spec_step_idx = 3
    assert judge(recs, 2, 2, [1, 2]).verdict == "mismatch"
    recs[1].predictor_spec_step_idx = ABSENT
    assert judge(recs, 2, 2, [1, 2]).verdict == "swallowed"


@FAST
@given(traces())
def test_the_layer_behind_each_step_is_its_most_frequent(case):
    records = case[0]
    got = layer_per_step(records)
    assert list(got) == sorted({r.draft_step for r in records})
    for s, j in got.items():
        ran = [r.executed_layer for r in records if r.draft_step == s]
        top = max(ran.count(x) for x in ran)
        assert ran.count(j) == top and j == next(x for x in ran if ran.count(x) == top)  # a tie: the first seen


@FAST
@given(st.integers(0, 6), st.integers(0, 6), st.lists(st.integers(1, 1000), max_size=6))
def test_layers_the_engine_did_not_load_are_named_with_their_bytes(checkpoint, loaded, sizes):
    lines = loaded_vs_checkpoint(checkpoint, loaded, sizes)
    if loaded == checkpoint:
        assert lines == []
    elif loaded > checkpoint:
        assert lines == [f"the draft model holds {loaded} blocks for the checkpoint's {checkpoint} MTP layer(s): "
                         "an MTP layer is made of several blocks here (e.g. Nemotron-H's mtp_hybrid_override_pattern), "
                         "so a 'layer' of this trace is one block"]
    else:
        dropped = list(range(loaded, checkpoint))
        assert lines == [f"the checkpoint declares {checkpoint} MTP layers but the engine loaded {loaded}: layers "
                         f"{dropped} ({sum(sizes[j] for j in dropped if j < len(sizes))} bytes of weights) never "
                         "reached memory"]


# ---- trace-matrix: what disagrees with vLLM --------------------------------------------------------------------

@FAST
@given(traces(), st.integers(-1, 30))
def test_the_check_against_vllm_names_every_disagreement(case, num_drafts):
    records, L, k, _, crash, _ = case
    said = vllm_check(records, L, k, num_drafts, crash)
    if crash and not records:
        assert said == "not checked: no draft call before the crash"
        return
    want = []
    if not crash:
        if num_drafts <= 0:
            want.append("vLLM's counters show no drafts")
        odd = sorted({n for n in Counter((r.batch, r.proposal) for r in records).values() if n != k})
        if odd:
            want.append(f"proposals with {odd} draft calls, not k = {k}")
    for r in records:  # the model's own rule: the predictor's index mod L picks the layer (none passed: 0)
        got = r.predictor_spec_step_idx
        i = 0 if got == ABSENT else got
        if r.executed_layer not in (None, -1) and i % L != r.executed_layer:
            want.append(f"step {r.draft_step}: the predictor received {got} but layer {r.executed_layer} ran (the "
                        f"model's rule gives {i % L})")
            break
    if records and all(r.executed_layer is None for r in records):
        assert said == "; ".join(want + ["the layer rule not checked: no MTP layer ran"])
    else:
        assert said == ("; ".join(want) or ("consistent before the crash" if crash else "consistent"))


@FAST
@given(traces(), st.sampled_from(["executed_layer", "wrapper_spec_step_idx"]))
def test_the_matrix_row_shows_every_value_each_step_saw(case, attr):
    records, _, k, _, _, _ = case
    want = []
    for s in range(k):  # "all": several layers in one call, "!": no MTP layer ran, "-": the step was not called
        vals = sorted({{-1: "all", None: "!"}.get(getattr(r, attr), str(getattr(r, attr)))
                       for r in records if r.draft_step == s})
        want.append("/".join(vals) or "-")
    assert _steps(records, k, attr) == " ".join(want)


HIDDEN = 4
# checkpoint tensor names with the MTP layer each belongs to (None: not an MTP layer's), in the schemes MTP models use
TENSOR = st.sampled_from([(f"mtp.layers.{j}.mlp.weight", j) for j in range(4)]
                         + [(f"model.layers.{HIDDEN + j}.eh_proj.weight", j) for j in range(3)]
                         + [("model.layers.1.mlp.weight", None), ("lm_head.extra", None)])


@FAST
@given(st.lists(TENSOR, max_size=6), st.lists(st.sampled_from(["mtp.layers.0.norm.weight", "embed.weight"]),
                                              max_size=2), st.none() | st.integers(0, 4), st.booleans())
def test_the_load_check_tells_dropped_layers_from_faults(unexpected, missing, loaded, empty):
    check = {} if empty else {"unexpected": [n for n, _ in unexpected], "missing": missing}
    for key in ("unexpected", "missing"):  # a check that found none of a kind may leave its key out
        if not check.get(key, True):
            del check[key]
    ok, problems = load_verdict(check, loaded, HIDDEN)
    if not check:  # no load check made (or an empty record of one): nothing said
        assert (ok, problems) == (None, "")
        return
    dropped = [j for _, j in unexpected if j is not None and loaded is not None and j >= loaded]
    unused = [n for n, j in unexpected if not (j is not None and loaded is not None and j >= loaded)]
    want = [f"missing: {n}" for n in missing] + [f"unused: {n}" for n in unused]
    if dropped:
        want.append(f"dropped at load: MTP layer(s) {sorted(set(dropped))} ({len(dropped)} tensors)")
    assert (ok, problems) == (not missing and not unused, "; ".join(want))


def test_layer_0_reuse_names_the_scheduled_layers_that_never_ran_with_their_bytes():
    recs = [CallRecord(1, p, s, executed_layer=0, expected_layer=s % 3) for p in (1, 2) for s in range(4)]
    v = judge(recs, 3, 4, [5, 7, 11])
    assert (v.verdict, v.unused_layers, v.unused_layer_bytes) == ("layer-0 reuse", [1, 2], 18)
    assert v.evidence == ["every draft step ran layer 0: step 0: layer 0 x2; step 1: layer 0 x2; step 2: layer 0 x2; "
                          "step 3: layer 0 x2",
                          "spec_step_idx never reached the model (wrapper received: absent)",
                          "layers a correct schedule at k = 4 would run but never ran: [1, 2], holding 18 bytes of "
                          "weights in the checkpoint"]


def test_the_vllm_check_says_what_it_could_not_check_after_what_disagrees():
    recs = [CallRecord(1, 1, s) for s in range(2)]  # no MTP layer ran in either call, one call short of k = 3
    assert vllm_check(recs, 2, 3, 0, None) == ("vLLM's counters show no drafts; proposals with [2] draft calls, not "
                                               "k = 3; the layer rule not checked: no MTP layer ran")


def test_calls_that_ran_no_layer_name_every_index_the_wrapper_received():
    recs = [CallRecord(1, 1, s, wrapper_spec_step_idx=idx) for s, idx in ((0, 0), (1, 1), (2, ABSENT))]
    assert judge(recs, 2, 3, [1, 2]).evidence[1] == "spec_step_idx received by the wrapper: 0, 1, absent"
