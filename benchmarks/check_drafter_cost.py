"""What check-drafter costs beside a plain trace of the same run, side by side.

Runs ``mtpbench trace-layers MODEL`` and ``mtpbench check-drafter MODEL`` with the same backend, runner, k, prompts
and output tokens, alternating within each round (so drift hits both alike), and prints per command the median
wall time over rounds (each command starts its own engine), check-drafter's capture time (its engine run, start
included) and its check time (the reference's recomputation, no engine), and the ratio check-drafter / trace.
check-drafter generates its prompts one at a time (batch 1, so each draft call belongs to one request);
trace-layers batches them (``--batch-size``'s default): the ratio includes that. Run it alone: the load average
before and after is printed.

Usage: python benchmarks/check_drafter_cost.py [--model builtin] [--backend vllm] [--runner v1] [--rounds 3]
       [--k 2] [--prompts 2] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtpbench.environment import cpu_summary


def run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mtpbench", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode not in (0, 1, 3):  # 1: check-drafter found a difference, 3: checked no stage; still measured runs
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin")
    ap.add_argument("--backend", default="vllm")
    ap.add_argument("--runner", default="v1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()
    common = [a.model, "--backend", a.backend, "--num-speculative-tokens", str(a.k), "--num-prompts", str(a.prompts),
              "--max-tokens", str(a.max_tokens)] + (["--runner", a.runner] if a.backend != "native" else [])
    print(f"CPU: {cpu_summary()}; torch threads as each command sets them; load before: {os.getloadavg()[0]:.2f}")
    walls: dict[str, list[float]] = {"trace-layers": [], "check-drafter": []}
    parts: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            order = ["trace-layers", "check-drafter"] if i % 2 == 0 else ["check-drafter", "trace-layers"]
            for cmd in order:
                out = Path(tmp) / f"{cmd}-{i}"
                walls[cmd].append(run([cmd, *common, "--out", str(out)]))
                if cmd == "check-drafter":
                    parts.append(json.loads((out / "drafter.json").read_text())["timing"])
    med = {cmd: statistics.median(w) for cmd, w in walls.items()}
    for cmd, w in walls.items():
        print(f"{cmd:<14} median {med[cmd]:6.1f} s over {len(w)} runs ({', '.join(f'{x:.1f}' for x in w)})")
    print(f"check-drafter: capture (engine run, start included) median "
          f"{statistics.median(p['capture_s'] for p in parts):.1f} s, check (reference) median "
          f"{statistics.median(p['check_s'] for p in parts):.2f} s")
    print(f"ratio check-drafter / trace-layers: {med['check-drafter'] / med['trace-layers']:.2f}; "
          f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
