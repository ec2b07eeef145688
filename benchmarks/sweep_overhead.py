"""The default sweep's own overhead: what `mtpbench sweep` spends outside the engine.

Runs the default sweep (the built-in model, the CLI's defaults) in this process and splits its wall time
into the engine's (the backend's import and start, and every point's calls into the engine, warm-up
included: each point file's ``wall_s``) and everything else (config, prompts, provenance, point files,
the report: tables, CSV, JSON and plots). Prints both, the overhead as a fraction of the sweep, and the
CPU and thread count the figures are from.
Usage: python benchmarks/sweep_overhead.py [--out DIR] [extra sweep options as KEY=VALUE, e.g. repeats=2]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from mtpbench.config import resolve
from mtpbench.environment import cpu_summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="SweepConfig fields as KEY=VALUE (integers only), e.g. repeats=2")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="mtpbench-overhead-")) / "sweep"
    extra = {k: int(v) for k, v in (o.split("=", 1) for o in args.overrides)}
    cfg = resolve({"out": str(out), **extra})  # the CLI's defaults, as `mtpbench sweep` resolves them
    t0 = time.perf_counter()
    from mtpbench.sweep import run_sweep  # imported inside the timed span: the CLI imports it too

    rows = run_sweep(cfg)
    wall = time.perf_counter() - t0
    run = json.loads((out / "run.json").read_text())
    engine_start = run["engine"]["engine_start_s"]
    points = [json.loads(p.read_text()) for p in out.glob("*.json")
              if p.name not in ("run.json", "summary.json") and not p.name.endswith(".failure.json")]
    engine = engine_start + sum(p["wall_s"] for p in points)
    import torch

    print(f"CPU: {cpu_summary()}; torch threads: {torch.get_num_threads()}")
    print(f"default sweep: {len(points)} points x {cfg.repeats} repeat(s), {cfg.num_prompts or 'default'} prompts x "
          f"{cfg.max_tokens} tokens; {sum(r.status == 'ok' for r in rows)} rows ok")
    print(f"engine: {engine:.2f} s (start {engine_start:.2f} s); everything else: {wall - engine:.2f} s; "
          f"sweep wall: {wall:.2f} s")
    print(f"RATIO overhead / sweep wall: {(wall - engine) / wall:.1%}")
    print(f"files under {out}")


if __name__ == "__main__":
    main()
