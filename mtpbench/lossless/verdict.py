"""check-lossless's verdicts, pure (no engine, no I/O): the greedy logit-gap bound and each divergence's class, the
A/A control, nothing drafted, and --fail-if-lossy's exit code. The sampling verdict is ``stats.lossless_verdict``."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import NamedTuple

from mtpbench import stats
from mtpbench.errors import INCONCLUSIVE as EXIT_INCONCLUSIVE
from mtpbench.errors import NEGATIVE as EXIT_LOSSY
from mtpbench.errors import MtpBenchError

# --fail-if-lossy's exit codes (errors.EXIT_CODES): 1 lossy or divergent, 3 inconclusive (the check could not tell)


# a greedy divergence is "numerical" when the logit gap between the k = 0 token and the token the drafting run
# emitted is within what rounding can flip (the top-two margin says nothing about which token was emitted: at a
# near-tie the drafting run may have emitted the 3rd-ranked token, far below). The bound: NUMERICAL_ULPS units
# in the last place of a logit of magnitude LOGIT_SCALE in the model's dtype (float32: 3.1e-5, bfloat16: 2.0,
# float16: 0.25; the logits' rounding error grows with every layer, so one ulp of the output would be too
# tight), or NOISE_FACTOR x the largest change of a teacher-forced log-prob between two batch compositions (a
# gap is a difference of two logits, each can move by it: x 2, and x 2 again for noise the measured positions
# did not reach), whichever is larger. An A/A divergence never raises it: one beyond it means the k = 0 engine
# itself is not reproducible, and the check cannot vouch for anything (inconclusive).
NUMERICAL_ULPS = 8
LOGIT_SCALE = 32.0
NOISE_FACTOR = 4.0
# The measured noise raises the bound to at most NOISE_CAP x the dtype's floor (float32 1.2e-4, bfloat16 8,
# float16 1): noise up to the floor itself, 8 ulps of a logit of 32, is rounding in that dtype. Log-probs that move
# further between batch compositions move by more than the dtype's rounding explains (float32 matmuls run in TF32,
# a nondeterministic reduction, a fault), and a bound raised to them would call almost any divergence numerical
# (0.5 nats of noise in float32 made it 2 logits, 65,000 x the floor): a finding, the check is inconclusive. So is
# noise that is not a finite number >= 0 (NaN was dropped by max(), inf excused everything).
NOISE_CAP = 4.0
# each dtype's machine epsilon (torch.finfo(dtype).eps, exact powers of two): the floor needs no torch
EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float64": 2.0 ** -52}
GREEDY_LOSSLESS, DIVERGENT, NUMERICAL_ONLY = "lossless", "divergent", "numerical only"
INCONCLUSIVE = stats.INCONCLUSIVE
NUMERICAL, DIVERGENT_CLASS = "numerical", "divergent"
SAMPLING_LOSSLESS = "lossless (no difference detectable at this N)"
NOISY_K0 = "log-prob noise beyond rounding"  # a noise finding's why begins with it (the summary's headline word)
# the A/A control of one prompt: the prompt beside AA_COPIES - 1 copies of itself in one batch, against it alone
AA_COPIES = 2


def dtype_floor(dtype: str) -> float:
    """NUMERICAL_ULPS ulps of a logit of magnitude LOGIT_SCALE in ``dtype`` (a torch dtype's name, "torch." or
    not)."""
    name = str(dtype).removeprefix("torch.")
    if name not in EPS:
        raise MtpBenchError(f"no rounding floor for dtype {name!r} (known: {', '.join(EPS)}); give --dtype")
    return NUMERICAL_ULPS * EPS[name] * LOGIT_SCALE


class Threshold(NamedTuple):
    value: float  # the largest |logit gap| classed numerical
    source: str  # what set it: "dtype", "A/A log-prob noise", or the cap
    problem: str | None  # the finding that makes the check inconclusive (noise beyond the cap, or not finite)
    cap: float  # NOISE_CAP x the dtype's floor: the most the noise may raise ``value`` to
    noise: float | None  # the measured noise as recorded: None where it was no finite number >= 0 (JSON has none)


def numerical_threshold(dtype: str, logprob_noise: float | None) -> Threshold:
    """The largest logit gap rounding can flip here and which source set it: the dtype's floor, or NOISE_FACTOR x
    the measured log-prob noise, at most NOISE_CAP x the floor. Noise that would raise it beyond the cap, or that
    is not a finite number >= 0, leaves it at the cap with ``problem`` naming the finding; an A/A divergence is
    judged against it, never added to it."""
    floor = dtype_floor(dtype)
    cap, name, noise = NOISE_CAP * floor, str(dtype).removeprefix("torch."), logprob_noise
    capped = f"the cap, {NOISE_CAP:g} x the {name} floor"
    if noise is None or not 0 <= noise < math.inf:  # NaN fails both comparisons
        what = "were not measured" if noise is None else f"change by {noise} (not a finite number >= 0)"
        return Threshold(cap, capped, f"{NOISY_K0}: the k = 0 engine's teacher-forced log-probs {what} between "
                                      "batch compositions, so no divergence can be bounded by rounding", cap, None)
    if NOISE_FACTOR * noise > cap:
        return Threshold(cap, capped, (
            f"{NOISY_K0}: the k = 0 engine's teacher-forced log-probs move by {noise:.3g} nats between batch "
            f"compositions, beyond the cap of {cap / NOISE_FACTOR:.3g} (the threshold, {NOISE_FACTOR:g} x the noise, "
            f"would be {NOISE_FACTOR * noise:.3g} logits, above its cap {cap:.3g}, {NOISE_CAP:g} x the {name} "
            f"floor): more than {name} rounding explains (TF32 matmuls, a nondeterministic reduction, a fault), so "
            "no divergence can be bounded by rounding"), cap, noise)
    if NOISE_FACTOR * noise > floor:
        return Threshold(NOISE_FACTOR * noise, "A/A log-prob noise", None, cap, noise)
    return Threshold(floor, "dtype", None, cap, noise)


def classify(logit_gap: float | None, threshold: float | None) -> str | None:
    """``numerical`` when the target's logit of the k = 0 token and that of the token the other run emitted
    (``Divergence.logit_gap``) are within ``threshold`` of each other (either sign: a negative gap is a k = 0 run
    that left the teacher-forced argmax), else ``divergent``; None (unclassified) when either is unknown or not a
    finite number (a NaN gap compares false with everything, an infinite one is no rounding's). The top-two margin
    plays no part: a near-tie at the top says nothing of a token emitted from further down."""
    if logit_gap is None or threshold is None or not (math.isfinite(logit_gap) and math.isfinite(threshold)):
        return None
    return NUMERICAL if abs(logit_gap) <= threshold else DIVERGENT_CLASS


def greedy_verdict(divergences: list[dict | None]) -> str:
    """``divergent`` on any divergence beyond the threshold, else ``inconclusive`` on any unclassified one (no
    logit gap, or not finite), else ``numerical only``; ``lossless`` when there is none."""
    found = [d for d in divergences if d is not None]
    if not found:
        return GREEDY_LOSSLESS
    if any(d["class"] == DIVERGENT_CLASS for d in found):
        return DIVERGENT
    return INCONCLUSIVE if any(d["class"] is None for d in found) else NUMERICAL_ONLY


def _divergence(d, threshold: float) -> dict | None:
    if d is None:
        return None
    return {**asdict(d), "class": classify(d.logit_gap, threshold)}


def _gap(d: dict) -> str:
    return "unknown" if d.get("logit_gap") is None else f"{d['logit_gap']:.3g}"


def _against(d: dict, threshold: float) -> str:
    """A divergence's gap beside the threshold it failed, e.g. "logit gap 6 > 2" or "logit gap -6 < -2"."""
    g = d.get("logit_gap")
    if g is None:
        return "logit gap unknown"
    if not math.isfinite(g):
        return f"logit gap {g} (not finite)"
    return f"logit gap {g:.3g} > {threshold:.3g}" if g >= 0 else f"logit gap {g:.3g} < -{threshold:.3g}"


def aa_plan(num_prompts: int, batch_size: int) -> tuple[int, int, list[int]]:
    """The greedy A/A arm (k = 0 again) in another batch composition than the k = 0 arm's: (its batch size, copies
    of each prompt it runs, [the most rows the k = 0 arm batched, the most the A/A arm batched]). Each prompt
    alone when the k = 0 arm batched several; all prompts in one batch when it ran them one at a time
    (--batch-size 1); with one prompt, alone in the k = 0 arm whatever --batch-size says, that prompt beside
    AA_COPIES - 1 copies of itself (otherwise both arms would run it alone and the control could not fail)."""
    batched = min(batch_size, num_prompts)
    if batched > 1:
        return 1, 1, [batched, 1]
    if num_prompts > 1:
        return num_prompts, 1, [1, num_prompts]
    return AA_COPIES, AA_COPIES, [1, AA_COPIES]


def aa_label(batch_sizes: list[int], copies: int = 1) -> str:
    """What the greedy A/A control ran, e.g. "k = 0 at batch sizes 1 and 2, the prompt beside a copy of itself"."""
    more = copies - 1
    return (f"k = 0 at batch sizes {batch_sizes[0]} and {batch_sizes[1]}"
            + (f", the prompt beside {'a copy' if more == 1 else f'{more} copies'} of itself" if more else ""))


def aa_problem(aa_rows: list[tuple[str, dict | None, bool]], threshold: float, batch_sizes: list[int],
               copies: int = 1) -> str | None:
    """Why the greedy A/A control (k = 0 against k = 0 in another batch composition, ``aa_plan``) forbids a
    verdict, or None: a divergence beyond the rounding bound (or one whose gap is unknown or not finite), or a
    run that stopped sooner with the same tokens as far as it went (a difference with no token to bound).
    ``aa_rows``: prompt id, the A/A divergence record (``_divergence``) or None, and whether the two runs'
    lengths differ."""
    where = f"the A/A control ({aa_label(batch_sizes, copies)})"
    beyond = [(pid, d) for pid, d, _ in aa_rows if d is not None and d["class"] != NUMERICAL]
    if beyond:
        # the worst first: an unknown or non-finite gap, else the largest
        pid, d = max(beyond, key=lambda x: _worst(x[1]["logit_gap"]))
        more = f" (and {len(beyond) - 1} more)" if len(beyond) > 1 else ""
        return (f"{where} diverges beyond rounding: prompt {pid}, token {d['position']}, {d['k0_token']} vs "
                f"{d['spec_token']}, {_against(d, threshold)}{more}; the k = 0 engine is not "
                "reproducible, so no divergence of the drafting arm can be told from it")
    length = [pid for pid, d, differ in aa_rows if d is None and differ]
    if length:
        return (f"{where} differs in length on prompt(s) {', '.join(length)} (the same tokens, one run stopped "
                "sooner): a difference of the k = 0 engine with no token to bound")
    return None


def _worst(gap: float | None) -> float:
    return math.inf if gap is None or not math.isfinite(gap) else abs(gap)


def greedy_why(divs: list[tuple[str, dict | None]], threshold: float) -> str:
    """One line on the drafting arm's divergences: the first beyond the threshold, or the first unclassified."""
    found = [(pid, d) for pid, d in divs if d is not None]
    if not found:
        return "the same tokens on every prompt"
    for cls in (DIVERGENT_CLASS, None):
        hit = [(pid, d) for pid, d in found if d["class"] == cls]
        if hit:
            pid, d = hit[0]
            head = "" if cls == DIVERGENT_CLASS else "unclassified divergence (logit gap unknown or not finite): "
            return (f"{head}prompt {pid}, token {d['position']}: the drafting run emitted {d['spec_token']} where k = 0 "
                    f"emitted {d['k0_token']}, {_against(d, threshold)} ({len(hit)} such of {len(found)})")
    return f"all {len(found)} divergence(s) within rounding (|logit gap| <= {threshold:.3g})"


def greedy_outcome(threshold: Threshold, aa_why: str | None, length_only: int,
                   divs: list[tuple[str, dict | None]]) -> tuple[str, str]:
    """The greedy verdict and its why, in this order: inconclusive on a noise finding (``threshold.problem``) or
    an A/A problem (``aa_problem``: either way the k = 0 engine is not reproducible within rounding, so nothing
    the drafting arm did can be told from it), divergent on ``length_only`` prompts of other length (the same
    tokens as far as they go, one run stopped sooner), else ``greedy_verdict`` of the drafting arm's
    divergences (``divs``: prompt id, ``_divergence`` record or None)."""
    if threshold.problem:
        return INCONCLUSIVE, threshold.problem
    if aa_why:
        return INCONCLUSIVE, aa_why
    if length_only:
        return DIVERGENT, (f"{length_only} prompt(s) of other length: the same tokens as far as they go, one run "
                           "stopped sooner")
    return greedy_verdict([d for _, d in divs]), greedy_why(divs, threshold.value)


def nothing_drafted(result: dict, arm: dict) -> None:
    """A drafting arm that drafted nothing (``num_drafts`` 0: --max-tokens 1, a config or a server that ignores
    the speculative config) tested k = 0 against k = 0: lossless or numerical only becomes inconclusive. A
    lossy or divergent verdict stands (two runs differ whatever the cause). No counters: unknown, left as is
    (the summary says so)."""
    acc = arm.get("acceptance")
    if acc is None or acc.get("num_drafts") != 0 or result["verdict"] in (stats.LOSSY, DIVERGENT):
        return
    was = result["verdict"]
    result["verdict"] = stats.INCONCLUSIVE
    result["why"] = (f"{NOTHING_DRAFTED}: the drafting arm drafted nothing (num_drafts 0), so it was k = 0 "
                     f"against k = 0 (the tests alone said: {was}" + (f"; {result['why']}" if result.get("why")
                                                                        else "") + ")")


NOTHING_DRAFTED = "nothing drafted"


def failed(record: dict) -> bool:
    """What --fail-if-lossy exits 1 on."""
    return record["verdict"] in (stats.LOSSY, DIVERGENT)


def exit_code(record: dict, allow_inconclusive: bool = False) -> int:
    """--fail-if-lossy's exit code: EXIT_LOSSY on lossy or divergent, EXIT_INCONCLUSIVE on inconclusive (fails
    closed: a gate must not pass what the check could not tell) unless ``allow_inconclusive``, else 0."""
    if failed(record):
        return EXIT_LOSSY
    if record["verdict"] == stats.INCONCLUSIVE and not allow_inconclusive:
        return EXIT_INCONCLUSIVE
    return 0
