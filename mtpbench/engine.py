"""The native MTP speculative-decoding loop (pure PyTorch, CPU or CUDA).

One round = k draft-model calls (draft step s = 0..k-1) then one target forward over k+1 positions
that verifies the drafts: greedy acceptance at temperature 0, standard rejection sampling above 0 (the
output distribution equals the target's). k = 0 is plain decoding.

Drafting geometry is vLLM's: at draft step s the MTP model works at position q = n-2+s (n = known
tokens), reading token x[q+1] and the previous hidden state, and predicts x[q+2]. Two modes:

* ``reuse``: every step runs MTP layer 0, fed its own previous output; the loop never passes
  ``spec_step_idx`` (what vLLM's proposer does today).
* ``chain``: step s passes ``spec_step_idx = s`` and runs layer s mod L, each layer with its own KV cache
  (DeepSeek-V3's chained MTP). Layer j at slot q reads layer j-1's output at slot q-1, so at step s the
  layer first catches up the slots it has not seen with final inputs, then the provisional ones.

``force_spec_step_idx`` (the vLLM pull request's proposal) keeps reuse's data flow but passes
``spec_step_idx = s``, so step s runs layer s mod L on its own KV cache, which holds only the positions
that layer wrote at its own steps: the same gap vLLM's per-layer caches would have. It is an experiment
to measure, not a drafting mode to recommend.

Every row keeps its own counters in vLLM's words (``num_drafts``, ``num_draft_tokens``,
``num_accepted_tokens``, ``num_accepted_tokens_per_pos``). ``Generation`` is iterated once per round,
so a benchmark can time around each step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mtpbench.config import MODES
from mtpbench.model import KVCache, MiMoModel
from mtpbench.sampling import draw, probs, verify  # noqa: F401 (verify: the engine's verify step)
from mtpbench.scoring import Divergence, check_score_args, divergence_points, first_divergence, top_two_margin  # noqa: F401


@dataclass
class Counts:
    """Per-sequence spec-decode counters, as vLLM's SpecDecodingStats."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # (sequence length when the drafts were verified, drafts accepted), one per verify step
    steps: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Faults:
    """Test-only switches: two reproduce the bugs the vLLM pull request described, two plant lossy
    verification rules as known-positive controls for ``check-lossless`` (a crude one and a subtle one).

    ``accept_draft_argmax`` accepts a sampled draft whenever it is the drafter's own argmax, skipping the
    probability ratio min(1, p/q); other drafts keep the standard rule. Where the drafter's top token has
    p < q that token is over-produced, so the output law is no longer the target's. It acts only at
    temperature > 0: at temperature 0 every draft is the drafter's argmax, and greedy verification, which
    accepts a draft only when it is the target's argmax, is left exact (the switch then changes nothing).
    """

    wrapper_drops_spec_step_idx: bool = False  # the wrapper takes the index and never forwards it
    loop_omits_spec_step_idx: bool = False  # the proposer never passes the index
    accept_draft_argmax: bool = False  # lossy on purpose: a draft that is q's argmax is always accepted
    # lossy on purpose, and subtler: the acceptance ratio min(1, p/q) takes p at temperature T x this factor
    # (the residual max(0, p - q) and the bonus token keep p at T), e.g. a temperature applied twice or once
    # too few; 1.0: the correct rule. At 0.95 on the built-in model it moves each drafted token's law by 0.019
    # in total variation (accept_draft_argmax: 0.11) and its mean target log-prob by +0.08 nats
    ratio_temperature_factor: float = 1.0
    # lossy on purpose, for the acceptance-law test (issue 46): the ratio taken to this power, (p/q)^power (0.5: a
    # square root, which accepts more where p < q); 1.0: the correct rule
    ratio_power: float = 1.0
    # lossy on purpose, at one draft position only: a draft the ratio rejects there is accepted anyway with
    # probability ``over_accept_share``; -1: no position
    over_accept_position: int = -1
    over_accept_share: float = 0.25


class Generation:
    """Iterate to run; each iteration is one decode round and yields the new tokens of every row."""

    def __init__(self, model: MiMoModel, prompts: list[list[int]], max_tokens: int, k: int,
                 mode: str = "reuse", num_mtp_layers: int | None = None, temperature: float = 0.0,
                 seed: int = 0, faults: Faults | None = None, force_spec_step_idx: bool = False,
                 top_p: float = 1.0, top_k: int = 0, record_law: bool = False):
        if k > 0 and mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        a = model.args
        L = a.num_nextn_predict_layers if num_mtp_layers is None else num_mtp_layers
        self.model, self.target = model, model.target
        self.drafter = model.drafter(L)
        self.faults = faults or Faults()
        self.drafter.drop_spec_step_idx = self.faults.wrapper_drops_spec_step_idx
        self.prompts, self.max_tokens, self.k, self.mode = prompts, max_tokens, k, mode
        self.temperature, self.force = temperature, force_spec_step_idx
        self.top_k, self.top_p = top_k, top_p  # the target's law only, as vLLM's (mtpbench.sampling)
        # layers the data flow cycles through: reuse feeds layer 0 its own output
        self.L = 0 if k == 0 else (1 if mode == "reuse" else min(k, L))
        dev = next(model.parameters()).device
        self.gen = torch.Generator(device=dev).manual_seed(seed) if temperature > 0 else None
        B = len(prompts)
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.counts = [Counts(num_accepted_tokens_per_pos=[0] * k) for _ in range(B)]
        self.dev, self.dtype = dev, next(model.parameters()).dtype
        self.maxlen = max(map(len, prompts)) + max_tokens + 4 * k + 8
        # summed wall time of draft-model calls and of target calls (verify forwards; decode steps at
        # k = 0), for the cost ratio c
        self.draft_time_s = self.target_time_s = 0.0
        self.num_draft_calls = self.num_target_calls = 0
        # with record_law, every draft position a verify step reached (its earlier drafts accepted): (row, position,
        # accepted, the law's acceptance probability, sum min(p, q), p at q's argmax) (issue 46; stats.acceptance);
        # off by default: a timed run does none of that work in its verify steps
        self.record_law = record_law
        self.law_steps: list[tuple] = []

    def _clock(self) -> float:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return time.perf_counter()

    def _caches(self, n: int) -> list[KVCache]:
        a, B = self.model.args, len(self.prompts)
        return [KVCache(B, a.num_key_value_heads, self.maxlen, a.head_dim, self.dev, self.dtype)
                for _ in range(n)]

    def _pick(self, logits: torch.Tensor, draft: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.temperature <= 0:
            return logits.argmax(-1), None
        p = probs(logits, self.temperature) if draft else probs(logits, self.temperature, self.top_k, self.top_p)
        return draw(p, self.gen), p

    @torch.inference_mode()
    def __iter__(self):
        B, k, dev = len(self.prompts), self.k, self.dev
        rows = torch.arange(B, device=dev)
        X, Ht, tcache, n, first = self._prefill(rows)
        self._emit(first)
        yield first

        dcache = self._caches(self.drafter.model.num_mtp_layers) if k else []
        # each active layer's output by slot: what the next layer (or step) reads at slot - 1
        layer_out = (torch.zeros(self.L, B, self.maxlen, self.model.args.hidden_size, device=dev, dtype=self.dtype)
                     if k else None)
        committed = torch.zeros(B, dtype=torch.long, device=dev)  # drafter slots < this are final
        while True:
            active = torch.tensor([len(t) < self.max_tokens for t in self.tokens], device=dev)
            if not bool(active.any()):
                return
            if k == 0:
                n, new = self._decode_step(X, tcache, n, active, rows)
            else:
                drafts, qprobs = self._draft(X, Ht, layer_out, dcache, n, committed)
                committed = n - 1
                new = self._verify_round(X, Ht, tcache, n, active, drafts, qprobs, rows)
            self._emit(new)
            yield new

    def _prefill(self, rows: torch.Tensor):
        """The prompts' target pass: the token buffer X, the target's hidden states Ht and KV caches, each row's
        known-token count n, and each row's first token."""
        a, B, dev = self.model.args, len(self.prompts), self.dev
        P = torch.tensor([len(p) for p in self.prompts], device=dev)
        X = torch.zeros(B, self.maxlen, dtype=torch.long, device=dev)
        for b, p in enumerate(self.prompts):
            X[b, : len(p)] = torch.tensor(p, device=dev)
        tcache = self._caches(a.num_hidden_layers)
        Ht = torch.zeros(B, self.maxlen, a.hidden_size, device=dev, dtype=self.dtype)
        # padded positions write junk that is overwritten before it is ever attended to
        T0 = int(P.max())
        h = self.target(X[:, :T0], torch.arange(T0, device=dev).expand(B, T0), tcache)
        Ht[:, :T0] = h
        x, _ = self._pick(self.target.compute_logits(h[rows, P - 1]))
        X[rows, P] = x
        return X, Ht, tcache, P + 1, [[t] for t in x.tolist()]

    def _decode_step(self, X, tcache, n, active, rows):
        """k = 0: one target decode step; returns the new n and each row's new token (none for finished rows)."""
        t0 = self._clock()
        q = (n - 1)[:, None]
        h = self.target(X[rows[:, None], q], q, tcache)
        x, _ = self._pick(self.target.compute_logits(h[:, 0]))
        self.target_time_s += self._clock() - t0
        self.num_target_calls += 1
        X[rows, n] = torch.where(active, x, X[rows, n])
        return n + active.long(), [[t] if act else [] for t, act in zip(x.tolist(), active.tolist())]

    def _verify_round(self, X, Ht, tcache, n, active, drafts, qprobs, rows) -> list[list[int]]:
        """The target's forward over x[n-1] and the k drafts, then per active row: the accepted drafts and the
        bonus token written to X, its counters, n advanced (in place). Returns each row's new tokens."""
        k = self.k
        t0 = self._clock()
        # verify: x[n-1], d_1..d_k at positions n-1 .. n-1+k
        vpos = (n - 1)[:, None] + torch.arange(k + 1, device=self.dev)
        h = self.target(X[rows[:, None], vpos], vpos, tcache)
        Ht[rows[:, None], vpos] = h
        logits = self.target.compute_logits(h)
        law: dict | None = {} if self.record_law else None
        accepted, bonus = verify(logits, drafts, qprobs, self.temperature, self.gen, self.faults, self.top_k,
                                 self.top_p, law)
        self.target_time_s += self._clock() - t0
        self.num_target_calls += 1
        new = []
        for b in range(len(self.prompts)):
            if not active[b]:
                new.append([])
                continue
            nb, ab = int(n[b]), int(accepted[b])
            X[b, nb + ab] = bonus[b]
            c = self.counts[b]
            c.num_drafts += 1
            c.num_draft_tokens += k
            c.num_accepted_tokens += ab
            for i in range(ab):
                c.num_accepted_tokens_per_pos[i] += 1
            c.steps.append((nb, ab))
            if law is not None:
                self._law_steps(b, ab, law, nb, drafts[b].tolist())
            new.append(X[b, nb: nb + ab + 1].tolist())
            n[b] = nb + ab + 1
        return new

    def _law_steps(self, b: int, ab: int, law: dict, context: int, drafts: list[int]) -> None:
        """Row b's positions this verify step reached: every accepted draft and the first rejected one, as
        ``metrics.law``'s steps (the draft at position i has ``context`` + i tokens before it)."""
        cols = {key: law[key][b].tolist() for key in ("accepted", "probability", "probabilistic", "greedy")
                if key in law}
        for i in range(min(ab + 1, self.k)):
            self.law_steps.append((b, i, int(cols["accepted"][i]), cols["probability"][i],
                                   cols["probabilistic"][i] if "probabilistic" in cols else None,
                                   cols["greedy"][i] if "greedy" in cols else None, self.temperature,
                                   context + i, drafts[i]))

    def _emit(self, new: list[list[int]]) -> None:
        for b, t in enumerate(new):
            self.tokens[b].extend(t[: self.max_tokens - len(self.tokens[b])])

    def _draft(self, X, Ht, layer_out, dcache, n, committed):
        """k draft-model calls; returns drafts [B, k] and (when sampling) their probabilities."""
        B, k, L, dev = X.shape[0], self.k, self.L, X.device
        rows = torch.arange(B, device=dev)
        # first slot each layer has not written this round (layer j starts at slot j)
        frontier = [torch.clamp(committed, min=j) for j in range(L)]
        drafts, qprobs = [], []
        for s in range(k):
            t0 = self._clock()
            j = s % L  # the layer whose data flow this step follows
            start, end = frontier[j], n - 2 + s
            slots, tokens, prev = self._draft_inputs(X, Ht, layer_out[(j - 1) % L], j, start, end, n)
            # like vLLM's proposer, reuse never passes spec_step_idx; chain (and --force) pass the step
            passes = (self.mode == "chain" or self.force) and not self.faults.loop_omits_spec_step_idx
            idx = s if passes else 0
            if passes:
                out = self.drafter(tokens, slots, prev, spec_step_idx=idx, caches=dcache)
            else:
                out = self.drafter(tokens, slots, prev, caches=dcache)
            if B == 1:
                layer_out[j][:, int(slots[0, 0]): int(slots[0, -1]) + 1] = out
            else:
                layer_out[j][rows[:, None], slots] = out
            frontier[j] = end + 1
            last = out[rows, end - start]
            logits = (self.drafter.compute_logits(last, spec_step_idx=idx) if passes
                      else self.drafter.compute_logits(last))
            d, q = self._pick(logits, draft=True)
            X[rows, n + s] = d
            drafts.append(d)
            qprobs.append(q)
            self.draft_time_s += self._clock() - t0
            self.num_draft_calls += 1
        q = torch.stack(qprobs, 1) if self.temperature > 0 else None
        return torch.stack(drafts, 1), q

    def _draft_inputs(self, X, Ht, prev_out, j, start, end, n):
        """Slots [start, end] of layer j, their tokens x[q+1] and input hidden states.

        Layer 0 reads the target's hidden state at final slots (q <= n-2) and, past them, the previous
        step's output at q-1; layer j > 0 reads layer j-1's output at q-1.
        """
        B, dev = X.shape[0], X.device
        if B == 1:  # one row: contiguous slices instead of gathers (the batch-1 latency path)
            st, en, last_final = int(start[0]), int(end[0]), int(n[0]) - 2
            slots = torch.arange(st, en + 1, device=dev)[None]
            tokens = X[:, st + 1: en + 2]
            if j > 0 or st > last_final:
                prev = prev_out[:, st - 1: en]
            elif en <= last_final:
                prev = Ht[:, st: en + 1]
            else:
                prev = torch.cat([Ht[:, st: last_final + 1], prev_out[:, last_final: en]], 1)
            return slots, tokens, prev
        rows = torch.arange(B, device=dev)[:, None]
        T = int((end - start).max()) + 1
        # rows with fewer slots are padded past their end: those writes land beyond the row's frontier
        slots = (start[:, None] + torch.arange(T, device=dev)).clamp(max=self.maxlen - 2)
        tokens = X[rows, slots + 1]
        prev = prev_out[rows, (slots - 1).clamp(min=0)]
        if j == 0:
            final = (slots <= (n - 2)[:, None])[..., None]
            prev = torch.where(final, Ht[rows, slots], prev)
        return slots, tokens, prev


def generate(model: MiMoModel, prompts: list[list[int]], max_tokens: int, k: int = 0, **kw) -> Generation:
    """Run a whole generation; returns the finished ``Generation`` (``.tokens``, ``.counts``)."""
    g = Generation(model, prompts, max_tokens, k, **kw)
    for _ in g:
        pass
    return g


# -- teacher-forced k = 0 passes: scoring a finished generation under the target ---------------------------

@torch.inference_mode()
def target_logits(model: MiMoModel, prompts: list[list[int]], continuations: list[list[int]],
                  batch_size: int = 32) -> list[torch.Tensor]:
    """Per row, the target's logits [len(continuation), V] (float32) at the positions that predict each
    continuation token: a teacher-forced k = 0 pass over prompt + continuation, through the engine's own
    prefill path (KV caches addressed by absolute position, rows of a batch right-padded).

    Row i of the result scores ``continuations[i]`` under its own prefix; the drafter plays no part, so the
    scores do not depend on how the tokens were produced.
    """
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    if not all(prompts):
        raise ValueError("every prompt needs at least one token")
    target, a = model.target, model.args
    dev, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    out = []
    for i in range(0, len(prompts), batch_size):
        group = list(zip(prompts[i: i + batch_size], continuations[i: i + batch_size]))
        seqs = [list(p) + list(c[:-1]) for p, c in group]  # the last token is scored, never fed
        B, T = len(seqs), max(map(len, seqs))
        X = torch.zeros(B, T, dtype=torch.long, device=dev)
        for b, s in enumerate(seqs):
            X[b, : len(s)] = torch.tensor(s, device=dev)
        caches = [KVCache(B, a.num_key_value_heads, T, a.head_dim, dev, dtype) for _ in range(a.num_hidden_layers)]
        h = target(X, torch.arange(T, device=dev).expand(B, T), caches)
        for b, (p, c) in enumerate(group):
            out.append(target.compute_logits(h[b, len(p) - 1: len(p) - 1 + len(c)]).float())
    return out


def target_logprobs(model: MiMoModel, prompts: list[list[int]], continuations: list[list[int]],
                    temperature: float, batch_size: int = 32) -> list[list[float]]:
    """Per row, each continuation token's log-probability under the target at ``temperature``
    (log-softmax of logits / T, the law the engine samples from), from the teacher-forced k = 0 pass."""
    check_score_args(prompts, continuations, temperature)
    out = []
    for logits, c in zip(target_logits(model, prompts, continuations, batch_size), continuations):
        lp = torch.log_softmax(logits / temperature, -1)
        out.append(lp.gather(-1, torch.tensor(c, dtype=torch.long, device=lp.device)[:, None])[:, 0].tolist())
    return out


def law_moments(logprobs: torch.Tensor, tokens: torch.Tensor) -> list[tuple[float, float, float]]:
    """Per position of [T, V] log-probs of a law: (log p of the token, the entropy H, the variance of log p under
    the law), in float64 (check-lossless's one-sample test, ``stats.score_test``)."""
    lp = logprobs.double()
    p = lp.exp()
    plp = torch.where(p > 0, lp, torch.zeros_like(lp))  # 0 * log 0 = 0
    h = -(p * plp).sum(-1)
    var = (p * (plp + h[:, None]) ** 2).sum(-1)
    tok = lp.gather(-1, tokens[:, None].to(lp.device))[:, 0]
    return list(zip(tok.tolist(), h.tolist(), var.tolist()))


def target_moments(model: MiMoModel, prompts: list[list[int]], continuations: list[list[int]],
                   temperature: float, batch_size: int = 32) -> list[list[tuple[float, float, float]]]:
    """``target_logprobs`` with, at each position, the entropy of the target's law at ``temperature`` and the
    variance of log p under it: per row, one (log p, H, Var) per continuation token (``law_moments``)."""
    check_score_args(prompts, continuations, temperature)
    return [law_moments(torch.log_softmax(logits / temperature, -1), torch.tensor(c, dtype=torch.long))
            for logits, c in zip(target_logits(model, prompts, continuations, batch_size), continuations)]


def greedy_divergences(model: MiMoModel, prompts: list[list[int]], k0: list[list[int]],
                       spec: list[list[int]], batch_size: int = 32) -> list[Divergence | None]:
    """Per prompt, the first divergence of the k > 0 tokens from the k = 0 ones with the target's margin
    there (one teacher-forced k = 0 pass over the prompt and the shared prefix), or None when identical."""
    at, rows = divergence_points(k0, spec)
    logits = target_logits(model, [prompts[i] for i in rows], [k0[i][: at[i] + 1] for i in rows], batch_size)
    out: list[Divergence | None] = [None] * len(prompts)
    for i, lg in zip(rows, logits):
        j, last = at[i], lg[-1]
        out[i] = Divergence(j, top_two_margin(last.topk(2).values.tolist()), k0[i][j], spec[i][j],
                            float(last[k0[i][j]] - last[spec[i][j]]))
    return out
