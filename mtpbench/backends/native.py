"""The native backend: our own PyTorch MTP engine on a MiMo-format checkpoint, CPU or CUDA.

The model is loaded once per sweep. Each point gets one warm-up generation, then every batch is timed
around the engine's per-round iterator (device synchronized before each clock read).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from mtpbench.backends import BackendBase
from mtpbench.config import SweepConfig
from mtpbench.engine import Faults, Generation
from mtpbench.errors import MtpBenchError
from mtpbench.metrics import BatchRecord, GridPoint, PointRun, RequestRecord
from mtpbench.prompts import Prompt, batches, load_tokenizer, token_ids  # noqa: F401 (load_tokenizer re-exported)
from mtpbench.scoring import max_abs_change

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dtype(name: str, model_dir) -> torch.dtype:
    """``auto`` is the checkpoint's own dtype (config.json ``torch_dtype``/``dtype``), as in vLLM."""
    if name != "auto":
        return DTYPES[name]
    from mtpbench.checkpoint import read_config

    cfg = read_config(model_dir)
    declared = cfg.get("torch_dtype") or cfg.get("dtype") or (cfg.get("text_config") or {}).get("torch_dtype")
    return DTYPES.get(str(declared).removeprefix("torch."), torch.float32)


def resolve_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtpBenchError(f"--device {name}: CUDA is not available on this machine")
    try:
        return torch.device(name)
    except RuntimeError:
        raise MtpBenchError(f"unknown device {name!r}") from None


class NativeBackend(BackendBase):
    name = "native"

    def __init__(self):
        self.model = self.tokenizer = None
        self.faults = Faults()

    def start(self, cfg: SweepConfig) -> dict:
        from mtpbench.model import load_model

        t0 = time.perf_counter()
        self.device = resolve_device(cfg.device)
        self.tokenizer = load_tokenizer(cfg.model_dir)
        self.dtype = model_dtype(cfg.dtype, cfg.model_dir)
        self.model = load_model(cfg.model_dir, self.device, self.dtype)
        self.dtype_name = str(self.dtype).removeprefix("torch.")  # check-lossless's numerical floor
        self.startup_s = time.perf_counter() - t0
        a = self.model.args
        return {"engine": "mtpbench-native", "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "num_mtp_layers_in_checkpoint": a.num_nextn_predict_layers,
                "num_parameters": sum(p.numel() for p in self.model.parameters()),
                "torch": torch.__version__, "startup_s": round(self.startup_s, 3)}

    def encode(self, prompts: list[Prompt]) -> list[list[int]]:
        return token_ids(self.tokenizer, prompts)

    def generation(self, cfg: SweepConfig, ids, k, mode, mtp_layers, max_tokens, record_law=False) -> Generation:
        torch.manual_seed(cfg.seed)
        return Generation(self.model, ids, max_tokens, k, mode=mode, num_mtp_layers=mtp_layers,
                          temperature=cfg.temperature, seed=cfg.seed, faults=self.faults,
                          force_spec_step_idx=cfg.force_spec_step_idx, top_p=cfg.top_p, top_k=cfg.top_k,
                          record_law=record_law)

    # ---- check-lossless (lossless.CheckBackend) -----------------------------------------------------------

    def check_facts(self) -> dict:
        return {"torch_threads": torch.get_num_threads()}  # native speed hangs on it (docs/check-lossless.md)

    def plant_faults(self, **switches) -> None:
        self.faults = replace(self.faults, **switches)

    def sample_arm(self, cfg: SweepConfig, ids: list[list[int]], k: int, seed: int, n: int, temperature: float,
                   max_tokens: int, speculative_overrides: dict | None = None,
                   batch_size: int | None = None) -> list[list[list[int]]]:
        """Per prompt, ``n`` continuations at k: the prompts' rows repeated n times (prompt 0's first),
        generated ``batch_size`` rows at a time with the arm's seed (``cfg.mode``, the config's MTP layers).
        The arm's spec-decode counters are kept in ``last_counters``, a drafting arm's verify steps against their
        law (acceptance against its exact law, check-lossless's third test) in ``last_law``."""
        if speculative_overrides:
            raise MtpBenchError("speculative overrides are vLLM's speculative_config: the native engine has none")
        c = replace(cfg, seed=seed, temperature=temperature)
        layers = c.mtp_layers[0] if c.mtp_layers else c.num_mtp_layers()
        rows = [p for p in ids for _ in range(n)]
        bs = batch_size or c.batch_size
        out, counts, law = [], [], []
        for chunk, i in enumerate(range(0, len(rows), bs)):
            # a seed of its own per chunk: the arm's seed in every chunk would give the rows at one place in
            # their chunks the same random stream (duplicate continuations once n > batch, and prompts that
            # share draws across chunks, which the permutation test assumes independent)
            seed_c = int(np.random.SeedSequence([seed, chunk]).generate_state(1)[0])
            g = self.generation(replace(c, seed=seed_c), rows[i: i + bs], k, c.mode[0], layers, max_tokens,
                                record_law=k > 0)
            for _ in g:
                pass
            out += [t[:max_tokens] for t in g.tokens]
            counts += g.counts
            law += g.law_steps
        self.last_counters = {"num_drafts": sum(x.num_drafts for x in counts),
                              "num_draft_tokens": sum(x.num_draft_tokens for x in counts),
                              "num_accepted_tokens": sum(x.num_accepted_tokens for x in counts),
                              "num_accepted_tokens_per_pos": [sum(x.num_accepted_tokens_per_pos[j] for x in counts)
                                                              for j in range(k)]}
        self.last_law = {"observable": True, "steps": law} if k > 0 else None
        return [out[j * n: (j + 1) * n] for j in range(len(ids))]

    def logprob_noise(self, ids: list[list[int]], continuations: list[list[int]]) -> float:
        """The largest |change| of a teacher-forced T = 1 log-prob between every row scored together and each
        row alone (padding and batch shape change the kernels' order of summation)."""
        together = self.target_logprobs(ids, continuations, 1.0)
        alone = [self.target_logprobs([p], [c], 1.0)[0] for p, c in zip(ids, continuations)]
        return max_abs_change(together, alone)

    def target_logprobs(self, ids: list[list[int]], continuations: list[list[int]],
                        temperature: float) -> list[list[float]]:
        """Each continuation token's log-probability under the target at ``temperature``, from the engine's
        own teacher-forced k = 0 pass (the planted ``faults`` act on drafting only, never on this pass)."""
        from mtpbench.engine import target_logprobs

        return target_logprobs(self.model, ids, continuations, temperature)

    def target_moments(self, ids: list[list[int]], continuations: list[list[int]],
                       temperature: float) -> list[list[tuple[float, float, float]]]:
        """``target_logprobs`` with each position's entropy and variance of log p under the target's law at
        ``temperature`` (the one-sample test): one (log p, H, Var) per token, from the same teacher-forced pass."""
        from mtpbench.engine import target_moments

        return target_moments(self.model, ids, continuations, temperature)

    def greedy_divergences(self, ids: list[list[int]], k0: list[list[int]], spec: list[list[int]]):
        """Per prompt, the first token where ``spec`` leaves ``k0``, with the target's top-two logit margin
        there (``scoring.Divergence``), or None when they agree."""
        from mtpbench.engine import greedy_divergences

        return greedy_divergences(self.model, ids, k0, spec)

    def trace_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt]) -> dict:
        """One traced generation over the prompts (one batch at a time); see mtpbench.trace.run."""
        from mtpbench.trace.hooks import LayerTracer

        records, crash, in_draft, law = [], None, False, []
        totals = {"num_drafts": 0, "num_accepted_tokens_per_pos": [0] * k}
        tracer = None
        for i, group in enumerate(batches(prompts, cfg.batch_size)):
            g = self.generation(cfg, self.encode(group), k, mode, mtp_layers, cfg.max_tokens, record_law=True)
            proposal = tracer.proposal if tracer else 0
            tracer = LayerTracer(g.drafter, g.target).install()  # each Generation has its own drafter
            tracer.batch, tracer.proposal, tracer.enabled = i + 1, proposal, True
            try:
                for _ in g:
                    pass
            except Exception as e:  # the model refused (a finding), or the engine failed: the tracer knows which
                crash = f"{type(e).__name__}: {e}"
                in_draft = tracer.draft_error is not None
            finally:
                tracer.remove()
            for r in tracer.records:  # the engine itself passes the step under --force-spec-step-idx
                r.forced = cfg.force_spec_step_idx and k > 0
            records += tracer.records
            law += g.law_steps  # acceptance against its law (issue 46)
            for c in g.counts:
                totals["num_drafts"] += c.num_drafts
                totals["num_accepted_tokens_per_pos"] = [a + b for a, b in zip(
                    totals["num_accepted_tokens_per_pos"], c.num_accepted_tokens_per_pos)]
            if crash:
                break
        st = tracer.structure
        return {"records": records, "crash": crash, "crash_in_draft": in_draft, "num_layers": len(st.layers),
                "structure": st.describe(), "law": {"observable": True, "steps": law},
                **totals}

    drafter_engine = "native"

    def drafter_point(self, cfg: SweepConfig, mode: str, k: int, mtp_layers: int, prompts: list[Prompt],
                      modules: dict, plant=None) -> dict:
        """check-drafter's capture: each prompt generated on its own (batch 1) with ``drafter.capture`` on the
        draft and target models; ``plant(generation)`` plants a wiring fault first and returns its undo
        (``drafter.faults``: tests, docs)."""
        from mtpbench.drafter.capture import DraftCapture

        calls, targets, sequences, totals = [], [], [], {"num_drafts": 0, "num_accepted_tokens_per_pos": [0] * k}
        for p in prompts:
            ids = self.encode([p])
            g = self.generation(cfg, ids, k, mode, mtp_layers, cfg.max_tokens)
            undo = plant(g) if plant is not None else None
            cap = DraftCapture(g.drafter, g.target, modules).install()
            cap.proposal, cap.enabled = len(targets), True
            try:
                for _ in g:
                    pass
            finally:
                cap.remove()
                if undo is not None:
                    undo()
            if cap.missing:
                raise MtpBenchError(f"the draft model has no module for {', '.join(cap.missing)}")
            calls += cap.calls
            targets += cap.targets
            sequences.append(ids[0] + g.tokens[0])
            totals["num_drafts"] += g.counts[0].num_drafts
            totals["num_accepted_tokens_per_pos"] = [a + b for a, b in zip(
                totals["num_accepted_tokens_per_pos"], g.counts[0].num_accepted_tokens_per_pos)]
        return {"calls": calls, "targets": targets, "sequences": sequences, "dtype": str(self.dtype).removeprefix(
            "torch."), "engine": "mtpbench-native", **totals}

    def run_point(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> PointRun:
        from mtpbench.telemetry import GpuSampler

        mode, k, mtp_layers = point.mode, point.k, point.mtp_layers
        groups = batches(prompts, cfg.batch_size)
        warm = self.encode(groups[0])
        for _ in self.generation(cfg, warm, k, mode, mtp_layers, min(16, cfg.max_tokens)):
            pass
        layers = self.model.model.mtp_layers[:mtp_layers] if k else []
        run = PointRun(startup_s=self.startup_s, engine={"engine": "mtpbench-native"},
                       mtp_weight_bytes=sum(t.numel() * t.element_size() for m in layers for t in m.parameters()))
        off = None if self.device.type == "cuda" else f"the native engine runs on the {self.device.type}"
        with GpuSampler(off=off) as tel:
            for _ in range(cfg.repeats):
                requests, records = [], []
                for group in groups:
                    requests += self._run_batch(cfg, records, group, k, mode, mtp_layers)
                run.add_repeat(requests, records)
        run.telemetry = tel.record
        return run

    def read_law(self, cfg: SweepConfig, point: GridPoint, prompts: list[Prompt]) -> dict:
        """sweep --law: one untimed pass over the point's prompts, batch by batch, with the engine's verify steps
        recorded against their law (a softmax over the vocabulary per step: never in a timed run). Each batch draws
        from a seed of its own derived from ``cfg.seed``: one seed for all would give every batch of one prompt the
        same uniform draws, correlated accept decisions the law's test does not allow for."""
        steps = []
        for i, group in enumerate(batches(prompts, cfg.batch_size)):
            seed = int(np.random.SeedSequence([cfg.seed, i]).generate_state(1)[0])
            g = self.generation(replace(cfg, seed=seed), self.encode(group), point.k, point.mode, point.mtp_layers,
                                cfg.max_tokens, record_law=True)
            for _ in g:
                pass
            steps += g.law_steps
        return {"observable": True, "steps": steps}

    def _run_batch(self, cfg: SweepConfig, records: list[BatchRecord], group: list[Prompt], k: int, mode: str,
                   mtp_layers: int) -> list[RequestRecord]:
        """Time one batch round by round: first token, token deliveries (ITL) and last token per row."""
        ids = self.encode(group)
        g = self.generation(cfg, ids, k, mode, mtp_layers, cfg.max_tokens)
        ttft, done = [None] * len(ids), [None] * len(ids)
        last, itl = [None] * len(ids), [[] for _ in ids]
        seen = [0] * len(ids)
        clock = g._clock
        t0 = clock()
        for _ in g:
            now = clock()
            for b, toks in enumerate(g.tokens):
                if len(toks) > seen[b] and done[b] is None:
                    if last[b] is None:
                        ttft[b] = now - t0
                    else:
                        itl[b].append(now - last[b])
                    last[b], seen[b] = now, len(toks)
                if done[b] is None and len(toks) >= cfg.max_tokens:
                    done[b] = now - t0
        wall = clock() - t0
        c = g.counts
        records.append(BatchRecord(
            group[0].category, wall,
            num_drafts=sum(x.num_drafts for x in c), num_draft_tokens=sum(x.num_draft_tokens for x in c),
            num_accepted_tokens=sum(x.num_accepted_tokens for x in c),
            num_accepted_tokens_per_pos=[sum(x.num_accepted_tokens_per_pos[i] for x in c) for i in range(k)],
            draft_time_s=g.draft_time_s, num_draft_calls=g.num_draft_calls,
            target_time_s=g.target_time_s, num_target_calls=g.num_target_calls))
        return [RequestRecord(p.category, len(ids[b]), g.tokens[b], ttft[b], done[b] if done[b] is not None else wall,
                              itl[b], num_drafts=c[b].num_drafts, num_draft_tokens=c[b].num_draft_tokens,
                              num_accepted_tokens=c[b].num_accepted_tokens,
                              num_accepted_tokens_per_pos=list(c[b].num_accepted_tokens_per_pos),
                              draft_steps=[list(x) for x in c[b].steps], prompt_id=p.id,
                              context_tokens=p.context_tokens)
                for b, p in enumerate(group)]

    def close(self) -> None:
        pass
