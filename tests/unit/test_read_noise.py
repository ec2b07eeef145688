"""A sweep's noise record as its files give it (``sweep.load.read_noise``; issue 55 case 8): the A/A control against
the k = 0 point it copies, cut to the same count, and the narrowest floor any drafting point's speedup interval read
(each at its own last look: a point decided early keeps that look's floor). The oracle picks the runs by hand and
takes the floor of the picked runs from ``stats.noise.floor`` (tested on its own, against scipy's t law). No model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.stats import noise
from mtpbench.sweep.load import read_noise

FP = {"x": 1}
RUN = {"fingerprint": FP}


def runs(speeds: list[float | None]) -> list[dict]:
    return [{"output_tokens_per_sec": s, "round": r} for r, s in enumerate(speeds)]


def point(k: int, speeds: list[float | None]) -> dict:
    return {"point": {"mode": "plain" if k == 0 else "chain", "k": k, "mtp_layers": 0 if k == 0 else 1},
            "fingerprint": FP, "repeats": runs(speeds)}


_speed = st.floats(80.0, 120.0, allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(_speed, min_size=3, max_size=8), st.lists(_speed, min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3), st.sampled_from([0.5, 100.0])), max_size=4))
def test_the_noise_record_reads_the_same_count_of_both_copies_and_the_narrowest_floor_a_point_read(
        tmp_path_factory, k0, copy, drafting):
    """``drafting``: (runs, then runs of None, their tokens/s) per k > 0 point; a point of fewer than 3 positive runs
    has no interval and reads no floor (a slow one of 0.5 tokens/s counts). The A/A copy may have fewer runs than its
    original (cut to the same count)."""
    d = tmp_path_factory.mktemp("s")
    points = [point(0, k0)] + [point(i + 1, [v] * n + [None] * none) for i, (n, none, v) in enumerate(drafting)]
    (d / "aa-k0.json").write_text(json.dumps({**point(0, copy), "point": {**point(0, copy)["point"], "mode": "aa"}}))
    got = read_noise(d, RUN, points)
    m = min(len(k0), len(copy))
    want = noise.summary(k0[:m], copy[:m])
    assert {k: v for k, v in got.items() if k in want} == want
    assert got["point"] == points[0]["point"]  # the copied point, named
    floors = [noise.floor_until((runs(k0), runs(copy)), n + none - 1) for n, none, _ in drafting if n >= 3]
    least = min(floors, default=None)
    assert got["floor_least"] == noise.rounded(least) and got["floor_least_pct"] == noise.pct(least)


def test_a_sweep_of_plain_decoding_alone_has_no_least_floor(tmp_path):
    k0 = [100.0, 101.0, 99.0, 100.5]
    (tmp_path / "aa-k0.json").write_text(json.dumps({**point(0, k0), "point": {**point(0, k0)["point"], "mode": "aa"}}))
    got = read_noise(tmp_path, RUN, [point(0, k0)])
    assert got["floor_least"] is None and got["floor_least_pct"] is None and got["point"]["k"] == 0


def test_k0_timed_on_after_its_points_stopped_never_narrows_their_least_floor(tmp_path):
    """k = 0 and its copy go on to round 5 and agree ever more closely; the only drafting point stopped at round 2,
    when the copies still differed: the least floor a speedup read is round 2's, not the later, narrower one."""
    k0 = [100.0, 100.0, 100.0, 100.0, 100.0, 100.0]
    copy = [90.0, 110.0, 100.0, 100.0, 100.0, 100.0]
    (tmp_path / "aa-k0.json").write_text(json.dumps({**point(0, copy), "point": {**point(0, copy)["point"], "mode": "aa"}}))
    got = read_noise(tmp_path, RUN, [point(0, k0), point(1, [120.0, 121.0, 119.0])])
    early = noise.floor([100.0] * 3, [90.0, 110.0, 100.0])
    assert early > noise.floor(k0, copy) and got["floor_least"] == noise.rounded(early)
    assert math.isclose(got["floor_least"], early, rel_tol=1e-3)


@pytest.mark.parametrize("aa", [None, "failure"])
def test_no_control_no_record(tmp_path, aa):
    if aa:
        (tmp_path / "aa-k0.failure.json").write_text(json.dumps({"point": point(0, [])["point"], "fingerprint": FP}))
    assert read_noise(Path(tmp_path), RUN, [point(0, [100.0] * 3)]) is None


def test_the_noise_figures_are_rounded_as_the_pages_print_them():
    """A floor in log ratio to 5 decimals, in % (e^x - 1) to 2: what summary.json keeps and the pages print."""
    assert noise.rounded(0.123456789) == 0.12346 and noise.rounded(None) is None
    assert noise.pct(0.0123456) == 1.24 and noise.pct(None) is None  # 100 (e^0.0123456 - 1) = 1.2422...


def test_the_noise_sentence_names_the_narrowest_floor_a_point_read():
    """Issue 55 case 8, word for word: where a point decided at an earlier look read a narrower floor than the last
    round's, the sentence says both; where they print alike, the plain sentence."""
    base = {"floor": 0.05, "single_run_pct": 7.5, "rounds": 6, "floor_pct": 5.46}
    plain = ("noise: on this machine two identical single runs differ by up to 7.5 % at 95 %; the A/A control (k = 0 "
             "against itself, 6 rounds) differs by up to 5.5 %, and no speedup interval is narrower than that")
    assert noise.line({**base, "floor_least_pct": 5.46}) == plain and noise.line(base) == plain
    assert noise.line({**base, "floor_least_pct": 0.58}) == plain[:-len("that")] + (
        "the floor as it stood at its point's last look (5.5 % after the last round, down to 0.6 % for a point "
        "decided at an earlier look)")
    assert noise.line(None) is None and noise.line({"floor": None}) is None
