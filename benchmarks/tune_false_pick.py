"""How often ``mtpbench tune`` picks a k > 0 that is not faster than plain decoding (issue 33, items 1 and 2):
simulated tunes of 5 loads x k = 0..4, every point's repeats drawn with multiplicative noise, chosen by today's
rule (``tune.choose.choose_all``: stats.judge, Bonferroni over every comparison, family-wise 5 %) and by the rule
before issue 33 (every pair of k at every load at 95 %, uncorrected, each ``stats.judge.ratio`` alone; the smallest
k that no other k beats).

A false pick is a k > 0 chosen at a load where its true speedup over k = 0 is <= 1; the rate is the share of
tunes with any false pick. "null": every k as fast as k = 0 at every load. "mixed": drafting pays at small loads
and costs at large ones (true speedups in SPEEDUPS); power there is the share of (tune, load) with a k > 0 truly
faster where a k > 0 truly faster was chosen. Noise: lognormal with the given sd of log(tokens/s); "+ slow": also a
10 % chance per repeat of a run 10-25 % slower (the intervals module's outlier model).

    python benchmarks/tune_false_pick.py [--trials 2000]

Prints one table row per (scenario, repeats, noise); docs/tune.md records it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mtpbench.stats import judge
from mtpbench.tune.choose import choose_all
from mtpbench.tune.model import Measured

LOADS = (1, 2, 4, 8, 16)
KS = (0, 1, 2, 3, 4)
# true tokens/s(k) / tokens/s(0) per load, k = 1..4: drafting pays at batch 1-2, is even at 4, costs above
SPEEDUPS = {1: (1.25, 1.4, 1.45, 1.4), 2: (1.15, 1.2, 1.2, 1.1), 4: (1.0, 1.0, 0.95, 0.9), 8: (0.9, 0.85, 0.8, 0.7),
            16: (0.8, 0.7, 0.6, 0.5)}


def true_speedup(scenario: str, load: int, k: int) -> float:
    return 1.0 if scenario == "null" or k == 0 else SPEEDUPS[load][k - 1]


def table(rng, scenario: str, repeats: int, sd: float, slow: bool) -> list[Measured]:
    points = []
    for b in LOADS:
        for k in KS:
            x = 100.0 * b * true_speedup(scenario, b, k) * np.exp(rng.normal(0, sd, repeats))
            if slow:
                x = x / np.where(rng.random(repeats) < 0.1, rng.uniform(1.10, 1.25, repeats), 1.0)
            points.append(Measured(b, k, [float(v) for v in x]))
    return points


def old_choices(points: list[Measured]) -> dict[int, int]:
    """The rule before issue 33, per load: the smallest k that no other k beats at 95 % (uncorrected)."""
    out = {}
    for b in LOADS:
        by = {p.k: p for p in points if p.load == b}
        ks = sorted(by)

        def beats(a: int, c: int) -> bool:
            return judge.ratio(by[a].tokps, by[c].tokps).decision == judge.ABOVE  # one comparison alone, 95 %

        beaten = {k: [j for j in ks if j != k and beats(j, k)] for k in ks}
        out[b] = next((k for k in ks if not beaten[k]), max(ks, key=lambda k: by[k].gmean))
    return out


def score(scenario: str, choices: dict[int, int]) -> tuple[bool, int, int]:
    """(any false pick, loads where a truly faster k > 0 exists, of those where one was chosen)."""
    false = any(k > 0 and true_speedup(scenario, b, k) <= 1 for b, k in choices.items())
    faster = [b for b in LOADS if any(true_speedup(scenario, b, k) > 1 for k in KS if k)]
    return false, len(faster), sum(choices[b] > 0 and true_speedup(scenario, b, choices[b]) > 1 for b in faster)


def run(scenario: str, repeats: int, sd: float, slow: bool, trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    new = {"false": 0, "loads": 0, "hit": 0}
    old = dict(new)
    for _ in range(trials):
        points = table(rng, scenario, repeats, sd, slow)
        for tally, choices in ((new, {c.load: c.chosen for c in choose_all(points)}), (old, old_choices(points))):
            false, loads, hit = score(scenario, choices)
            tally["false"] += false
            tally["loads"] += loads
            tally["hit"] += hit
    return {"new": new, "old": old}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2000)
    args = ap.parse_args()
    t0 = time.time()
    print(f"{args.trials} simulated tunes per row, 5 loads x k = 0-4; false-pick rate (any k > 0 chosen where it is "
          f"not faster), power (a faster k > 0 chosen where one exists)")
    print("| scenario | repeats | noise | false picks, Bonferroni 5 % | false picks, before | power, Bonferroni 5 % "
          "| power, before |")
    print("|---|---:|---|---:|---:|---:|---:|")
    seed = 0
    for scenario in ("null", "mixed"):
        for repeats in (3, 6):
            for sd, slow in ((0.03, False), (0.10, False), (0.03, True)):
                seed += 1
                r = run(scenario, repeats, sd, slow, args.trials, seed)
                power = ["" if t["loads"] == 0 else f"{t['hit'] / t['loads']:.1%}" for t in (r["new"], r["old"])]
                print(f"| {scenario} | {repeats} | sd {sd:.0%}{' + slow' if slow else ''} | "
                      f"{r['new']['false'] / args.trials:.1%} | {r['old']['false'] / args.trials:.1%} | "
                      f"{power[0] or 'n/a'} | {power[1] or 'n/a'} |")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
