"""check-lossless's verdicts, pure (no engine, no I/O): the greedy logit-gap bound and each divergence's class, the
A/A control, nothing drafted, and --fail-if-lossy's exit code. The sampling verdict is ``stats.lossless_verdict``."""

from __future__ import annotations

from dataclasses import asdict

from mtpbench import stats

# --fail-if-lossy's exit codes: 1 lossy or divergent, 3 inconclusive (the check could not tell; 2 is a refused input)
EXIT_LOSSY, EXIT_INCONCLUSIVE = 1, 3


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
GREEDY_LOSSLESS, DIVERGENT, NUMERICAL_ONLY = "lossless", "divergent", "numerical only"
INCONCLUSIVE = stats.INCONCLUSIVE
NUMERICAL, DIVERGENT_CLASS = "numerical", "divergent"
SAMPLING_LOSSLESS = "lossless (no difference detectable at this N)"


def dtype_floor(dtype: str) -> float:
    import torch

    return NUMERICAL_ULPS * torch.finfo(getattr(torch, dtype)).eps * LOGIT_SCALE


def numerical_threshold(dtype: str, logprob_noise: float) -> tuple[float, str]:
    """The largest logit gap rounding can flip here, and which of its two sources set it (the dtype's floor or
    the measured log-prob noise); an A/A divergence is judged against it, never added to it."""
    parts = {"dtype": dtype_floor(dtype), "A/A log-prob noise": NOISE_FACTOR * logprob_noise}
    source = max(parts, key=parts.get)
    return parts[source], source


def classify(logit_gap: float | None, threshold: float | None) -> str | None:
    """``numerical`` when the target's logit of the k = 0 token and that of the token the other run emitted
    (``Divergence.logit_gap``) are within ``threshold`` of each other (either sign: a negative gap is a k = 0 run
    that left the teacher-forced argmax), else ``divergent``; None (unclassified) when either is unknown. The
    top-two margin plays no part: a near-tie at the top says nothing of a token emitted from further down."""
    if logit_gap is None or threshold is None:
        return None
    return NUMERICAL if abs(logit_gap) <= threshold else DIVERGENT_CLASS


def greedy_verdict(divergences: list[dict | None]) -> str:
    """``divergent`` on any divergence beyond the threshold, else ``inconclusive`` on any unclassified one (no
    logit gap), else ``numerical only``; ``lossless`` when there is none."""
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
    return f"logit gap {g:.3g} > {threshold:.3g}" if g >= 0 else f"logit gap {g:.3g} < -{threshold:.3g}"


def aa_problem(aa_rows: list[tuple[str, dict | None, bool]], threshold: float, batch_sizes: list[int]) -> str | None:
    """Why the greedy A/A control (k = 0 against k = 0 at another batch size) forbids a verdict, or None: a
    divergence beyond the rounding bound (or one whose gap is unknown), or a run that stopped sooner with the
    same tokens as far as it went (a difference with no token to bound). ``aa_rows``: prompt id, the A/A
    divergence record (``_divergence``) or None, and whether the two runs' lengths differ."""
    where = f"the A/A control (k = 0 at batch sizes {batch_sizes[0]} and {batch_sizes[1]})"
    beyond = [(pid, d) for pid, d, _ in aa_rows if d is not None and d["class"] != NUMERICAL]
    if beyond:
        # the worst first: an unknown gap, else the largest
        pid, d = max(beyond, key=lambda x: float("inf") if x[1]["logit_gap"] is None else abs(x[1]["logit_gap"]))
        more = f" (and {len(beyond) - 1} more)" if len(beyond) > 1 else ""
        return (f"{where} diverges beyond rounding: prompt {pid}, token {d['position']}, {d['k0_token']} vs "
                f"{d['spec_token']}, {_against(d, threshold)}{more}; the k = 0 engine is not "
                "reproducible, so no divergence of the drafting arm can be told from it")
    length = [pid for pid, d, differ in aa_rows if d is None and differ]
    if length:
        return (f"{where} differs in length on prompt(s) {', '.join(length)} (the same tokens, one run stopped "
                "sooner): a difference of the k = 0 engine with no token to bound")
    return None


def greedy_why(divs: list[tuple[str, dict | None]], threshold: float) -> str:
    """One line on the drafting arm's divergences: the first beyond the threshold, or the first unclassified."""
    found = [(pid, d) for pid, d in divs if d is not None]
    if not found:
        return "the same tokens on every prompt"
    for cls in (DIVERGENT_CLASS, None):
        hit = [(pid, d) for pid, d in found if d["class"] == cls]
        if hit:
            pid, d = hit[0]
            head = "" if cls == DIVERGENT_CLASS else "unclassified divergence (no logit gap measured): "
            return (f"{head}prompt {pid}, token {d['position']}: the drafting run emitted {d['spec_token']} where k = 0 "
                    f"emitted {d['k0_token']}, {_against(d, threshold)} ({len(hit)} such of {len(found)})")
    return f"all {len(found)} divergence(s) within rounding (|logit gap| <= {threshold:.3g})"


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
