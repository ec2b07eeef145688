"""Acceptance against its law as the artifacts show it (mtpbench.metrics.law): the summary's numbers against sums
written here from the steps, its verdict against the oracle of test_acceptance_law_properties. No engine, no model,
no torch (the recorder's reading of a vLLM verify step: tests/test_acceptance_law.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.metrics.law import LAW_HEADERS, law_lines, law_report, law_rows, law_summary
from tests.unit.test_acceptance_law_properties import oracle

maybe = st.one_of(st.none(), st.floats(0.0, 1.0, allow_nan=False))
law_step = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 1), st.floats(0.0, 1.0, allow_nan=False),
                     maybe, maybe).map(lambda s: (s[0], s[1], s[2], s[3], s[4], s[4] if s[5] is None else s[5]))


@settings(max_examples=300, deadline=None)
@given(st.lists(law_step, min_size=1, max_size=40))
def test_each_positions_numbers_are_its_steps_and_the_verdict_the_rules(steps):
    block = law_summary(steps)
    verdict, rows = oracle([(s[1], s[2], s[3]) for s in steps])
    assert block["observable"] and block["verdict"] == verdict
    assert [t["position"] for t in block["positions"]] == sorted({s[1] for s in steps})
    for t in block["positions"] + [block["joint"]]:
        at = [s for s in steps if t["position"] is None or s[1] == t["position"]]
        assert t["steps"] == len(at)
        assert t["observed"] == pytest.approx(sum(s[2] for s in at) / len(at), abs=1e-4)
        assert t["expected"] == pytest.approx(sum(s[3] for s in at) / len(at), abs=1e-4)
        known = [s[4] for s in at if s[4] is not None]
        if known:  # 1 - sum_x min(p, q) is the total-variation distance between p and q
            assert t["probabilistic"] == pytest.approx(sum(known) / len(known), abs=1e-4)
            assert t["tv"] == pytest.approx(1 - sum(known) / len(known), abs=2e-4)
        else:
            assert t["probabilistic"] is None and t["tv"] is None
        want = next(r for r in rows if r[0] == t["position"])
        assert t["decision"] == want[5]
        assert (t["z"] is None) == math.isinf(want[2])  # an infinite z (a certain step departed) is written None
        if t["z"] is not None:
            assert t["z"] == pytest.approx(want[2], abs=1e-4)
    table = law_rows(block)
    assert len(table) == len(block["positions"]) + 1 and table[-1][0] == "all"
    assert all(len(row) == len(LAW_HEADERS) for row in table)


def test_what_cannot_be_observed_is_said_not_tested():
    block = law_summary([], "the server does not serve mtpbench's law routes")
    assert not block["observable"] and block["verdict"] is None and block["positions"] == []
    assert law_lines(block) == ["acceptance against its law: not observable (the server does not serve mtpbench's "
                                "law routes)"]
    assert not law_report([{"recording": False}], [None])["observable"]
    assert law_report([{"recording": True}, {"recording": True}],
                      [{"rank": 0, "steps": [1]}, {"rank": 1, "steps": [2]}]) == {"observable": True, "rank": 0,
                                                                                 "steps": [1]}
