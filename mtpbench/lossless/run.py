"""``mtpbench check-lossless``: does MTP drafting change what the model says?

Runs the same prompts with drafting off (k = 0) and on (k = K) and tests the promise of speculative decoding:
* greedy (temperature 0): the same tokens. The share of prompts whose k = K tokens equal k = 0's; at each
  first divergence, from a teacher-forced k = 0 pass, the target's logit of the k = 0 token minus that of the
  token the drafting run emitted (the logit gap). A gap within what rounding and batch composition can flip is
  ``numerical``, any other ``divergent`` (``numerical_threshold``; the top-two margin is recorded beside it). An
  A/A control (k = 0 at two batch sizes) that diverges beyond that bound makes the check ``inconclusive``.
* sampling (temperature > 0): the same law. Three arms with independent seeds (off, on, and off again as the
  A/A control), ``samples_per_prompt`` continuations of each prompt per arm, every sampled token scored by
  the target under its own prefix (teacher-forced k = 0, never the drafting run's own numbers); the
  permutation test of ``stats.lossless_test`` off against on and off against off, and where the backend gives
  the target's entropies (``target_moments``) the one-sample test of each arm against the target's law
  (``stats.score_test``; the off arms are its control); ``stats.lossless_verdict``, which calls lossless only
  when a shift of ``max_mde`` nats/token would have been seen (else inconclusive: underpowered).
* either: a drafting arm that drafted nothing (``num_drafts`` 0) is inconclusive (``nothing_drafted``), and
  ``exit_code`` is --fail-if-lossy's: 1 lossy or divergent, 3 inconclusive.

Output directory::

    lossless.json   config, provenance, engine facts, per-prompt details, tests (p-values, effect, MDE), verdict
    lossless.md     the one-screen summary the CLI prints
    lossless.png    greedy: each divergence's |logit gap| against the threshold; sampling: per-prompt mean score per arm

Every backend runs it through one small protocol (``CheckBackend``, token ids everywhere): ``encode``,
``sample_arm``, ``target_logprobs``, ``logprob_noise`` and ``greedy_divergences``, and optionally
``target_moments`` (per token log p, H and Var of the target's law; ``errors.Unavailable`` where it cannot).
``planted_lossy`` switches on the native engine's planted lossy acceptance rule
(``engine.Faults.accept_draft_argmax``), ``planted_subtle`` a subtler one (``ratio_temperature_factor``):
known-positive controls, never a way to decode. On vLLM, ``speculative_overrides`` (``--speculative-config``)
are merged into the drafting arm's ``speculative_config``: vLLM's own lossy control is
``{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [...]}``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from mtpbench import stats
from mtpbench.config import SweepConfig, truncated, with_runner
from mtpbench.errors import MtpBenchError, Unavailable
from mtpbench.lossless.config import SUBTLE_FACTOR, CheckConfig, check_config
from mtpbench.lossless.report import write_outputs
from mtpbench.lossless.verdict import (
    DIVERGENT_CLASS,
    NUMERICAL,
    SAMPLING_LOSSLESS,
    _divergence,
    aa_plan,
    aa_problem,
    dtype_floor,
    greedy_outcome,
    nothing_drafted,
    numerical_threshold,
)


def arm_seeds(seed: int, n: int = 3) -> list[int]:
    """Independent seeds for the arms (off, on, off again), not seed, seed + 1, ...: so the checks of
    consecutive --seed values share no arm."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def generate(backend, cfg: CheckConfig, ids: list[list[int]], k: int, seed: int, n: int = 1,
             batch_size: int | None = None, log: list | None = None) -> list[list[int]]:
    """One arm: ``n`` continuations of each prompt, flat (prompt 0's n first), cut to max_tokens; the
    drafting arm (k > 0) carries the check's speculative overrides. Keeps the arm's counters and engine
    facts into ``log`` where the backend reports them (``last_counters``, ``last_engine``), and the seed the
    arm's draws came from: ``seed``, unless the backend says otherwise (``last_seed``: ``{"seed": int or None
    (unknown), "note": why}``; a server's requests carry no seed)."""
    e = cfg.engine
    backend.last_counters = backend.last_engine = backend.last_seed = backend.last_law = None
    per = backend.sample_arm(e, ids, k, seed, n, e.temperature, e.max_tokens,
                             speculative_overrides=cfg.speculative_overrides if k > 0 else None,
                             batch_size=batch_size)
    ran = backend.last_seed or {"seed": seed, "note": None}
    if log is not None:
        log.append({"k": k, "seed": ran["seed"], "seed_note": ran["note"], "n": n,
                    "batch_size": batch_size or e.batch_size,
                    "acceptance": acceptance(backend.last_counters), "engine": backend.last_engine})
    return [c[: e.max_tokens] for cs in per for c in cs]


def acceptance(counters: dict | None) -> dict | None:
    """vLLM's spec-decode words for an arm's counters (None: the backend did not report them)."""
    if not counters or counters.get("num_drafts") is None:
        return None
    d, t, a = counters["num_drafts"], counters.get("num_draft_tokens"), counters.get("num_accepted_tokens")
    return {**counters, "acceptance_length": None if not d or a is None else 1 + a / d,
            "acceptance_rate": None if not t or a is None else a / t}


def threshold_dtype(backend, e: SweepConfig) -> str:
    """The dtype whose rounding sets the floor: the one asked for, else the one the engine reports it ran
    (``backend.dtype_name``, set by ``start`` or by the arms' engines)."""
    if e.dtype != "auto":
        return e.dtype
    name = backend.dtype_name
    if name is None:
        raise MtpBenchError("--dtype auto: the engine did not report the dtype it ran; give --dtype")
    return str(name).removeprefix("torch.")


class Steps:
    """``on_point(i, n, label)`` as each step of the check starts (a progress display's); ``grow`` adds steps (a
    sampling check's second stage)."""

    def __init__(self, on_point=None, total: int = 1):
        self.on_point, self.total, self.i = on_point, total, 0

    def __call__(self, label: str) -> None:
        if self.on_point:
            self.on_point(self.i, self.total, label)
        self.i += 1

    def grow(self, more: int) -> None:
        self.total += more

    def done(self) -> None:
        if self.on_point:
            self.on_point(self.total, self.total, "done")


def run_greedy(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str], step=None) -> dict:
    e, step = cfg.engine, step or Steps()
    bs = e.batch_size
    # the A/A control: k = 0 again in another batch composition (with one prompt, beside copies of itself)
    aa_bs, copies, batched = aa_plan(len(ids), bs)
    log: list = []
    step("greedy: k = 0")
    k0 = generate(backend, cfg, ids, 0, e.seed, batch_size=bs, log=log)
    step(f"greedy: k = {cfg.k}")
    spec = generate(backend, cfg, ids, cfg.k, e.seed, batch_size=bs, log=log)
    step("greedy: k = 0 again (A/A)")
    aa = generate(backend, cfg, ids * copies, 0, e.seed, batch_size=aa_bs, log=log)[: len(ids)]
    step("greedy: scoring the divergences")
    aa_div = backend.greedy_divergences(ids, k0, aa)
    # rounding noise of the target's own numbers: the same teacher-forced pass, all rows together and one by one
    # (one prompt: beside its copies, as in the A/A arm)
    noise = backend.logprob_noise(ids * copies, k0 * copies)
    dtype = threshold_dtype(backend, e)
    threshold = numerical_threshold(dtype, noise)
    div = [_divergence(d, threshold.value) for d in backend.greedy_divergences(ids, k0, spec)]
    aa_rows = [_divergence(d, threshold.value) for d in aa_div]  # judged against the same bound, never raising it
    identical = [d is None and len(a) == len(b) for d, a, b in zip(div, k0, spec)]
    # one run stopped sooner than the other, the tokens they share equal: a difference with no token to judge
    length_only = sum(d is None and len(a) != len(b) for d, a, b in zip(div, k0, spec))
    per_prompt = [{"prompt_id": pid, "identical": same, "k0_tokens": a, "spec_tokens": b, "divergence": d,
                   "aa_identical": ad is None and len(a) == len(c), "aa_tokens": c, "aa_divergence": ad}
                  for pid, same, a, b, c, d, ad in zip(prompt_ids, identical, k0, spec, aa, div, aa_rows)]
    aa_why = aa_problem([(pid, ad, len(a) != len(c)) for pid, ad, a, c in zip(prompt_ids, aa_rows, k0, aa)],
                        threshold.value, batched, copies)
    verdict, why = greedy_outcome(threshold, aa_why, length_only, list(zip(prompt_ids, div)))
    return {
        "verdict": verdict, "why": why, "num_length_differences": length_only,
        "identical_share": sum(identical) / len(identical),
        "num_prompts": len(ids),
        "num_divergent": sum(d is not None and d["class"] == DIVERGENT_CLASS for d in div),
        "num_numerical": sum(d is not None and d["class"] == NUMERICAL for d in div),
        "numerical_threshold": threshold.value, "numerical_threshold_source": threshold.source,
        "numerical_threshold_cap": threshold.cap, "dtype_floor": dtype_floor(dtype), "threshold_dtype": dtype,
        "aa_batch_sizes": batched, "aa_copies": copies,
        "aa_identical_share": sum(p["aa_identical"] for p in per_prompt) / len(per_prompt),
        "num_aa_numerical": sum(d is not None and d["class"] == NUMERICAL for d in aa_rows),
        "num_aa_beyond_bound": sum(d is not None and d["class"] != NUMERICAL for d in aa_rows),
        "aa_logprob_noise": threshold.noise,  # null where it was no finite number (the why gives it)
        "arms": dict(zip(("k0", "spec", "k0_aa"), log)), "per_prompt": per_prompt,
    }


def _scored(tokens: list[list[int]], lps: list[list[float]]) -> list[list[tuple]]:
    return [list(zip(range(len(t)), t, lp)) for t, lp in zip(tokens, lps)]


def score_arms(backend, prompts: list[list[int]], continuations: list[list[int]], temperature: float,
               truncated: bool = False):
    """(log-probs, moments, note): every continuation's target log-probs; where the backend has
    ``target_moments``, per token (log p, H, Var) of the target's law as well, else None and the note says why
    the one-sample test is unavailable. ``truncated`` (top-k or top-p): the arms sample a cut law that the
    moments of the whole one do not describe, so only the two-sample tests run (the score is then one fixed
    function of the tokens, which is all a permutation test needs)."""
    fn = backend.target_moments
    if truncated:
        note = "top-k/top-p cut the law sampled: the one-sample test against the whole law does not apply"
    elif fn is None:
        note = "the backend gives no target entropies"
    else:
        try:
            moments = fn(prompts, continuations, temperature)
            return [[m[0] for m in ms] for ms in moments], moments, None
        except Unavailable as err:
            note = str(err)
    return backend.target_logprobs(prompts, continuations, temperature), None, note


STAGES = ("off", "on", "off_aa")


def draw_stage(backend, cfg: CheckConfig, ids: list[list[int]], seeds: dict[str, int], n: int, step=None) -> dict:
    """One stage's three arms (off, on, off again), ``n`` continuations of each prompt an arm, drawn at ``seeds`` and
    scored by one teacher-forced pass: per arm its scored continuations and their prompts, the moments where the
    backend gives them, and its log."""
    e = cfg.engine
    rows = [p for p in ids for _ in range(n)]
    strata = [i for i in range(len(ids)) for _ in range(n)]
    log, drawn, law = {}, {}, None
    # drawn A/A first: on two attached servers of one engine seed (vLLM's default, 0; requests carry none), the
    # drafting server's first draws line up with the baseline's first, the A/A arm's, never the tested off arm's
    step = step or Steps()
    for name, k in (("off_aa", 0), ("off", 0), ("on", cfg.k)):
        step(f"sampling: arm {name} (k = {k}), {n} continuations a prompt")
        arm_log: list = []
        toks = generate(backend, cfg, ids, k, seeds[name], n=n, log=arm_log)
        log[name] = arm_log[0]
        if k > 0:  # its verify steps against their law, where the backend reads them (the third test)
            law = backend.last_law
        drawn[name] = [i for i, t in enumerate(toks) if t], toks  # an empty continuation has nothing to score
    # one teacher-forced pass scores all three arms (on vLLM: one scoring engine, not three); with the target's
    # entropies where the backend gives them (the excess test), else the log-probs alone
    step("sampling: scoring the arms")
    lps, moments, note = score_arms(backend, [rows[i] for name in STAGES for i in drawn[name][0]],
                                    [drawn[name][1][i] for name in STAGES for i in drawn[name][0]], e.temperature,
                                    truncated(e))
    lps, per_arm = iter(lps), iter(moments or [])
    arms = {}
    for name in STAGES:
        keep, toks = drawn[name]
        arms[name] = {"continuations": _scored([toks[i] for i in keep], [next(lps) for _ in keep]),
                      "prompts": [strata[i] for i in keep],
                      "moments": [next(per_arm) for _ in keep] if moments else None}
    return {"arms": arms, "log": {name: log[name] for name in STAGES}, "seeds": seeds, "moments_note": note,
            "law": law}


def stage_tests(drawn: dict, perm_seed: int) -> tuple[stats.Stage, dict | None]:
    """A stage's tests (``stats.Stage``: off vs on, the A/A control, the excess test where the moments exist) and
    each arm's one-sample test against the scorer's law (the scorer's fit, reported, deciding nothing)."""
    arms = drawn["arms"]
    law = drawn.get("law")
    law = stats.law_evidence((s[1], s[2], s[3]) for s in law["steps"]) if law and law.get("observable") else None
    ab = stats.lossless_test(arms["off"]["continuations"], arms["on"]["continuations"],
                             arms["off"]["prompts"], arms["on"]["prompts"], seed=perm_seed)
    aa = stats.lossless_test(arms["off"]["continuations"], arms["off_aa"]["continuations"],
                             arms["off"]["prompts"], arms["off_aa"]["prompts"], seed=perm_seed + 1)
    if arms["on"]["moments"] is None:
        return stats.Stage(ab, aa, None, law), None
    excess, strata, on = [], [], []
    for name in STAGES:
        for ms, p in zip(arms[name]["moments"], arms[name]["prompts"]):
            excess.append(stats.continuation_excess([m[0] for m in ms], [m[1] for m in ms]))
            strata.append(p)
            on.append(name == "on")
    fit = {name: stats.score_test(*zip(*[m for ms in arms[name]["moments"] for m in ms]))
           if any(arms[name]["moments"]) else None for name in STAGES}
    return stats.Stage(ab, aa, stats.excess_test(excess, strata, on), law), fit


def law_block(law: dict | None, over: float = stats.ALARM_LAW) -> dict:
    """The drafting arm's acceptance against its law, as trace.json's ``acceptance_law`` (``law_summary``), or why
    it was not read; over-acceptance decided at the level the verdict reads it at in this stage (``over``: the
    alarm's, or the confirmation's), under-acceptance at the law test's own (the note beside the verdict), so the
    table and the verdict never disagree."""
    from mtpbench.metrics.law import law_summary
    from mtpbench.stats.acceptance import ALPHA

    if law is None:
        return law_summary([], why="this backend does not read the verifier's law")
    if not law.get("observable"):
        return law_summary([], why=law.get("why") or "not observable")
    return law_summary(law["steps"], levels={"over": over, "under": ALPHA / 2})


def _stage_record(drawn: dict, stage: stats.Stage, fit: dict | None, over: float = stats.ALARM_LAW) -> dict:
    return {"arm_seeds": drawn["seeds"], "arms": drawn["log"],
            "test": stage.ab and asdict(stage.ab), "aa_test": stage.aa and asdict(stage.aa),
            "excess_test": stage.excess and asdict(stage.excess),
            "acceptance_law": law_block(drawn.get("law"), over),
            "score_tests": None if fit is None else {name: t and asdict(t) for name, t in fit.items()}}


def per_prompt_means(arms: dict, prompt_ids: list[str]) -> list[dict]:
    """Per prompt and arm: the mean score of its continuations, how many, and their tokens (the figures)."""
    out = []
    for i, pid in enumerate(prompt_ids):
        entry = {"prompt_id": pid}
        for name, arm in arms.items():
            means = [float(np.mean([max(lp, stats.LOGPROB_FLOOR) for _, _, lp in c]))
                     for c, p in zip(arm["continuations"], arm["prompts"]) if p == i]
            entry[f"mean_logprob_{name}"] = float(np.mean(means)) if means else None
            entry[f"num_continuations_{name}"] = len(means)
            entry[f"tokens_{name}"] = [[t for _, t, _ in c] for c, p in zip(arm["continuations"], arm["prompts"])
                                       if p == i]
        out.append(entry)
    return out


def run_sampling(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str], step=None) -> dict:
    """The sampling check: a first stage of three arms; where its numbers raise an alarm (``stats.alarm``), a
    second stage of three arms at fresh seeds and twice the continuations that must show it again, on its own or
    with the first stage combined (``stats.lossless_verdict``)."""
    e = cfg.engine
    six = arm_seeds(e.seed, 6)  # the first three are arm_seeds(e.seed): a first stage as before the second existed
    seeds = [dict(zip(STAGES, six[:3])), dict(zip(STAGES, six[3:]))]
    perm_seeds = [int(x) for x in np.random.SeedSequence([e.seed, 1]).generate_state(2)]
    step = step or Steps(total=4)
    first = draw_stage(backend, cfg, ids, seeds[0], cfg.per_prompt, step)
    stages = [stage_tests(first, perm_seeds[0])]
    raised = stats.alarm(stages[0][0])
    second = None
    if raised:
        step.grow(4)
        second = draw_stage(backend, cfg, ids, seeds[1], 2 * cfg.per_prompt, step)
        stages.append(stage_tests(second, perm_seeds[1]))
    verdict, why = stats.lossless_verdict([s for s, _ in stages], max_mde=cfg.max_mde)
    ab = stages[0][0].ab
    return {
        "verdict": SAMPLING_LOSSLESS if verdict == stats.LOSSLESS else verdict, "why": why,
        **_stage_record(first, *stages[0]), "score_tests_unavailable": first["moments_note"],
        "alarm": raised,
        "confirmation": None if second is None else _stage_record(second, *stages[1], stats.CONFIRM_LAW),
        "combined": None if second is None else {k: c and asdict(c) for k, c in
                                                 stats.combined(stages[0][0], stages[1][0]).items()},
        "detectable_shift": None if ab is None else stats.detectable_shift(ab),
        "max_detectable_shift": cfg.max_mde,
        "levels": stats.verdict.levels(stages[0][0]),
        "alpha_aa": stats.ALPHA_AA,
        "num_prompts": len(ids), "samples_per_prompt": cfg.per_prompt,
        "per_prompt": per_prompt_means(first["arms"], prompt_ids),
    }


def run_check(cfg: CheckConfig, on_point=None) -> dict:
    """Run the check and write lossless.json, lossless.md and lossless.png into ``cfg.engine.out``; returns
    the saved record. Bad input raises MtpBenchError before anything is loaded or written. ``on_point(i, n, label)``:
    as each step starts (a progress display)."""
    from mtpbench.backends import get_backend
    from mtpbench.environment import provenance
    from mtpbench.prompts import run_prompts

    check_config(cfg)
    e = with_runner(cfg.engine)  # the runner each vLLM engine is asked for, recorded
    cfg = replace(cfg, engine=e)
    pset = run_prompts(e)
    t0 = time.perf_counter()
    backend = get_backend(e.backend)
    backend.baseline_server = cfg.baseline_server  # None but for an attached --server (check_config)
    engine = backend.start(e)
    if e.server and not e.k:  # the attached server's own k (start refuses a --server that does not draft)
        e = replace(e, k=(backend.grid_k(),))
        cfg = replace(cfg, engine=e)
    engine.update(backend.check_facts())
    if cfg.planted_lossy:  # only a backend with planted rules gets here (check_config)
        backend.plant_faults(accept_draft_argmax=True)
    if cfg.planted_subtle:
        backend.plant_faults(ratio_temperature_factor=SUBTLE_FACTOR)
    try:
        ids = backend.encode(pset.prompts)
        pids = [p.id for p in pset.prompts]
        step = Steps(on_point, 4)  # greedy: three arms and the scoring; sampling: a stage's (more if a second runs)
        result = run_greedy(backend, cfg, ids, pids, step) if cfg.greedy else run_sampling(backend, cfg, ids, pids, step)
        step.done()
    finally:
        backend.close()
    # the drafting arm's facts beside the engine's: what ran (runner, drafter class) and how much it accepted
    engine["drafting_arm"] = result["arms"]["spec" if cfg.greedy else "on"]
    nothing_drafted(result, engine["drafting_arm"])
    if backend.scoring_engine:  # vLLM: which runner scored (VllmBackend._lossless_worker)
        engine["scoring_engine"] = backend.scoring_engine
    engine.setdefault("dtype", backend.dtype_name)  # vLLM's: what its engines reported
    if result["verdict"] == stats.INCONCLUSIVE:  # the reason in a word: the summary's headline
        result["inconclusive_reason"] = (result.get("why") or "").split(":")[0] or None
    record = {"kind": "greedy" if cfg.greedy else "sampling", "verdict": result["verdict"],
              "config": cfg.to_json(), "provenance": provenance(), "engine": engine, "prompts": pset.describe(),
              "wall_s": round(time.perf_counter() - t0, 3), **{k: v for k, v in result.items() if k != "verdict"}}
    write_outputs(Path(e.out), record)
    return record
