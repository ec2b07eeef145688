"""check-lossless's sampling verdict on simulated checks with a known answer: how often a correct engine is called
lossy (also when the scorer is not the sampler's law), and the power against the two planted rules, with and without
the target's entropies. No model: the 50-token Markov chain of tests/unit/test_lossless_stats.py, 12 prompts x 8
continuations of 16 tokens an arm, whole checks as ``lossless.run.run_sampling`` runs them (a second stage at fresh
draws where the first raised an alarm). Prints the rates quoted in docs/check-lossless.md.

    python benchmarks/lossless_verdict_rates.py [TRIALS]     # 2000: about 3 min on the 2-core AMD EPYC
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
from test_lossless_stats import checks, noisy_draft, planted_lossy, target_chain, wrong_ratio_temperature  # noqa: E402

from mtpbench import stats  # noqa: E402


def old_rule_rate(res) -> float:
    """The earlier release's one-sample half on the same first stages: the drafting arm's |z| beyond 2.2414 (2.5 %)
    with both arms without drafting within 2.807 (0.5 % each)."""
    z = np.array([r[3] for r in res], dtype=float)
    return float(np.mean((np.abs(z[:, 1]) > 2.2414) & (np.abs(z[:, 0]) < 2.807) & (np.abs(z[:, 2]) < 2.807)))


def main(trials: int) -> None:
    p = target_chain(np.random.default_rng(0))
    q = noisy_draft(p, np.random.default_rng(1))
    biased = p ** (1 / 0.96)
    cases = {"correct": {}, "correct, no entropies": {"excess": False},
             "correct, sampled at 0.96 T": {"law": biased / biased.sum(1, keepdims=True)},
             "planted rule": {"lossy": planted_lossy(p, q)},
             "subtle rule (0.9 T)": {"lossy": wrong_ratio_temperature(p, q, 0.9)},
             "subtle rule, no entropies": {"lossy": wrong_ratio_temperature(p, q, 0.9), "excess": False}}
    for i, (name, kw) in enumerate(cases.items()):
        t0 = time.time()
        res = checks(100 + i, p, trials, **kw)
        share = {v: np.mean([r[0] == v for r in res]) for v in (stats.LOSSY, stats.LOSSLESS, stats.INCONCLUSIVE)}
        second = np.mean([stats.alarm(r[2]) is not None for r in res])
        old = "" if kw.get("excess") is False else f", old one-sample rule {old_rule_rate(res):.3f}"
        print(f"{name:30s} lossy {share['lossy']:.4f} lossless {share['lossless']:.3f} inconclusive "
              f"{share['inconclusive']:.3f}; second stage {second:.2f}{old} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
