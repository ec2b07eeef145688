"""An output folder's earlier results are never reused or replaced silently (issue 45, item 1): the rule of
sweep/store.py against an oracle written here from the rule itself, on real folders.

The rule: a folder with no result file is measured into; with ``--replace`` a folder holding results is moved,
whole, to ``<out>.replaced-<time>`` (nothing in it changed) and nothing is reused; else a folder whose run.json
holds the same fingerprint reuses exactly the points whose own file holds it (none for an attached server), and
any other folder is refused in one line naming the settings that differ, with nothing written or moved."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.errors import MtpBenchError
from mtpbench.sweep import store

NAMES = ["k0", "chain-L1-k1", "chain-L1-k2", "aa-k0"]
FP = st.fixed_dictionaries({"max_tokens": st.sampled_from([8, 16]), "temperature": st.sampled_from([0.0, 1.0]),
                            "versions": st.fixed_dictionaries({"torch": st.just("2.13.0"),
                                                               "mtpbench_code": st.sampled_from(["a", "b"])}),
                            "prompts_sha256": st.sampled_from(["s1", "s2"])})


def snapshot(d: Path) -> dict[str, str]:
    """Every file under ``d`` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@st.composite
def folders(draw):
    """What --out holds: nothing, a stray file, another command's JSON, or a sweep (run.json with a fingerprint, or
    an old one without) with some points saved, each with the sweep's fingerprint or another."""
    kind = draw(st.sampled_from(["missing", "empty", "stray", "other-json", "sweep", "old-sweep"]))
    run_fp = draw(FP)
    points = {n: draw(st.sampled_from(["same", "other", "failed"])) for n in draw(st.sets(st.sampled_from(NAMES)))}
    return kind, run_fp, points


def build(d: Path, kind: str, run_fp: dict, points: dict, other: dict) -> None:
    if kind == "missing":
        return
    d.mkdir()
    if kind == "stray":
        (d / "notes.txt").write_text("mine")
    elif kind == "other-json":
        (d / "lossless.json").write_text("{}")
    elif kind in ("sweep", "old-sweep"):
        (d / "run.json").write_text(json.dumps({"config": {}, **({"fingerprint": run_fp} if kind == "sweep" else {})}))
        for name, how in points.items():
            if how == "failed":
                (d / f"{name}.failure.json").write_text(json.dumps({"fingerprint": run_fp, "error": "boom"}))
            else:
                (d / f"{name}.json").write_text(json.dumps({"fingerprint": run_fp if how == "same" else other}))


@settings(max_examples=150, deadline=None)
@given(folders(), FP, FP, st.lists(st.sampled_from(NAMES), unique=True), st.booleans(), st.booleans(),
       st.booleans(), st.booleans())
def test_the_folder_rule(folder, fp, other, names, replace, attached, dry_run, force):
    kind, run_fp, points = folder
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s"
        build(out, kind, run_fp, points, other)
        before = snapshot(out) if out.exists() else None
        holds = kind in ("sweep", "old-sweep", "other-json")  # a result file (JSON) is there
        try:
            got = store.claim(out, fp, names, replace, attached, dry_run, force)
        except MtpBenchError as e:
            got = e
        if kind == "stray" and not force:  # files that are not mtpbench's (issue 56): refused, unless --force
            assert isinstance(got, MtpBenchError) and snapshot(out) == before, got
            text = str(got)
            assert "\n" not in text and "notes.txt" in text and "--force" in text and "another --out" in text
            return
        if not holds:  # nothing of a sweep's there: measured into, nothing said
            assert got == store.Claim(planned=len(names)) and (snapshot(out) if out.exists() else None) == before
            return
        if replace:
            assert isinstance(got, store.Claim) and got.reused == () and got.moved_to
            if dry_run:  # said, not done
                assert snapshot(out) == before and got.moved_to == f"{out}.replaced-<time>"
            else:  # moved whole, nothing in it changed
                moved = Path(got.moved_to)
                assert not out.exists() and moved.parent == out.parent and moved.name.startswith("s.replaced-")
                assert snapshot(moved) == before
            return
        assert snapshot(out) == before  # never written to, reused or refused
        if kind != "sweep" or run_fp != fp:  # refused in one line: what differs, and the two ways on
            assert isinstance(got, MtpBenchError), got
            text = str(got)
            assert "\n" not in text and "--replace" in text and "another --out" in text
            if kind == "sweep":
                a, b = flat(run_fp), flat(fp)
                named = [k for k in b if a[k] != b[k]]
                assert all(f"{k} {json.dumps(a[k])} there, {json.dumps(b[k])} now" in text for k in named[:3])
            return
        # reused: a point file whose fingerprint is this sweep's ("other" drawn equal to it counts too)
        want = () if attached else tuple(n for n in names if points.get(n) == "same"
                                         or (points.get(n) == "other" and other == fp))
        assert got == store.Claim(reused=want, planned=len(names))


def test_a_tune_folder_follows_the_same_rule(tmp_path):
    out = tmp_path / "t"
    config = {"sweep": {"max_tokens": 8, "k": [0, 1]}, "loads": [1, 2]}
    assert store.claim_tune(out, config, False) == store.Claim()  # new
    out.mkdir()
    (out / "tune.json").write_text(json.dumps({"config": config, "result": {}}))
    before = snapshot(out)
    assert store.claim_tune(out, config, False) == store.Claim()  # the same settings: its sweeps resume
    with pytest.raises(MtpBenchError, match=r"holds a tune measured with other settings \(sweep.max_tokens 8 there, "
                                            r"16 now; loads \[1, 2\] there, \[4\] now\)"):
        store.claim_tune(out, {"sweep": {"max_tokens": 16, "k": [0, 1]}, "loads": [4]}, False)
    assert snapshot(out) == before
    moved = Path(store.claim_tune(out, {"loads": [4]}, True).moved_to)
    assert not out.exists() and snapshot(moved) == before


def test_what_is_said(tmp_path):
    """The line before the run: how many points are reused and how to measure them anew; where --replace moved the
    earlier results; nothing for a fresh folder."""
    assert store.Claim(planned=3).message("s") is None
    assert store.Claim(reused=("k0",), planned=3).message("s") == (
        "reusing 1 of 3 points measured before in s with the same settings (k0); --replace measures them anew")
    assert store.Claim(reused=("k0",), planned=1).message("s").startswith(
        "nothing to measure: the 1 point was measured before in s with the same settings")
    assert "all 2 points were" in store.Claim(reused=("k0", "x"), planned=2).message("s")
    assert store.Claim(moved_to="s.replaced-1").message("s") == (
        "--replace: the earlier results in s were moved to s.replaced-1; measuring afresh")


def test_more_than_three_differences_are_counted(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"fingerprint": {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}}))
    with pytest.raises(MtpBenchError, match=r"\(a 1 there, 2 now; b 1 there, 2 now; c 1 there, 2 now; and 2 more\)"):
        store.claim(out, {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2}, [], False)
