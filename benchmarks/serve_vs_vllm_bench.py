"""mtpbench's served measurement vs ``vllm bench serve``, side by side against one server in one run.

Starts one vLLM server (the CPU build here; MTP with k drafts over L layers of the built-in checkpoint),
then alternates (ABBA order), ``--repeats`` times each: mtpbench's load generator (``--server URL``) and vLLM's own
``vllm bench serve`` (``vllm.benchmarks.serve.main``, the code behind the command) on the same prompts,
output length, concurrency and request rate. Prints per side the median output tokens/s over the window
and the acceptance length from /metrics, then the ratios mtpbench / vllm bench serve (target: AL equal,
tokens/s within 5 %), and the load generator's own cost:

* client CPU per request, from the process CPU time of each side's measured call;
* the client's ceiling: mtpbench's load generator against a null server (a local aiohttp app that streams
  the same number of chunks at once), in requests/s and tokens/s at the same concurrency;
* a client-only control: both clients, alternated, against a stand-in engine (a local aiohttp app that runs
  one "step" every ``--step-ms``, with at most ``--concurrency`` requests in its batch, and gives each
  running request 1 to 3 tokens per step, drawn from a hash of its prompt and step). Its work is the same
  whichever client asks, so its ratio shows whether the two clients' windows (start, end, the concurrency
  gate, stream parsing, token counts) agree, apart from the real server's noise.

Both sides define output tokens/s alike: the completion tokens of the window's requests (the usage block)
over the time from before the first request is released to after the last completes (mtpbench
``loadgen._run``; vLLM ``benchmarks/serve.py``, ``benchmark_start_time`` .. ``benchmark_duration``).
The CPU is printed with the figures: timing ratios move with it.

Needs pandas (vLLM's ``bench`` extra, for its custom dataset): pip install pandas
Usage: python benchmarks/serve_vs_vllm_bench.py [--prompts 16] [--max-tokens 128] [--concurrency 4]
       [--k 2] [--mtp-layers 2] [--repeats 3] [--eager] [--step-ms 17]
"""

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from mtpbench.checkpoint import derived_checkpoint
from mtpbench.backends.vllm_server import (VllmServerBackend, free_port, probe, server_args, server_command,
                                           server_env, wait_healthy)
from mtpbench.config import SweepConfig
from mtpbench.environment import cpu_summary
from mtpbench.loadgen import run_load
from mtpbench.metrics import GridPoint, summarize
from mtpbench.procguard import Guarded
from mtpbench.prompts import BUILTIN_MODEL_DIR, Prompt, load_prompts

NULL_SERVER = r"""
import asyncio, json, sys
from aiohttp import web
chunks = int(sys.argv[2])
async def completions(request):
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(chunks):
        c = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
        await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
    u = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": chunks}}
    await resp.write(b"data: " + json.dumps(u).encode() + b"\n\ndata: [DONE]\n\n")
    return resp
app = web.Application()
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""

STEP_SERVER = r"""
import asyncio, json, sys, zlib
from aiohttp import web
STEP, BATCH = float(sys.argv[2]), int(sys.argv[3])
waiting, running = [], []
async def engine():
    loop = asyncio.get_running_loop()
    t = loop.time()
    while True:
        t += STEP
        await asyncio.sleep(max(0.0, t - loop.time()))
        while waiting and len(running) < BATCH:
            running.append(waiting.pop(0))
        for r in list(running):
            n = 1 if r["steps"] == 0 else 1 + zlib.crc32(f"{r['prompt']}|{r['steps']}".encode()) % 3
            n = min(n, r["max"] - r["done"])
            r["steps"], r["done"] = r["steps"] + 1, r["done"] + n
            r["q"].put_nowait(n)
            if r["done"] >= r["max"]:
                running.remove(r)
                r["q"].put_nowait(None)
async def completions(request):
    body = await request.json()
    r = {"prompt": body["prompt"], "max": body["max_tokens"], "done": 0, "steps": 0, "q": asyncio.Queue()}
    waiting.append(r)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    while (n := await r["q"].get()) is not None:
        c = {"choices": [{"index": 0, "text": "x" * n, "token_ids": [7] * n}]}
        await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
    u = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": r["max"]}}
    await resp.write(b"data: " + json.dumps(u).encode() + b"\n\ndata: [DONE]\n\n")
    return resp
async def start(app):
    app["engine"] = asyncio.create_task(engine())
app = web.Application()
app.on_startup.append(start)
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def vllm_bench(url: str, model: str, tokenizer: str, dataset: Path, args) -> tuple[dict, float]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    ns = parser.parse_args(["--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
                            "--dataset-name", "custom", "--dataset-path", str(dataset), "--disable-shuffle",
                            "--skip-chat-template", "--custom-output-len", str(args.max_tokens),
                            "--num-prompts", str(args.prompts), "--max-concurrency", str(args.concurrency),
                            "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
                            "--disable-tqdm", "--seed", "0"])
    cpu0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        result = main(ns)
    return result, time.process_time() - cpu0


def null_ceiling(prompts: list[Prompt], args) -> tuple[float, float, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", NULL_SERVER, str(port), str(args.max_tokens)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # until the null server answers
            if not run_load(url, "null", prompts[:1], max_tokens=args.max_tokens).errors:
                break
            time.sleep(0.1)
        many = (prompts * 8)[: 8 * len(prompts)]
        r = run_load(url, "null", many, max_tokens=args.max_tokens, concurrency=args.concurrency)
        return len(many) / r.wall_s, sum(len(q.output_token_ids) for q in r.requests) / r.wall_s, \
            r.client_cpu_s / len(many)
    finally:
        proc.terminate()
        proc.wait()


def _wait_for(url: str, prompts: list[Prompt]) -> None:
    for _ in range(100):  # until the local server answers
        if not run_load(url, "null", prompts[:1], max_tokens=2).errors:
            return
        time.sleep(0.1)


def client_only(prompts: list[Prompt], dataset: Path, args) -> tuple[list[float], list[float]]:
    """Output tokens/s of both clients, ABBA-alternated, against the stand-in engine (STEP_SERVER)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", STEP_SERVER, str(port), str(args.step_ms / 1e3),
                             str(args.concurrency)])
    ours, theirs = [], []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for(url, prompts)
        for i in range(args.repeats):
            for side in ("mtpbench", "vllm") if i % 2 == 0 else ("vllm", "mtpbench"):
                if side == "mtpbench":
                    r = run_load(url, "null", prompts, max_tokens=args.max_tokens, concurrency=args.concurrency)
                    ours.append(sum(len(q.output_token_ids) for q in r.requests) / r.wall_s)
                else:
                    theirs.append(vllm_bench(url, "null", str(BUILTIN_MODEL_DIR), dataset, args)[0]["output_throughput"])
        return ours, theirs
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--mtp-layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile at start)")
    ap.add_argument("--step-ms", type=float, default=17.0, help="the stand-in engine's step (client-only control)")
    args = ap.parse_args()

    prompts = load_prompts("builtin", args.prompts)
    tmp = Path(tempfile.mkdtemp(prefix="mtpbench-serve-bench-"))
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts))
    cfg = SweepConfig(backend="vllm-server", max_model_len=1024, num_prompts=args.prompts,
                      max_tokens=args.max_tokens, concurrency=(args.concurrency,),
                      engine_args={"enforce_eager": True} if args.eager else {})
    model = derived_checkpoint(BUILTIN_MODEL_DIR, args.mtp_layers)
    port = free_port()
    guard = Guarded(server_command(server_args(cfg, str(model), args.k), port), tmp / "server.log",
                    env=server_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, guard.running, 600)
        served_model = probe(url)["model"]
        attached = replace(cfg, server=url, k=())
        backend = VllmServerBackend()
        backend.start(attached)
        point = GridPoint("vllm", args.k, None, args.concurrency)
        ours, theirs = [], []
        def mtpbench_once():
            run = backend.run_point(attached, point, prompts)
            row = summarize("vllm-server", point, "all", run.requests, run.batches, None)
            ours.append((row.output_tokens_per_sec, row.acceptance_length, run.batches[0].client_cpu_s / len(prompts)))

        def vllm_bench_once():
            result, cpu = vllm_bench(url, served_model, str(model), dataset, args)
            theirs.append((result["output_throughput"], result.get("spec_decode_acceptance_length"),
                           cpu / result["completed"]))

        # alternate in ABBA order, so drift on this shared machine and going first hit both sides alike
        for i in range(args.repeats):
            for once in ((mtpbench_once, vllm_bench_once) if i % 2 == 0 else (vllm_bench_once, mtpbench_once)):
                once()
    finally:
        guard.stop()
    ceiling = null_ceiling(prompts, args)
    ctl_ours, ctl_theirs = client_only(prompts, dataset, args)

    med = lambda rows, i: statistics.median(r[i] for r in rows)  # noqa: E731
    print(f"CPU: {cpu_summary()}, {os.cpu_count()} logical CPUs")
    print(f"built-in model, L={args.mtp_layers} MTP layers, k={args.k}, {args.prompts} prompts x {args.max_tokens} "
          f"tokens, concurrency {args.concurrency}, greedy, {args.repeats} ABBA-alternated repeats; "
          f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE', '1 (set by mtpbench)')}, "
          f"eager={args.eager}")
    print(f"{'':22}{'tok/s runs':>34}{'median tok/s':>14}{'AL':>8}{'client CPU ms/req':>19}")
    for name, rows in (("mtpbench", ours), ("vllm bench serve", theirs)):
        print(f"{name:22}{' '.join(f'{r[0]:.1f}' for r in rows):>34}{med(rows, 0):>14.1f}"
              f"{med(rows, 1):>8.3f}{med(rows, 2) * 1e3:>19.2f}")
    print(f"RATIO mtpbench / vllm bench serve, output tokens/s (median): {med(ours, 0) / med(theirs, 0):.3f}")
    print(f"RATIO mtpbench / vllm bench serve, acceptance length: {med(ours, 1) / med(theirs, 1):.4f}")
    print(f"RATIO client-only control, against a stand-in engine ({args.step_ms:g} ms steps): "
          f"{statistics.median(ctl_ours) / statistics.median(ctl_theirs):.3f} "
          f"(mtpbench {' '.join(f'{x:.1f}' for x in ctl_ours)}; vllm bench serve {' '.join(f'{x:.1f}' for x in ctl_theirs)} tok/s)")
    print(f"load generator overhead: {med(ours, 2) * 1e3:.2f} ms CPU per request "
          f"({med(ours, 2) * 1e3 / args.max_tokens:.3f} ms per output token); ceiling against a null server at "
          f"concurrency {args.concurrency}: {ceiling[0]:.0f} requests/s, {ceiling[1]:.0f} tokens/s "
          f"({ceiling[2] * 1e3:.2f} ms CPU per request)")


if __name__ == "__main__":
    main()
