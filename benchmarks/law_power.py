"""The acceptance-law test's power and false-alarm rate, measured through the code (issue 46; docs/acceptance-law.md).

On the native engine with the built-in model (k = 3, T = 1), an over-acceptance is planted at one draft position
(``engine.Faults.over_accept_position``: a draft the ratio rejects there is accepted anyway with probability
``share``), and ``stats.acceptance.law_test`` judges each run's law steps. Per share it prints the acceptance the
fault adds at that position (observed - expected, averaged over runs), and the share of runs (seeds) in which the
test names that position over-accepting; share 0 is the correct engine, whose row is the false-alarm rate (any
position or the joint test called out). No timing: the CPU is printed only to name the machine.

Usage: python benchmarks/law_power.py [--prompts 8] [--max-tokens 64] [--seeds 40] [--position 1]
       [--shares 0,0.05,0.1,0.2,0.3,0.5]
"""

from __future__ import annotations

import argparse

import torch

from mtpbench.builtin import BUILTIN_MODEL_DIR
from mtpbench.engine import Faults, generate
from mtpbench.environment import cpu_summary
from mtpbench.model import load_model
from mtpbench.prompts import load_prompts, load_tokenizer
from mtpbench.stats.acceptance import OVER, follows, law_test


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--position", type=int, default=1)
    ap.add_argument("--shares", default="0,0.05,0.1,0.2,0.3,0.5")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer(BUILTIN_MODEL_DIR)
    model = load_model(BUILTIN_MODEL_DIR)
    prompts = [tok.encode(p.text).ids for p in load_prompts("builtin", a.prompts)]
    print(f"{cpu_summary()}; built-in model, k = 3, T = 1, {a.prompts} prompts x {a.max_tokens} tokens, "
          f"{a.seeds} seeds; fault at position {a.position}")
    print("share  added acceptance  steps there  named there  any alarm")
    for share in (float(s) for s in a.shares.split(",")):
        named = alarms = steps = 0
        added = 0.0
        for seed in range(a.seeds):
            faults = Faults(over_accept_position=a.position if share > 0 else -1, over_accept_share=share)
            g = generate(model, prompts, a.max_tokens, k=3, seed=1000 + seed, temperature=1.0, record_law=True,
                         faults=faults)
            verdict, tests = law_test([(i, x, p) for _, i, x, p, *_ in g.law_steps])
            at = next(t for t in tests if t.position == a.position)
            named += at.decision == OVER
            alarms += not follows(verdict)
            added += at.observed - at.expected
            steps += at.steps
        print(f"{share:5.2f}  {added / a.seeds:+16.3f}  {steps / a.seeds:11.0f}  {named / a.seeds:11.0%}  "
              f"{alarms / a.seeds:9.0%}")


if __name__ == "__main__":
    main()
