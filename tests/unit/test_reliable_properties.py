"""Whether a tune's decision is reliable (tune/reliable.py) against an oracle written here from the rule: loaded
machine, load changed, A/A told apart (judged as a family of the tune's controls), impossible fitted costs, a bad
prediction where the schedule uses it, not drafting as the default; the facts read back from hand-made sweep files;
and issue 44's cases 2, 3, 5 and 8 end to end."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.tune.reliable import MAX_HELD_OUT_ERROR, facts, goodput_reasons, reasons

sweep = st.fixed_dictionaries({"dir": st.sampled_from(["b1", "b2"]), "load": st.one_of(st.none(), st.floats(0, 8)),
                               "cores": st.one_of(st.none(), st.integers(1, 8)), "own": st.integers(0, 8),
                               "load_change": st.one_of(st.none(), st.just("load: went up"))})
cost = st.fixed_dictionaries({"load": st.integers(1, 16), "f": st.floats(-2, 2), "c": st.floats(-1, 1)})
control = st.fixed_dictionaries({"load": st.integers(1, 16), "estimate": st.just(1.3), "low": st.just(1.1),
                                 "high": st.just(1.5), "level": st.just(0.99), "family": st.just(5)})


@given(st.lists(sweep, max_size=4), st.lists(cost, max_size=4), st.one_of(st.none(), st.floats(0, 3)),
       st.lists(st.integers(1, 16), max_size=3, unique=True), st.lists(control, max_size=3),
       st.lists(st.integers(1, 16), max_size=3, unique=True))
def test_the_decision_is_unreliable_exactly_when_the_rule_says(sweeps, costs, held_out, open_loads, drifted,
                                                               goodput_open):
    f = {"sweeps": sweeps, "costs": costs, "held_out_max": held_out, "unit": "batch", "undecided": open_loads,
         "drifted": drifted, "goodput_undecided": goodput_open}
    machine = sum((s["load"] is not None and bool(s["cores"]) and s["load"] > s["cores"] + s["own"])
                  + bool(s["load_change"]) for s in sweeps) + len(drifted)
    want = machine + any(c["f"] < 0 or c["c"] < 0 for c in costs)
    want += held_out is not None and held_out > MAX_HELD_OUT_ERROR
    want += bool(open_loads)
    got = reasons(f)
    assert len(got) == want
    assert all("\n" not in r for r in got)
    assert len(goodput_reasons(f)) == machine + bool(goodput_open)  # the model plays no part in the goodput choice


def test_known_reasons():
    f = {"sweeps": [], "costs": [{"load": 1, "f": 0.1, "c": -0.107}], "held_out_max": 2.04, "unit": "batch",
         "drifted": [{"load": 4, "estimate": 1.25, "low": 1.1, "high": 1.42, "level": 0.99, "family": 5}]}
    got = reasons(f)
    assert got[0] == ("batch 4: the A/A control told two identical timings of k = 0 apart (x1.25 [1.1, 1.42] at "
                      "99 %, one of 5 controls): the machine drifted")
    assert got[1] == "impossible fitted costs (batch 1: f = 0.1, c = -0.107)"
    assert got[2] == ("the model predicts badly where the schedule uses it (worst held-out error 204% at the loads a "
                      "boundary lies between, above 25%)")
    assert reasons({**f, "costs": [], "held_out_max": 0.1, "drifted": []}) == []


def choice(load: int, chosen: int, **decisions: str) -> dict:
    """A LoadChoice as tune.json keeps it: its k (0 and those named k1, k2, ...) and each k's decision against 0."""
    ks = [0] + [int(k[1:]) for k in decisions]
    return {"load": load, "chosen": chosen, "ks": ks,
            "vs_0": {str(int(k[1:])): {"decision": d} for k, d in decisions.items() if d is not None}}


def test_the_facts_come_from_each_sweeps_summary(tmp_path):
    d = tmp_path / "b1"
    d.mkdir()
    prov = {"load_average": [3.5, 0, 0], "load_average_end": [6.2, 0, 0], "hardware": {"cpus_usable": 2}}
    (d / "summary.json").write_text(json.dumps({"provenance": prov, "noise": {"called_different": True}}))
    result = {"choices": [choice(1, 0, k1="open"), choice(2, 0, k1="below"), choice(4, 1, k1="above")],
              "costs": [{"load": 1, "f": -2.47, "c": 0.2, "source": "measured"},
                        {"load": 3, "f": -1.0, "c": 0.2, "source": "interpolated"}],
              "controls": [{"load": 1, "decision": "above", "estimate": 1.3, "low": 1.1, "high": 1.5, "level": 0.95,
                            "family": 1}, {"load": 2, "decision": "open"}],
              "prediction": {"held_out_abs_error_max": 0.9, "held_out_used_max": 0.1}, "unit": "batch"}
    f = facts(result, [str(d)])
    assert f["sweeps"][0]["load"] == 3.5 and f["sweeps"][0]["cores"] == 2
    assert [c["load"] for c in f["drifted"]] == [1]  # the tune's own judgement, not the sweep's single test
    assert f["sweeps"][0]["own"] == 0  # the first sweep: its start load is nobody's of the tune
    assert "busier" in f["sweeps"][0]["load_change"]
    assert f["costs"] == [{"load": 1, "f": -2.47, "c": 0.2}]  # only a load's own fit
    assert f["held_out_max"] == 0.1  # where the schedule uses the prediction, not the worst anywhere
    assert f["undecided"] == [1]  # batch 2: k = 1 slower beyond noise, so k = 0 is a finding there
    assert len(reasons(f)) == 5 and f["goodput_undecided"] == []


def test_the_edges_of_the_rule():
    base = {"sweeps": [], "costs": [], "held_out_max": MAX_HELD_OUT_ERROR, "unit": "batch", "undecided": [1, 2]}
    got = reasons(base)  # a held-out error at the limit is not above it
    assert len(got) == 1 and got[0].startswith("not drafting at batch 1, 2 is the default")
    two = reasons({**base, "undecided": [], "costs": [{"load": 1, "f": -1.0, "c": 0.1}, {"load": 2, "f": 0.1, "c": -1}]})
    assert two == ["impossible fitted costs (batch 1: f = -1, c = 0.1; batch 2: f = 0.1, c = -1)"]
    # a sweep record without "own" (one read from elsewhere) counts none of its load as the tune's own
    loaded = reasons({**base, "undecided": [], "sweeps": [{"dir": "b1", "load": 2.5, "cores": 2, "load_change": None}]})
    assert loaded == ["the machine was loaded: load average 2.50 on 2 cores at the start of b1"]


@given(st.lists(st.sampled_from(["above", "below", "open", None]), min_size=1, max_size=4), st.integers(0, 4))
def test_not_drafting_is_a_finding_only_where_every_k_was_shown_slower(decisions, chosen):
    """Issue 44, case 3: "don't draft" was shown reliable beside a k > 0 whose uncorrected interval lay above 1. The
    rule reads the decisions the choice read: k = 0 chosen and some k > 0 not shown slower (open, or no comparison
    at all) is the default."""
    c = choice(1, chosen if chosen <= len(decisions) else 0, **{f"k{i + 1}": d for i, d in enumerate(decisions)})
    got = facts({"choices": [c], "costs": [], "prediction": {}, "unit": "batch"}, [])["undecided"]
    assert got == ([1] if c["chosen"] == 0 and any(d != "below" for d in decisions) else [])


def test_a_sweep_without_a_summary_is_read_from_its_run_json_and_later_sweeps_count_the_one_before(tmp_path):
    prov = {"load_average": [3.5, 0, 0], "hardware": {"cpus_usable": 2}}
    for name in ("b1", "b2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"provenance": prov}))
    result = {"choices": [], "rows": [], "costs": [], "prediction": {"held_out_abs_error_max": None}, "unit": "batch"}
    f = facts(result, [str(tmp_path / "b1"), str(tmp_path / "b2")])
    assert [s["dir"] for s in f["sweeps"]] == [str(tmp_path / "b1"), str(tmp_path / "b2")]
    assert [s["own"] for s in f["sweeps"]] == [0, 2] and [s["load"] for s in f["sweeps"]] == [3.5, 3.5]
    assert reasons(f) == [f"the machine was loaded: load average 3.50 on 2 cores at the start of {tmp_path / 'b1'}"]


@given(st.lists(st.one_of(st.none(), st.datetimes(timezones=st.just(__import__("datetime").timezone.utc))
                          .map(lambda t: t.isoformat(timespec="seconds"))), min_size=1, max_size=6))
def test_the_sweep_that_ran_first_is_the_earliest_dated(dates):
    """The tune runs its sweeps cheapest first, not in the order it lists them: the load the previous sweep left on
    the machine is expected of every sweep but the one that started first."""
    from mtpbench.tune.reliable import ran_first

    dated = [i for i, d in enumerate(dates) if d is not None]
    want = min(dated, key=lambda i: (dates[i], i)) if dated else 0
    assert ran_first(dates) == want
    assert ran_first([]) == 0


def test_the_sweep_that_started_first_is_the_one_whose_start_load_is_nobodys(tmp_path):
    """A tune runs batch 16 first and batch 1 last: the dates in the sweeps' files, not the order they are listed
    in, say which one started on a machine the tune had not loaded yet."""
    dates = {"b1": "2026-12-04T22:09:12+00:00", "b2": "2026-12-04T22:08:40+00:00", "b16": "2026-12-04T22:07:05+00:00"}
    for name, date in dates.items():
        (tmp_path / name).mkdir()
        prov = {"load_average": [3.5, 0, 0], "hardware": {"cpus_usable": 2}, "date": date}
        (tmp_path / name / "run.json").write_text(json.dumps({"provenance": prov}))
    result = {"choices": [], "rows": [], "costs": [], "prediction": {"held_out_abs_error_max": None}, "unit": "batch"}
    f = facts(result, [str(tmp_path / n) for n in ("b1", "b2", "b16")])
    assert [s["own"] for s in f["sweeps"]] == [2, 2, 0]
    assert reasons(f) == [f"the machine was loaded: load average 3.50 on 2 cores at the start of {tmp_path / 'b16'}"]


def test_a_load_equal_to_the_cores_is_not_loaded_and_the_wording_of_each_reason():
    base = {"sweeps": [], "costs": [], "held_out_max": None, "unit": "batch", "undecided": [], "drifted": [],
            "goodput_undecided": []}
    assert reasons({**base, "sweeps": [{"dir": "b1", "load": 2.0, "cores": 2, "own": 0, "load_change": None}]}) == []
    assert reasons({**base, "sweeps": [{"dir": "b1", "load": 4.0, "cores": 2, "own": 2, "load_change": None}]}) == []
    # a drift barely off 1 keeps the digits that tell it from 1 (ends read against the null, 1)
    close = {"load": 4, "estimate": 1.0004, "low": 1.0001, "high": 1.0007, "level": 0.99, "family": 5}
    assert reasons({**base, "drifted": [close]}) == [
        "batch 4: the A/A control told two identical timings of k = 0 apart (x1.0004 [1.0001, 1.001] at 99 %, one "
        "of 5 controls): the machine drifted"]
    by_speed = reasons({**base, "undecided": [2]})  # a record from before the ks were kept: the loads alone
    assert by_speed == ["not drafting at batch 2 is the default, not a finding: no k was shown faster than k = 0 there "
                        "beyond noise, and these were not told apart from it either way (the speedup interval the "
                        "choice read holds 1, or none could be taken): batch 2: some k > 0; more repeats "
                        "(--max-repeats, --max-seconds) or a quieter machine decide it"]
    # issue 55 case 10: at batch 4 one k slower beyond noise and another open: the reason names each, never "no k
    # was shown slower" beside the row marked slower
    detail = [[1, [1, 2], []], [4, [2], [1]]]
    by_speed = reasons({**base, "undecided": [1, 4], "undecided_ks": detail})
    assert by_speed == ["not drafting at batch 1, 4 is the default, not a finding: no k was shown faster than k = 0 "
                        "there beyond noise, and these were not told apart from it either way (the speedup interval "
                        "the choice read holds 1, or none could be taken): batch 1: k = 1, 2; batch 4: k = 2 (k = 1 "
                        "slower beyond noise); more repeats (--max-repeats, --max-seconds) or a quieter machine "
                        "decide it"]
    by_goodput = goodput_reasons({**base, "goodput_undecided": [1, 4], "goodput_undecided_ks": detail})
    assert by_goodput == [by_speed[0].replace("the speedup", "the goodput")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.sampled_from([0, 1, 2]),
                          st.lists(st.sampled_from(["above", "below", "open", None]), min_size=3, max_size=3)),
                unique_by=lambda c: c[0], max_size=4))
def test_the_default_names_each_k_as_its_row_was_decided(raw):
    """Issue 55 case 10: where k = 0 is chosen and some k > 0 is open, the reason lists the open ks as not told
    apart and the ks decided slower as slower, never one as the other; the loads are ``undecided``'s."""
    from mtpbench.tune.reliable import default_reason, undecided, undecided_ks

    choices = [{"load": load, "chosen": chosen, "ks": [0, 1, 2, 3],
                "vs_0": {str(k): ({"decision": d} if d else {}) for k, d in zip((1, 2, 3), ds)}}
               for load, chosen, ds in raw]
    detail = undecided_ks(choices)
    want = sorted([c["load"], [k for k, d in zip((1, 2, 3), ds) if d != "below"],
                   [k for k, d in zip((1, 2, 3), ds) if d == "below"]] for c, (_, _, ds) in zip(choices, raw)
                  if c["chosen"] == 0 and any(d != "below" for d in ds))
    assert detail == want and [d[0] for d in detail] == undecided(choices)
    if detail:
        text = default_reason("batch", [d[0] for d in detail], detail=detail)
        for load, open_, slower in detail:
            part = f"batch {load}: k = {', '.join(map(str, open_))}"
            assert part + (f" (k = {', '.join(map(str, slower))} slower beyond noise)" if slower else "") in text
        assert "no k was shown slower" not in text


def test_the_default_read_from_a_tunes_facts_names_its_ks_by_tokens_s_and_by_goodput():
    """``facts`` carries ``undecided_ks`` (and goodput's) to ``reasons``: a tune whose result chose k = 0 at batch 4
    with k = 1 slower and k = 2 open says so from its own result, not "some k > 0"; a load the detail lacks (a
    record from before it) still gets its words, the loads after it theirs."""
    from mtpbench.tune.reliable import default_reason, facts, goodput_reasons, reasons

    choices = [{"load": 4, "chosen": 0, "ks": [0, 1, 2], "vs_0": {"1": {"decision": "below"}, "2": {"decision": "open"}}}]
    result = {"costs": [], "prediction": {}, "unit": "batch", "choices": choices, "goodput": {"choices": choices}}
    f = facts(result, [])
    said = "batch 4: k = 2 (k = 1 slower beyond noise)"
    assert said in reasons(f)[0] and said in goodput_reasons(f)[0]
    text = default_reason("batch", [1, 4], detail=[[4, [2], [1]]])
    assert "batch 1: some k > 0; batch 4: k = 2 (k = 1 slower beyond noise)" in text


def test_a_choices_words_for_each_decision():
    from mtpbench.stats import judge
    from mtpbench.tune.choose import _word

    assert [_word(d) for d in (judge.ABOVE, judge.BELOW, judge.OPEN, None)] == [
        "faster than k = 0", "slower than k = 0", "not told apart from k = 0", "not told apart from k = 0"]
