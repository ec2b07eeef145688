"""Native engine speed, measured side by side in one run on the built-in checkpoint (batch 1, greedy).

Prints two ratios:
  1. native plain-decode tokens/sec / transformers generate() tokens/sec   (target >= 1.5)
  2. native best-k measured speedup / its theoretical speedup              (target >= 0.85)
     theoretical = (1-a^(k+1)) / ((1-a)(k*c+1)), a and c measured in the same run (see mtpbench.metrics)

Each engine gets a warm-up; the two are interleaved over several repeats and the median is reported.
Usage: python benchmarks/native_speed.py [--prompts 4] [--max-tokens 128] [--repeats 3] [--threads N]
"""

import argparse
import statistics
import time

import torch

from mtpbench.backends.native import NativeBackend
from mtpbench.config import SweepConfig
from mtpbench.environment import cpu_summary
from mtpbench.metrics import GridPoint, mean_call_s, summarize
from mtpbench.prompts import BUILTIN_MODEL_DIR, load_prompts


def transformers_tps(hf, ids_list, max_tokens):
    n, t0 = 0, time.perf_counter()
    for ids in ids_list:
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids], device=hf.device), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=0)
        n += out.shape[1] - len(ids)
    return n / (time.perf_counter() - t0)


def native_point(backend, cfg, prompts, mode, k, L, target_step_s=None):
    point = GridPoint(mode, k, L)
    run = backend.run_point(cfg, point, prompts)
    return summarize("native", point, "all", run.requests, run.batches, None, target_step_s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import Qwen2ForCausalLM

    cfg = SweepConfig(num_prompts=args.prompts, max_tokens=args.max_tokens, device=args.device)
    prompts = load_prompts("builtin", args.prompts)
    backend = NativeBackend()
    backend.start(cfg)
    ids = backend.encode(prompts)
    hf = Qwen2ForCausalLM.from_pretrained(str(BUILTIN_MODEL_DIR), dtype=torch.float32).eval().to(args.device)
    transformers_tps(hf, ids[:1], 8)  # warm-up

    native, theirs = [], []
    for _ in range(args.repeats):
        native.append(native_point(backend, cfg, prompts, "plain", 0, 0).output_tokens_per_sec)
        theirs.append(transformers_tps(hf, ids, args.max_tokens))
    n_med, t_med = statistics.median(native), statistics.median(theirs)
    print(f"plain decode, batch 1, {args.prompts} prompts x {args.max_tokens} tokens, torch threads "
          f"{torch.get_num_threads()}")
    print(f"CPU: {cpu_summary()}")  # ratios between engines move with the CPU: quote it beside them
    print(f"  native        {n_med:8.1f} tok/s   samples {[round(x, 1) for x in native]}")
    print(f"  transformers  {t_med:8.1f} tok/s   samples {[round(x, 1) for x in theirs]}")
    print(f"  RATIO native/transformers = {n_med / t_med:.2f}   (target >= 1.5)")

    print("\nspeculative decoding (speedup vs k=0 measured in the same repeat)")
    rows = []
    for mode in ("reuse", "chain"):
        for k in (1, 2, 3, 4):
            speed, theory = [], []
            for _ in range(args.repeats):
                plain = backend.run_point(cfg, GridPoint("plain", 0, 0), prompts)
                base = summarize("native", GridPoint("plain", 0, 0), "all", plain.requests, plain.batches, None)
                step = mean_call_s(plain.batches, "target")  # c = draft call / target decode step
                r = native_point(backend, cfg, prompts, mode, k, 3, step)
                base = base.output_tokens_per_sec
                speed.append(r.output_tokens_per_sec / base)
                theory.append(r.theoretical_speedup)
            s, t = statistics.median(speed), statistics.median(theory)
            rows.append((s, t, mode, k, r))
            print(f"  {mode:5s} k={k}  AL {r.acceptance_length:.3f}  alpha {r.alpha:.3f}  c {r.draft_cost_ratio:.3f}"
                  f"  speedup {s:.3f}  theoretical {t:.3f}  ratio {s / t:.3f}")
    s, t, mode, k, _ = max(rows, key=lambda x: x[0])
    print(f"  best k: {mode} k={k}  RATIO measured/theoretical speedup = {s / t:.2f}   (target >= 0.85)")


if __name__ == "__main__":
    main()
