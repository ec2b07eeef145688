"""How often the sequential stopping rule (mtpbench/stats/sequential.py) decides, and how often it names the wrong
side, by simulation with a known truth; beside the same loop looking at a plain 95 % interval after every round
(no correction for stopping on the data). Log-normal timings (per-run noise ``--sd`` in log units, 0.05 is what
a loaded 2-core machine shows for a short sweep point), rounds from ``--min-repeats`` to ``--max-repeats``.

Usage: python benchmarks/sequential_error_rate.py [--runs 4000] [--sd 0.05] [--min-repeats 3] [--max-repeats 15]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from mtpbench.stats.sequential import max_looks, run


def rates(truth: float, runs: int, sd: float, lo: int, hi: int, alpha: float, seed: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(seed)
    decided = wrong = rounds = 0
    for _ in range(runs):
        look, why = run(lambda: (100 * truth * math.exp(rng.normal(0, sd)), 100 * math.exp(rng.normal(0, sd))),
                        lo, hi, alpha=alpha)
        rounds += look.repeats
        if why == "decided":
            decided += 1
            wrong += truth == 1 or (look.state == "faster") != (truth > 1)
    return decided / runs, wrong / runs, rounds / runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--sd", type=float, default=0.05)
    ap.add_argument("--min-repeats", type=int, default=3)
    ap.add_argument("--max-repeats", type=int, default=15)
    a = ap.parse_args()
    looks = max_looks(a.min_repeats, a.max_repeats)
    print(f"{a.runs} runs a row, noise sd {a.sd} (log), rounds {a.min_repeats}..{a.max_repeats} ({looks} looks)")
    print(f"{'truth':>6} {'rule':<22} {'decided':>8} {'wrong side':>10} {'mean rounds':>11}")
    for truth in (1.0, 1.02, 1.05, 1.10, 1 / 1.05):
        for name, alpha in (("Bonferroni (mtpbench)", 0.05), ("plain 95 % each look", 0.05 * looks)):
            d, w, r = rates(truth, a.runs, a.sd, a.min_repeats, a.max_repeats, alpha, seed=1)
            print(f"{truth:6.3f} {name:<22} {d:8.3f} {w:10.4f} {r:11.1f}")


if __name__ == "__main__":
    main()
