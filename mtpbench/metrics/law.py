"""Acceptance against its law, as the artifacts show it (issue 46): the block ``acceptance_law`` of trace.json (and
the rows and pages that read it), made from the law steps a backend recorded where the engine verifies.

A law step: (row, position, accepted 0/1, probability, probabilistic, greedy, temperature, context, draft token) —
the engine's verdict on a draft at a position its earlier drafts reached, the probability the law gives that verdict
(``mtpbench.sampling.expected_acceptance``), and, where the drafter's law q is known and the request samples, the
acceptance the same drafter would give with probabilistic proposal (sum_x min(p, q) = 1 - TV(p, q)) and with greedy
proposal (p at q's argmax); then the tokens before the draft (None where the runner does not show them) and the
draft token. The test itself is ``mtpbench.stats.acceptance.law_test``.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from mtpbench.stats.acceptance import law_test


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


SIGNIFICANT = ("p_over", "p_under", "over_level", "under_level")  # written to 4 significant digits
TOKEN_CLASSES = ("special", "whitespace/punctuation", "digits", "words", "other")


def token_class(text: str, special: bool = False) -> str:
    """A draft token's class by its text: a special token; only white space and punctuation; digits (no letter);
    words and identifiers (a letter or "_"); "other" for a token that is part of a character (its bytes decode to
    U+FFFD) or decodes to nothing."""
    if special:
        return "special"
    if not text or "\ufffd" in text:
        return "other"
    if any(c.isalpha() or c == "_" for c in text):
        return "words"
    if any(c.isdigit() for c in text):
        return "digits"
    return "whitespace/punctuation"


def context_bucket(n: int) -> str:
    """The context-length bucket of a draft with ``n`` tokens before it: "< 32", then doubling ("32-63",
    "64-127", ...)."""
    if n < 32:
        return "< 32"
    low = 32
    while n >= 2 * low:
        low *= 2
    return f"{low}-{2 * low - 1}"


def _groups(steps: list, key) -> list[dict]:
    """Observed and expected acceptance and TV(p, q) per (group, position), descriptive (no test: many small
    groups), ordered by ``key``'s rank (its first element), then position."""
    cells: dict = {}
    for s in steps:
        cells.setdefault((key(s), s[1]), []).append(s)
    out = []
    for (group, position), at in sorted(cells.items(), key=lambda kv: (kv[0][0][0], kv[0][1])):
        probabilistic = _mean([s[4] for s in at])
        out.append({"group": group[1], "position": position, "steps": len(at),
                    "observed": round(sum(s[2] for s in at) / len(at), 4),
                    "expected": round(sum(s[3] for s in at) / len(at), 4),
                    "tv": None if probabilistic is None else round(1 - probabilistic, 4)})
    return out


def breakdowns(steps: list, classify=None) -> dict:
    """Where acceptance is lost (issue 46 item 3): by context-length bucket (steps whose context is known: the
    native engine, Model Runner V2) and by the draft token's class (``classify``: token id -> class; None where no
    tokenizer is at hand). Each group's sort key: the bucket's lower edge, the class's place in TOKEN_CLASSES."""
    def by_context(s):
        b = context_bucket(s[7])
        return (0 if b == "< 32" else int(b.split("-")[0])), b

    def by_class(s):
        c = classify(s[8])
        return TOKEN_CLASSES.index(c), c

    known = [s for s in steps if len(s) > 8 and s[7] is not None]
    drafted = [s for s in steps if len(s) > 8 and s[8] is not None]
    return {"by_context": _groups(known, by_context) if known else None,
            "by_token_class": _groups(drafted, by_class) if drafted and classify is not None else None}


def law_summary(steps: list, why: str | None = None, classify=None, levels: dict | None = None) -> dict:
    """``{"observable", "verdict", "positions": [...], "joint": {...}}``: per draft position the exact test
    (observed and expected acceptance, its two tails, certain departures, z, the interval of observed - expected
    against the law's region at the test's levels, decision) and where the drafter's law is known the
    total-variation distance between p and q and the two proposals' acceptance; then ``breakdowns``. ``levels``:
    the answer's budget for the test (``stats.judge.law_levels``: over, under, and a family where the answer holds
    more tests than this block); ``why``: the reason the laws could not be read (an attached server without the
    plugin): observable False."""
    if why is not None:
        return {"observable": False, "why": why, "verdict": None, "positions": [], "joint": None,
                "by_context": None, "by_token_class": None}
    verdict, tests = law_test([(s[1], s[2], s[3]) for s in steps], **(levels or {}))
    out = []
    for t in tests:
        at = [s for s in steps if t.position is None or s[1] == t.position]
        probabilistic = _mean([s[4] for s in at])
        # z infinite (a certain departure: the decision and the counts say which way) is written as None, as is the
        # z of a test whose every step was certain; the tails and levels to 4 significant digits (small, read
        # against each other), the shares to 4 decimals
        row = {key: (None if not math.isfinite(v) else float(f"{v:.4g}") if key in SIGNIFICANT else round(v, 4))
               if isinstance(v, float) else v for key, v in asdict(t).items()}
        out.append({**row, "tv": None if probabilistic is None else round(1 - probabilistic, 4),
                    "probabilistic": probabilistic, "greedy": _mean([s[5] for s in at])})
    return {"observable": True, "why": None, "verdict": verdict, "positions": out[:-1],
            "joint": out[-1] if out else None, **breakdowns(steps, classify)}


def law_block(report: dict | None, why: str, classify=None, levels: dict | None = None) -> dict:
    """The artifacts' block (``law_summary``, at ``levels``) of what a backend recorded (``{"observable": True,
    "steps": [...]}``), or, where it recorded nothing, of the reason it gave (``why`` where it gave none)."""
    if not report or not report.get("observable"):
        return law_summary([], (report or {}).get("why") or why)
    return law_summary(report["steps"], classify=classify, levels=levels)


def token_classifier(model_dir):
    """token id -> ``token_class`` by the model's tokenizer, or None where it has none here (an attached server's
    model, a checkpoint without tokenizer.json)."""
    from mtpbench.errors import MtpBenchError
    from mtpbench.prompts import load_tokenizer

    try:
        tok = load_tokenizer(model_dir)
    except MtpBenchError:
        return None
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return lambda i: token_class(tok.decode([i], skip_special_tokens=False), i in special)


def law_report(started: list, stopped: list) -> dict:
    """The first verifying rank's law report (its steps, verify steps, unmodelled steps: every rank that samples
    verifies the same batch; else the first recording rank's) from the ranks' answers to ``mtpbench_law_start`` and
    ``_stop`` (offline or through a server's routes), or ``{"observable": False, "why": ...}`` where no rank's
    sampler could be hooked."""
    ranks = [r for r in stopped if r]
    if not any(r["recording"] for r in started) or not ranks:
        return {"observable": False, "why": "no rank of this engine has a rejection sampler to hook"}
    verifying = [r for r in ranks if r.get("verify_steps")]  # a pipeline rank before the last verifies nothing
    return {"observable": True, **(verifying or ranks)[0]}


def failed_pass(e: Exception) -> dict:
    """The law's report where its untimed pass raised (the point's timed runs stand): not observable, and why."""
    return {"observable": False, "why": f"the untimed pass failed: {type(e).__name__}: {e}"[:500]}


def z_text(z: float | None) -> str:
    """A position's z in words, as every terminal line writes it: "certain" where there is none (None: a certain
    departure, or every step certain, as at temperature 0, where the law is argmax agreement), else two decimals
    with a sign, never "-0.00" (a z that rounds to zero is "+0.00" wherever it is printed)."""
    return "certain" if z is None else f"z {round(z, 2) + 0.0:+.2f}"


def law_lines(block: dict | None) -> list[str]:
    """The law test in words for a terminal: the verdict, then per position the observed and expected share of
    the drafts that reached it (not vLLM's joint rate, which counts every draft), with its steps and z."""
    if not block:
        return []
    if not block["observable"]:
        return [f"acceptance against its law: not observable ({block['why']})"]
    lines = [f"acceptance against its law: {block['verdict']}",
             "  (the share of the drafts reaching each position that were accepted, against the law's expectation)"]
    for t in block["positions"]:
        z = z_text(t["z"])  # as the sweep's row line says it (the page's table counts certain departures)
        tv = "" if t["tv"] is None else f", TV(p, q) {t['tv']:.2f}"
        lines.append(f"  pos {t['position']}: observed {t['observed']:.3f}, expected {t['expected']:.3f} "
                     f"({t['steps']} steps, {z}{tv}): {t['decision']}")
    return lines


def sure_text(t: dict) -> str:
    """A test's certain departures in words (records written before issue 55 have none)."""
    said = [f"{n} accepted with probability 0" if key == "certain_over" else f"{n} rejected with probability 1"
            for key in ("certain_over", "certain_under") if (n := t.get(key))]
    return f": {', '.join(said)}" if said else ""


def row_fields(block: dict | None, k: int) -> dict:
    """A sweep row's law columns (``PointResult.law_*``) from a point's block: the verdict as ``law_lines`` says
    it, and per draft position 0..k-1 its steps, observed and expected shares and z (None where no step reached
    it); nothing without a block (a sweep without --law, a k = 0 point)."""
    if not block:
        return {}
    if not block["observable"]:
        return {"law_verdict": f"not observable ({block['why']})"}
    at = {t["position"]: t for t in block["positions"]}

    def column(key: str) -> tuple:
        return tuple(at[i][key] if i in at else None for i in range(k))

    return {"law_verdict": block["verdict"], "law_steps_per_pos": column("steps"),
            "law_observed_per_pos": column("observed"), "law_expected_per_pos": column("expected"),
            "law_z_per_pos": column("z")}


LAW_HEADERS = ["position", "steps", "observed", "expected", "observed - expected", "z", "decision",
               "TV(p, q)", "probabilistic proposal", "greedy proposal"]


def law_rows(block: dict) -> list[list]:
    """The law test's table (``LAW_HEADERS``): a row per position and the joint one ("all"); the interval of
    observed - expected against the law's region at the test's levels; "certain" in place of a z where there is
    none (and a certain departure's drafts counted); the drafter-side columns empty where q is not known."""
    def cell(v):
        return "" if v is None else v

    return [["all" if t["position"] is None else t["position"], t["steps"], t["observed"], t["expected"],
             f"{t['observed'] - t['expected']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]",
             z_text(t["z"]) + sure_text(t) if t["z"] is None else t["z"], t["decision"], cell(t["tv"]),
             cell(t["probabilistic"]), cell(t["greedy"])] for t in block["positions"] + [block["joint"]]]
