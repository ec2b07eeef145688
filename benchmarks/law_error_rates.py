"""Every answer that reads the acceptance law, its stated error rate against the rate simulated through the real
decision functions (issue 55), in the regimes where a normal approximation failed: near-certain steps (a = 0.999,
0.99), few steps (3 chains), low temperature (a in {0.9995, 0.0005}), greedy and sampled requests at one position,
one step, probabilities that read the last verdict; and a = 0.7, beta(2, 1.5) away from the ends. The engine follows
its law in every trial (tests/unit/test_acceptance_law_properties.py's ``chains`` and ``REGIMES``).

1. the law test (trace-layers, a sweep's point): ``stats.acceptance.law_test`` at alpha 0.05 two-sided over the
   positions and the joint test; false: any verdict but "follows the law".
2. a sweep of 6 drafting points read as one family (``stats.judge.law_levels(family=law_family(...))``, k = 1..3
   twice); false: any point called out.
3. check-lossless's law confirmation alone (``stats.verdict.over_accepting`` at CONFIRM_LAW, 0.1 %): a stage's law
   over-accepting at the confirmation's level.
4. check-lossless, the whole verdict (``stats.lossless_verdict``) with the law read, on null stages as the bound
   assumes (each stage's two-sample p uniform with a fair sign, the excess z N(0, 1), the A/A p uniform, stage 2
   fresh and independent with twice the continuations; the law's steps of that regime): false: lossy, against
   FALSE_LOSSY_BOUND (1.58 %).

Measured: the share of false answers with its Clopper-Pearson 95 % interval; "ABOVE" where the interval's low end
exceeds the stated rate.

    python benchmarks/law_error_rates.py [TRIALS] [REGIME ...]   # default 4000, every regime
    python benchmarks/law_error_rates.py --lossless SEED TRIALS REGIME   # check-lossless's row alone, at a seed
"""

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]  # this checkout's mtpbench, not an installed one
from test_acceptance_law_properties import REGIMES, chains  # noqa: E402

from check_lossless_rates import clopper_pearson  # noqa: E402  (benchmarks/: the script's own folder)
from mtpbench import stats  # noqa: E402
from mtpbench.stats.acceptance import follows, law_test  # noqa: E402
from mtpbench.stats.judge import law_family, law_levels  # noqa: E402


def null_two_sample(rng, n):
    p = float(rng.uniform(1 / 2001, 1.0))
    lp = float(rng.choice([-1.0, 1.0])) * 0.01
    return stats.LosslessTest(p, p, p, 1 / 2001, -2.0, -2.0 + lp, lp, None, None, 0.05, n, n, 12, 2000)


def null_stage(rng, regime, n):
    excess_z = float(rng.normal())
    excess = stats.ExcessTest(excess_z, 2 * stats.lossless.NormalDist().cdf(-abs(excess_z)), 0.0, 0.0, 0.0, 0.01, n,
                              2 * n)
    law = stats.law_evidence(chains(rng, *REGIMES[regime]))
    return stats.Stage(null_two_sample(rng, n), null_two_sample(rng, n), excess, law)


def row(name, stated, count, trials):
    low, high = clopper_pearson(count, trials)
    flag = " ABOVE" if low > stated else ""
    print(f"| {name} | <= {100 * stated:.3g} % | {100 * count / trials:.2f} % [{100 * low:.2f}, {100 * high:.2f}]"
          f"{flag} | {trials} |", flush=True)


def main(trials: int, only: list[str]) -> None:
    t0 = time.time()
    print("| answer, regime | stated | simulated (95 % CI) | trials |\n|---|---|---|---:|")
    for regime, (n, k, law) in REGIMES.items():
        if only and regime not in only:
            continue
        rng = np.random.default_rng(55)
        row(f"law test, {regime}", 0.05,
            sum(not follows(law_test(chains(rng, n, k, law))[0]) for _ in range(trials)), trials)
        rng = np.random.default_rng(56)
        ks = [1, 2, 3, 1, 2, 3]
        levels = law_levels(family=law_family(ks))
        row(f"sweep --law, 6 points one family, {regime}", 0.05,
            sum(any(not follows(law_test(chains(rng, n, kk, law), **levels)[0]) for kk in ks)
                for _ in range(trials)), trials)
        rng = np.random.default_rng(57)
        row(f"check-lossless: the law confirms on its own, {regime}", stats.CONFIRM_LAW,
            sum(bool(stats.verdict.over_accepting(stats.law_evidence(chains(rng, n, k, law)), stats.CONFIRM_LAW))
                for _ in range(trials)), trials)
        lossless_row(regime, trials, 58)
    print(f"\n{trials} trials a row, {time.time() - t0:.0f} s")


def lossless_row(regime: str, trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lossy = 0
    for _ in range(trials):
        first = null_stage(rng, regime, 96)
        stages = [first] + ([null_stage(rng, regime, 192)] if stats.alarm(first) else [])
        lossy += stats.lossless_verdict(stages)[0] == stats.LOSSY
    row(f"check-lossless: lossy, null stages with the law read, {regime}" + ("" if seed == 58 else f" (seed {seed})"),
        stats.FALSE_LOSSY_BOUND, lossy, trials)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--lossless"]:
        lossless_row(sys.argv[4], int(sys.argv[3]), int(sys.argv[2]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000, sys.argv[2:])
