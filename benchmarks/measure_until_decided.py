"""Issue 36's measurements on this machine (run alone: every figure is a timing), each printed with the CPU and
torch's threads, and saved as JSON beside the runs:

  tune   `mtpbench tune` with its defaults against the old fixed 3 repeats (no warm-up, no A/A, no sequential
         rounds): the decision at each batch, the repeats each point got, wall time; then whether an independent
         default sweep at batch 1 contradicts the batch-1 decision
  sweep  the default sweep: speedup interval half-widths with 6 fixed repeats, and with sequential rounds
         (--repeats 3 --max-repeats 20) given the same wall time (--max-seconds)
  aa     the A/A noise floor, and how often an A/A comparison is called "different": --trials sweeps of k = 0
         alone, one after another, each with its A/A copy (3 rounds)
  steps  (no run: reads the sweeps `tune` left in DIR) the per-step estimate of the issue's item 4 beside the
         end-to-end one, point by point: speedup = the ratio of each run's acceptance length / its median ITL (a
         decode round), Welch t interval on logs across runs as tokens/s gets; its bias against tokens/s, the
         two intervals' half-widths, and the per-step A/A (the A/A copy against k = 0)

Usage: python benchmarks/measure_until_decided.py {tune,sweep,aa,steps} --out DIR [--trials 30]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from mtpbench.environment import cpu_model


def mtpbench(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mtpbench", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def tune_part(out: Path) -> dict:
    res = {}
    for name, extra in (("old", ["--max-repeats", "3", "--warmup", "0", "--no-aa-control"]), ("new", [])):
        wall = mtpbench("tune", "--out", str(out / f"tune-{name}"), *extra)
        r = json.loads((out / f"tune-{name}" / "tune.json").read_text())["result"]
        reps = {f"b{row['load']} k{row['k']}": row["num_repeats"] for row in r["rows"] if row["measured"]}
        res[name] = {"wall_s": round(wall, 1), "decision": r["decision"], "reliable": r.get("decision_reliable"),
                     "why_not": r.get("unreliable_because"), "repeats": reps,
                     "choices": {c["load"]: c["chosen"] for c in r["choices"]}}
        print(f"tune {name}: {wall:.0f} s; {r['decision']}; chosen {res[name]['choices']}; repeats {reps}")
    wall = mtpbench("sweep", "--out", str(out / "sweep-b1"))
    rows = json.loads((out / "sweep-b1" / "summary.json").read_text())["rows"]
    res["default_sweep_b1"] = {"wall_s": round(wall, 1), "rows": [
        {k: r[k] for k in ("mode", "k", "speedup", "speedup_ci_low", "speedup_ci_high", "speedup_decision")}
        for r in rows if r["category"] == "all"]}
    for r in res["default_sweep_b1"]["rows"]:
        print(f"default sweep b1: {r}")
    return res


def half_widths(d: Path) -> list[dict]:
    rows = json.loads((d / "summary.json").read_text())["rows"]
    return [{"point": f"{r['mode']}-k{r['k']}", "speedup": r["speedup"], "n": r["num_repeats"],
             "half_width": round((r["speedup_ci_high"] - r["speedup_ci_low"]) / 2, 4) if r["speedup_ci_low"] else None,
             "decided": r.get("speedup_decision")} for r in rows if r["category"] == "all" and r["k"] > 0]


def sweep_part(out: Path) -> dict:
    wall = mtpbench("sweep", "--repeats", "6", "--warmup", "0", "--no-aa-control", "--out", str(out / "fixed6"))
    seq = mtpbench("sweep", "--repeats", "3", "--max-repeats", "20", "--max-seconds", f"{wall * 0.8:.0f}",
                   "--out", str(out / "sequential"))
    res = {"fixed6": {"wall_s": round(wall, 1), "rows": half_widths(out / "fixed6")},
           "sequential": {"wall_s": round(seq, 1), "rows": half_widths(out / "sequential"),
                          "noise": json.loads((out / "sequential" / "summary.json").read_text())["noise"]}}
    for name in ("fixed6", "sequential"):
        print(f"sweep {name}: {res[name]['wall_s']} s")
        for r in res[name]["rows"]:
            print(f"  {r}")
    return res


def aa_part(out: Path, trials: int) -> dict:
    found = []
    for i in range(trials):
        mtpbench("sweep", "--k", "0", "--repeats", "3", "--seed", str(i), "--out", str(out / f"aa-{i}"))
        found.append(json.loads((out / f"aa-{i}" / "summary.json").read_text())["noise"])
    different = sum(bool(n["called_different"]) for n in found)
    floors = sorted(n["floor_pct"] for n in found)
    singles = sorted(n["single_run_pct"] for n in found)
    res = {"trials": trials, "called_different": different, "floor_pct_median": floors[len(floors) // 2],
           "floor_pct_max": floors[-1], "single_run_pct_median": singles[len(singles) // 2]}
    print(f"A/A: called different in {different} of {trials} (5 % stated); floor median {res['floor_pct_median']} %, "
          f"max {res['floor_pct_max']} %; single runs differ up to {res['single_run_pct_median']} % (median)")
    return res


def step_rate(repeat: dict) -> float | None:
    """One run's tokens per second of decoding, per step: its acceptance length (1 at k = 0) over its median ITL."""
    itl = repeat.get("itl_ms_p50")
    return (repeat.get("acceptance_length") or 1.0) * 1e3 / itl if itl else None


def interval(num: list, den: list) -> dict:
    from mtpbench.stats import judge

    c = judge.ratio(num, den)  # one comparison alone: 95 %
    ci = None if c.low is None else (c.low, c.high)
    est = math.exp(sum(map(math.log, num)) / len(num) - sum(map(math.log, den)) / len(den))
    return {"speedup": round(est, 3), "ci": ci and [round(ci[0], 3), round(ci[1], 3)],
            "half_width": ci and round((ci[1] - ci[0]) / 2, 3)}


def steps_part(out: Path) -> dict:
    rows = []
    for d in sorted((out / "tune-new" / "sweeps").iterdir(), key=lambda p: int(p.name[1:])):
        pts = {f.stem: json.loads(f.read_text()) for f in d.glob("*.json") if f.stem not in ("run", "summary")}
        base = pts.pop("k0")["repeats"]
        for name, p in sorted(pts.items()):
            reps = p["repeats"]
            e2e = interval([r["output_tokens_per_sec"] for r in reps], [r["output_tokens_per_sec"] for r in base])
            step = interval([step_rate(r) for r in reps], [step_rate(r) for r in base])
            rows.append({"load": d.name, "point": name, "n": len(reps), "end_to_end": e2e, "per_step": step,
                         "bias": round(step["speedup"] / e2e["speedup"], 3)})
            print(f"{d.name} {name:12s} n={len(reps)}  tokens/s: {e2e['speedup']} {e2e['ci']}  per step: "
                  f"{step['speedup']} {step['ci']}  (per step / tokens/s: {rows[-1]['bias']})")
    return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["tune", "sweep", "aa", "steps"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=30)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}, torch threads {torch.get_num_threads()}")
    res = {"tune": tune_part, "sweep": sweep_part, "steps": steps_part}.get(a.part, lambda o: aa_part(o, a.trials))(out)
    res["cpu"], res["torch_threads"] = cpu_model(), torch.get_num_threads()
    (out / f"{a.part}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
