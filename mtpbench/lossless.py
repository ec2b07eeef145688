"""``mtpbench check-lossless``: does MTP drafting change what the model says?

Runs the same prompts with drafting off (k = 0) and on (k = K) and tests the promise of speculative decoding:
* greedy (temperature 0): the same tokens. The share of prompts whose k = K tokens equal k = 0's; at each
  first divergence the target's top-two logit margin from a teacher-forced k = 0 pass. A margin within what
  rounding and batch composition can flip is ``numerical``, any other ``divergent`` (``numerical_threshold``).
* sampling (temperature > 0): the same law. Three arms with independent seeds (off, on, and off again as the
  A/A control), ``samples_per_prompt`` continuations of each prompt per arm, every sampled token scored by
  the target under its own prefix (teacher-forced k = 0, never the drafting run's own numbers); the
  permutation test of ``stats.lossless_test`` off against on and off against off; ``stats.lossless_verdict``.

Output directory::

    lossless.json   config, provenance, engine facts, per-prompt details, tests (p-values, effect, MDE), verdict
    lossless.md     the one-screen summary the CLI prints
    lossless.png    greedy: each divergence's margin against the threshold; sampling: per-prompt mean score per arm

Only the native backend runs it for now. ``planted_lossy`` switches on the engine's planted lossy acceptance
rule (``engine.Faults.accept_draft_argmax``): a known-positive control, never a way to decode.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from mtpbench import stats
from mtpbench.config import SweepConfig, validate
from mtpbench.errors import MtpBenchError

BACKENDS = ("native",)
NOT_YET = ("vllm", "vllm-server")
# the default N, measured on the built-in model at k = 2, temperature 1 (README, check-lossless): the planted
# lossy rule is called lossy in >= 9 of 10 seeded checks, the correct engine in <= 1 of 10, in well under 3 min
# (on that drafter the planted shift is small, about +0.1 nats/token, per-continuation sd 0.39 at 64 tokens:
# subsampled from pools of 48 continuations a prompt, 12 x 24 x 64 tokens was called lossy 85 % of the time,
# 12 x 16 x 64 65 %, 12 x 24 x 32 42 %; so 16 x 24 x 64 tokens, 384 continuations an arm)
DEFAULT_PROMPTS = 16
DEFAULT_SAMPLES_PER_PROMPT = 24
DEFAULT_MAX_TOKENS = 64
DEFAULT_BATCH_SIZE = 48
CHECK_DEFAULTS = {"k": (2,), "mode": ("reuse",), "num_prompts": DEFAULT_PROMPTS, "max_tokens": DEFAULT_MAX_TOKENS,
                  "temperature": 1.0, "batch_size": DEFAULT_BATCH_SIZE, "out": "lossless"}
# a greedy tie is "numerical" when its margin is within what rounding can flip. The floor: NUMERICAL_ULPS units
# in the last place of a logit of magnitude LOGIT_SCALE in the model's dtype (float32: 3.1e-5, bfloat16: 2.0,
# float16: 0.25); the logits' rounding error grows with every layer, so one ulp of the output would be too
# tight. Above the floor the A/A control decides: NOISE_FACTOR x the largest change of a teacher-forced
# log-prob between two batch compositions (a margin is a difference of two logits, each can move by it: x 2,
# and x 2 again for noise the measured positions did not reach), and the largest margin an A/A divergence had.
NUMERICAL_ULPS = 8
LOGIT_SCALE = 32.0
NOISE_FACTOR = 4.0
GREEDY_LOSSLESS, DIVERGENT, NUMERICAL_ONLY = "lossless", "divergent", "numerical only"
NUMERICAL, DIVERGENT_CLASS = "numerical", "divergent"
SAMPLING_LOSSLESS = "lossless (no difference detectable at this N)"


@dataclass(frozen=True)
class CheckConfig:
    """One check: the engine settings (a ``SweepConfig``, its ``k`` a single K > 0) and the check's own."""
    engine: SweepConfig
    samples_per_prompt: int | None = None  # sampling only; None: DEFAULT_SAMPLES_PER_PROMPT
    planted_lossy: bool = False

    @property
    def k(self) -> int:
        return self.engine.k[0]

    @property
    def greedy(self) -> bool:
        return self.engine.temperature <= 0

    @property
    def per_prompt(self) -> int:
        return DEFAULT_SAMPLES_PER_PROMPT if self.samples_per_prompt is None else self.samples_per_prompt

    def to_json(self) -> dict:
        return {**self.engine.to_json(), "k": self.k,
                "samples_per_prompt": None if self.greedy else self.per_prompt, "planted_lossy": self.planted_lossy}


def check_config(cfg: CheckConfig) -> None:
    """Everything that can be refused before a model is loaded or a file is written."""
    e = cfg.engine
    if e.backend in NOT_YET:
        raise MtpBenchError(f"check-lossless: --backend {e.backend} is not supported yet (only native for now)")
    if e.backend not in BACKENDS:
        raise MtpBenchError(f"unknown backend {e.backend!r} (check-lossless runs: {', '.join(BACKENDS)})")
    if len(e.k) != 1 or e.k[0] < 1:
        raise MtpBenchError(f"--k takes one value >= 1 (the drafting arm; k = 0 is the baseline it is checked "
                            f"against), got {','.join(map(str, e.k)) or 'none'}")
    if len(e.mode) != 1:
        raise MtpBenchError(f"--mode takes one drafting mode, got {','.join(e.mode)}")
    if cfg.greedy and cfg.samples_per_prompt is not None:
        raise MtpBenchError("--samples-per-prompt applies to sampling (temperature > 0): at temperature 0 "
                            "every continuation of a prompt is the same")
    if cfg.samples_per_prompt is not None and cfg.samples_per_prompt < 1:
        raise MtpBenchError(f"--samples-per-prompt must be >= 1, got {cfg.samples_per_prompt}")
    if e.context_tokens:
        raise MtpBenchError("--context-tokens is a sweep dimension: check-lossless runs without held-out text")
    validate(e, e.num_mtp_layers())


def arm_seeds(seed: int, n: int = 3) -> list[int]:
    """Independent seeds for the arms (off, on, off again), not seed, seed + 1, ...: so the checks of
    consecutive --seed values share no arm."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n)]


def generate(backend, cfg: CheckConfig, rows: list[list[int]], k: int, seed: int, batch_size: int) -> list[list[int]]:
    e = replace(cfg.engine, seed=seed)
    layers = e.mtp_layers[0] if e.mtp_layers else e.num_mtp_layers()
    out = []
    for i in range(0, len(rows), batch_size):
        g = backend.generation(e, rows[i: i + batch_size], k, e.mode[0], layers, e.max_tokens)
        for _ in g:
            pass
        out += [t[: e.max_tokens] for t in g.tokens]
    return out


# ---- greedy ------------------------------------------------------------------------------------------------

def dtype_floor(dtype: str) -> float:
    import torch

    return NUMERICAL_ULPS * torch.finfo(getattr(torch, dtype)).eps * LOGIT_SCALE


def numerical_threshold(dtype: str, logprob_noise: float, aa_margins: list[float]) -> tuple[float, str]:
    """The largest top-two margin rounding can flip here, and which of its three sources set it."""
    parts = {"dtype": dtype_floor(dtype), "A/A log-prob noise": NOISE_FACTOR * logprob_noise,
             "A/A divergence margin": max(aa_margins, default=0.0)}
    source = max(parts, key=parts.get)
    return parts[source], source


def classify(margin: float, threshold: float) -> str:
    return NUMERICAL if margin <= threshold else DIVERGENT_CLASS


def greedy_verdict(divergences: list[dict | None]) -> str:
    found = [d for d in divergences if d is not None]
    if not found:
        return GREEDY_LOSSLESS
    return DIVERGENT if any(d["class"] == DIVERGENT_CLASS for d in found) else NUMERICAL_ONLY


def _divergence(d, threshold: float | None = None) -> dict | None:
    if d is None:
        return None
    out = asdict(d)
    if threshold is not None:
        out["class"] = classify(d.margin, threshold)
    return out


def run_greedy(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str]) -> dict:
    e = cfg.engine
    bs = e.batch_size
    other = 1 if bs > 1 else len(ids)  # the A/A control: k = 0 at another batch size
    k0 = generate(backend, cfg, ids, 0, e.seed, bs)
    spec = generate(backend, cfg, ids, cfg.k, e.seed, bs)
    aa = generate(backend, cfg, ids, 0, e.seed, other)
    aa_div = backend.greedy_divergences(ids, k0, aa)
    # rounding noise of the target's own numbers: the same teacher-forced pass, all rows together and one by one
    together = backend.target_logprobs(ids, k0, 1.0)
    alone = [backend.target_logprobs([p], [c], 1.0)[0] for p, c in zip(ids, k0)]
    noise = max((abs(a - b) for x, y in zip(together, alone) for a, b in zip(x, y)), default=0.0)
    threshold, source = numerical_threshold(e.dtype if e.dtype != "auto" else backend.dtype_name, noise,
                                            [d.margin for d in aa_div if d is not None])
    div = [_divergence(d, threshold) for d in backend.greedy_divergences(ids, k0, spec)]
    aa_rows = [_divergence(d) for d in aa_div]
    identical = [d is None and len(a) == len(b) for d, a, b in zip(div, k0, spec)]
    per_prompt = [{"prompt_id": pid, "identical": same, "k0_tokens": a, "spec_tokens": b, "divergence": d,
                   "aa_identical": ad is None, "aa_divergence": ad}
                  for pid, same, a, b, d, ad in zip(prompt_ids, identical, k0, spec, div, aa_rows)]
    return {
        "verdict": greedy_verdict(div),
        "identical_share": sum(identical) / len(identical),
        "num_prompts": len(ids),
        "num_divergent": sum(d is not None and d["class"] == DIVERGENT_CLASS for d in div),
        "num_numerical": sum(d is not None and d["class"] == NUMERICAL for d in div),
        "numerical_threshold": threshold, "numerical_threshold_source": source,
        "dtype_floor": dtype_floor(e.dtype if e.dtype != "auto" else backend.dtype_name),
        "aa_batch_sizes": [bs, other], "aa_identical_share": sum(d is None for d in aa_div) / len(aa_div),
        "aa_logprob_noise": noise,
        "per_prompt": per_prompt,
    }


# ---- sampling ----------------------------------------------------------------------------------------------

def _scored(tokens: list[list[int]], lps: list[list[float]]) -> list[list[tuple]]:
    return [list(zip(range(len(t)), t, lp)) for t, lp in zip(tokens, lps)]


def run_sampling(backend, cfg: CheckConfig, ids: list[list[int]], prompt_ids: list[str]) -> dict:
    e, n = cfg.engine, cfg.per_prompt
    rows = [p for p in ids for _ in range(n)]
    strata = [i for i in range(len(ids)) for _ in range(n)]
    seeds = dict(zip(("off", "on", "off_aa"), arm_seeds(e.seed)))
    arms = {}
    for name, k in (("off", 0), ("on", cfg.k), ("off_aa", 0)):
        toks = generate(backend, cfg, rows, k, seeds[name], e.batch_size)
        keep = [i for i, t in enumerate(toks) if t]  # an empty continuation has nothing to score
        lps = backend.target_logprobs([rows[i] for i in keep], [toks[i] for i in keep], e.temperature)
        arms[name] = {"continuations": _scored([toks[i] for i in keep], lps),
                      "prompts": [strata[i] for i in keep]}
    perm_seed = np.random.SeedSequence([e.seed, 1]).generate_state(1)[0]
    ab = stats.lossless_test(arms["off"]["continuations"], arms["on"]["continuations"],
                             arms["off"]["prompts"], arms["on"]["prompts"], seed=int(perm_seed))
    aa = stats.lossless_test(arms["off"]["continuations"], arms["off_aa"]["continuations"],
                             arms["off"]["prompts"], arms["off_aa"]["prompts"], seed=int(perm_seed) + 1)
    verdict, why = stats.lossless_verdict(ab, aa)
    per_prompt = []
    for i, pid in enumerate(prompt_ids):
        entry = {"prompt_id": pid}
        for name, arm in arms.items():
            means = [float(np.mean([max(lp, stats.LOGPROB_FLOOR) for _, _, lp in c]))
                     for c, p in zip(arm["continuations"], arm["prompts"]) if p == i]
            entry[f"mean_logprob_{name}"] = float(np.mean(means)) if means else None
            entry[f"num_continuations_{name}"] = len(means)
            entry[f"tokens_{name}"] = [[t for _, t, _ in c] for c, p in zip(arm["continuations"], arm["prompts"])
                                       if p == i]
        per_prompt.append(entry)
    return {
        "verdict": SAMPLING_LOSSLESS if verdict == stats.LOSSLESS else verdict, "why": why,
        "test": None if ab is None else asdict(ab), "aa_test": None if aa is None else asdict(aa),
        "alpha": stats.ALPHA, "alpha_aa": stats.ALPHA_AA, "arm_seeds": seeds,
        "num_prompts": len(ids), "samples_per_prompt": n, "per_prompt": per_prompt,
    }


# ---- the check -----------------------------------------------------------------------------------------------

def run_check(cfg: CheckConfig) -> dict:
    """Run the check and write lossless.json, lossless.md and lossless.png into ``cfg.engine.out``; returns
    the saved record. Bad input raises MtpBenchError before anything is loaded or written."""
    from mtpbench.backends import get_backend
    from mtpbench.environment import provenance
    from mtpbench.sweep import sweep_prompts

    check_config(cfg)
    e = cfg.engine
    pset = sweep_prompts(e)
    t0 = time.perf_counter()
    backend = get_backend(e.backend)
    engine = backend.start(e)
    import torch

    engine["torch_threads"] = torch.get_num_threads()  # the native engine's speed hangs on it (README)
    backend.dtype_name = engine.get("dtype", "float32")
    backend.faults = replace(backend.faults, accept_draft_argmax=cfg.planted_lossy)
    try:
        ids = backend.encode(pset.prompts)
        pids = [p.id for p in pset.prompts]
        result = run_greedy(backend, cfg, ids, pids) if cfg.greedy else run_sampling(backend, cfg, ids, pids)
    finally:
        backend.close()
    record = {"kind": "greedy" if cfg.greedy else "sampling", "verdict": result["verdict"],
              "config": cfg.to_json(), "provenance": provenance(), "engine": engine, "prompts": pset.describe(),
              "wall_s": round(time.perf_counter() - t0, 3), **{k: v for k, v in result.items() if k != "verdict"}}
    write_outputs(Path(e.out), record)
    return record


def failed(record: dict) -> bool:
    """What --fail-if-lossy exits 1 on."""
    return record["verdict"] in (stats.LOSSY, DIVERGENT)


def _f(x, fmt: str = ".3g") -> str:
    return "unknown" if x is None else format(x, fmt)


def summary(record: dict) -> str:
    """The one-screen summary (lossless.md, printed by the CLI)."""
    c = record["config"]
    head = (f"# check-lossless: {record['verdict']}\n\n"
            f"{c['model']} on {c['backend']} ({record['engine'].get('dtype')}), k = {c['k']} ({c['mode'][0]}) "
            f"against k = 0, temperature {c['temperature']:g}, {record['num_prompts']} prompts x "
            f"{c['max_tokens']} tokens, seed {c['seed']}"
            + (", PLANTED LOSSY CONTROL (--planted-lossy)" if c["planted_lossy"] else "") + "\n")
    if record["kind"] == "greedy":
        lines = [f"- identical to k = 0: {record['identical_share']:.1%} of prompts; divergent "
                 f"{record['num_divergent']}, numerical {record['num_numerical']}",
                 f"- numerical threshold: top-two margin <= {record['numerical_threshold']:.3g} (set by "
                 f"{record['numerical_threshold_source']}; dtype floor {record['dtype_floor']:.3g})",
                 f"- A/A control (k = 0 at batch sizes {record['aa_batch_sizes'][0]} and "
                 f"{record['aa_batch_sizes'][1]}): identical {record['aa_identical_share']:.1%}, teacher-forced "
                 f"log-prob noise {record['aa_logprob_noise']:.3g}"]
        for p in record["per_prompt"]:
            d = p["divergence"]
            if d:
                lines.append(f"  - {p['prompt_id']}: token {d['position']}, k0 {d['k0_token']} vs spec "
                             f"{d['spec_token']}, margin {d['margin']:.3g} -> {d['class']}")
        return head + "\n" + "\n".join(lines) + "\n"
    t, aa = record["test"], record["aa_test"]
    lines = [f"- {record['samples_per_prompt']} continuations of each prompt per arm (off, on, off again), "
             "independent seeds; every token scored by a teacher-forced k = 0 pass",
             f"- why: {record['why']}"]
    if t:
        lines += [f"- off vs on: p = {t['p_value']:.3g} (scores {t['p_value_scores']:.3g}, tokens "
                  f"{t['p_value_tokens']:.3g}); mean target log-prob {t['mean_logprob_a']:.4g} -> "
                  f"{t['mean_logprob_b']:.4g} nats/token, shift {t['logprob_diff']:+.3g} (95 % CI "
                  f"{_f(t['logprob_diff_ci_low'])} .. {_f(t['logprob_diff_ci_high'])}); smallest detectable "
                  f"shift {_f(t['mde_logprob'])}"]
    if aa:
        lines.append(f"- A/A control (off vs off): p = {aa['p_value']:.3g} (alarm below {record['alpha_aa']:g}), "
                     f"shift {aa['logprob_diff']:+.3g}")
    return head + "\n" + "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    try:
        pp = record["per_prompt"]
        x = np.arange(len(pp))
        if record["kind"] == "greedy":
            margins = [p["divergence"]["margin"] if p["divergence"] else np.nan for p in pp]
            colors = ["tab:red" if p["divergence"] and p["divergence"]["class"] == DIVERGENT_CLASS else "tab:orange"
                      for p in pp]
            ax.bar(x, np.nan_to_num(margins, nan=0.0), color=colors)
            for i, p in enumerate(pp):
                if not p["divergence"]:
                    ax.text(i, 0, "=", ha="center", va="bottom", fontsize=8, color="tab:green")
            ax.axhline(record["numerical_threshold"], color="gray", ls="--", lw=1, label="numerical threshold")
            ax.set_ylabel("top-two logit margin at divergence")
            ax.legend(fontsize=7)
            ax.set_title(f"greedy k = {record['config']['k']} vs k = 0: {record['verdict']} "
                         f"(identical {record['identical_share']:.0%}; '=' identical)", fontsize=9)
        else:
            for off, (name, color) in enumerate((("off", "tab:blue"), ("on", "tab:red"), ("off_aa", "tab:gray"))):
                ys = [p[f"mean_logprob_{name}"] for p in pp]
                ax.plot(x + (off - 1) * 0.2, [np.nan if y is None else y for y in ys], "o", color=color,
                        label={"off": "k = 0", "on": f"k = {record['config']['k']}", "off_aa": "k = 0 (A/A)"}[name])
            ax.set_ylabel("mean target log-prob / token")
            ax.legend(fontsize=7)
            t = record["test"]
            p = "" if not t else f", p = {t['p_value']:.3g}"
            ax.set_title(f"sampling T = {record['config']['temperature']:g}: {record['verdict']}{p}", fontsize=9)
        ax.set_xticks(x)
        ax.set_xticklabels([str(p["prompt_id"]) for p in pp], rotation=60, fontsize=6)
        fig.tight_layout()
        tmp = path.with_name(path.name + ".tmp.png")
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)


def write_outputs(out: Path, record: dict) -> None:
    from mtpbench.report import write_json, write_text

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MtpBenchError(f"output directory is not writable: {out} ({err.strerror})") from None
    write_json(out / "lossless.json", record)
    write_text(out / "lossless.md", summary(record))
    plot(record, out / "lossless.png")
