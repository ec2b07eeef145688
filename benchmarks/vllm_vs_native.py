"""Native engine vs vLLM (the CPU build here) on the built-in model, side by side in one run.

Runs the same sweep twice (k = 0..3 over all 3 MTP layers, same prompts, batch 1, greedy): once with the
native backend (reuse mode, what vLLM does) and once with the vLLM backend. Prints
  * native tokens/sec / vLLM tokens/sec at k = 0 and at each backend's best k
  * the tool's own overhead: sweep wall time minus the time spent in the engine (the backend's import
    and start in the sweep process, plus every point's run; for vLLM each point's whole worker process,
    start-up included), as a fraction of the sweep.
Usage: python benchmarks/vllm_vs_native.py [--prompts 4] [--max-tokens 128] [--eager] [--out DIR]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from mtpbench.config import SweepConfig
from mtpbench.environment import cpu_summary
from mtpbench.sweep import run_sweep


def sweep(cfg: SweepConfig):
    t0 = time.perf_counter()
    rows = run_sweep(cfg)
    wall = time.perf_counter() - t0
    engine = sum(json.loads(p.read_text())["wall_s"] for p in Path(cfg.out).glob("*.json")
                 if p.name not in ("run.json", "summary.json") and not p.name.endswith(".failure.json"))
    engine += json.loads((Path(cfg.out) / "run.json").read_text())["engine"]["engine_start_s"]
    return {(r.k): r for r in rows if r.category == "all" and r.status == "ok"}, wall, engine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--eager", action="store_true", help="vLLM with enforce_eager (no torch.compile)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="mtpbench-bench-"))
    common = dict(k=(0, 1, 2, 3), num_prompts=args.prompts, max_tokens=args.max_tokens, batch_size=1)
    native, n_wall, n_engine = sweep(SweepConfig(backend="native", mode=("reuse",), out=str(out / "native"), **common))
    vllm, v_wall, v_engine = sweep(SweepConfig(backend="vllm", max_model_len=1024, out=str(out / "vllm"),
                                               engine_args={"enforce_eager": True} if args.eager else {}, **common))
    print(f"built-in model, {args.prompts} prompts x {args.max_tokens} tokens, batch 1, greedy; "
          f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '1 (set by mtpbench)')}")
    print(f"CPU: {cpu_summary()}")  # native/vLLM was 1.34 on a Xeon, 0.71-1.06 on an EPYC: quote it beside them
    print(f"{'k':>3} {'native tok/s':>13} {'vLLM tok/s':>11} {'native AL':>10} {'vLLM AL':>8}  native/vLLM")
    for k in sorted(set(native) & set(vllm)):
        n, v = native[k], vllm[k]
        print(f"{k:>3} {n.output_tokens_per_sec:>13.1f} {v.output_tokens_per_sec:>11.1f} "
              f"{n.acceptance_length:>10.3f} {v.acceptance_length:>8.3f}  {n.output_tokens_per_sec / v.output_tokens_per_sec:.2f}")
    bn = max(native.values(), key=lambda r: r.output_tokens_per_sec)
    bv = max(vllm.values(), key=lambda r: r.output_tokens_per_sec)
    print(f"RATIO native/vLLM tokens/sec at k=0: {native[0].output_tokens_per_sec / vllm[0].output_tokens_per_sec:.2f}")
    print(f"RATIO native/vLLM tokens/sec at best k (native k={bn.k}, vLLM k={bv.k}): "
          f"{bn.output_tokens_per_sec / bv.output_tokens_per_sec:.2f}")
    for name, wall, engine in (("native", n_wall, n_engine), ("vllm", v_wall, v_engine)):
        print(f"tool overhead, {name} sweep: {wall - engine:.2f} s of {wall:.1f} s = {(wall - engine) / wall:.1%}")
    print(f"files under {out}")


if __name__ == "__main__":
    main()
