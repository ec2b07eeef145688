"""The answer sentences of the sweep, check-lossless, trace-layers and trace-matrix pages (``*/page.py``
``headline``), by property: every expectation is an oracle written here from the rule the page's docstring and
docs/report.md state, never computed by the code under test.

The sweep's rule: only finished drafting points count (status ok, k > 0); a point is faster (slower) than plain
decoding beyond noise where its row's decision says so (stats.judge made it: its interval, at the level printed
beside it, lies wholly above (below) 1; an end at 1 is not beyond it). Some point faster: "Best:" the fastest of
those, all of them named, the highest speedup named if it is not one of them (good). Every point slower: "Drafting
is slower here" (bad). No decision at all (no interval): "Not judged", the highest speedup measured, never "Best"
(plain). Else "No k is faster than plain decoding
beyond noise" (warn). No speedup: the highest
acceptance length or "Nothing was drafted" (plain); nothing finished: bad.

check-lossless's tone follows --fail-if-lossy's exit code: bad exactly where it exits 1 (lossy, divergent), warn
where it exits 3 (inconclusive), good only for a lossless verdict, plain for the rest (numerical only)."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.lossless.page import headline as lossless_headline
from mtpbench.lossless.verdict import exit_code
from mtpbench.matrix.page import headline as matrix_headline
from mtpbench.sweep.page import headline as sweep_headline
from mtpbench.sweep.page import label
from mtpbench.trace.page import headline as trace_headline

FAST = settings(max_examples=200, deadline=None)

# ---- the sweep ------------------------------------------------------------------------------------------------

# a coarse grid, so that ties, ends exactly at 1 and equal medians come up often
GRID = [0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.3, 1.5]


def name(r: dict) -> str:
    """How the page names a point of these tables: the mode and k (no MTP layers or load given here)."""
    return "plain decoding" if r["k"] == 0 else f"{r['mode']} k = {r['k']}"


def ci(r: dict):
    lo, hi = r.get("speedup_ci_low"), r.get("speedup_ci_high")
    return None if lo is None or hi is None else (lo, hi)


LEVELS = [0.95, 0.99, 1 - 0.05 / 6, 1 - 0.05 / 60]


def decision(lo, hi) -> str | None:
    """What stats.judge decides of an interval (the row's speedup_decision): none without one."""
    if lo is None or hi is None:
        return None
    return "faster" if lo > 1 else "slower" if hi < 1 else "open"


@st.composite
def sweep_row(draw, k: int, mode: str = "vllm", status: str = "ok", grid: list[float] = GRID) -> dict:
    speedup = draw(st.none() | st.sampled_from(grid))
    ends = sorted(draw(st.lists(st.sampled_from(grid), min_size=2, max_size=2)))
    shape = draw(st.sampled_from(["interval", "interval", "none", "low only", "high only"]))
    lo = ends[0] if shape in ("interval", "low only") else None
    hi = ends[1] if shape in ("interval", "high only") else None
    al = draw(st.none() | st.sampled_from([1.0, 1.5, 2.25, 3.0]))
    return {"mode": mode, "k": k, "category": "all", "status": status, "speedup": speedup,
            "speedup_ci_low": lo, "speedup_ci_high": hi, "acceptance_length": al,
            "speedup_decision": decision(lo, hi), "speedup_level": draw(st.sampled_from(LEVELS)) if lo else None}


@st.composite
def sweep_rows(draw) -> list[dict]:
    """Drafting points of distinct k (1..9, so no name is a prefix of another), and distractors that must not
    count: k = 0 and failed points whose numbers would change the answer if they did (another mode's name)."""
    ks = draw(st.lists(st.integers(1, 9), unique=True, max_size=6))
    grid = draw(st.sampled_from([GRID, GRID, GRID[4:], GRID[:6]]))  # a table mostly at or above 1, or at or below
    rows = [draw(sweep_row(k, grid=grid)) for k in ks]
    rows += [draw(sweep_row(0, "plain")) for _ in range(draw(st.integers(0, 1)))]
    rows += [draw(sweep_row(k, "other", "failed")) for k in draw(st.lists(st.integers(1, 9), unique=True,
                                                                             max_size=2))]
    return draw(st.permutations(rows))


def counted(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "ok" and r["k"] > 0]


def timed_of(rows: list[dict]) -> list[dict]:
    return [r for r in counted(rows) if r["speedup"] is not None]


def faster_of(rows: list[dict]) -> list[dict]:
    return [r for r in timed_of(rows) if r["speedup_decision"] == "faster"]


def by_name(rows: list[dict], named: str) -> dict:
    hits = [r for r in counted(rows) if name(r) == named]
    assert len(hits) == 1, (named, rows)
    return hits[0]


def level(x: float) -> str:
    """The level as the page prints it: a percentage to at most two decimals, no trailing zeros."""
    return {0.95: "95 %", 0.99: "99 %", 1 - 0.05 / 6: "99.17 %", 1 - 0.05 / 60: "99.92 %"}[x]


def speed(r: dict) -> str:
    c = ci(r)
    return "(no interval)" if c is None else f"[{level(r['speedup_level'])}: {c[0]:.2f} to {c[1]:.2f}]"


@FAST
@given(sweep_rows())
def test_the_sweep_tone_follows_every_row(rows):
    text, tone = sweep_headline(rows)
    timed = timed_of(rows)
    all_slower = bool(timed) and all(r["speedup_decision"] == "slower" for r in timed)
    assert (tone == "good") == bool(faster_of(rows)), (text, rows)
    assert (tone == "bad") == (not counted(rows) or (not faster_of(rows) and all_slower)), (text, rows)
    # the issue's sentence is false if any row's interval lies above 1; it is said exactly when it is the answer
    says_none = text.startswith("No k is faster than plain decoding beyond noise: ")
    assert says_none == (not faster_of(rows) and not all_slower and any(r["speedup_decision"] for r in timed)), \
        (text, rows)
    assert says_none == (tone == "warn")
    if text.startswith("Drafting is slower here"):
        assert all(ci(r) and ci(r)[1] < 1 for r in timed)


NOISE = st.none() | st.sampled_from([0.0, 0.04, 0.1, 0.5, 3.3])  # an A/A floor (log ratio), or no A/A timed


@FAST
@given(sweep_rows(), NOISE, st.none() | st.sampled_from([0.3, 7.5]), st.none() | st.sampled_from([2, 64]))
def test_a_sweep_whose_noise_drowns_every_difference_says_so_and_ranks_nothing(rows, floor, load, cores):
    """Issue 45 item 2: where the sweep timed an A/A control, no drafting point is decided and every timed one's
    speedup s lies within the floor f (|log s| <= f), the answer says nothing can be told apart, with the floor as
    its noise line prints it, the speedups' range, the load and what to do (tone bad); else it is the headline."""
    import math

    from mtpbench.sweep.page import answer

    noise = None if floor is None else {"floor": floor, "floor_pct": round(100 * math.expm1(floor), 2)}
    prov = {"load_average": [load, load, load], "hardware": {"cpus_usable": cores}} if load is not None else {}
    text, tone = answer({"rows": rows, "noise": noise, "provenance": prov})
    timed = [r for r in timed_of(rows) if r["speedup"]]
    drowned = (floor is not None and bool(timed) and not any(r["speedup_decision"] in ("faster", "slower")
                                                             for r in timed)
               and all(max(r["speedup"], 1 / r["speedup"]) <= math.exp(floor) for r in timed))
    assert text.startswith("Nothing can be told apart here") == drowned, (text, rows, floor)
    if not drowned:
        assert (text, tone) == sweep_headline([r for r in rows if r["category"] == "all"])
        return
    assert tone == "bad" and "Best" not in text and "the best" not in text
    xs = sorted(r["speedup"] for r in timed)
    span = f"{xs[0]:.2f}x" if f"{xs[0]:.2f}" == f"{xs[-1]:.2f}" else f"{xs[0]:.2f}x to {xs[-1]:.2f}x"
    assert f"differ by up to {noise['floor_pct']:.1f} %" in text and f"({span})" in text
    assert ("The load average was" in text) == (load is not None)
    assert load is None or f"The load average was {load:.2f}" in text
    assert (f"on {cores} usable cores" in text) == (load is not None and cores is not None)
    assert "Stop other work and run again" in text


@FAST
@given(sweep_rows())
def test_the_best_the_sweep_names_is_faster_beyond_noise_and_the_fastest_of_those(rows):
    text, tone = sweep_headline(rows)
    faster, timed = faster_of(rows), timed_of(rows)
    if tone != "good":
        assert "faster than plain decoding beyond noise at" not in text
        return
    m = re.match(r"Best: (\w+ k = \d) at (\d+\.\d\d)x the speed of plain decoding (\[[\d.]+ %: [\d.]+ to [\d.]+\])"
                 r"(, acceptance length (\d+\.\d\d))?; faster than plain decoding beyond noise at (\d+) of (\d+) "
                 r"timed points: ([^.]*)\.( (\w+ k = \d) has the highest speedup, (\d+\.\d\d)x (.*), but is not "
                 r"faster beyond noise\.)?$", text)
    assert m, text
    best = by_name(rows, m[1])
    assert best in faster and best["speedup"] == max(r["speedup"] for r in faster)
    assert m[2] == f"{best['speedup']:.2f}" and m[3] == speed(best)
    assert m[5] == (None if best["acceptance_length"] is None else f"{best['acceptance_length']:.2f}")
    assert (int(m[6]), int(m[7])) == (len(faster), len(timed))
    assert m[8].split("; ") == [name(r) for r in faster]  # every point faster beyond noise, and no other
    top = max(r["speedup"] for r in timed)
    assert (m[9] is not None) == (top > best["speedup"])
    if m[9]:
        other = by_name(rows, m[10])
        assert other["speedup"] == top and other not in faster and m[11] == f"{top:.2f}" and m[12] == speed(other)


@FAST
@given(sweep_rows())
def test_without_a_point_faster_the_sweep_names_the_highest_speedup(rows):
    text, tone = sweep_headline(rows)
    timed = timed_of(rows)
    if tone == "good" or not timed:
        return
    top = max(r["speedup"] for r in timed)
    bare = sum(r["speedup_decision"] is None for r in timed)
    al = lambda r: "" if r["acceptance_length"] is None else f", acceptance length {r['acceptance_length']:.2f}"  # noqa: E731
    if tone == "bad":
        m = re.fullmatch(r"Drafting is slower here: every drafting point runs below plain decoding beyond noise; "
                         r"the highest speedup, (\w+ k = \d), runs at (.*)\.", text)
        r = by_name(rows, m[1]) if m else None
        assert m and r["speedup"] == top and m[2] == f"{top:.2f}x {speed(r)}", text
    elif tone == "plain":
        m = re.fullmatch(r"Not judged: no drafting point has an interval \(a speedup needs 3 repeats a side: --repeats 3 "
                         r"judges it\); the highest speedup measured is (\w+ k = \d) at (\d+\.\d\d)x the speed of plain "
                         r"decoding \(no interval\)(.*)\.", text)
        assert "Best" not in text
        r = by_name(rows, m[1]) if m else None
        assert m and bare == len(timed) and r["speedup"] == top and m[2] == f"{top:.2f}" and m[3] == al(r), text
    else:
        m = re.fullmatch(r"No k is faster than plain decoding beyond noise: the highest speedup, (\w+ k = \d), runs "
                         r"at (\d+\.\d\d)x (.*?)(, acceptance length [\d.]+)?(; (\d) of (\d) timed points have no "
                         r"interval)?\.", text)
        r = by_name(rows, m[1]) if m else None
        assert m and r["speedup"] == top and m[2] == f"{top:.2f}" and m[3] == speed(r), text
        assert (m[4] or "") == al(r)
        assert (m[5] is not None) == (bare > 0) and (not bare or (int(m[6]), int(m[7])) == (bare, len(timed)))


@FAST
@given(sweep_rows())
def test_a_sweep_without_speedups_says_what_it_has(rows):
    rows = [{**r, "speedup": None} for r in rows]
    text, tone = sweep_headline(rows)
    drafted = [r for r in counted(rows) if r["acceptance_length"] is not None]
    if drafted:
        peak = max(r["acceptance_length"] for r in drafted)
        m = re.match(r"Acceptance length peaks at (\d+\.\d\d) \((\w+ k = \d)\); no speedup", text)
        assert m and m[1] == f"{peak:.2f}" and by_name(rows, m[2])["acceptance_length"] == peak and tone == "plain"
    elif counted(rows):
        assert text == f"Nothing was drafted at {', '.join(name(r) for r in counted(rows))} (e.g. a batch-size " \
                       "schedule that gives this load k = 0)." and tone == "plain"
    else:
        assert (text, tone) == ("No drafting point finished: see the failed points below.", "bad")


@FAST
@given(st.integers(0, 4), st.sampled_from(["vllm", "chain"]), st.none() | st.integers(0, 3),
       st.none() | st.integers(0, 64), st.none() | st.integers(0, 4096))
def test_a_point_is_named_by_each_of_its_dimensions(k, mode, layers, concurrency, context):
    r = {"k": k, "mode": mode, "mtp_layers": layers, "concurrency": concurrency, "context_tokens": context}
    parts = ["plain decoding" if k == 0 else f"{mode} k = {k}"]
    if k and layers:
        parts.append(f"{layers} MTP layer" + ("s" if layers > 1 else ""))
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if context is not None:
        parts.append(f"context {context}")
    assert label(r) == ", ".join(parts)
    assert label({"k": k, "mode": mode}) == parts[0]  # older rows lack the load's keys


def test_a_k_faster_beyond_noise_beside_a_higher_noisy_median_is_named_issue_33_item_5():
    """The issue's table: k = 1 at 1.10 [1.05, 1.15] beside k = 3 at 1.15 [0.80, 1.50]. The old rule looked at
    k = 3 only and said no k is faster beyond noise."""
    rows = [{"mode": "vllm", "k": 1, "category": "all", "status": "ok", "speedup": 1.10, "speedup_ci_low": 1.05,
             "speedup_ci_high": 1.15, "acceptance_length": 1.8, "speedup_decision": "faster", "speedup_level": 0.95},
            {"mode": "vllm", "k": 3, "category": "all", "status": "ok", "speedup": 1.15, "speedup_ci_low": 0.80,
             "speedup_ci_high": 1.50, "acceptance_length": 2.4, "speedup_decision": "open", "speedup_level": 0.95}]
    assert sweep_headline(rows) == (
        "Best: vllm k = 1 at 1.10x the speed of plain decoding [95 %: 1.05 to 1.15], acceptance length 1.80; faster "
        "than plain decoding beyond noise at 1 of 2 timed points: vllm k = 1. vllm k = 3 has the highest speedup, "
        "1.15x [95 %: 0.80 to 1.50], but is not faster beyond noise.", "good")


def test_the_headline_says_beyond_noise_only_where_the_row_says_decided_issue_44_case_4():
    """Issue 44, case 4: --repeats 3 --max-repeats 12, true x1.05: the page's headline read the plain 95 %
    interval (1.07x [1.01, 1.09], "faster beyond noise") while its row, judged at 1 - 0.05 / L, read open, n = 12.
    Rebuilt from files, the row's interval is the one its decision was made at, and the headline reads the row."""
    rows = [{"mode": "reuse", "k": 1, "category": "all", "status": "ok", "speedup": 1.07, "speedup_ci_low": 0.98,
             "speedup_ci_high": 1.16, "acceptance_length": 1.7, "speedup_decision": "open",
             "speedup_level": 1 - 0.05 / 60}]
    text, tone = sweep_headline(rows)
    assert tone == "warn" and "beyond noise:" in text and "[99.92 %: 0.98 to 1.16]" in text


# ---- check-lossless -------------------------------------------------------------------------------------------

KNOWN = {"lossless": (0, "good"), "lossless (no difference detectable at this N)": (0, "good"),
         "numerical only": (0, "plain"), "lossy": (1, "bad"), "divergent": (1, "bad"), "inconclusive": (3, "warn")}
VERDICT = st.sampled_from(sorted(KNOWN)) | st.from_regex(r"[a-z]([a-z ]{0,14}[a-z])?", fullmatch=True)
WHY = st.none() | st.just("") | st.from_regex(r"[a-z0-9][a-z0-9 ,=.()-]{0,30}[a-z0-9)]", fullmatch=True)


@FAST
@given(VERDICT, WHY)
def test_the_lossless_tone_follows_the_exit_code(verdict, why):
    text, tone = lossless_headline({"verdict": verdict, "why": why})
    code, want = KNOWN.get(verdict, (0, "plain"))
    assert tone == want, (verdict, tone)
    # and with --fail-if-lossy's own function: red exactly where the gate exits 1, amber where it exits 3
    assert (tone == "bad") == (exit_code({"verdict": verdict}) == 1) == (code == 1)
    assert (tone == "warn") == (exit_code({"verdict": verdict}) == 3)
    assert tone != "good" or exit_code({"verdict": verdict}) == 0
    assert text == verdict[0].upper() + verdict[1:] + (f": {why}" if why else "")


def test_numerical_only_is_not_red_while_the_gate_passes_it_issue_33_item_11():
    record = {"verdict": "numerical only", "why": "all 2 divergence(s) within rounding (|logit gap| <= 0.25)"}
    assert exit_code(record) == 0
    assert lossless_headline(record) == ("Numerical only: all 2 divergence(s) within rounding (|logit gap| <= "
                                         "0.25)", "plain")


# ---- trace-layers ---------------------------------------------------------------------------------------------

TRACE_TONES = {"multi-module": "good", "layer-0 reuse": "warn", "multi-layer calls": "plain", "inconclusive": "plain",
               "swallowed": "bad", "mismatch": "bad", "crashed": "bad", "engine error": "bad"}
LAYER = st.sampled_from([0, 1, 2, 3, -1, None])


def layer_words(j) -> str:
    return {-1: "all layers in one call", None: "no MTP layer"}.get(j, f"layer {j}")


@st.composite
def trace_record(draw) -> tuple[dict, list[str]]:
    """trace.json as the trace writes it (a step's "ran layer:count" is "j:n" per layer, ordered by str), and the
    words the oracle expects for each step: the one layer that ran, or each with its count."""
    steps, words = [], []
    for s in range(draw(st.integers(0, 5))):
        ran = draw(st.dictionaries(LAYER, st.integers(1, 9), min_size=1, max_size=3))
        cell = " ".join(f"{j}:{n}" for j, n in sorted(ran.items(), key=str))
        steps.append({"step": s, "calls": sum(ran.values()), "ran layer:count": cell})
        order = sorted(ran, key=str)
        words.append(layer_words(order[0]) if len(ran) == 1 else
                     ", ".join(f"{layer_words(j)} x{ran[j]}" for j in order))
    t = {"verdict": draw(st.sampled_from(sorted(TRACE_TONES)) | st.just("build failed")), "per_step": steps,
         "mode": draw(st.sampled_from(["chain", "reuse", "vllm"])), "k": draw(st.integers(1, 6)),
         "num_mtp_layers": draw(st.integers(1, 3)), "backend": "native",
         "drafter": draw(st.sampled_from([None, "", "EagleProposer"]))}
    return t, words


@FAST
@given(trace_record())
def test_the_trace_headline_names_every_layer_each_step_ran(case):
    t, words = case
    text, tone = trace_headline(t)
    steps = "; ".join(f"step {s}: {w}" for s, w in enumerate(words)) or "No draft step ran"
    layers = f"{t['num_mtp_layers']} MTP layer" + ("" if t["num_mtp_layers"] == 1 else "s")
    assert text == (f"Verdict: {t['verdict']}. {steps} ({t['mode']}, k = {t['k']}, {layers}, drafted by "
                    f"{t['drafter'] or 'native'}).")
    assert tone == TRACE_TONES.get(t["verdict"], "bad")


def test_a_step_that_ran_two_layers_is_not_said_to_have_run_one():
    """The old sentence took the first "j:n" of a step's cell: a step that ran layer 0 five times and layer 1
    three times read "step 1: layer 0". A step with no cell reads "layer -"."""
    t = {"verdict": "mismatch", "mode": "chain", "k": 2, "num_mtp_layers": 2, "backend": "native",
         "per_step": [{"step": 0, "ran layer:count": "0:8"}, {"step": 1, "ran layer:count": "0:5 1:3"}]}
    assert trace_headline(t)[0] == ("Verdict: mismatch. step 0: layer 0; step 1: layer 0 x5, layer 1 x3 (chain, "
                                    "k = 2, 2 MTP layers, drafted by native).")
    t["per_step"] = [{"step": 0, "ran layer:count": ""}, {"step": 1}]
    assert trace_headline(t)[0].startswith("Verdict: mismatch. step 0: layer -; step 1: layer - (chain")


# ---- trace-matrix ---------------------------------------------------------------------------------------------

MATRIX_WORDS = {"multi-module": "chain", "layer-0 reuse": "reuse layer 0", "swallowed": "swallow the index",
                "crashed": "crash"}
CELL = st.fixed_dictionaries({
    "arch": st.sampled_from(["deepseek-v3", "qwen3-next", "mimo", "glm4-moe"]),
    "runner": st.sampled_from(["v1", "v2"]), "runner_asked": st.sampled_from(["", "v1", "v2"]),
    "drafting": st.sampled_from(["as installed", "forced"]),
    "verdict": st.sampled_from(["multi-module", "layer-0 reuse", "swallowed", "crashed", "mismatch",
                                "inconclusive", "build failed", "did not start", "interrupted"])})


@FAST
@given(st.lists(CELL, min_size=1, max_size=12))
def test_the_matrix_headline_counts_every_cell_once_per_runner_and_drafting(cells):
    text = matrix_headline(cells)
    archs = len({c["arch"] for c in cells})
    head = f"{archs} architecture{'s' if archs != 1 else ''}. "
    assert text.startswith(head) and text.endswith(".")
    said = {}
    for part in text[len(head):-1].split("; "):
        group, counts = part.split(": ")
        pairs = [x.split(" ", 1) for x in counts.split(", ")]
        assert [int(n) for n, _ in pairs] == sorted((int(n) for n, _ in pairs), reverse=True)  # most first
        said[group] = Counter({w: int(n) for n, w in pairs})
    want = {}
    for c in cells:  # each verdict in the page's word for it where it has one ("chain"), else as it is
        group = f"{(c['runner_asked'] or c['runner']).upper()} {c['drafting']}"
        want.setdefault(group, Counter())[MATRIX_WORDS.get(c["verdict"], c["verdict"])] += 1
    assert said == want
    order = sorted(want, key=lambda g: (g.split(" ", 1)[0], g.split(" ", 1)[1] != "as installed"))
    assert list(said) == order
