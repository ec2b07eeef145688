"""How often check-lossless (sampling, the defaults, the built-in model) calls each drafting arm lossy: the correct
engine, --planted-lossy and --planted-subtle, over seeds. Measures the rates quoted in docs/check-lossless.md.

    python benchmarks/check_lossless_rates.py run 1,2,3,4,5,6,7,8,9,10 rates.jsonl   # one JSON line a (seed, arm)
    python benchmarks/check_lossless_rates.py summary rates.jsonl                     # rates, Clopper-Pearson 95 %

Each (seed, arm) is ``mtpbench check-lossless --threads 1 --seed S [--planted-lossy | --planted-subtle]``'s
``run_sampling`` (the same config, arm seeds, scorer and verdict), except that a seed's two k = 0 arms are drawn
once and shared by its three drafting arms: the faults act on drafting only and a k = 0 arm is a function of its
seed, so the verdicts are the CLI's at 5 of 9 arm draws (seed 1, correct engine: two-sample p = 0.4653 here, the
value the CLI's seed-1 check gave in the previous release's measurement). About
2 min a (seed, arm), 4-5 min for the first of a seed (its k = 0 arms), 64 min for seeds 1-10, on one core of the 2-core
AMD EPYC (pinned, beside one other job); the verdicts do not depend on the load, the wall times do.
"""

import json
import math
import sys
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

ARMS = ("correct", "planted", "subtle")


def run(seeds: list[int], log: str) -> None:
    import torch

    from mtpbench.backends.native import NativeBackend
    from mtpbench.config import resolve
    from mtpbench.lossless import CHECK_DEFAULTS, SUBTLE_FACTOR, CheckConfig, run_sampling
    from mtpbench.prompts import run_prompts

    torch.set_num_threads(1)

    class SharedOffArms(NativeBackend):
        memo: dict = {}

        def sample_arm(self, cfg, ids, k, seed, n, temperature, max_tokens, speculative_overrides=None,
                       batch_size=None):
            key = (seed, n, temperature, max_tokens, batch_size, cfg.batch_size)
            if k == 0 and key in self.memo:
                self.last_counters = None
                return self.memo[key]
            out = super().sample_arm(cfg, ids, k, seed, n, temperature, max_tokens, speculative_overrides,
                                     batch_size)
            if k == 0:
                self.memo = {key: out, **{kk: v for kk, v in self.memo.items() if kk[0] == seed}}
            return out

    e = resolve(dict(), None, CHECK_DEFAULTS)
    b = SharedOffArms()
    b.start(e)
    pset = run_prompts(e)
    ids, pids = b.encode(pset.prompts), [p.id for p in pset.prompts]
    for seed in seeds:
        for arm in ARMS:
            b.faults = replace(b.faults, accept_draft_argmax=arm == "planted",
                               ratio_temperature_factor=SUBTLE_FACTOR if arm == "subtle" else 1.0)
            cfg = CheckConfig(replace(e, seed=seed), planted_lossy=arm == "planted", planted_subtle=arm == "subtle")
            t0 = time.time()
            r = run_sampling(b, cfg, ids, pids)
            row = {"seed": seed, "cond": arm, "verdict": r["verdict"], "why": r["why"],
                   "wall_s": round(time.time() - t0, 1), "test": r["test"], "aa_test": r["aa_test"],
                   "score_tests": r["score_tests"], "excess_test": r.get("excess_test"), "alarm": r.get("alarm"),
                   "confirmation": r.get("confirmation"), "detectable_shift": r["detectable_shift"],
                   "acceptance": r["arms"]["on"]["acceptance"]}
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval, by bisection on the tail summed in logs (n in the thousands overflows floats)."""
    j = np.arange(n + 1)
    log_comb = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in j])

    def tail(x: float, a: int) -> float:  # P(Binomial(n, x) >= a)
        with np.errstate(divide="ignore"):
            lp = log_comb[a:] + j[a:] * np.log(x) + (n - j[a:]) * np.log1p(-x)
        return float(np.exp(lp).sum())

    def solve(target: float, a: int) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tail(mid, a) < target else (lo, mid)
        return (lo + hi) / 2

    a = (1 - level) / 2
    return (0.0 if k == 0 else solve(a, k)), (1.0 if k == n else solve(1 - a, k + 1))


def summary(log: str) -> None:
    by, seen = defaultdict(list), set()
    for r in map(json.loads, open(log)):
        if (r["seed"], r["cond"]) not in seen:  # a pair measured twice: the first
            seen.add((r["seed"], r["cond"]))
            by[r["cond"]].append(r)
    for arm, rs in by.items():
        verdicts = [r["verdict"].split(" ")[0] for r in rs]
        print(f"{arm}: seeds {sorted(r['seed'] for r in rs)}")
        for name in ("lossy", "lossless", "inconclusive"):
            k = verdicts.count(name)
            lo, hi = clopper_pearson(k, len(rs))
            print(f"  {name}: {k}/{len(rs)} ({lo:.2f}-{hi:.2f})")
        print("  two-sample p:", " ".join(f"{r['test']['p_value']:.4f}" for r in rs))
        print("  shift:", " ".join(f"{r['test']['logprob_diff']:+.3f}" for r in rs))
        for side in ("on", "off", "off_aa"):
            print(f"  one-sample z {side}:", " ".join(f"{r['score_tests'][side]['z']:+.2f}" for r in rs))
        print("  A/A p:", " ".join(f"{r['aa_test']['p_value']:.3f}" for r in rs))
        if any(r.get("excess_test") for r in rs):
            print("  excess z:", " ".join(f"{r['excess_test']['z']:+.2f}" for r in rs))
            print("  second stage (alarm confirmed?): ", " ".join(
                "-" if not r.get("confirmation") else
                f"{r['confirmation']['excess_test']['z']:+.2f}/{r['confirmation']['test']['p_value']:.3f}" for r in rs))
        print("  detectable shift:", " ".join(f"{r['detectable_shift']:.4f}" for r in rs))


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run([int(s) for s in sys.argv[2].split(",")], sys.argv[3])
    elif sys.argv[1:2] == ["summary"]:
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)
