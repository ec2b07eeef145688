"""vLLM's spec-decode counters (``vllm:spec_decode_*`` from ``LLM.get_metrics()``): read in an engine, and the
deltas around a measured batch (cumulative counters: the warm-up never counts); one request's counts."""

from __future__ import annotations

from mtpbench.metrics import BatchRecord

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def read_spec_counters(llm) -> dict:
    """Current values of vLLM's spec-decode counters, summed over label sets."""
    out = {name: 0 for name in SPEC_COUNTERS}
    out["num_accepted_tokens_per_pos"] = []
    for m in llm.get_metrics():
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in SPEC_COUNTERS:
            out[name] += int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            vals = out[name]
            vals.extend([0] * (len(m.values) - len(vals)))
            for i, v in enumerate(m.values):
                vals[i] += int(v)
    return out


def counter_delta(before: dict, after: dict, k: int) -> dict:
    """What the counters gained between two readings, per position for the first k. A position the later
    reading lacks is unknown (None), not 0; one only the earlier reading lacks was created in between,
    from 0 (a Prometheus child appears on its first count)."""
    old, new = before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"]
    per_pos = [None if i >= len(new) or new[i] is None
               else new[i] - (old[i] if i < len(old) and old[i] is not None else 0) for i in range(k)]
    return {**{n: after[n] - before[n] for n in SPEC_COUNTERS}, "num_accepted_tokens_per_pos": per_pos}


def per_request_acceptance(output, k: int, alone: BatchRecord | None) -> dict:
    """One request's spec-decode counts: from vLLM's per-request data where the engine keeps it
    (``per_request_spec_decode_metrics``; ``detailed`` gives each step, hence positions), else from the
    counter deltas of a batch it ran in alone, else unknown (empty)."""
    from mtpbench.metrics import request_acceptance, request_acceptance_from_histogram

    if k == 0:
        return {}
    sd = getattr(output.outputs[0], "spec_decode_metrics", None)
    if sd is not None and sd.per_step_accepted:
        return request_acceptance(k, list(sd.per_step_accepted), list(sd.per_step_drafted),
                                  len(output.prompt_token_ids or []) + 1)
    if sd is not None and sd.histogram:
        return request_acceptance_from_histogram(k, list(sd.histogram), sd.num_draft_tokens)
    if alone is not None:
        return {name: getattr(alone, name) for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                         "num_accepted_tokens_per_pos")}
    return {}
