"""Whether a tune's decision can be relied on, and why not: the answer carries its noise (issues 36, 44).

The rule (``reasons``): a decision is not reliable when

* the machine was loaded: a sweep started with a 1-minute load average above its usable cores (``load_warning``'s
  condition; after the first sweep the tune ran, above twice its cores: the sweep before it still weighs on the
  average),
  or its load changed during the sweep (``environment.load_change``);
* a fitted cost is impossible: f < 0 or c < 0 at a measured load (a verify step cheaper than plain decoding, or a
  draft step that takes no time: timings noisier than the costs they fit);
* the model predicts badly where the schedule uses it: the worst held-out error of the points whose prediction
  places a boundary between two measured loads (``analyse``'s ``held_out_used_max``) above ``MAX_HELD_OUT_ERROR``;
  a schedule without such a boundary uses no prediction, and no error of it is read;
* an A/A control came out different: two identical timings of k = 0 told apart (drift), each sweep's control judged
  as one of the tune's family of controls (``stats.judge``: 1 - 0.05 / n for n controls, so a tune of five sweeps on
  a steady machine flags drift at most 5 % of the time, not one sweep in twenty);
* not drafting at a load is the default there, not a finding: k = 0 was chosen and not every k > 0 was shown
  slower beyond noise (the comparison the choice read, ``LoadChoice.vs_0``), so the noise, not MTP, decided.

The choice by goodput carries the machine's reasons and its own default loads (``goodput_reasons``): the model plays
no part in it.

``facts`` gathers what the rule reads from a tune's result and its sweeps' files; ``reasons`` is pure.
"""

from __future__ import annotations

import json
from pathlib import Path

from mtpbench.environment import load_change
from mtpbench.stats import judge

MAX_HELD_OUT_ERROR = 0.25  # |predicted - measured| / measured of a point left out of the fit


def facts(result: dict, dirs: list[str]) -> dict:
    """What ``reasons`` reads: per sweep its start load, cores and load change line; the loads whose A/A control
    came out different; the fitted costs; the worst held-out error where the schedule uses the prediction; the loads
    where not drafting is the default (by tokens/s, and by goodput where it was chosen by)."""
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
                       "load_change": (load_change(prov) or [None])[0]})
    goodput = result.get("goodput")
    return {"sweeps": sweeps, "costs": [{"load": c["load"], "f": c["f"], "c": c["c"]} for c in result["costs"]
                                         if c.get("source") == "measured"],
            "held_out_max": result["prediction"].get("held_out_used_max"), "unit": result["unit"],
            "drifted": [c for c in result.get("controls") or [] if c["decision"] != judge.OPEN],
            "undecided": undecided(result["choices"]), "undecided_ks": undecided_ks(result["choices"]),
            "goodput_undecided": undecided(goodput["choices"]) if goodput else [],
            "goodput_undecided_ks": undecided_ks(goodput["choices"]) if goodput else []}


def ran_first(dates: list) -> int:
    """Which sweep the tune ran first, by the start dates its files record (ISO 8601, one zone); a sweep without a
    date ranks after the dated ones; none dated: the first listed."""
    return min(range(len(dates)), key=lambda i: (dates[i] is None, dates[i] or "", i)) if dates else 0


def undecided(choices: list[dict]) -> list:
    """The measured loads where k = 0 was chosen and some k > 0 measured there was not shown slower beyond noise
    (its comparison with k = 0 open, or none made: too few repeats, a goodput of 0)."""
    out = []
    for c in choices:
        others = [k for k in c.get("ks") or [] if k > 0]
        vs_0 = {int(k): v for k, v in (c.get("vs_0") or {}).items()}
        if c["chosen"] == 0 and any(vs_0.get(k, {}).get("decision") != judge.BELOW for k in others):
            out.append(c["load"])
    return sorted(out)


def undecided_ks(choices: list[dict]) -> list[list]:
    """At each ``undecided`` load, [load, the k > 0 not told apart from k = 0, the k > 0 slower beyond noise]: what
    the default's reason names, so it never says "no k was shown slower" beside a row marked slower (issue 55)."""
    out = []
    for c in choices:
        others = [k for k in c.get("ks") or [] if k > 0]
        vs_0 = {int(k): v for k, v in (c.get("vs_0") or {}).items()}
        open_ = [k for k in others if vs_0.get(k, {}).get("decision") != judge.BELOW]
        if c["chosen"] == 0 and open_:
            out.append([c["load"], open_, [k for k in others if k not in open_]])
    return sorted(out, key=lambda x: x[0])


def machine_reasons(f: dict) -> list[str]:
    """The machine's part of the rule: loaded, its load changed, an A/A control told apart."""
    out = []
    for s in f["sweeps"]:
        if s["load"] is not None and s["cores"] and s["load"] - s.get("own", 0) > s["cores"]:
            out.append(f"the machine was loaded: load average {s['load']:.2f} on {s['cores']} cores at the start of "
                       f"{s['dir']}")
        if s["load_change"]:
            out.append(f"{s['dir']}: {s['load_change']}")
    for c in f.get("drifted") or []:
        out.append(f"{f['unit']} {c['load']}: the A/A control told two identical timings of k = 0 apart "
                   f"(x{judge.end_text(c['estimate'], 1.0)} {judge.interval_text(c['low'], c['high'], 1.0)} at "
                   f"{judge.level_text(c['level'])}, one of {c['family']} controls): the machine drifted")
    return out


def _ks(ks: list) -> str:
    return f"k = {', '.join(map(str, ks))}"


def default_reason(unit: str, loads: list, what: str = "speedup", detail: list | None = None) -> str:
    """``detail``: ``undecided_ks``' [load, open ks, slower ks] (records from before it: the loads alone)."""
    at = {d[0]: d for d in detail or []}
    said = []
    for load in loads:
        if load not in at:
            said.append(f"{unit} {load}: some k > 0")
            continue
        _, open_, slower = at[load]
        said.append(f"{unit} {load}: {_ks(open_)}" + (f" ({_ks(slower)} slower beyond noise)" if slower else ""))
    return (f"not drafting at {unit} {', '.join(map(str, loads))} is the default, not a finding: no k was shown "
            f"faster than k = 0 there beyond noise, and these were not told apart from it either way (the {what} "
            f"interval the choice read holds 1, or none could be taken): {'; '.join(said)}; more repeats "
            f"(--max-repeats, --max-seconds) or a quieter machine decide it")


def reasons(f: dict) -> list[str]:
    """Why the decision by tokens/s is not reliable, one short clause each; [] where nothing says so."""
    out = machine_reasons(f)
    bad = [c for c in f["costs"] if (c["f"] is not None and c["f"] < 0) or (c["c"] is not None and c["c"] < 0)]
    if bad:
        out.append("impossible fitted costs (" + "; ".join(f"{f['unit']} {c['load']}: f = {c['f']:.3g}, "
                                                            f"c = {c['c']:.3g}" for c in bad) + ")")
    if f["held_out_max"] is not None and f["held_out_max"] > MAX_HELD_OUT_ERROR:
        out.append(f"the model predicts badly where the schedule uses it (worst held-out error "
                   f"{f['held_out_max']:.0%} at the loads a boundary lies between, above {MAX_HELD_OUT_ERROR:.0%})")
    if f.get("undecided"):
        out.append(default_reason(f["unit"], f["undecided"], detail=f.get("undecided_ks")))
    return out


def goodput_reasons(f: dict) -> list[str]:
    """Why the decision by goodput is not reliable: the machine's reasons and its own default loads."""
    out = machine_reasons(f)
    if f.get("goodput_undecided"):
        out.append(default_reason(f["unit"], f["goodput_undecided"], "goodput", f.get("goodput_undecided_ks")))
    return out
