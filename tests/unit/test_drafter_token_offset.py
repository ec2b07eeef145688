"""check-drafter's reading of a draft call's token input (drafter/check.py token_offset): the offset at which the
call's token ids equal the request's tokens most often, a tie going to the architecture's offset (t + 1)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.integers(1, 5), st.integers(0, 3))
def test_a_repeated_token_ties_every_offset_and_the_tie_is_the_architectures(start, rows, other):
    import torch

    from mtpbench.drafter.check import token_offset

    seq = [7] * (start + rows + 8)  # a greedy loop on one token: every offset matches the first row
    ids = torch.tensor([7] + [100 + other + i for i in range(rows - 1)])  # later rows: rejected drafts
    pos = torch.arange(start, start + rows)
    assert token_offset(ids, pos, seq) == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 40), st.sampled_from([-1, 0, 1, 2]))
def test_distinct_tokens_give_the_offset_they_were_read_at(n, o):
    import torch

    from mtpbench.drafter.check import token_offset

    seq = list(range(1000, 1000 + n + 4))
    pos = torch.arange(1, n + 1)
    ids = torch.tensor([seq[p + o] for p in pos.tolist()])
    assert token_offset(ids, pos, seq) == o
