"""Whether a tune's decision can be relied on, and why not: the answer carries its noise (issue 36).

The rule (``reasons``): a decision is not reliable when

* the machine was loaded: a sweep started with a 1-minute load average above its usable cores (``load_warning``'s
  condition; after the first sweep the tune ran, above twice its cores: the sweep before it still weighs on the
  average),
  or its load changed during the sweep (``environment.load_change``);
* a fitted cost is impossible: f < 0 or c < 0 at a measured load (a verify step cheaper than plain decoding, or a
  draft step that takes no time: timings noisier than the costs they fit);
* the model predicts badly: the worst held-out error above ``MAX_HELD_OUT_ERROR`` (the schedule between measured
  loads comes from that model);
* the machine's A/A control came out different (two identical timings of k = 0 told apart: drift);
* not drafting at a load is the default there, not a finding: no k > 0 was told apart from k = 0 (every speedup
  interval at that load holds 1), so the noise, not MTP, decided.

``facts`` gathers what the rule reads from a tune's result and its sweeps' files; ``reasons`` is pure.
"""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.environment import load_change

MAX_HELD_OUT_ERROR = 0.25  # |predicted - measured| / measured of a point left out of the fit


def facts(result: dict, dirs: list[str]) -> dict:
    """What ``reasons`` reads: per sweep its start load, cores, load change line and A/A verdict; the fitted
    costs; the worst held-out error."""
    sweeps, runs = [], []
    for d in dirs:
        summary = Path(d) / "summary.json"
        runs.append(json.loads((summary if summary.is_file() else Path(d) / "run.json").read_text()))
    first = ran_first([(r.get("provenance") or {}).get("date") for r in runs])
    for i, (d, run) in enumerate(zip(dirs, runs)):
        prov = run.get("provenance") or {}
        cores = (prov.get("hardware") or {}).get("cpus_usable")
        sweeps.append({"dir": str(d), "load": (prov.get("load_average") or [None])[0], "cores": cores,
                       "own": cores if i != first and cores else 0,  # the load of the sweep that ran just before
                       "load_change": (load_change(prov) or [None])[0],
                       "aa_different": (run.get("noise") or {}).get("called_different")})
    return {"sweeps": sweeps, "costs": [{"load": c["load"], "f": c["f"], "c": c["c"]} for c in result["costs"]
                                         if c.get("source") == "measured"],
            "held_out_max": result["prediction"]["held_out_abs_error_max"], "unit": result["unit"],
            "undecided": undecided(result)}


def ran_first(dates: list) -> int:
    """Which sweep the tune ran first, by the start dates its files record (ISO 8601, one zone); a sweep without a
    date ranks after the dated ones; none dated: the first listed."""
    return min(range(len(dates)), key=lambda i: (dates[i] is None, dates[i] or "", i)) if dates else 0


def undecided(result: dict) -> list:
    """The measured loads where k = 0 was chosen and every k > 0 speedup interval holds 1 (or has none)."""
    zero = {c["load"] for c in result["choices"] if c["chosen"] == 0}
    rows = [r for r in result["rows"] if r["measured"] and r["k"] > 0]
    return [b for b in sorted(zero) if all(r["speedup_ci_low"] is None or r["speedup_ci_low"] <= 1 <= r["speedup_ci_high"]
                                           for r in rows if r["load"] == b)]


def reasons(f: dict) -> list[str]:
    """Why the decision is not reliable, one short clause each; [] where nothing says so."""
    out = []
    for s in f["sweeps"]:
        if s["load"] is not None and s["cores"] and s["load"] - s.get("own", 0) > s["cores"]:
            out.append(f"the machine was loaded: load average {s['load']:.2f} on {s['cores']} cores at the start of "
                       f"{s['dir']}")
        if s["load_change"]:
            out.append(f"{s['dir']}: {s['load_change']}")
        if s["aa_different"]:
            out.append(f"{s['dir']}: the A/A control told two identical timings of k = 0 apart (the machine drifted)")
    bad = [c for c in f["costs"] if (c["f"] is not None and c["f"] < 0) or (c["c"] is not None and c["c"] < 0)]
    if bad:
        out.append("impossible fitted costs (" + "; ".join(f"{f['unit']} {c['load']}: f = {c['f']:.3g}, "
                                                            f"c = {c['c']:.3g}" for c in bad) + ")")
    if f["held_out_max"] is not None and f["held_out_max"] > MAX_HELD_OUT_ERROR:
        out.append(f"the model predicts badly (worst held-out error {f['held_out_max']:.0%}, above "
                   f"{MAX_HELD_OUT_ERROR:.0%})")
    if f.get("undecided"):
        out.append(f"not drafting at {f['unit']} {', '.join(map(str, f['undecided']))} is the default, not a finding: "
                   f"no k was told apart from k = 0 there (every speedup interval holds 1); more repeats "
                   f"(--max-repeats, --max-seconds) or a quieter machine decide it")
    return out
