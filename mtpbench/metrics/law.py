"""Acceptance against its law, as the artifacts show it (issue 46): the block ``acceptance_law`` of trace.json (and
the rows and pages that read it), made from the law steps a backend recorded where the engine verifies.

A law step: (row, position, accepted 0/1, probability, probabilistic, greedy[, temperature]) — the engine's verdict
on a draft at a position its earlier drafts reached, the probability the law gives that verdict
(``mtpbench.sampling.expected_acceptance``), and, where the drafter's law q is known and the request samples, the
acceptance the same drafter would give with probabilistic proposal (sum_x min(p, q) = 1 - TV(p, q)) and with greedy
proposal (p at q's argmax); None where not. The test itself is ``mtpbench.stats.acceptance.law_test``.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from mtpbench.stats.acceptance import law_test


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def law_summary(steps: list, why: str | None = None) -> dict:
    """``{"observable", "verdict", "positions": [...], "joint": {...}}``: per draft position the test (observed
    and expected acceptance, z, the interval of observed - expected at the family's level, p, decision) and where
    the drafter's law is known the total-variation distance between p and q and the two proposals' acceptance.
    ``why``: the reason the laws could not be read (an attached server without the plugin): observable False."""
    if why is not None:
        return {"observable": False, "why": why, "verdict": None, "positions": [], "joint": None}
    verdict, tests = law_test([(s[1], s[2], s[3]) for s in steps])
    out = []
    for t in tests:
        at = [s for s in steps if t.position is None or s[1] == t.position]
        probabilistic = _mean([s[4] for s in at])
        # z infinite (every step certain, one departed: the decision says which way) is written as None
        row = {key: (round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v
               for key, v in asdict(t).items()}
        out.append({**row, "tv": None if probabilistic is None else round(1 - probabilistic, 4),
                    "probabilistic": probabilistic, "greedy": _mean([s[5] for s in at])})
    return {"observable": True, "why": None, "verdict": verdict, "positions": out[:-1],
            "joint": out[-1] if out else None}


def law_report(started: list, stopped: list) -> dict:
    """The first verifying rank's law report (its steps, verify steps, unmodelled steps: every rank that samples
    verifies the same batch; else the first recording rank's) from the ranks' answers to ``mtpbench_law_start`` / ``_stop`` (offline or through a
    server's routes), or ``{"observable": False, "why": ...}`` where no rank's sampler could be hooked."""
    ranks = [r for r in stopped if r]
    if not any(r["recording"] for r in started) or not ranks:
        return {"observable": False, "why": "no rank of this engine has a rejection sampler to hook"}
    verifying = [r for r in ranks if r.get("verify_steps")]  # a pipeline rank before the last verifies nothing
    return {"observable": True, **(verifying or ranks)[0]}


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
        z = "certain" if t["z"] is None else f"z {t['z']:+.2f}"
        tv = "" if t["tv"] is None else f", TV(p, q) {t['tv']:.2f}"
        lines.append(f"  pos {t['position']}: observed {t['observed']:.3f}, expected {t['expected']:.3f} "
                     f"({t['steps']} steps, {z}{tv}): {t['decision']}")
    return lines


LAW_HEADERS = ["position", "steps", "observed", "expected", "observed - expected", "z", "decision",
               "TV(p, q)", "probabilistic proposal", "greedy proposal"]


def law_rows(block: dict) -> list[list]:
    """The law test's table (``LAW_HEADERS``): a row per position and the joint one ("all"); the interval of
    observed - expected at the family's level; the drafter-side columns empty where q is not known."""
    def cell(v):
        return "" if v is None else v

    return [["all" if t["position"] is None else t["position"], t["steps"], t["observed"], t["expected"],
             f"{t['observed'] - t['expected']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]",
             "certain" if t["z"] is None else t["z"], t["decision"], cell(t["tv"]), cell(t["probabilistic"]),
             cell(t["greedy"])] for t in block["positions"] + [block["joint"]]]
