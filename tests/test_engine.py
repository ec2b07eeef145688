from collections import Counter

import pytest
import torch

from mtpbench.engine import Faults, generate

from conftest import tiny_random_model


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


def test_per_sequence_counts_add_up_and_positions_follow_the_tokens(model, prompt_ids):
    """Each row's verify steps: positions start after the prefill token and advance by accepted + 1."""
    g = generate(model, prompt_ids, 40, k=3, mode="chain")
    for ids, c in zip(prompt_ids, g.counts):
        assert c.steps[0][0] == len(ids) + 1
        assert sum(a for _, a in c.steps) == c.num_accepted_tokens and len(c.steps) == c.num_drafts
        for (p0, a0), (p1, _) in zip(c.steps, c.steps[1:]):
            assert p1 == p0 + a0 + 1
        assert c.num_accepted_tokens_per_pos == [sum(a > i for _, a in c.steps) for i in range(3)]


# -- the engine's drafts against a cache-free reference of the documented geometry ----------------------

def record_draft_calls(g):
    """Wrap the generation's drafter: per draft call, the output at its last slot and the draft token."""
    calls, drafter = [], g.drafter
    fwd, logits = drafter.forward, drafter.compute_logits

    def forward(input_ids, positions, hidden_states, spec_step_idx=0, caches=None):
        out = fwd(input_ids, positions, hidden_states, spec_step_idx, caches)
        calls.append({"slot": int(positions[0, -1]), "hidden": out[0, -1].clone()})
        return out

    def compute_logits(h, spec_step_idx=0):
        lg = logits(h, spec_step_idx)
        calls[-1]["draft"] = int(lg[0].argmax())
        return lg

    drafter.forward, drafter.compute_logits = forward, compute_logits
    return calls


@torch.inference_mode()
def reference_round(model, known: list[int], k: int, L: int):
    """One round of drafting, computed from scratch with no cache (the engine module docstring's geometry).

    Slot q of MTP layer j reads token x[q+1] and an input hidden state: for layer 0 the target's hidden
    state at q while q <= n-2 (final), else the previous step's layer (L-1)'s output at q-1; for layer j > 0
    layer j-1's output at q-1. Layer j attends over its slots j..q. Step s runs layer s mod L at slot n-2+s
    and drafts argmax(lm_head(output)). Reuse is L = 1. Everything from earlier rounds is recomputed, so a
    rejected draft cannot leak into this round: the reference of rollback."""
    n = len(known)
    tgt = model.target
    H = tgt(torch.tensor([known]), torch.arange(n)[None])[0]  # cache-free causal pass
    layers, embed = model.model.mtp_layers, model.model.embed_tokens
    x = list(known)
    drafts, hiddens, memo = [], [], {}

    def run_layer(j: int, last: int) -> torch.Tensor:
        """Layer j's outputs over slots j..last (row i = slot j + i); x[q+1] never changes once drafted."""
        if (j, last) in memo:
            return memo[j, last]
        slots = list(range(j, last + 1))
        if j == 0:
            prev = torch.stack([H[q] if q <= n - 2 else run_layer(L - 1, q - 1)[q - 1 - (L - 1)] for q in slots])
        else:
            below = run_layer(j - 1, last - 1)  # slots j-1 .. last-1
            prev = below[torch.tensor(slots) - 1 - (j - 1)]
        tokens = torch.tensor([x[q + 1] for q in slots])
        memo[j, last] = layers[j](embed(tokens)[None], torch.tensor(slots)[None], prev[None])[0]
        return memo[j, last]

    for s in range(k):
        j, q = s % L, n - 2 + s
        out = run_layer(j, q)[q - j]
        d = int(model.lm_head(out).argmax())
        drafts.append(d)
        hiddens.append(out)
        x.append(d)
    return drafts, hiddens


@pytest.mark.parametrize("mode,k", [("reuse", 3), ("chain", 4), ("chain", 2)])
def test_drafts_and_hidden_states_follow_the_cache_free_reference(model, prompt_ids, mode, k):
    """Per round and step: the engine's draft token and MTP output equal the reference's, over rounds that
    include rejections (so stale provisional slots must have been rolled back)."""
    from mtpbench.engine import Generation

    prompt = prompt_ids[0][:40]
    g = Generation(model, [prompt], 24, k, mode=mode)
    calls = record_draft_calls(g)
    L = 1 if mode == "reuse" else min(k, model.args.num_nextn_predict_layers)
    rounds = []
    emitted: list[int] = []
    for i, new in enumerate(g):
        if i > 0:  # a round: the k calls just made were drafted from prompt + emitted tokens so far
            rounds.append((list(prompt) + emitted, calls[-k:]))
        emitted += new[0]
    assert len(calls) == k * len(rounds)
    partial = [a for _, a in g.counts[0].steps if a < k]
    assert partial and any(a > 0 for a in partial), "no round with a partial rejection: rollback untested"
    for known, got in rounds:
        drafts, hiddens = reference_round(model, known, k, L)
        assert [c["slot"] for c in got] == [len(known) - 2 + s for s in range(k)]
        assert [c["draft"] for c in got] == drafts
        for c, h in zip(got, hiddens):
            torch.testing.assert_close(c["hidden"], h, atol=2e-4, rtol=1e-3)


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    a = 2 / (9 * dof)
    return dof * (1 - a + z * a ** 0.5) ** 3


@torch.inference_mode()
def test_rejection_sampling_reproduces_the_target_law_at_every_position_and_the_bonus():
    """k = 2, four tokens: t1 (prefill), t2 and t3 (draft positions 0 and 1, or the resample after a
    rejection) and t4 (the bonus token when both drafts were accepted). Their joint law must be the
    target's, whatever the drafter proposed."""
    m = tiny_random_model()
    prompt = [1, 3, 2]
    N, T, V = 20000, 1.0, 4
    g = generate(m, [prompt] * N, 4, k=2, mode="reuse", temperature=T, seed=2)
    tgt = m.target
    exact = torch.ones([V] * 4)
    seqs = [[]]
    for depth in range(4):  # p(t_{depth+1} | prompt, t_1..t_depth) for every prefix
        ids = torch.tensor([prompt + s for s in seqs])
        pos = torch.arange(ids.shape[1])[None].expand_as(ids)
        probs = torch.softmax(tgt.compute_logits(tgt(ids, pos))[:, -1] / T, -1)
        for s, p in zip(seqs, probs):
            for t in range(V):
                exact[tuple(s) + (t,) + (slice(None),) * (3 - depth)] *= p[t]
        seqs = [s + [t] for s in seqs for t in range(V)]
    counts = torch.zeros([V] * 4)
    for toks in g.tokens:
        counts[tuple(toks)] += 1
    expected = (exact * N).flatten()
    counts = counts.flatten()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < chi2_critical(len(obs) - 1), (chi2, len(obs))
    # every path was exercised: rejection at position 0 and at position 1, and both accepted (bonus)
    first_steps = Counter(c.steps[0][1] for c in g.counts)
    assert all(first_steps[a] > N // 50 for a in (0, 1, 2)), first_steps
