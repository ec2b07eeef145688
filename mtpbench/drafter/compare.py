"""The answers check-drafter draws from its numbers, pure (no torch): the tolerance of a dtype, the first stage
whose engine output differs from the reference beyond it, the verdict (parity, differs, or inconclusive where no stage
was checked) with its exit code, and the acceptance per position of a list of drafts.

Tolerance: a stage's error is max |engine - reference| / max |reference| over its rows; the reference recomputes
the stage in float32 from the engine's own input to it, so a correct engine differs only by its dtype's rounding
(one rounding of the output: 2^-8 of an element in bfloat16) and by the order of its sums. The bound is 8 such
roundings in bfloat16 and float16, 1e-4 in float32 (vLLM's CPU kernels reduce in another order than torch);
measured on correct engines in docs/check-drafter.md, far below it, and a wiring fault is of order 1.
"""

from __future__ import annotations

import math

from mtpbench.drafter.families import STAGES
from mtpbench.errors import INCONCLUSIVE, NEGATIVE, OK

TOLERANCE = {"float32": 1e-4, "bfloat16": 8 * 2.0 ** -8, "float16": 8 * 2.0 ** -11}
# check-drafter's exit code per verdict; it fails closed: a check that could not tell (3, as check-lossless's
# inconclusive) is no pass
EXIT_CODE = {"parity": OK, "differs": NEGATIVE, "inconclusive": INCONCLUSIVE}  # errors.EXIT_CODES


def tolerance(dtype: str) -> float:
    return TOLERANCE.get(str(dtype).removeprefix("torch."), TOLERANCE["bfloat16"])


def differs(error: float | None, tol: float) -> bool:
    """A measured error beyond the tolerance (NaN differs: a stage that produced NaN where the reference did
    not); None is a stage not measured."""
    return error is not None and (math.isnan(error) or error > tol)


def first_difference(errors: dict[str, float | None], tol: float) -> str | None:
    """The first stage, in the order an MTP step runs them, whose error differs; None where none does."""
    return next((s for s in STAGES if differs(errors.get(s), tol)), None)


NO_CAUSE = "differs from here on; the captured values match no known alternative, so no cause is named"


def note_stages(note: str) -> set[str]:
    """The stages a note speaks of: its prefix before the first ': ', names joined by ' and '."""
    head, sep, _ = note.partition(": ")
    return set(head.split(" and ")) if sep else set()


def cause(first: str | None, notes: dict[str, int]) -> str | None:
    """What the captured values show at the first differing stage: the note naming that stage that the most calls
    gave (each note is a match of captured values against one known alternative: an exchange of two stages'
    inputs or weights, another layer's weights, a norm not applied, shifted inputs), else ``NO_CAUSE``; None where
    no stage differs."""
    if first is None:
        return None
    named = [(-n, i, note) for i, (note, n) in enumerate(notes.items()) if first in note_stages(note)]
    return min(named)[2] if named else f"{first}: {NO_CAUSE}"


def verdict(errors: dict[str, float | None], tol: float) -> str:
    """"differs" where a stage differs (``first_difference``); else "parity" where some stage was measured (every one
    measured is within the tolerance), "inconclusive" where none was: nothing checked says nothing of parity."""
    if first_difference(errors, tol) is not None:
        return "differs"
    return "parity" if any(errors.get(s) is not None for s in STAGES) else "inconclusive"


def acceptance_per_position(cycles: list[list[bool]], k: int) -> list[float]:
    """vLLM's per-position acceptance of greedy drafts: position s of a proposal is accepted when its draft and
    every earlier one equal the target's tokens. ``cycles``: each proposal's matches, step by step (a proposal
    with fewer than k known steps counts its missing ones as rejected)."""
    if not cycles or k <= 0:
        return [0.0] * max(k, 0)
    counts = [0] * k
    for matches in cycles:
        for s in range(k):
            if s >= len(matches) or not matches[s]:
                break
            counts[s] += 1
    return [c / len(cycles) for c in counts]


def headline(first: str | None, checked: list[str], expected: list[float] | None, measured: list[float],
             calls: int | None = None, seen: str | None = None) -> str:
    """One line: parity, the first stage that differs (with ``seen``, what the captured values show there:
    ``cause``), or that no stage was checked (``calls``: the draft calls captured, where known), with the
    acceptance the reference implies."""
    acc = ""
    if expected:
        acc = (f"; the checkpoint's MTP would accept {expected[0]:.2f} at position 0, the engine accepts "
               f"{measured[0]:.2f}" if measured else f"; the checkpoint's MTP would accept {expected[0]:.2f}")
    if first is None and not checked:
        why = "" if calls is None else \
            f": none of the engine's {calls} draft call{'s' * (calls != 1)} gave a stage the reference could compare"
        return f"inconclusive: no stage was checked{why}, so nothing shows the draft equals the reference{acc}"
    if first is None:
        return f"parity: every stage checked ({', '.join(checked)}) equals the reference{acc}"
    return f"the engine's draft differs from the checkpoint's MTP first at stage '{first}'" + \
        (f" ({seen})" if seen else "") + acc
