import pytest
import torch

from mtpbench.engine import Faults, generate
from mtpbench.model import MiMoModel, ModelArgs


@pytest.fixture(scope="module")
def plain(model, prompt_ids):
    return generate(model, prompt_ids, 40, k=0).tokens


@pytest.mark.parametrize("mode", ["reuse", "chain"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_speculative_equals_plain(model, prompt_ids, plain, mode, k):
    g = generate(model, prompt_ids, 40, k=k, mode=mode)
    assert g.tokens == plain
    assert all(len(t) == 40 for t in g.tokens)


def test_batched_rows_equal_single_rows(model, prompt_ids):
    batched = generate(model, prompt_ids, 24, k=3, mode="chain")
    for b, ids in enumerate(prompt_ids):
        single = generate(model, [ids], 24, k=3, mode="chain")
        assert single.tokens[0] == batched.tokens[b]
        assert single.counts[0].num_accepted_tokens_per_pos == batched.counts[b].num_accepted_tokens_per_pos


@pytest.mark.parametrize("mode", ["reuse", "chain"])
def test_accounting_invariants(model, prompt_ids, mode):
    k = 4
    g = generate(model, prompt_ids, 48, k=k, mode=mode)
    for c in g.counts:
        per_pos = c.num_accepted_tokens_per_pos
        assert len(per_pos) == k
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
        assert c.num_draft_tokens == k * c.num_drafts
        assert 0 < c.num_accepted_tokens <= c.num_draft_tokens
        assert sum(per_pos) == c.num_accepted_tokens
        al = 1 + c.num_accepted_tokens / c.num_drafts
        assert 1 <= al <= k + 1


def record_layers(model, fn):
    """Run fn with forward hooks on every MTP layer; returns the executed layer index per draft call."""
    ran = []
    hooks = [layer.register_forward_hook(lambda mod, args, out, j=j: ran.append(j))
             for j, layer in enumerate(model.model.mtp_layers)]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return ran


@pytest.mark.parametrize("mode,k,expected", [
    ("reuse", 5, [0, 0, 0, 0, 0]),
    ("chain", 5, [0, 1, 2, 0, 1]),
    ("chain", 2, [0, 1]),
])
def test_layer_choice_per_draft_step(model, prompt_ids, mode, k, expected):
    g = None

    def run():
        nonlocal g
        g = generate(model, prompt_ids[:1], 20, k=k, mode=mode)

    ran = record_layers(model, run)
    rounds = g.counts[0].num_drafts
    assert ran == expected * rounds


def test_faults_route_every_step_to_layer_0(model, prompt_ids):
    for faults in (Faults(wrapper_drops_spec_step_idx=True), Faults(loop_omits_spec_step_idx=True)):
        ran = record_layers(model, lambda: generate(model, prompt_ids[:1], 12, k=3, mode="chain", faults=faults))
        assert ran and set(ran) == {0}


def tiny_random_model(seed=0):
    torch.manual_seed(seed)
    m = MiMoModel(ModelArgs(vocab_size=4, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, num_nextn_predict_layers=1))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.6)
    return m.eval()


@torch.inference_mode()
def test_rejection_sampling_reproduces_target_distribution():
    """(t1, t2) from speculative sampling (t2 passes through accept/reject) vs the exact target law."""
    m = tiny_random_model()
    prompt = [1, 3, 2]
    N, T = 6000, 1.0
    g = generate(m, [prompt] * N, 3, k=2, mode="reuse", temperature=T, seed=1)
    tgt = m.target
    logits = tgt.compute_logits(tgt(torch.tensor([prompt]), torch.arange(3)[None]))[0, -1]
    p1 = torch.softmax(logits / T, -1)
    exact = torch.zeros(4, 4)
    for t1 in range(4):
        ids = torch.tensor([prompt + [t1]])
        l2 = tgt.compute_logits(tgt(ids, torch.arange(4)[None]))[0, -1]
        exact[t1] = p1[t1] * torch.softmax(l2 / T, -1)
    counts = torch.zeros(4, 4)
    for toks in g.tokens:
        counts[toks[0], toks[1]] += 1
    expected = exact * N
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 37.7  # chi-square, 15 degrees of freedom, p = 0.001
    # the draft disagrees with the target often enough that the rejection path was exercised
    accepted = sum(c.num_accepted_tokens for c in g.counts)
    drafted = sum(c.num_draft_tokens for c in g.counts)
    assert 0.1 < accepted / drafted < 0.95


def test_per_sequence_counts_add_up_and_positions_follow_the_tokens(model, prompt_ids):
    """Each row's verify steps: positions start after the prefill token and advance by accepted + 1."""
    g = generate(model, prompt_ids, 40, k=3, mode="chain")
    for ids, c in zip(prompt_ids, g.counts):
        assert c.steps[0][0] == len(ids) + 1
        assert sum(a for _, a in c.steps) == c.num_accepted_tokens and len(c.steps) == c.num_drafts
        for (p0, a0), (p1, _) in zip(c.steps, c.steps[1:]):
            assert p1 == p0 + a0 + 1
        assert c.num_accepted_tokens_per_pos == [sum(a > i for _, a in c.steps) for i in range(3)]
