"""The native engine's sampling law and its verify step: temperature, then top-k, then top-p, as vLLM's sampler
applies them (``SamplingParams`` semantics), and standard rejection sampling against that law.

* ``top_k``: 0 or -1 is off (vLLM prefers 0 and quietly takes -1); k >= 1 keeps every token whose scaled logit is
  at least the k-th largest (a tie at the threshold keeps all of it).
* ``top_p``: 1.0 is off; p in (0, 1) keeps, among what top-k left, every token whose more likely tokens (those
  ranked above it) hold less than p of the mass: the smallest head of the law holding at least p, never empty.

What vLLM filters when it drafts: its rejection sampler filters the *target's* logits (temperature, top-k, top-p;
``apply_sampling_constraints``), while a probabilistic drafter's law takes the temperature only ("we ignore most
of the sampling parameters in generating the draft tokens", ``compute_probs_and_sample_next_token``). The native
engine does the same. Rejection sampling against the filtered target law p' is lossless for any drafter law q: a
draft outside p''s support has p' = 0 and is always rejected, and the residual max(0, p' - q) lies inside it.
"""

from __future__ import annotations

import torch

TOP_P_OFF, TOP_K_OFF = 1.0, 0


def filters(top_p: float, top_k: int) -> bool:
    """Whether these settings truncate the law at all (top-k of the whole vocabulary is also off, as in vLLM)."""
    return top_p < 1.0 or top_k > 0


def probs(logits: torch.Tensor, temperature: float, top_k: int = TOP_K_OFF, top_p: float = TOP_P_OFF) -> torch.Tensor:
    """The law sampled from at ``temperature`` > 0 (float32, last dim the vocabulary), after top-k then top-p."""
    x = logits.float() / temperature
    if top_k > 0 and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        order = x.argsort(-1, descending=True)
        p_sorted = torch.softmax(x, -1).gather(-1, order)
        above = p_sorted.cumsum(-1) - p_sorted  # the mass ranked above each token
        drop_sorted = above >= top_p
        drop_sorted[..., 0] = False  # never empty
        x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return torch.softmax(x, -1)


def draw(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    return torch.multinomial(p, 1, generator=gen).squeeze(-1)


def verify(logits: torch.Tensor, drafts: torch.Tensor, qprobs: torch.Tensor | None, temperature: float,
           gen: torch.Generator | None, faults=None, top_k: int = TOP_K_OFF,
           top_p: float = TOP_P_OFF, law: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One verify step: the accepted-draft count [B] and the bonus/correction token [B] per row.

    ``logits`` [B, k+1, V] are the target's at the k+1 verified positions, ``drafts`` [B, k] the proposed
    tokens, ``qprobs`` [B, k, V] the drafter's probabilities (None at temperature 0, where top-k and top-p do
    nothing: greedy takes the argmax, as vLLM's greedy requests). ``faults``: ``engine.Faults`` (planted rules).
    ``law``: a dict filled with what each position's verdict was and what the law says it should be
    (``expected_acceptance``: issue 46), whatever rule (or planted fault) decided.
    """
    B, k = drafts.shape
    rows = torch.arange(B, device=drafts.device)
    if temperature <= 0:
        target = logits.argmax(-1)  # [B, k+1]
        ok = (target[:, :k] == drafts).long()
        if law is not None:
            law.update(expected_acceptance(logits, drafts, None, temperature, top_k, top_p), accepted=ok.bool())
        accepted = ok.cumprod(1).sum(1)
        return accepted, target[rows, accepted]
    p = probs(logits, temperature, top_k, top_p)  # [B, k+1, V]
    pr = p if faults is None or faults.ratio_temperature_factor == 1.0 else \
        probs(logits, temperature * faults.ratio_temperature_factor, top_k, top_p)  # the planted fault
    pd = pr[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qd = qprobs.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(B, k, generator=gen, device=drafts.device)
    ok = (u * qd <= pd) & (pd > 0)  # accept with probability min(1, p/q); never a token p' excludes
    if faults is not None:
        ok = planted(ok, u, pd, qd, drafts, qprobs, faults, gen)
    if law is not None:
        law.update(expected_acceptance(logits, drafts, qprobs, temperature, top_k, top_p, p), accepted=ok)
    accepted = ok.long().cumprod(1).sum(1)
    bonus = torch.empty(B, dtype=torch.long, device=drafts.device)
    for b in range(B):
        a = int(accepted[b])
        if a == k:
            dist = p[b, k]
        else:  # rejected at a: resample from the residual max(0, p - q)
            dist = (p[b, a] - qprobs[b, a]).clamp(min=0)
            if float(dist.sum()) <= 0:
                dist = p[b, a]
        bonus[b] = draw(dist / dist.sum(), gen)
    return accepted, bonus


def planted(ok, u, pd, qd, drafts, qprobs, faults, gen) -> torch.Tensor:
    """The accept decisions [B, k] under ``engine.Faults``' planted lossy rules (each off by default)."""
    if faults.ratio_power != 1.0:
        ok = (u <= (pd / qd.clamp(min=1e-30)) ** faults.ratio_power) & (pd > 0)
    if faults.accept_draft_argmax:
        ok = ok | (drafts == qprobs.argmax(-1))
    if 0 <= faults.over_accept_position < ok.shape[1]:
        i = faults.over_accept_position
        extra = torch.rand(ok.shape[0], generator=gen, device=ok.device) < faults.over_accept_share
        ok = ok.clone()
        ok[:, i] |= extra
    return ok


def expected_acceptance(logits: torch.Tensor, drafts: torch.Tensor, qprobs: torch.Tensor | None, temperature: float,
                        top_k: int = TOP_K_OFF, top_p: float = TOP_P_OFF, p: torch.Tensor | None = None) -> dict:
    """What the law says of each draft [B, k] (issue 46): ``probability``, the chance standard rejection sampling
    accepts it given the draft, min(1, p(d) / q(d)) (0 where p excludes d), and at temperature 0 1 exactly where d
    is the target's argmax; where the drafter's law is known, ``probabilistic`` = sum_x min(p(x), q(x)) (the
    acceptance over drafts drawn from q; 1 - the total-variation distance between p and q) and ``greedy`` = p at
    q's argmax (the acceptance a greedy draft proposal would get). ``p``: the filtered target law, if computed."""
    k = drafts.shape[1]
    if temperature <= 0:
        return {"probability": (logits[:, :k].argmax(-1) == drafts).float()}
    p = (p if p is not None else probs(logits, temperature, top_k, top_p))[:, :k]
    pd = p.gather(-1, drafts[..., None]).squeeze(-1)
    qd = qprobs.gather(-1, drafts[..., None]).squeeze(-1)
    a = torch.where(pd > 0, (pd / qd.clamp(min=1e-30)).clamp(max=1.0), torch.zeros_like(pd))
    return {"probability": a, "probabilistic": torch.minimum(p, qprobs).sum(-1),
            "greedy": p.gather(-1, qprobs.argmax(-1, keepdim=True)).squeeze(-1)}
