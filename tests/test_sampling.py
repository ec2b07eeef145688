"""Top-k and top-p in the native engine (mtpbench.sampling): the cut law against a hand computation and an oracle
written from vLLM's rule, and the engine's output against what the cut law allows."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.engine import generate, target_logits
from mtpbench.sampling import probs


def softmax(xs):
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [v / sum(e) for v in e]


def test_the_cut_law_of_four_logits_by_hand():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    full = softmax([2.0, 1.0, 0.0, -1.0])  # 0.644, 0.237, 0.087, 0.032
    assert probs(logits, 1.0).tolist() == pytest.approx(full)
    two = softmax([2.0, 1.0])
    assert probs(logits, 1.0, top_k=2).tolist() == pytest.approx(two + [0, 0])
    # top-p 0.7: token 0 holds 0.644 < 0.7, so token 1 is needed too; 0.6: token 0 alone holds enough
    assert probs(logits, 1.0, top_p=0.7).tolist() == pytest.approx(two + [0, 0])
    assert probs(logits, 1.0, top_p=0.6).tolist() == pytest.approx([1, 0, 0, 0])
    # top-p reads the law top-k left: of tokens 0..2, token 0 holds 0.665 (not 0.644), enough for 0.66
    assert probs(logits, 1.0, top_k=3, top_p=0.66).tolist() == pytest.approx([1, 0, 0, 0])
    # the temperature first: at T = 2 the law is 0.455, 0.276, 0.167, 0.102, and top-p 0.75 needs three tokens
    assert probs(logits, 1.0, top_p=0.75).tolist() == pytest.approx(two + [0, 0])
    assert probs(logits, 2.0, top_p=0.75).tolist() == pytest.approx(softmax([1.0, 0.5, 0.0]) + [0])
    assert probs(logits, 1.0, top_k=-1).tolist() == pytest.approx(full)  # -1 and 0: off, as vLLM takes them
    assert probs(logits, 1.0, top_k=9).tolist() == pytest.approx(full)


def oracle(logits: list[float], t: float, k: int, p: float) -> list[float]:
    """vLLM's rule written out: scale by 1/T; keep the tokens at least as likely as the k-th; of those, in order of
    likelihood, keep each token while the ones before it hold less than p of their mass; renormalise."""
    x = [v / t for v in logits]
    keep = set(range(len(x)))
    if k > 0:
        kth = sorted(x, reverse=True)[min(k, len(x)) - 1]
        keep = {i for i in keep if x[i] >= kth}
    law = dict(zip(sorted(keep), softmax([x[i] for i in sorted(keep)])))
    mass, kept = 0.0, set()
    for i in sorted(keep, key=lambda i: -x[i]):
        if mass < p:
            kept.add(i)
        mass += law[i]
    z = sum(law[i] for i in kept)
    return [law[i] / z if i in kept else 0.0 for i in range(len(x))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-40, 40), min_size=2, max_size=12, unique=True),
       st.sampled_from([0.5, 1.0, 1.7]), st.integers(-1, 14), st.floats(0.01, 1.0))
def test_the_cut_law_is_the_rule_s(ints, t, k, p):
    logits = [i / 8 for i in ints]  # distinct logits: no tie whose order the rule leaves open
    got = probs(torch.tensor(logits, dtype=torch.float64), t, k, p).tolist()
    want = oracle(logits, t, k, p)
    # a token whose mass-above lands within rounding of p may go either way: compare supports where it cannot
    assert got == pytest.approx(want, abs=1e-5) or boundary(logits, t, k, p)


def boundary(logits, t, k, p) -> bool:
    law = [v for v in oracle(logits, t, k, 1.0) if v > 0]
    above = 0.0
    for v in sorted(law, reverse=True):
        if abs(above - p) < 1e-6:
            return True
        above += v
    return False


def test_no_token_outside_the_top_k_is_ever_emitted(model, prompt_ids):
    g = generate(model, prompt_ids, 24, k=2, temperature=1.5, top_k=3, seed=1)
    lg = target_logits(model, prompt_ids, g.tokens)
    for toks, rows in zip(g.tokens, lg):
        top3 = rows.topk(3, -1).indices
        assert all(t in top3[i].tolist() for i, t in enumerate(toks))
    # and without the cut some token falls outside (the check above could fail)
    free = generate(model, prompt_ids, 24, k=2, temperature=1.5, seed=1)
    lf = target_logits(model, prompt_ids, free.tokens)
    assert any(t not in rows.topk(3, -1).indices[i].tolist()
               for toks, rows in zip(free.tokens, lf) for i, t in enumerate(toks))


@pytest.mark.parametrize("k", [0, 2])
def test_top_k_1_samples_the_greedy_tokens_whatever_the_drafts(model, prompt_ids, k):
    """top-k 1 leaves the law one token, the target's argmax: sampling at T = 1, drafting or not, must give greedy's
    tokens (the drafter samples its own uncut law, as vLLM's, so its drafts are often rejected)."""
    greedy = generate(model, prompt_ids, 32, k=0).tokens
    g = generate(model, prompt_ids, 32, k=k, temperature=1.0, top_k=1, seed=3)
    assert g.tokens == greedy
    if k:
        c = g.counts
        assert sum(x.num_accepted_tokens for x in c) < sum(x.num_draft_tokens for x in c)
