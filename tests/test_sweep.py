"""The sweep's own orchestration on the native engine: repeats are timed round robin across points."""

import json

from mtpbench.config import SweepConfig
from mtpbench.sweep import run_sweep


def test_repeats_run_round_robin_and_carry_their_round(tmp_path):
    seen = []
    cfg = SweepConfig(k=(0, 1, 2), mode=("chain",), num_prompts=2, max_tokens=8, repeats=3, out=str(tmp_path))
    run_sweep(cfg, lambda i, n, name: seen.append(name))
    order = [name.split(" ")[0] for name in seen if name != "report"]
    # every point once per round, before the next round starts (not one block of repeats per point)
    assert order == ["k0", "chain-L3-k1", "chain-L3-k2"] * 3, order
    for name in ("k0", "chain-L3-k1", "chain-L3-k2"):
        point = json.loads((tmp_path / f"{name}.json").read_text())
        assert [r["round"] for r in point["repeats"]] == [0, 1, 2]
        assert all(r["output_tokens_per_sec"] > 0 for r in point["repeats"])
        assert len(point["requests"]) == 2  # the first round's records are the point's own
    seen.clear()
    run_sweep(cfg, lambda i, n, name: seen.append(name))  # the same settings again: nothing re-measured
    assert seen == ["report"]


def test_timings_without_an_interval_are_marked_in_the_table_and_hollow_in_the_plot(tmp_path):
    from mtpbench.report import NO_INTERVAL, build, table

    one = SweepConfig(k=(0, 1), mode=("chain",), num_prompts=2, max_tokens=8, repeats=1, out=str(tmp_path / "one"))
    rows = run_sweep(one)
    text = table(rows)
    k1 = next(line for line in text.splitlines() if line.startswith("chain "))
    assert k1.count("*") >= 2 and f"* {NO_INTERVAL}" in text  # tokens/s and speedup, each one measurement
    three = SweepConfig(k=(0, 1), mode=("chain",), num_prompts=2, max_tokens=8, repeats=3, out=str(tmp_path / "three"))
    rows = {r.k: r for r in run_sweep(three) if r.category == "all"}
    assert rows[1].speedup_ci_low is not None  # 3 repeats give the speedup an interval, not yet tokens/s
    k1 = next(line for line in table(list(rows.values())).splitlines() if line.startswith("chain "))
    speedup = next(cell for cell in k1.split("  ") if "±" in cell)
    assert "*" not in speedup and rows[1].output_tokens_per_sec_ci_low is None and "*" in k1
    assert build(tmp_path / "three") and (tmp_path / "three" / "throughput.png").stat().st_size > 1000


def test_the_default_sweep_times_six_repeats_on_the_native_backend_only():
    from mtpbench.config import resolve

    assert resolve({}).repeats == 6  # the fewest that give tokens/s an interval
    assert resolve({"repeats": 2}).repeats == 2
    assert resolve({"backend": "vllm"}).repeats == 1  # each repeat there is a whole timed engine run
    assert resolve({}, defaults={"repeats": 3}).repeats == 3


def test_greedy_rows_say_which_share_of_prompts_kept_the_k0_tokens(tmp_path):
    """Issue 16 item 4: greedy drafting is lossless, so every k > 0 row keeps k = 0's tokens (share 1.0);
    a point file whose second prompt's tokens were changed by hand reads 0.5, rebuilt from the files alone."""
    from mtpbench.report import build, table

    cfg = SweepConfig(k=(0, 2), mode=("chain",), num_prompts=2, max_tokens=8, repeats=1, out=str(tmp_path))
    rows = run_sweep(cfg)
    assert {r.k: r.greedy_match_k0 for r in rows if r.category == "all"} == {0: None, 2: 1.0}
    assert "=k0" in table(rows)
    path = tmp_path / "chain-L3-k2.json"
    point = json.loads(path.read_text())
    point["requests"][1]["output_token_ids"][3] += 1  # what a lossy drafter would have said
    path.write_text(json.dumps(point))
    assert next(r for r in build(tmp_path) if r.k == 2 and r.category == "all").greedy_match_k0 == 0.5
    hot = SweepConfig(k=(0, 2), mode=("chain",), num_prompts=2, max_tokens=8, repeats=1, temperature=1.0,
                      out=str(tmp_path / "hot"))
    assert all(r.greedy_match_k0 is None for r in run_sweep(hot))  # sampled tokens are not compared
