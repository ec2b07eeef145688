"""check-lossless's sampling verdict on simulated checks with a known answer, each stated error rate against the
measured one: how often a correct engine is called lossy (also when the scorer is not the sampler's law, and without
the target's entropies) against the union bound stats.FALSE_LOSSY_BOUND(_ALONE); the power against the planted rules
(1 - power: how often a faulty engine is not called lossy); and how often a fault whose shift of the mean target
log-prob is the set bound (--max-detectable-shift) is called lossless, against 1 - POWER (20 %: lossless claims the
power to see that shift). No model: the 50-token Markov chain of tests/unit/test_lossless_stats.py, 12 prompts x 8
continuations of 16 tokens an arm, whole checks as ``lossless.run.run_sampling`` runs them (a second stage at fresh
draws where the first raised an alarm), every verdict from ``stats.lossless_verdict``. Prints the rates quoted in
docs/check-lossless.md, each with its Clopper-Pearson 95 % interval.

    python benchmarks/lossless_verdict_rates.py [TRIALS]     # 2000: about 7 min on the 2-core AMD EPYC
"""

import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]  # this checkout's mtpbench, not an installed one
from test_lossless_stats import checks, noisy_draft, planted_lossy, target_chain, wrong_ratio_temperature  # noqa: E402

from check_lossless_rates import clopper_pearson  # noqa: E402  (benchmarks/: the script's own folder)
from mtpbench import stats  # noqa: E402
from mtpbench.stats.lossless import POWER  # noqa: E402

SET_SHIFT = 0.21  # the 0.7 T rule's shift of the mean target log-prob at this N (+0.214 measured), as the bound


def old_rule_rate(res) -> float:
    """The earlier release's one-sample half on the same first stages: the drafting arm's |z| beyond 2.2414 (2.5 %)
    with both arms without drafting within 2.807 (0.5 % each)."""
    z = np.array([r[3] for r in res], dtype=float)
    return float(np.mean((np.abs(z[:, 1]) > 2.2414) & (np.abs(z[:, 0]) < 2.807) & (np.abs(z[:, 2]) < 2.807)))


def share(res, verdict: str) -> str:
    k = sum(r[0] == verdict for r in res)
    lo, hi = clopper_pearson(k, len(res))
    return f"{verdict} {k / len(res):.4f} ({lo:.4f}-{hi:.4f})"


def main(trials: int) -> None:
    p = target_chain(np.random.default_rng(0))
    q = noisy_draft(p, np.random.default_rng(1))
    biased = p ** (1 / 0.96)
    at_bound = wrong_ratio_temperature(p, q, 0.7)
    # (name, checks' keywords, the stated rate: (verdict, at most) or None where the rate is a measured power)
    cases = {"correct": ({}, (stats.LOSSY, stats.FALSE_LOSSY_BOUND)),
             "correct, no entropies": ({"excess": False}, (stats.LOSSY, stats.FALSE_LOSSY_BOUND_ALONE)),
             "correct, sampled at 0.96 T": ({"law": biased / biased.sum(1, keepdims=True)},
                                            (stats.LOSSY, stats.FALSE_LOSSY_BOUND)),
             "planted rule": ({"lossy": planted_lossy(p, q)}, None),
             "subtle rule (0.9 T)": ({"lossy": wrong_ratio_temperature(p, q, 0.9)}, None),
             "subtle rule, no entropies": ({"lossy": wrong_ratio_temperature(p, q, 0.9), "excess": False}, None),
             f"0.7 T rule, bound {SET_SHIFT}": ({"lossy": at_bound, "max_mde": SET_SHIFT},
                                                (stats.LOSSLESS, 1 - POWER)),
             f"0.7 T rule, bound {SET_SHIFT}, no entropies": (
                 {"lossy": at_bound, "max_mde": SET_SHIFT, "excess": False}, (stats.LOSSLESS, 1 - POWER))}
    for i, (name, (kw, stated)) in enumerate(cases.items()):
        t0 = time.time()
        res = checks(100 + i, p, trials, **kw)
        second = np.mean([stats.alarm(r[2]) is not None for r in res])
        combined = np.mean([r[0] == stats.LOSSY and "both stages combined" in r[1] for r in res])
        shift = np.mean([r[2].ab.logprob_diff for r in res])
        old = "" if kw.get("excess") is False else f", old one-sample rule {old_rule_rate(res):.3f}"
        line = (f"{name:38s} {share(res, stats.LOSSY)}, {share(res, stats.LOSSLESS)}, "
                f"{share(res, stats.INCONCLUSIVE)}; lossy by the combination only {combined:.4f}; second stage "
                f"{second:.2f}; shift {shift:+.3f}{old}")
        if stated:
            measured = np.mean([r[0] == stated[0] for r in res])
            line += f"; stated {stated[0]} at most {stated[1]:.4f}: {'holds' if measured <= stated[1] else 'FAILS'}"
        print(f"{line} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
