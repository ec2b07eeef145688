"""Whether two sweeps can be compared, and what differs between them as a whole (workload, execution, drift)."""

from __future__ import annotations

from mtpbench.compare.pair import CompareRow
from mtpbench.config import execution
from mtpbench.errors import MtpBenchError

# settings that make two runs incomparable unless --force: the model and what it was asked
SAME_WORKLOAD = ("model", "prompts", "num_prompts", "chat_template", "max_tokens", "temperature", "top_p", "top_k",
                 "seed")
OFF = {"top_p": 1.0, "top_k": 0}  # what a run saved before these settings existed sampled with


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two runs as a whole: settings, and engine versions."""
    out = []
    for key in sorted(set(a["config"]) | set(b["config"])):
        if key in ("out", "description"):
            continue
        va, vb = a["config"].get(key), b["config"].get(key)
        if va != vb:
            out.append(f"{key}: {va} vs {vb}")
    ea, eb = run_execution(a), run_execution(b)
    if ea != eb:
        out.append(f"execution: {describe_execution(ea)} vs {describe_execution(eb)}")
    for key in ("vllm", "torch", "mtpbench_code"):
        va, vb = a["provenance"]["versions"].get(key), b["provenance"]["versions"].get(key)
        if va != vb:
            out.append(f"{key} version: {va} vs {vb}")
    return out


def run_execution(run: dict) -> dict:
    """How a run's engine executed its points: as the run recorded it, else as its settings tell."""
    return run.get("execution") or execution(run["config"])


def describe_execution(e: dict) -> str:
    graphs = e.get("graphs") or "unknown graphs"
    return graphs + (f", runner {e['runner']}" if e.get("runner") else "")


def check_same_workload(a: dict, b: dict, force: bool) -> None:
    pa, pb = (a.get("prompts") or {}).get("sha256"), (b.get("prompts") or {}).get("sha256")
    # where both runs recorded their prompts' texts, those decide, not how the prompts were asked for
    keys = [k for k in SAME_WORKLOAD if not (pa and pb and k in ("prompts", "num_prompts", "chat_template"))]
    problems = [f"{k} ({a['config'].get(k, OFF.get(k))!r} vs {b['config'].get(k, OFF.get(k))!r})" for k in keys
                if a["config"].get(k, OFF.get(k)) != b["config"].get(k, OFF.get(k))]
    if pa and pb and pa != pb:
        na, nb = a["config"].get("prompts"), b["config"].get("prompts")
        problems.insert(0, f"prompts ({na!r} vs {nb!r})" if na != nb else
                        f"prompt texts (both from {na!r}, but other texts: another --num-prompts, --chat-template, "
                        f"--context-tokens or version of the set)")
    if problems and not force:
        raise MtpBenchError(f"A and B differ in {', '.join(problems)}: their numbers do not pair "
                            "(--force compares them anyway)")


# differences between two runs that leave the k = 0 baseline as it was: it drafts nothing. (Under vLLM
# --force-spec-step-idx also runs k = 0 eagerly: that shows as an "execution" difference, which counts.)
NOT_BASELINE = ("mode:", "force_spec_step_idx:", "draft_model:", "method:", "k:", "mtp_layers:")


def drift_notes(rows: list[CompareRow], a: dict, b: dict) -> list[str]:
    """The k = 0 baseline is a control when both runs made it the same way: if its tokens/s still moved
    beyond noise, the machine drifted between the runs, and raw timings of other points carry that drift."""
    same_baseline = not [d for d in differences(a, b) if not d.startswith(NOT_BASELINE)]
    out = []
    for r in rows:
        if r.k == 0 and r.category == "all" and r.metric == "output_tokens_per_sec" and same_baseline \
                and r.verdict in ("better", "worse"):
            out.append(f"the k = 0 baseline {r.point}, made the same way in both runs, moved {r.rel_diff * 100:+.1f} % beyond "
                       "its interval: timings drifted between the runs; read tokens/s, TTFT and TPOT through "
                       "'speedup' (each run against its own baseline) or rerun")
    return out


def execution_notes(a: dict, b: dict) -> list[str]:
    """A difference in how the engines executed (eager vs compiled graphs, the model runner) is one of the
    whole runs, k = 0 included: the baseline is then no control for machine drift."""
    ea, eb = run_execution(a), run_execution(b)
    if ea == eb:
        return []
    return [f"A ran {describe_execution(ea)}, B {describe_execution(eb)}, every point alike, k = 0 included: raw "
            "tokens/s, TTFT and TPOT differences hold the execution's difference too (they still count for "
            "--fail-if-worse), and the k = 0 baseline tells nothing about machine drift; 'speedup' reads each "
            "run against its own baseline"]
