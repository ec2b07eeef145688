"""The native engine's pieces of check-lossless: the planted lossy verify rule, teacher-forced scoring and
the greedy divergence margin, each against a small independent reference."""

import math

import pytest
import torch

from mtpbench.engine import (Divergence, Faults, first_divergence, generate, greedy_divergences, target_logprobs,
                             target_moments, verify)

from conftest import tiny_random_model

LOSSY = Faults(accept_draft_argmax=True)
# the drafter's top token (0) is over-proposed: p/q = 0.2/0.7; token 2 is under it too but not q's argmax
P = torch.tensor([0.2, 0.4, 0.1, 0.3])
Q = torch.tensor([0.6, 0.1, 0.25, 0.05])


def verify_one_draft(draft: int, faults: Faults | None, n: int, seed: int):
    """k = 1 verify on hand-made laws for n rows proposing ``draft``; returns the accepted flags."""
    logits = P.log().expand(n, 2, 4)  # softmax(log p / 1) = p
    drafts = torch.full((n, 1), draft)
    accepted, _ = verify(logits, drafts, Q.expand(n, 1, 4), 1.0, torch.Generator().manual_seed(seed), faults)
    return accepted.float()


def within(share: float, expected: float, n: int, z: float = 4.5) -> bool:
    return abs(share - expected) <= z * math.sqrt(expected * (1 - expected) / n) + 1e-9


def test_the_standard_rule_accepts_with_probability_p_over_q_and_the_planted_fault_always_takes_q_argmax():
    n = 1000
    correct = torch.cat([verify_one_draft(0, None, n, s) for s in range(5)])
    assert within(float(correct.mean()), 0.2 / 0.6, correct.numel()), float(correct.mean())
    lossy = torch.cat([verify_one_draft(0, LOSSY, n, s) for s in range(5)])
    assert bool(lossy.all())
    # a draft that is not q's argmax keeps the ratio under the fault: p/q = 0.1/0.25
    for faults in (None, LOSSY):
        other = torch.cat([verify_one_draft(2, faults, n, s) for s in range(5)])
        assert within(float(other.mean()), 0.4, other.numel()), (faults, float(other.mean()))


def test_the_emitted_token_follows_the_target_law_only_without_the_fault():
    """Drafts drawn from q, then the first emitted token (the draft if accepted, else the resample): its law
    is p under the standard rule, and not under the planted fault (token 0 over-produced)."""
    n = 10000
    gen = torch.Generator().manual_seed(7)
    drafts = torch.multinomial(Q, n, replacement=True, generator=gen)[:, None]
    logits = P.log().expand(n, 2, 4)
    for faults, lawful in ((None, True), (LOSSY, False)):
        accepted, bonus = verify(logits, drafts, Q.expand(n, 1, 4), 1.0, gen, faults)
        first = torch.where(accepted == 1, drafts[:, 0], bonus)
        freq = torch.bincount(first, minlength=4).float() / n
        chi2 = float(((freq - P) ** 2 / P).sum() * n)
        assert (chi2 < 25.0) == lawful, (faults, freq.tolist(), chi2)  # 3 dof: p ~ 2e-5
    # the fault's law: q0 (always accepted) + the residual mass elsewhere
    assert float(freq[0]) == pytest.approx(0.6, abs=0.03)


def test_the_planted_fault_changes_nothing_at_temperature_0(model, prompt_ids):
    # hand-made: greedy verification already accepts only the target's argmax
    logits = torch.randn(64, 3, 16, generator=torch.Generator().manual_seed(0))
    drafts = torch.randint(0, 16, (64, 2), generator=torch.Generator().manual_seed(1))
    drafts[:32] = logits[:32, :2].argmax(-1)  # half the rows agree with the target
    for a, b in zip(verify(logits, drafts, None, 0.0, None), verify(logits, drafts, None, 0.0, None, LOSSY)):
        assert torch.equal(a, b)
    # the engine: same tokens and counters with the switch on
    ref = generate(model, prompt_ids[:2], 16, k=2)
    got = generate(model, prompt_ids[:2], 16, k=2, faults=LOSSY)
    assert got.tokens == ref.tokens
    assert [c.steps for c in got.counts] == [c.steps for c in ref.counts]


def test_the_planted_fault_reaches_the_engine_at_temperature_above_0():
    m = tiny_random_model()
    ref = generate(m, [[1, 3, 2]] * 300, 4, k=2, temperature=1.0, seed=3)
    got = generate(m, [[1, 3, 2]] * 300, 4, k=2, temperature=1.0, seed=3, faults=LOSSY)
    acc = [sum(c.num_accepted_tokens for c in g.counts) / sum(c.num_draft_tokens for c in g.counts)
           for g in (ref, got)]
    assert acc[1] > acc[0] + 0.05, acc


# -- teacher-forced scoring --------------------------------------------------------------------------------

@torch.inference_mode()
def reference_logits(model, prompt: list[int], cont: list[int]) -> torch.Tensor:
    """A plain full-sequence forward of the target, no cache: logits predicting each continuation token."""
    tgt = model.target
    ids = torch.tensor([prompt + cont])
    h = tgt(ids, torch.arange(ids.shape[1])[None], None)
    return tgt.compute_logits(h[0, len(prompt) - 1: len(prompt) + len(cont) - 1]).float()


@pytest.fixture(scope="module")
def sampled(model, prompt_ids):
    conts = generate(model, prompt_ids, 8, temperature=1.0, seed=5).tokens
    return [c[: 8 - 3 * i] for i, c in enumerate(conts)]  # rows of different lengths in one batch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_target_logprobs_equal_a_plain_forward(model, prompt_ids, sampled, temperature):
    conts = sampled
    got = target_logprobs(model, prompt_ids, conts, temperature, batch_size=2)
    assert [len(g) for g in got] == [len(c) for c in conts]
    for p, c, g in zip(prompt_ids, conts, got):
        lp = torch.log_softmax(reference_logits(model, p, c) / temperature, -1)
        want = lp[torch.arange(len(c)), torch.tensor(c)]
        torch.testing.assert_close(torch.tensor(g), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        target_logprobs(model, prompt_ids, conts, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_target_moments_equal_a_plain_forwards_entropy_and_variance(model, prompt_ids, sampled, temperature):
    """The one-sample test's inputs: per token (log p, H, Var of log p) of the target's law at T, against the
    plain forward's law, H = -sum p log p and Var = sum p (log p)^2 - H^2 (a different formula)."""
    got = target_moments(model, prompt_ids, sampled, temperature, batch_size=2)
    lps = target_logprobs(model, prompt_ids, sampled, temperature)
    assert [m[0] for g in got for m in g] == pytest.approx([x for lp in lps for x in lp], abs=1e-5)
    for p, c, g in zip(prompt_ids, sampled, got):
        law = torch.softmax(reference_logits(model, p, c).double() / temperature, -1)
        h = -(law * law.log()).sum(-1)
        var = (law * law.log() ** 2).sum(-1) - h ** 2
        torch.testing.assert_close(torch.tensor([m[1] for m in g], dtype=torch.float64), h, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.tensor([m[2] for m in g], dtype=torch.float64), var, atol=1e-3, rtol=1e-3)
        assert all(m[1] > 0.1 and m[2] > 0.01 for m in g)  # a tiny model's law is far from one-hot
    with pytest.raises(ValueError):
        target_moments(model, prompt_ids, sampled, 0.0)


def test_the_subtle_planted_fault_takes_the_acceptance_ratio_at_another_temperature():
    """Faults.ratio_temperature_factor f: the draft is accepted with probability min(1, p'/q), p' the target's law
    at f x T (p^(1/f) renormalized); the correct rule's ratio is p/q = 0.2/0.6. At f = 0.5 (--planted-subtle's
    0.95 moves this ratio by 0.006, too little to see in 5000 draws) p' = 0.133 at token 0."""
    n = 1000
    sharp = P ** 2 / (P ** 2).sum()
    got = torch.cat([verify_one_draft(0, Faults(ratio_temperature_factor=0.5), n, s) for s in range(5)])
    assert within(float(got.mean()), float(sharp[0]) / 0.6, got.numel()), float(got.mean())
    assert not within(float(got.mean()), 0.2 / 0.6, got.numel())
    # the residual keeps the right p: a draft of q's argmax rejected is replaced from max(0, p - q), never token 0
    logits = P.log().expand(n, 2, 4)
    accepted, bonus = verify(logits, torch.zeros(n, 1, dtype=torch.long), Q.expand(n, 1, 4), 1.0,
                             torch.Generator().manual_seed(0), Faults(ratio_temperature_factor=0.5))
    assert int((bonus[accepted == 0] == 0).sum()) == 0 and int((accepted == 0).sum()) > 0


# -- the greedy divergence margin --------------------------------------------------------------------------

def test_greedy_divergence_finds_a_hand_made_divergence_and_its_margin(model, prompt_ids):
    k0 = generate(model, prompt_ids, 12).tokens
    spec = [list(t) for t in k0]
    at = 5
    second = int(reference_logits(model, prompt_ids[0], k0[0][: at + 1])[-1].topk(2).indices[1])
    spec[0][at] = second
    spec[0][at + 1:] = [7] * (12 - at - 1)  # what follows a divergence is whatever the run did
    spec[2] = spec[2][:8]  # a shorter run alone is not a divergence
    got = greedy_divergences(model, prompt_ids, k0, spec, batch_size=2)
    assert got[1] is None and got[2] is None
    d = got[0]
    assert isinstance(d, Divergence) and (d.position, d.k0_token, d.spec_token) == (at, k0[0][at], second)
    top = reference_logits(model, prompt_ids[0], k0[0][: at + 1])[-1].topk(2).values
    assert d.margin == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert d.margin > 0 and d.logit_gap == pytest.approx(d.margin, abs=1e-5)  # the runner-up was taken
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 2], [1, 4]) == 1


def test_the_native_backend_hands_out_the_scoring_pass_and_carries_the_planted_fault(model, prompt_ids, sampled):
    from types import SimpleNamespace

    from mtpbench.backends.native import NativeBackend

    b = NativeBackend()
    b.model, b.faults = model, LOSSY
    cfg = SimpleNamespace(seed=0, temperature=1.0, force_spec_step_idx=False, top_p=1.0, top_k=0)
    assert b.generation(cfg, prompt_ids[:1], 2, "reuse", 1, 4).faults.accept_draft_argmax
    assert b.target_logprobs(prompt_ids, sampled, 1.0) == target_logprobs(model, prompt_ids, sampled, 1.0)
    assert b.greedy_divergences(prompt_ids, sampled, sampled) == [None] * len(sampled)


def test_the_native_backend_reads_margin_and_logit_gap_from_the_model_at_each_divergence(model, prompt_ids):
    """Issue 23 item 12: the backend's greedy pass on sequences that differ, so the model is called. Prompt 0 leaves
    k = 0 for the target's 3rd-ranked token (logit gap above the top-two margin), prompt 1 for the runner-up (gap =
    margin), at other positions; prompt 2 does not leave it. Each margin and gap against a plain cache-free forward."""
    from mtpbench.backends.native import NativeBackend

    b = NativeBackend()
    b.model, b.faults = model, Faults()
    k0 = generate(model, prompt_ids, 10).tokens
    spec, want = [list(t) for t in k0], {}
    for i, at, rank in ((0, 2, 2), (1, 6, 1)):
        lg = reference_logits(model, prompt_ids[i], k0[i][: at + 1])[-1]
        assert int(lg.argmax()) == k0[i][at]  # k = 0 is greedy: the target's argmax
        spec[i][at] = int(lg.topk(3).indices[rank])
        spec[i][at + 1:] = [spec[i][at]] * (10 - at - 1)  # what follows a divergence is whatever the run did
        top = lg.topk(3).values
        want[i] = (at, float(top[0] - top[1]), float(top[0] - top[rank]))
    got = b.greedy_divergences(prompt_ids, k0, spec)
    assert got[2] is None and all(isinstance(got[i], Divergence) for i in want)
    for i, (at, margin, gap) in want.items():
        d = got[i]
        assert (d.position, d.k0_token, d.spec_token) == (at, k0[i][at], spec[i][at])
        assert d.margin == pytest.approx(margin, abs=1e-4) and d.logit_gap == pytest.approx(gap, abs=1e-4)
    assert got[0].logit_gap > got[0].margin + 1e-3, got[0]  # the 3rd-ranked token: the gap is not the margin


def test_each_batch_chunk_of_an_arm_draws_with_a_seed_of_its_own(model, prompt_ids):
    """An arm larger than the batch: every chunk gets its own seed (from the arm's), so no two rows share a
    random stream; with the arm's seed in every chunk, row j and row j + batch of a prompt came out identical."""
    from mtpbench.backends.native import NativeBackend
    from mtpbench.config import SweepConfig

    b = NativeBackend()
    b.model, b.faults = model, Faults()
    seeds = []
    real = b.generation

    def spy(cfg, *args, **kwargs):
        seeds.append(cfg.seed)
        return real(cfg, *args, **kwargs)

    b.generation = spy
    cfg = SweepConfig(seed=0, temperature=1.0, batch_size=3, mtp_layers=(1,))
    per = b.sample_arm(cfg, prompt_ids[:1], 0, seed=11, n=6, temperature=1.0, max_tokens=6)
    assert len(seeds) == 2 and len(set(seeds)) == 2
    assert per[0][0] != per[0][3]  # row 0 and row 0 + batch of the one prompt
    assert b.sample_arm(cfg, prompt_ids[:1], 0, seed=11, n=6, temperature=1.0, max_tokens=6) == per  # reproducible
