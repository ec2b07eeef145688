"""The numbers of check-drafter: each captured draft call recomputed stage by stage by the reference
(``reference``), the engine's inputs tried against their plausible alternatives, and the drafts of engine and
reference scored against the target's tokens. The answers drawn from them are ``compare``'s."""

from __future__ import annotations

import math
from collections import Counter

import torch

from mtpbench.drafter.compare import acceptance_per_position, cause, differs, first_difference
from mtpbench.drafter.families import STAGES, Family
from mtpbench.drafter.reference import Reference


def rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    """max |a - b| / max |b|; None where either is missing, inf where their shapes differ."""
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return math.inf
    return float((a.float() - b.float()).abs().max()) / max(float(b.abs().max()), 1e-12) if b.numel() else 0.0


def nearest(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of a: the index of the nearest row of b and that distance relative to max |b|."""
    d = (a[:, None, :] - b[None, :, :]).abs().amax(-1)
    best = d.min(1)
    return best.indices, best.values / max(float(b.abs().max()), 1e-12)


def _rec(call: dict, stage: str, phase: str | None = "forward") -> dict | None:
    recs = call["stages"].get(stage) or []
    return next((r for r in recs if phase is None or r["phase"] == phase), recs[0] if recs else None)


def layer_of(call: dict, num_layers: int) -> int:
    for recs in call["stages"].values():
        for r in recs:
            if r["j"] is not None:
                return r["j"]
    idx = call["spec_step_idx"]
    return idx % num_layers if isinstance(idx, int) else 0


class Checker:
    """Walks the captured calls in order (the reference's decoder layers keep the keys each call wrote)."""

    def __init__(self, ref: Reference, tol: float):
        self.ref, self.f, self.tol = ref, ref.family, tol
        self.check_dec: dict[int, object] = {}
        self.chain_dec: dict[int, object] = {}

    def _decoders(self, j: int):
        if j not in self.check_dec:
            self.check_dec[j] = self.ref.decoder(j)
            self.chain_dec[j] = None if self.check_dec[j] is None else type(self.check_dec[j])(
                self.check_dec[j].w, self.ref.cfg, self.ref.eps, self.check_dec[j].mlp)
        return self.check_dec[j], self.chain_dec[j]

    def new_request(self) -> None:
        for d in (*self.check_dec.values(), *self.chain_dec.values()):
            if d is not None:
                d.reset()

    def call(self, c: dict, prev: dict | None, target: dict | None) -> dict:
        """One draft call: each stage's error, the inputs' best alternatives, the engine's and the reference's
        selected rows (positions and draft tokens)."""
        ref, f = self.ref, self.f
        j = layer_of(c, ref.num_layers)
        ids, pos, h_prev = c["input_ids"].long(), c["positions"].long(), c["h_prev"]
        en, hn, pj, bk, fn = (_rec(c, s) for s in ("enorm", "hnorm", "proj", "block", "final_norm"))
        bo = _block_out(c, bk)
        e: dict[str, float | None] = {s: None for s in STAGES}
        notes: list[str] = []
        embed = ref.embed(ids, pos)
        if en:
            e["embedding"] = rel(en.get("in"), embed)
            e["enorm"] = rel(en.get("out"), ref.stage("enorm", en["in"], j))
        if hn:
            e["hidden input"] = rel(hn.get("in"), h_prev)
            e["hnorm"] = rel(hn.get("out"), ref.stage("hnorm", hn["in"], j))
        exchanged = bool(en and hn) and self._within(en.get("in"), h_prev) and self._within(hn.get("in"), embed) \
            and not self._within(en.get("in"), embed)
        if exchanged:
            notes.append("embedding and hidden input: exchanged: enorm was given the previous hidden state and hnorm "
                         "the token embedding")
        if pj and en and hn:
            self._concat_and_proj(e, notes, en, hn, pj, j, exchanged)
        if en and hn and differs(e["enorm"], self.tol) and self._within(en.get("out"), ref.stage("hnorm", en["in"], j)) \
                and self._within(hn.get("out"), ref.stage("enorm", hn["in"], j)):
            notes.append("enorm and hnorm: exchanged weights: enorm normed with hnorm's weights and hnorm with "
                         "enorm's")
        for name, r in (("enorm", en), ("hnorm", hn), ("proj", pj)):
            if r and e[name] is not None and e[name] > self.tol:
                other = next((jj for jj in range(ref.num_layers) if jj != j and
                              (rel(r.get("out"), ref.stage(name, r["in"], jj)) or 0.0) <= self.tol), None)
                if other is not None:
                    notes.append(f"{name}: layer {j} computes with layer {other}'s weights")
        if bk and pj:
            e["block input"] = rel(bk.get("in"), pj.get("out"))
        check_dec, chain_dec = self._decoders(j)
        n = run_length(pos)  # rows past the first break in positions are padding (Model Runner V2's)
        if check_dec is not None and bk is not None and bk.get("in") is not None and bo is not None:
            e["block"] = rel(bo[:n], check_dec(bk["in"], pos, n)[:n])
        if fn:
            e["final norm"] = rel(fn.get("out"), ref.stage("final norm", fn["in"], j))
            if differs(e["final norm"], self.tol) and self._within(fn.get("out"), fn.get("in")):
                notes.append("final norm: its output is its input (the norm is not applied)")
        # the reference's own chain from the engine's call inputs, to its draft
        r_proj = ref.stage("proj", ref.stage("concat", (ref.stage("enorm", embed, j),
                                                        ref.stage("hnorm", h_prev, j)), j), j)
        if chain_dec is not None:
            r_bo = chain_dec(r_proj, pos, n)
        elif bo is not None and bk is not None and (rel(bk.get("in"), r_proj) or 0.0) <= self.tol:
            r_bo = bo  # the engine's decoder layer on the reference's own input
        else:
            r_bo = None
        heads = self._heads(c, e, notes, bo, fn, r_bo, pos, j)
        inputs = self._inputs(c, prev, target, bo, j)
        return {"layer": j, "errors": e, "notes": notes, "heads": heads, "inputs": inputs}

    def _heads(self, c: dict, e: dict, notes: list, bo, fn, r_bo, pos, j: int) -> list[dict]:
        """The logits calls: their input against the state the family defines (normed or not), their output
        against the reference head on that input, and each selected row's draft, the engine's and (where its
        chain could be computed) the reference's."""
        ref, f = self.ref, self.f
        post = ref.stage("final norm", bo, j) if bo is not None else None
        heads = []
        for lg in c["logits"]:
            want = bo if f.head_norms else (fn.get("out") if fn else post)
            other = post if f.head_norms else bo
            if want is None or lg["in"] is None:
                continue
            idx, dist = nearest(lg["in"], want)
            e["head input"] = max(e["head input"] or 0.0, float(dist.max()))
            if other is not None and float(dist.max()) > self.tol and float(nearest(lg["in"], other)[1].max()) <= self.tol:
                notes.append("head input: the head got the " + ("normed" if f.head_norms else "un-normed") +
                             " state where the " + ("un-normed" if f.head_norms else "normed") + " one is defined")
            out = lg["out"][..., : ref.w("head", j).shape[0]]
            e["head"] = max(e["head"] or 0.0, rel(out, ref.stage("head", lg["in"], j)) or 0.0)
            r_tok = None
            if r_bo is not None:
                x = r_bo[idx]
                r_logits = ref.stage("head", x if f.head_norms else ref.stage("final norm", x, j), j)
                r_tok = r_logits.argmax(-1).tolist()
            heads.append({"positions": pos[idx].tolist(), "engine": out.argmax(-1).tolist(), "reference": r_tok})
        return heads

    def _within(self, a, b) -> bool:
        """a equals b within the tolerance (both captured, the same shape)."""
        r = rel(a, b)
        return r is not None and r <= self.tol

    def _concat_and_proj(self, e: dict, notes: list, en: dict, hn: dict, pj: dict, j: int, exchanged: bool) -> None:
        """The projection's input against the two normed halves in the defined order, and its output. A half is
        what it holds: where the norms were given each other's inputs (``exchanged``) the embedding's half is
        hnorm's output, so the order is judged by content and no "other order" is claimed that only the exchange
        made. An engine that concatenates in the other order with the weight's halves swapped to match computes the
        same product (the native engine's builtin-glm) and is parity, with a note."""
        ref = self.ref
        halves = (hn["out"], en["out"]) if exchanged else (en["out"], hn["out"])  # (embedding's, hidden's)
        e["concat"] = rel(pj.get("in"), ref.stage("concat", halves, j))
        e["proj"] = rel(pj.get("out"), ref.stage("proj", pj["in"], j))
        if e["concat"] is None or e["concat"] <= self.tol:
            return
        defined = ref.stage("concat", halves, j)
        for jj in (j, *(jj for jj in range(ref.num_layers) if jj != j)):  # its own layer's weights, else another's
            both = rel(pj.get("out"), ref.stage("proj", defined, jj))
            if both is not None and both <= self.tol:
                e["concat"] = both
                e["proj"] = rel(pj.get("out"), ref.stage("proj", defined, j))
                notes.append("concat and proj: the engine concatenates the halves in the other order and holds the "
                             "projection's halves swapped to match (the same product)")
                if jj != j:
                    notes.append(f"proj: layer {j} computes with layer {jj}'s weights")
                return
        if self._within(pj.get("in"), ref.stage("concat", halves[::-1], j)):
            notes.append("concat: the projection's input is the two halves in the other order")

    def _inputs(self, c: dict, prev: dict | None, target: dict | None, bo, j: int) -> dict:
        """Which candidate each row of the call's previous hidden state equals: step 0, the target's hidden before
        or after its final norm at some offset of position; later steps, the previous call's output before or after
        its final norm."""
        pos, h = c["positions"].long(), c["h_prev"]
        cands = []
        if c["step"] == 0 and target is not None:
            tpos = target["positions"].long().reshape(-1)
            pre, post, out = target.get("pre"), target.get("post"), target.get("out")
            if out is not None and (pre is None or pre.shape[0] < out.shape[0]):
                # the norm ran on some rows only (a target that hands over its hidden before the norm and norms
                # in its logits call): its output is the pre-norm state, the reference norms it
                pre, post = out, self.ref.target_norm(out)
            cands = [("target", "pre", pre, tpos), ("target", "post", post, tpos)]
        elif prev is not None and prev.get("bo") is not None:
            cands = [("previous step", "pre", prev["bo"], prev["positions"].long()),
                     ("previous step", "post", self.ref.stage("final norm", prev["bo"], prev["layer"]),
                      prev["positions"].long())]
        n = run_length(pos)  # padding rows (V2's) are handed whatever: not judged
        matches: list[set] = [set() for _ in range(n)]
        for who, kind, rows, rpos in cands:
            if rows is None or rows.shape[-1] != h.shape[-1] or len(rpos) != rows.shape[0]:
                continue
            d = (h[:n, None, :] - rows[None, :, :]).abs().amax(-1) / max(float(rows.abs().max()), 1e-12)
            for i, r in (d <= self.tol).nonzero().tolist():
                matches[i].add((who, kind, int(rpos[r]) - int(pos[i])))
        # a row that equals several candidates (a repeated token's states) tells nothing: only unique matches vote
        best = Counter(next(iter(m)) for m in matches if len(m) == 1)
        c["bo"], c["layer"] = bo, j
        if not best:
            return {"hidden": None, "rows": h.shape[0]}
        (who, kind, off), n = best.most_common(1)[0]
        return {"hidden": {"from": who, "kind": kind, "offset": off}, "share": n / h.shape[0], "rows": h.shape[0]}


def run_length(pos: torch.Tensor) -> int:
    """How many leading rows sit at consecutive positions (the rest are an engine's padding)."""
    p = pos.reshape(-1).tolist()
    n = 1
    while n < len(p) and p[n] == p[n - 1] + 1:
        n += 1
    return min(n, len(p))


def _block_out(c: dict, bk: dict | None):
    if bk is not None and bk.get("out") is not None:
        return bk["out"]
    r = _rec(c, "block_out")
    return None if r is None else (r.get("out") if r.get("out") is not None else r.get("in"))


def analyse(calls: list[dict], targets: list[dict], sequences: list[list[int]], ref: Reference, tol: float,
            k: int) -> dict:
    """Every call checked; per stage the largest error; the first stage that differs; the inputs' alternatives;
    the acceptance per position of the engine's drafts and of the reference's, against the target's tokens."""
    checker = Checker(ref, tol)
    by_proposal = {t["proposal"]: t for t in targets}
    worst: dict[str, float | None] = {s: None for s in STAGES}
    notes: Counter = Counter()
    hidden: Counter = Counter()
    tokens: Counter = Counter()
    cycles: list[dict] = []  # each proposal: the engine's and the reference's matches, step by step
    request, prev, cur = -1, None, None
    ref_complete = True
    for c in calls:
        if c["step"] == 0 and c["positions"].numel() and int(c["positions"].min()) == 0:
            request += 1
            checker.new_request()
        out = checker.call(c, prev if c["step"] > 0 else None, by_proposal.get(c["proposal"]))
        prev = c
        for s, v in out["errors"].items():
            if v is not None:
                worst[s] = v if worst[s] is None else max(worst[s], v)
        notes.update(out["notes"])
        if out["inputs"]["hidden"] is not None:
            hd = out["inputs"]["hidden"]
            hidden[(c["step"] > 0, hd["from"], hd["kind"], hd["offset"])] += 1
        seq = sequences[request] if 0 <= request < len(sequences) else []
        if c["step"] == 0 and seq:
            tokens[token_offset(c["input_ids"].long(), c["positions"].long(), seq)] += 1
        if c["step"] == 0:
            cur = {"engine": [], "reference": [], "unknown": False}
            cycles.append(cur)
        for head in out["heads"][:1]:
            if c["step"] == 0:
                cur["q0"] = head["positions"][-1]
            q = cur.get("q0", head["positions"][-1]) + c["step"]  # step s drafts the token at q0 + 2 + s
            want = seq[q + 2] if q + 2 < len(seq) else None
            if want is None:  # past the generated tokens: the proposal cannot be judged
                cur["unknown"] = True
            cur["engine"].append(head["engine"][-1] == want)
            if head["reference"] is None:
                ref_complete = False
            else:
                cur["reference"].append(head["reference"][-1] == want)
    judged = [c for c in cycles if not c["unknown"]]
    flag_inputs(worst, notes, tokens, hidden, ref.family, tol)
    first = first_difference(worst, tol)
    return {"errors": worst, "first_difference": first, "cause": cause(first, notes), "notes": dict(notes),
            "hidden_inputs": [{"later_step": a, "from": b, "kind": kd, "offset": o, "calls": n}
                              for (a, b, kd, o), n in sorted(hidden.items())],
            "engine_acceptance": acceptance_per_position([c["engine"] for c in judged], k),
            "reference_acceptance": acceptance_per_position([c["reference"] for c in judged], k) if ref_complete
            else None, "num_calls": len(calls), "num_proposals": len(judged), "num_requests": request + 1}


def token_offset(ids: torch.Tensor, pos: torch.Tensor, seq: list[int]) -> int | None:
    """The offset o at which the call's token ids equal the request's tokens (vLLM's geometry: o = 1, the row at
    position t reads the token at t + 1), by the vote of the rows that tell offsets apart: the leading rows at
    consecutive positions (the rest are padding) that equal the request's token at some offsets but not at all
    (a sequence that repeats one token, a tiny model's greedy loop, matches every offset). A tie, or no row that
    tells, goes to o = 1 where some row matched; None where no row matches at any offset."""
    offsets = (1, -1, 0, 2)
    votes: Counter = Counter()
    matched = False
    for i, p in list(zip(ids.tolist(), pos.tolist()))[:run_length(pos)]:
        hit = [o for o in offsets if 0 <= p + o < len(seq) and seq[p + o] == i]
        matched = matched or bool(hit)
        if hit and len(hit) < len([o for o in offsets if 0 <= p + o < len(seq)]):
            votes.update(hit)
    if not votes:
        return 1 if matched else None
    top = max(votes.values())
    return next(o for o in offsets if votes[o] == top)


def flag_inputs(worst: dict, notes: Counter, tokens: Counter, hidden: Counter, f: Family, tol: float) -> None:
    """The engine's inputs against the architecture's definition: step 0 reads the token at t + 1 and the
    target's hidden at t (after or before its final norm, per family); a later step reads the previous step's
    output at t - 1. A majority of calls elsewhere is the first differing 'token input' / 'hidden input'."""
    if tokens:
        off = tokens.most_common(1)[0][0]
        worst["token input"] = 0.0 if off == 1 else 1.0
        if off != 1:
            got = f"the token at t{off:+d}" if off is not None else "tokens of no position of the request"
            notes[f"token input: the row at position t reads {got} (the architecture: t+1)"] += 1
    for later, allowed in ((False, [("target", f.target_hidden, 0)]),
                           (True, [("previous step", kind, o) for kind in f.next_hidden for o in (-1, 0)])):
        seen = Counter({key[1:]: n for key, n in hidden.items() if key[0] == later})
        if not seen:
            continue
        got = seen.most_common(1)[0][0]
        expected = allowed[0]
        if later and got not in allowed and differs(worst["final norm"], tol):
            notes["hidden input: a later step's hidden is the previous step's final norm output, which differs"] += 1
        elif got not in allowed:
            worst["hidden input"] = max(worst["hidden input"] or 0.0, 1.0)
            step = "a later step" if later else "step 0"
            notes[f"hidden input: {step} reads {got[0]}'s hidden {'before' if got[1] == 'pre' else 'after'} its "
                  f"final norm at t{got[2]:+d}; the architecture defines {expected[0]}'s "
                  f"{'before' if expected[1] == 'pre' else 'after'} it at t{expected[2]:+d}"] += 1
