"""trace-matrix's cells and their verdicts, pure (no engine, no I/O): what vLLM's drafting did in one
(architecture, runner, drafting) cell, judged from the traced records, the crash and the load check."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from mtpbench.errors import MtpBenchError

DRAFTING = ("as installed", "forced")
INTERRUPTED = "interrupted"


@dataclass
class Cell:
    """One architecture x one drafting, a row of matrix.csv."""

    arch: str
    mtp_class: str  # vLLM's registry key
    target: str
    runner: str  # vLLM's model runner the engine ran ("v1", "v2"; the one asked for if it did not start)
    runner_asked: str  # the one it was asked for: the cell's column (older matrix.json: the one it ran)
    drafter: str  # the class that drafted: V1's proposer (EagleProposer, ...) or V2's speculator
    drafting: str  # "as installed" or "forced" (spec_step_idx = draft step)
    k: int
    mtp_layers: int  # in the checkpoint
    loaded_layers: int | None  # held by the engine's draft model
    verdict: str  # a trace verdict, or "build failed" / "did not start" / "interrupted" (Ctrl-C came first)
    layer_per_step: str  # the layer that ran at draft steps 0..k-1 ("0 1 0 1"; "all" = several in one call)
    idx_received: str  # spec_step_idx the wrapper received at steps 0..k-1
    evidence: str
    error: str  # the exception text of a crash, a failed build or a failed start
    load_ok: bool | None  # the load check: no missing parameter, no unused checkpoint tensor
    load_problems: str
    vllm_check: str  # "consistent" or what disagrees with vLLM's counters / the model's own rule
    num_drafts: int
    startup_s: float | None
    note: str  # "asked V2, ran V1" where the engine ran another runner than the one asked for, else ""


def runner_note(asked: str, ran: str) -> str:
    return f"asked {asked.upper()}, ran {ran.upper()}" if asked and ran and asked != ran else ""


def _steps(records: list, k: int, attr: str) -> str:
    out = []
    for s in range(k):
        # "all": several layers in one call; "!": no MTP layer ran in the call (e.g. it raised first)
        vals = {{-1: "all", None: "!"}.get(getattr(r, attr), str(getattr(r, attr))) for r in records
                if r.draft_step == s}
        out.append("/".join(sorted(vals)) if vals else "-")
    return " ".join(out)


def vllm_check(records: list, num_layers: int, k: int, num_drafts: int, crash: str | None) -> str:
    """What, if anything, disagrees with vLLM itself (see the module docstring)."""
    from collections import Counter

    from mtpbench.trace.records import ABSENT

    if crash and not records:
        return "not checked: no draft call before the crash"
    problems = []
    if not crash:  # a crashed run's counters and last proposal are cut short: only the layer rule applies
        if num_drafts <= 0:
            problems.append("vLLM's counters show no drafts")
        per_proposal = Counter((r.batch, r.proposal) for r in records)
        odd = {n for n in per_proposal.values() if n != k}
        if odd:
            problems.append(f"proposals with {sorted(odd)} draft calls, not k = {k}")
    for r in records:
        if r.executed_layer in (None, -1):
            continue
        got = r.predictor_spec_step_idx
        idx = 0 if got == ABSENT else got
        if isinstance(idx, int) and idx % num_layers != r.executed_layer:
            problems.append(f"step {r.draft_step}: the predictor received {got} but layer {r.executed_layer} ran "
                            f"(the model's rule gives {idx % num_layers})")
            break
    if records and all(r.executed_layer is None for r in records):
        return "; ".join(problems + ["the layer rule not checked: no MTP layer ran"])
    return "; ".join(problems) or ("consistent before the crash" if crash else "consistent")


def load_verdict(check: dict, loaded_layers: int | None, hidden_layers: int) -> tuple[bool | None, str]:
    """(ok, problems) of a load check. Tensors of MTP layers the engine did not build (vLLM caps MiMo-V2 at
    one) are not a checkpoint fault: they are named as dropped at load, and the trace reports them too."""
    from mtpbench.checkpoint import mtp_layer_of

    if not check:
        return None, ""
    dropped, unused = [], []
    for name in check.get("unexpected", []):
        j = mtp_layer_of(name, hidden_layers)
        (dropped if j is not None and loaded_layers is not None and j >= loaded_layers else unused).append(name)
    problems = [f"missing: {n}" for n in check.get("missing", [])] + [f"unused: {n}" for n in unused]
    if dropped:
        layers = sorted({mtp_layer_of(n, hidden_layers) for n in dropped})
        problems.append(f"dropped at load: MTP layer(s) {layers} ({len(dropped)} tensors)")
    return not check.get("missing") and not unused, "; ".join(problems)


def cells_for(arch, k: int, L: int, data: dict | None, error: str, verdict: str, hidden_layers: int = 0,
               runner: str = "") -> list[Cell]:
    from mtpbench.trace.records import drafting_ranks, rank_records
    from mtpbench.trace.verdict import judge_ranks, loaded_vs_checkpoint

    cells = []
    check = (data or {}).get("load_check") or {}
    loaded = data["traces"][0]["num_layers"] if data and data.get("traces") else None
    ok, problems = load_verdict(check, loaded, hidden_layers)
    first = (data or {}).get("traces") or [{}]
    ran = first[0].get("runner") or runner
    base = dict(arch=arch.name, mtp_class=arch.mtp_class, target=arch.target, k=k, mtp_layers=L,
                runner_asked=runner or ran, load_ok=ok, load_problems=problems, startup_s=(data or {}).get("startup_s"))
    if data is None:
        return [Cell(drafting=d, loaded_layers=None, verdict=verdict, layer_per_step="", idx_received="",
                     evidence="", error=error, vllm_check="", num_drafts=0, runner=ran, drafter="", note="", **base)
                for d in DRAFTING]
    for drafting, tr in zip(DRAFTING, data["traces"]):
        # each trace's own engine (a trace after a crash runs in a fresh one); one that did not start: the first's
        tr_ran, drafter = tr.get("runner") or ran, tr.get("drafter") or first[0].get("drafter") or ""
        ranks = drafting_ranks(rank_records(tr), tr.get("ranks"))
        records = ranks[min(ranks)] if ranks else []  # the reference rank's: the cell's steps
        n = tr["num_layers"]
        bytes_ = data.get("layer_bytes", [])
        v = judge_ranks(ranks, n, k, (bytes_ + [0] * n)[:n], tr["crash"], tr.get("crash_in_draft", True))
        v.evidence += loaded_vs_checkpoint(L, n, bytes_) + tr.get("notes", [])
        cells.append(Cell(drafting=drafting, loaded_layers=n, verdict=v.verdict,
                          layer_per_step=_steps(records, k, "executed_layer"),
                          idx_received=_steps(records, k, "wrapper_spec_step_idx"), evidence=" | ".join(v.evidence),
                          error=tr["crash"] or "", vllm_check=vllm_check(records, n, k, tr["num_drafts"], tr["crash"]),
                          num_drafts=tr["num_drafts"], runner=tr_ran, drafter=drafter,
                          note=runner_note(base["runner_asked"], tr_ran), **base))
    return cells


# the engine's own note, which older cells kept only in their evidence (backends.vllm.inprocess.engine_runner)
ASKED_IN_EVIDENCE = re.compile(r"asked for vLLM model runner (\w+), the engine ran")


def load_cells(records: list, where: str = "matrix.json") -> list[Cell]:
    """Cells from matrix.json's records. A record from before cells named the runner asked for: the one its
    evidence names as asked where the engine ran another, else the one it ran; its note follows from them."""
    names = [f.name for f in fields(Cell)]
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise MtpBenchError(f"{where}: cell {i} is not an object")
        if not rec.get("runner_asked"):
            m = ASKED_IN_EVIDENCE.search(str(rec.get("evidence") or ""))
            asked = m[1].lower() if m else rec.get("runner")
            rec = {**rec, "runner_asked": asked, "note": runner_note(asked, rec.get("runner"))}
        missing = [n for n in names if n not in rec]
        if missing:
            raise MtpBenchError(f"{where}: cell {i} lacks {', '.join(missing)}")
        out.append(Cell(**{n: rec[n] for n in names}))
    return out


def runners_of(cells: list[Cell]) -> list[str]:
    """The runners asked for: one column each."""
    return sorted({c.runner_asked for c in cells})
