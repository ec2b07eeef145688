"""The scoring maths every backend shares (check-lossless and the sweep's greedy margins), in one place.

Pure Python (numpy where a whole vocabulary is reduced): the native engine, the offline vLLM worker and the
served backend each fetch raw log-probs their own way and hand them here. vLLM's prompt log-probs are of the
raw logits, the law at T = 1; at any other temperature the score of a token is its log-prob renormalized over
the whole vocabulary, lp / T - logsumexp(lp / T).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

MOMENTS_MAX_VOCAB = 32768  # above: the one-sample test is unavailable (a row of this many floats per scored token)
MOMENTS_CHUNK = 32  # requests scored over the whole vocabulary at a time: a vocabulary-sized row per token


@dataclass(frozen=True)
class Divergence:
    """Where a k > 0 greedy continuation first leaves the k = 0 one, and how close the target's call was."""

    position: int  # index into the continuation (0 = the first generated token)
    margin: float  # target's top-1 minus top-2 logit there (teacher-forced over the shared prefix)
    k0_token: int
    spec_token: int
    logit_gap: float  # target's logit of k0_token minus that of spec_token (negative: the k > 0 run was right)


def check_score_args(ids: Sequence, continuations: Sequence, temperature: float) -> None:
    """The arguments every backend's ``target_logprobs``/``target_moments`` refuses: ValueError."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score a sampled token, got {temperature}")
    if len(ids) != len(continuations):
        raise ValueError(f"{len(ids)} prompts but {len(continuations)} continuations")


def needs_whole_vocab(temperature: float) -> bool:
    """Whether scoring at ``temperature`` needs every token's raw log-prob (True unless T = 1, where the raw
    prompt log-prob is the score)."""
    return temperature != 1.0


def renormalized(token_logprob: float, logprobs: Iterable[float], temperature: float) -> float:
    """A token's log-prob under softmax(raw / T), from its raw log-prob and the whole vocabulary's; at T = 1 the
    raw log-prob itself (``logprobs`` is then not read)."""
    if not needs_whole_vocab(temperature):
        return token_logprob
    xs = [v / temperature for v in logprobs]
    top = max(xs)
    return token_logprob / temperature - top - math.log(sum(math.exp(x - top) for x in xs))


def law_moments(ids, raw, tok: int, temperature: float, vocab: int | None = None) -> tuple[float, float, float]:
    """(log p of ``tok``, the entropy H, the variance of log p) of the law softmax(raw / T) over the whole
    vocabulary, given as sorted numpy token ids and their raw log-probs; ``vocab``: the size the ids must
    cover (a missing token would make it not the whole law)."""
    import numpy as np

    if vocab is not None and ids.size < vocab:
        raise RuntimeError(f"prompt logprobs cover {ids.size} of {vocab} tokens: not the whole vocabulary")
    x = raw / temperature
    top = x.max()
    lp = x - top - np.log(np.exp(x - top).sum())
    p = np.exp(lp)
    # 0 * log 0 = 0: a token the law rules out (raw -inf, e.g. a masked id) adds nothing, as in engine.law_moments
    # (without it the entropy is NaN, and a NaN moment must never reach the verdict as a number)
    plp = np.where(p > 0, lp, 0.0)
    h = float(-(p * plp).sum())
    var = float((p * (plp + h) ** 2).sum())
    return float(lp[np.searchsorted(ids, tok)]), h, var


def max_abs_change(together: Iterable[Iterable[float]], alone: Iterable[Iterable[float]]) -> float:
    """The largest |a - b| between two passes' per-token log-probs, row by row (0 when there are none): the
    rounding noise of a teacher-forced score when only the batch composition differs. NaN if any change is NaN
    (max() keeps a NaN only when it comes first, so a broken score would read as small noise)."""
    changes = [abs(a - b) for x, y in zip(together, alone) for a, b in zip(x, y)]
    return math.nan if any(math.isnan(c) for c in changes) else max(changes, default=0.0)


def top_two_margin(logprobs: Iterable[float]) -> float:
    """Top-1 minus top-2 of a position's logits or raw log-probs (equal: log-softmax shifts them by one
    constant)."""
    top = sorted(logprobs, reverse=True)
    return top[0] - top[1]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None when one is a prefix of the other (a length difference
    alone, e.g. a different max_tokens, is not a divergence)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def divergence_points(k0: list[list[int]], spec: list[list[int]]) -> tuple[list[int | None], list[int]]:
    """Per prompt, the first divergence of ``spec`` from ``k0`` (None: identical), and the prompts that have one."""
    at = [first_divergence(a, b) for a, b in zip(k0, spec)]
    return at, [i for i, j in enumerate(at) if j is not None]


def moments_vocab(model_dir) -> int:
    """The target's vocabulary size, from its checkpoint's config.json; ``errors.Unavailable`` when it cannot be
    read or is above MOMENTS_MAX_VOCAB."""
    from mtpbench.checkpoint import read_config
    from mtpbench.errors import MtpBenchError, Unavailable

    try:
        c = read_config(model_dir)
    except MtpBenchError as e:
        raise Unavailable(f"the target's vocabulary size is unknown ({e})") from None
    vocab = c.get("vocab_size") or (c.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise Unavailable("the target's config.json gives no vocab_size")
    if vocab > MOMENTS_MAX_VOCAB:
        raise Unavailable(f"a vocabulary of {vocab} tokens: whole-vocabulary log-probs at every scored token would "
                          f"be too large (at most {MOMENTS_MAX_VOCAB})")
    return vocab
