"""Whether a tune's decision is reliable (tune/reliable.py) against an oracle written here from the rule: loaded
machine, load changed, A/A told apart, impossible fitted costs, a bad prediction; and the facts read back from
hand-made sweep files."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mtpbench.tune.reliable import MAX_HELD_OUT_ERROR, facts, reasons

sweep = st.fixed_dictionaries({"dir": st.sampled_from(["b1", "b2"]), "load": st.one_of(st.none(), st.floats(0, 8)),
                               "cores": st.one_of(st.none(), st.integers(1, 8)), "own": st.integers(0, 8),
                               "load_change": st.one_of(st.none(), st.just("load: went up")),
                               "aa_different": st.one_of(st.none(), st.booleans())})
cost = st.fixed_dictionaries({"load": st.integers(1, 16), "f": st.floats(-2, 2), "c": st.floats(-1, 1)})


@given(st.lists(sweep, max_size=4), st.lists(cost, max_size=4), st.one_of(st.none(), st.floats(0, 3)),
       st.lists(st.integers(1, 16), max_size=3, unique=True))
def test_the_decision_is_unreliable_exactly_when_the_rule_says(sweeps, costs, held_out, open_loads):
    f = {"sweeps": sweeps, "costs": costs, "held_out_max": held_out, "unit": "batch", "undecided": open_loads}
    want = sum((s["load"] is not None and bool(s["cores"]) and s["load"] > s["cores"] + s["own"]) + bool(s["load_change"])
               + bool(s["aa_different"]) for s in sweeps)
    want += any(c["f"] < 0 or c["c"] < 0 for c in costs)
    want += held_out is not None and held_out > MAX_HELD_OUT_ERROR
    want += bool(open_loads)
    got = reasons(f)
    assert len(got) == want
    assert all("\n" not in r for r in got)


def test_known_reasons():
    f = {"sweeps": [], "costs": [{"load": 1, "f": 0.1, "c": -0.107}], "held_out_max": 2.04, "unit": "batch"}
    got = reasons(f)
    assert got[0] == "impossible fitted costs (batch 1: f = 0.1, c = -0.107)"
    assert got[1] == "the model predicts badly (worst held-out error 204%, above 25%)"
    assert reasons({**f, "costs": [], "held_out_max": 0.1}) == []


def test_the_facts_come_from_each_sweeps_summary(tmp_path):
    d = tmp_path / "b1"
    d.mkdir()
    prov = {"load_average": [3.5, 0, 0], "load_average_end": [6.2, 0, 0], "hardware": {"cpus_usable": 2}}
    (d / "summary.json").write_text(json.dumps({"provenance": prov, "noise": {"called_different": True}}))
    result = {"choices": [{"load": 1, "chosen": 0}, {"load": 2, "chosen": 0}, {"load": 4, "chosen": 1}],
              "rows": [{"load": 1, "k": 1, "measured": True, "speedup_ci_low": 0.9, "speedup_ci_high": 1.2},
                       {"load": 2, "k": 1, "measured": True, "speedup_ci_low": 0.7, "speedup_ci_high": 0.9},
                       {"load": 4, "k": 1, "measured": True, "speedup_ci_low": 1.1, "speedup_ci_high": 1.2}],
              "costs": [{"load": 1, "f": -2.47, "c": 0.2, "source": "measured"},
                        {"load": 3, "f": -1.0, "c": 0.2, "source": "interpolated"}],
              "prediction": {"held_out_abs_error_max": 0.1}, "unit": "batch"}
    f = facts(result, [str(d)])
    assert f["sweeps"][0]["load"] == 3.5 and f["sweeps"][0]["cores"] == 2 and f["sweeps"][0]["aa_different"]
    assert f["sweeps"][0]["own"] == 0  # the first sweep: its start load is nobody's of the tune
    assert "busier" in f["sweeps"][0]["load_change"]
    assert f["costs"] == [{"load": 1, "f": -2.47, "c": 0.2}]  # only a load's own fit
    assert f["undecided"] == [1]  # batch 2: k = 1 slower beyond noise, so k = 0 is a finding there
    assert len(reasons(f)) == 5


def test_the_edges_of_the_rule():
    base = {"sweeps": [], "costs": [], "held_out_max": MAX_HELD_OUT_ERROR, "unit": "batch", "undecided": [1, 2]}
    got = reasons(base)  # a held-out error at the limit is not above it
    assert len(got) == 1 and got[0].startswith("not drafting at batch 1, 2 is the default")
    two = reasons({**base, "undecided": [], "costs": [{"load": 1, "f": -1.0, "c": 0.1}, {"load": 2, "f": 0.1, "c": -1}]})
    assert two == ["impossible fitted costs (batch 1: f = -1, c = 0.1; batch 2: f = 0.1, c = -1)"]
    # a sweep record without "own" (one read from elsewhere) counts none of its load as the tune's own
    loaded = reasons({**base, "undecided": [], "sweeps": [{"dir": "b1", "load": 2.5, "cores": 2, "load_change": None,
                                                           "aa_different": None}]})
    assert loaded == ["the machine was loaded: load average 2.50 on 2 cores at the start of b1"]


def test_intervals_that_end_at_one_hold_it(tmp_path):
    def result(lo, hi):
        return {"choices": [{"load": 1, "chosen": 0}],
                "rows": [{"load": 1, "k": 0, "measured": True, "speedup_ci_low": 1.0, "speedup_ci_high": 1.0},
                         {"load": 1, "k": 1, "measured": True, "speedup_ci_low": lo, "speedup_ci_high": hi},
                         {"load": 1, "k": 2, "measured": False, "speedup_ci_low": 1.2, "speedup_ci_high": 1.3}],
                "costs": [], "prediction": {"held_out_abs_error_max": None}, "unit": "batch"}

    assert facts(result(0.9, 1.0), [])["undecided"] == [1] and facts(result(1.0, 1.1), [])["undecided"] == [1]
    assert facts(result(1.01, 1.1), [])["undecided"] == []  # faster beyond noise: k = 0 there is a finding
    assert facts(result(None, None), [])["undecided"] == [1]


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
