"""check-lossless's work inside one vLLM engine (the worker's ops ``sample``, ``score``, ``moments``, ``noise``
and ``margins``), on token-id prompts: n continuations per prompt with the arm's counter deltas, and the
teacher-forced k = 0 passes over vLLM's prompt logprobs that score them. Each takes the engine and the op's
arguments (``spec["args"]``) and returns the op's result."""

from __future__ import annotations

from mtpbench.backends.vllm.counters import counter_delta, read_spec_counters
from mtpbench.scoring import MOMENTS_CHUNK, law_moments, max_abs_change, needs_whole_vocab, renormalized, top_two_margin

# scores need no text: no detokenized logprob tokens, and flat containers (a few lists per request, not a dict
# per position)
QUIET = {"detokenize": False, "flat_logprobs": True}


def _generate(llm, seqs: list[list[int]], params) -> list:
    from vllm.inputs import TokensPrompt

    return llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)


def sample(llm, args: dict) -> dict:
    """``n`` continuations per prompt at ``temperature``, with the arm's counter deltas."""
    from vllm import SamplingParams

    params = SamplingParams(n=args["n"], temperature=args["temperature"], max_tokens=args["max_tokens"],
                            top_p=args.get("top_p", 1.0), top_k=args.get("top_k", 0),
                            ignore_eos=True)  # no request seed: the engine's (VllmBackend.sample_arm)
    before = read_spec_counters(llm)
    outs = _generate(llm, args["prompts"], params)
    return {"continuations": [[list(c.token_ids) for c in sorted(o.outputs, key=lambda c: c.index)] for o in outs],
            "counters": counter_delta(before, read_spec_counters(llm), args["k"])}


def noise(llm, args: dict) -> dict:
    """The same teacher-forced T = 1 pass, every row together and each alone: the largest |change|."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, **QUIET)
    prompts, conts = args["prompts"], args["continuations"]
    seqs = [p + c for p, c in zip(prompts, conts)]

    def scores(out, p, c):
        return [out.prompt_logprobs[len(p) + m][tok].logprob for m, tok in enumerate(c)]

    together = [scores(o, p, c) for o, p, c in zip(_generate(llm, seqs, params), prompts, conts)]
    alone = [scores(_generate(llm, [s], params)[0], p, c) for s, p, c in zip(seqs, prompts, conts)]
    return {"noise": max_abs_change(together, alone)}


def moments(llm, args: dict) -> dict:
    """(log p, H, Var) of each continuation token under the law at ``temperature`` (``law_moments``)."""
    from vllm import SamplingParams

    t = args["temperature"]
    vocab = llm.llm_engine.model_config.get_vocab_size()
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1, **QUIET)
    prompts, conts = args["prompts"], args["continuations"]
    rows = [i for i, c in enumerate(conts) if c]
    out = [[] for _ in conts]
    for start in range(0, len(rows), MOMENTS_CHUNK):  # reduced to three numbers a token, chunk by chunk
        chunk = rows[start: start + MOMENTS_CHUNK]
        for i, o in zip(chunk, _generate(llm, [prompts[i] + conts[i] for i in chunk], params)):
            p, c = prompts[i], conts[i]
            for m, tok in enumerate(c):
                out[i].append(law_moments(*position_logprobs(o.prompt_logprobs, len(p) + m), tok, t, vocab))
    return {"moments": out}


def score(llm, args: dict) -> dict:
    """Each continuation token's log-prob at ``temperature``, teacher-forced."""
    from vllm import SamplingParams

    t = args["temperature"]
    full = needs_whole_vocab(t)  # the raw prompt logprobs are the law at T = 1 only: renormalize over the vocabulary
    prompts, conts = args["prompts"], args["continuations"]
    rows = [i for i, c in enumerate(conts) if c]
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=-1 if full else 0, **QUIET)
    outs = _generate(llm, [prompts[i] + conts[i] for i in rows], params)
    logprobs = [[] for _ in conts]
    for i, o in zip(rows, outs):
        p, c = prompts[i], conts[i]
        for m, tok in enumerate(c):
            d = o.prompt_logprobs[len(p) + m]
            logprobs[i].append(renormalized(d[tok].logprob, (v.logprob for v in d.values()), t))
    return {"logprobs": logprobs}


def margins(llm, args: dict) -> dict:
    """The top-two margin and the k0/spec gap at each first divergence (after ``prompt + prefix``)."""
    from vllm import SamplingParams

    rows = list(zip(args["prompts"], args["prefixes"], args["k0_tokens"], args["spec_tokens"]))
    seqs, params = [], []
    for p, pre, a, b in rows:
        seqs += [p + pre + [a], p + pre + [b]]
        params += [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2, **QUIET),
                   SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, **QUIET)]
    outs = _generate(llm, seqs, params)
    out = []
    for j, (p, pre, a, b) in enumerate(rows):
        at = len(p) + len(pre)
        d, e = outs[2 * j].prompt_logprobs[at], outs[2 * j + 1].prompt_logprobs[at]
        out.append({"margin": top_two_margin(v.logprob for v in d.values()), "logit_gap": d[a].logprob - e[b].logprob})
    return {"margins": out}


def position_logprobs(rows, j: int):
    """Token ids and raw log-probs at prompt position ``j`` of vLLM's prompt logprobs (flat or a dict per
    position), as numpy arrays, each token once (the scored token is also listed beside the ranked ones)."""
    import numpy as np

    if hasattr(rows, "start_indices"):  # FlatLogprobs
        a, b = rows.start_indices[j], rows.end_indices[j]
        ids, lps = np.asarray(rows.token_ids[a:b]), np.asarray(rows.logprobs[a:b], float)
    else:
        d = rows[j]
        ids, lps = np.fromiter(d.keys(), int, len(d)), np.fromiter((v.logprob for v in d.values()), float, len(d))
    ids, first = np.unique(ids, return_index=True)
    return ids, lps[first]


OPS = {"sample": sample, "score": score, "moments": moments, "noise": noise, "margins": margins}
