"""``load_check.merge_reports``: one load check from each tensor-parallel rank's, against the rule written here.
A checkpoint tensor is unexpected only where no rank consumed it; a parameter is missing where any rank left its
shard unwritten, named with that rank; the engine loaded cleanly only where neither is found. One rank: its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mtpbench.load_check import merge_reports

TENSORS = ["a.weight", "b.weight", "c.inv_freq", "d.bias"]
PARAMS = ["Target: x", "Target: y", "MTP: z"]


@st.composite
def rank_reports(draw):
    n = draw(st.integers(1, 4))
    ranks = draw(st.permutations(range(n)))  # answered in any order
    out = []
    for r in ranks:
        unexpected = sorted(draw(st.sets(st.sampled_from(TENSORS))))
        missing = sorted(draw(st.sets(st.sampled_from(PARAMS))))
        out.append({"rank": r, "report": {"loads": [{"model": "Target", "rank": r}], "checkpoint_tensors": 4,
                                          "unexpected": unexpected, "missing": missing,
                                          "ok": not unexpected and not missing}})
    return out


@given(rank_reports())
def test_the_merged_check_follows_the_rule(reports):
    merged = merge_reports(reports)
    if len(reports) == 1:
        assert merged == reports[0]["report"]
        return
    unread = [t for t in TENSORS if all(t in r["report"]["unexpected"] for r in reports)]
    assert merged["unexpected"] == unread
    want_missing = sorted(f"rank {r['rank']}: {p}" for r in reports for p in r["report"]["missing"])
    assert merged["missing"] == want_missing
    assert merged["ok"] is (not unread and not want_missing)
    assert [x["rank"] for x in merged["ranks"]] == list(range(len(reports)))
    assert all(x["ok"] is (not x["missing"] and not x["unexpected"]) for x in merged["ranks"])


def test_a_tensor_one_rank_read_is_not_unexpected():
    read_by_1 = {"rank": 0, "report": {"loads": [], "checkpoint_tensors": 2, "unexpected": ["e.weight"],
                                       "missing": [], "ok": False}}
    read_by_0 = {"rank": 1, "report": {"loads": [], "checkpoint_tensors": 2, "unexpected": [], "missing": [],
                                       "ok": True}}
    assert merge_reports([read_by_1, read_by_0])["ok"] is True
