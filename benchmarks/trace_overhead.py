"""Cost of layer tracing on the vLLM CPU backend: tokens/sec with the tracer on vs off, one engine, one run.

Both arms run eager (enforce_eager=True, which tracing needs). The arms alternate over several repeats
on the same engine and prompts; the ratio of medians is printed (target: tracing under 5 % slower).
Usage: python benchmarks/trace_overhead.py [--k 2] [--mtp-layers 3] [--prompts 4] [--max-tokens 96] [--repeats 5]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from mtpbench.environment import cpu_summary  # noqa: E402  (after the vLLM settings above)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--mtp-layers", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from vllm import LLM, SamplingParams

    from mtpbench.backends.vllm import engine_models
    from mtpbench.checkpoint import derived_checkpoint
    from mtpbench.prompts import BUILTIN_MODEL_DIR, load_prompts
    from mtpbench.trace.hooks import LayerTracer

    model = derived_checkpoint(BUILTIN_MODEL_DIR, args.mtp_layers)
    llm = LLM(model=str(model), dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
              speculative_config={"method": "mtp", "num_speculative_tokens": args.k})
    prompts = [p.text for p in load_prompts("builtin", args.prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    draft, target = engine_models(llm)

    def tps():
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)

    off, on, calls = [], [], 0
    for _ in range(args.repeats):
        off.append(tps())
        tracer = LayerTracer(draft, target).install()
        tracer.enabled = True
        on.append(tps())
        calls += len(tracer.records)
        tracer.remove()
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"vLLM CPU, eager, k={args.k}, {args.mtp_layers} MTP layers, {args.prompts} prompts x {args.max_tokens} tokens")
    print(f"CPU: {cpu_summary()}")  # vLLM's CPU kernels differ with AMX / AVX-512 BF16: quote it beside the ratio
    print(f"  tracing off {m_off:8.1f} tok/s  samples {[round(x, 1) for x in off]}")
    print(f"  tracing on  {m_on:8.1f} tok/s  samples {[round(x, 1) for x in on]}  ({calls} draft calls traced)")
    print(f"  RATIO on/off = {m_on / m_off:.3f}  -> tracing is {(1 - m_on / m_off):.1%} slower   (target < 5 %)")


if __name__ == "__main__":
    main()
