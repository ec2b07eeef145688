"""``sweep --dry-run``'s counts and text (``mtpbench.sweep.plan``), against the rule written out here: points are
k = 0 plus every (mode, layers, k > 0), plus the A/A copy of k = 0 on a backend that interleaves its repeats when
--repeats >= 3; timed runs are points x (warm-ups on such a backend + repeats); output tokens are timed runs x
prompts x max tokens; engine starts are 1 for the native engine and one per (k, layers) on vLLM. The earlier sweep
the estimate reads is the same backend's and model's whole-point rows that ran."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.config import resolve
from mtpbench.sweep.plan import earlier_rows, lines, plan


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), st.sampled_from([("reuse",), ("chain",),
       ("chain", "reuse")]), st.lists(st.integers(1, 3), min_size=1, max_size=2, unique=True), st.integers(1, 7),
       st.integers(0, 2), st.integers(1, 5), st.integers(1, 40), st.sampled_from([None, 12]))
def test_native_counts_follow_the_rule(ks, modes, layers, repeats, warmup, prompts, tokens, max_repeats):
    if max_repeats is not None and not 3 <= repeats <= max_repeats:  # --max-repeats' own bounds
        max_repeats = None
    cfg = resolve(dict(k=tuple(ks), mode=modes, mtp_layers=tuple(layers), repeats=repeats, warmup=warmup,
                       num_prompts=prompts, max_tokens=tokens, max_repeats=max_repeats, out="/nonexistent-dir/x"))
    got = plan(cfg)
    names = (["k0"] if 0 in ks else []) + [f"{m}-L{L}-k{k}" for k in sorted(set(ks) - {0}) for L in layers
                                           for m in modes]
    if 0 in ks and repeats >= 3:
        names.append("aa-k0")
    assert got["points"] == names
    assert got["engine_starts"] == 1 and got["prompts"] == prompts
    assert got["timed_runs"] == len(names) * (warmup + repeats)
    assert got["timed_runs_at_most"] == len(names) * (warmup + (max_repeats or repeats))
    assert got["output_tokens"] == len(names) * (warmup + repeats) * prompts * tokens


def test_vllm_starts_one_engine_per_k_and_layers_and_times_no_warm_up_runs():
    cfg = resolve(dict(model="builtin-glm", backend="vllm", k=(0, 1, 2), mtp_layers=(1, 3), repeats=3, warmup=2,
                       num_prompts=2, max_tokens=8, out="/nonexistent-dir/x"))
    got = plan(cfg)
    assert got["points"] == ["k0", "vllm-L1-k1", "vllm-L3-k1", "vllm-L1-k2", "vllm-L3-k2"]
    assert got["engine_starts"] == 5  # (0, 0), (1, 1), (1, 3), (2, 1), (2, 3)
    assert got["timed_runs"] == 5 * 3 and got["output_tokens"] == 5 * 3 * 2 * 8


def test_the_dry_run_says_what_it_counted_line_by_line():
    counts = {"points": ["k0", "reuse-L3-k1"], "engine_starts": 1, "prompts": 4, "timed_runs": 8,
              "timed_runs_at_most": 8, "output_tokens": 512}
    assert lines(counts, None, "out") == [
        "grid: 2 points: k0, reuse-L3-k1", "engine starts: 1; prompts per run: 4", "timed runs: 8",
        "output tokens: 512",
        "time: no estimate (no earlier sweep of this backend and model in out to take a rate from; a short sweep "
        "there first, e.g. --k 0 --repeats 1, gives one)",
        "dry run: nothing was loaded, run or written"]
    more = dict(counts, timed_runs_at_most=20)
    got = lines(more, {"seconds": 90.0, "tokens_per_sec": 123.45, "startup_s": 2.25}, "o")
    assert got[2] == "timed runs: 8 (up to 20 with --max-repeats)"
    assert got[4] == ("time: about 1.5 min at 123.5 tokens/s and 2.2 s per engine start (the earlier sweep in o); "
                      "more rounds, if --max-repeats gives them, add to it")


def test_the_earlier_sweep_is_the_same_backends_and_models_rows_that_ran(tmp_path):
    cfg = resolve(dict(k=(0, 1), out=str(tmp_path)))
    assert earlier_rows(tmp_path, cfg) == []  # none there
    (tmp_path / "summary.json").write_text("{not json")
    assert earlier_rows(tmp_path, cfg) == []
    rows = [{"category": "all", "status": "ok", "output_tokens_per_sec": 1.0},
            {"category": "code", "status": "ok", "output_tokens_per_sec": 2.0},
            {"category": "all", "status": "failed", "output_tokens_per_sec": None},
            {"category": "all", "status": "ok", "output_tokens_per_sec": 3.0}]
    for config, want in (({"backend": cfg.backend, "model": cfg.model}, [rows[0], rows[3]]),
                         ({"backend": "vllm", "model": cfg.model}, []),
                         ({"backend": cfg.backend, "model": "other"}, []), ({}, [])):
        (tmp_path / "summary.json").write_text(json.dumps({"config": config, "rows": rows}))
        assert earlier_rows(tmp_path, cfg) == want
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"backend": cfg.backend, "model": cfg.model}}))
    assert earlier_rows(tmp_path, cfg) == []


@pytest.mark.parametrize("name, want", [("k-1", "k(server's)"), ("vllm-k-1-c4", "vllm-k(server's)-c4")])
def test_an_attached_servers_k_is_named_as_its_own(name, want):
    from mtpbench.sweep.plan import _name

    class P:
        pass

    p = P()
    p.name = name
    assert _name(p) == want


def test_attached_servers_start_no_engine_and_list_each_servers_points():
    cfg = resolve(dict(backend="vllm-server", server="http://127.0.0.1:9", servers=("http://127.0.0.1:9",
                       "http://127.0.0.1:10"), concurrency=(1, 4), repeats=3, num_prompts=2, max_tokens=8,
                       out="/nonexistent-dir/x"))
    got = plan(cfg)
    names = ["vllm-k(server's)-c1", "vllm-k(server's)-c4"]
    assert got["points"] == [f"{n} at {url}" for url in cfg.servers for n in names]
    assert got["engine_starts"] == 0 and got["timed_runs"] == 4 * 3 and got["output_tokens"] == 4 * 3 * 2 * 8
    assert got["max_seconds"] == cfg.max_seconds


def test_an_earlier_sweep_without_start_up_times_adds_none():
    from mtpbench.sweep.plan import estimate

    guess = estimate([{"output_tokens_per_sec": 50.0, "startup_s": None}], {"output_tokens": 100, "engine_starts": 2})
    assert guess == {"seconds": 2.0, "tokens_per_sec": 50.0, "startup_s": 0.0}


def test_a_dry_run_needing_vllm_here_is_refused_where_the_run_would_be(monkeypatch):
    """Issue 45: a vllm-server dry run without vLLM installed said exit 0, then the real run failed: the plan makes
    the run's check first (an attached server needs no vLLM here)."""
    import importlib.util

    from mtpbench.environment import INSTALL_HINT
    from mtpbench.errors import MtpBenchError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    for backend in ("vllm", "vllm-server"):
        with pytest.raises(MtpBenchError, match="need vLLM"):
            plan(resolve(dict(backend=backend, k=(0, 1), out="/nonexistent-dir/x")))
    assert "need vLLM" in INSTALL_HINT
    assert plan(resolve(dict(k=(0, 1), out="/nonexistent-dir/x")))["points"]  # the native engine needs none
