"""Every artifact agrees with itself (issue 44, item 5): hypothesis draws sweeps, tunes and compares (A/A floors,
rounds and their looks, goodput, failed and missing points), ``mtpbench report`` and ``mtpbench compare`` write
every file they write (terminal, .md, .csv, .json, report.html), and each claim is checked against the numbers
printed beside it, read back from the text alone: nothing here calls mtpbench's decision code for an answer.

The rules, from the issue and docs/report.md, docs/tune.md, docs/compare.md:

* a speedup's decision is the side of 1 its printed interval lies on (faster: low > 1, slower: high < 1, else
  open; an end at 1 is not beyond it), and a decided speedup's printed p is below 0.05;
* a sweep's headline says "faster beyond noise" of exactly the points whose rows say faster, counts them and the
  timed points right, and "No k is faster" / "Drafting is slower" only where no row / every row says so;
  "Nothing can be told apart" only where no row is decided and the A/A floor it prints is at least every printed
  speedup's distance from 1; the terminal starts with the page's headline, its table fits 120 columns and a
  legend names each column;
* a tune's chosen k > 0 has a printed interval wholly above 1 and a p below 0.05; a load where k = 0 is chosen
  shows no k > 0 interval wholly above 1; "not drafting at ... is the default" names exactly the loads where k = 0
  is chosen beside a k > 0 not shown slower; the decision's ranges give each load its chosen k (unless a "why" says
  what is run instead); the same for the choice by goodput and its intervals;
* compare's verdict is better / worse exactly where its printed interval of B - A lies wholly on one side of 0
  (better in the metric's good direction); --fail-if-worse exits 1 exactly where a printed row of all prompts is
  worse beyond the threshold (raw timings not while the k = 0 baseline drifted), or a point of A failed in B or is
  missing from it; the page's counts are the table's; compare's A speedup is the one A's sweep prints;
* CSV, JSON, the terminal, the .md and the page print the same figures (to the digits printed).
"""

from __future__ import annotations

import csv
import json
import math
import re
import tempfile
from dataclasses import asdict
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mtpbench.cli import app
from mtpbench.config import SweepConfig, fingerprint
from mtpbench.metrics import BatchRecord, GridPoint, RequestRecord, request_acceptance

ALPHA = 0.05
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERSIONS = {"vllm": "0.32.0", "torch": "2.13.0", "mtpbench_code": "c0de"}
PROMPTS = ["p0", "p1", "p2", "p3"]
SLO_MS = 900.0  # --goodput e2el:900

# ---- sweep directories on disk, as a sweep writes them -------------------------------------------------------


def request(pid: str, k: int, accepted: int) -> RequestRecord:
    if k == 0:
        return RequestRecord("c", 10, [1] * 20, 0.01, 0.1, prompt_id=pid)
    per_step = [min(k, accepted)] * 10
    return RequestRecord("c", 10, [1] * (sum(per_step) + 10), 0.01, 0.1, prompt_id=pid,
                         **request_acceptance(k, per_step))


def point_file(point: GridPoint, tokps: list[float], rounds: list[int] | None, fp: dict, rng) -> dict:
    reqs = [request(p, point.k, 1 + i % 2) for i, p in enumerate(PROMPTS)]
    out = sum(len(r.output_token_ids) for r in reqs)
    counts = [sum(getattr(r, n) or 0 for r in reqs) for n in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")]
    per_pos = [sum(r.num_accepted_tokens_per_pos[i] for r in reqs) for i in range(point.k)] if point.k else []
    batch = BatchRecord("c", out / tokps[0], *counts, per_pos) if point.k else BatchRecord("c", out / tokps[0])
    repeats = [{"output_tokens_per_sec": x, "ttft_ms_p50": 10.0, "tpot_ms_p50": 1000 / x, "wall_s": out / x,
                "request_e2el_ms": [float(e) for e in 8e4 / x * np.exp(rng.normal(0, 0.1, len(reqs)))],
                **({"round": rounds[i]} if rounds else {})} for i, x in enumerate(tokps)]
    return {"point": point.to_json("vllm"), "requests": [asdict(r) for r in reqs], "batches": [asdict(batch)],
            "repeats": repeats, "notes": [], "fingerprint": fp}


@st.composite
def sweeps(draw, batch: int = 1, ks=st.sets(st.integers(1, 3), min_size=1)) -> dict:
    """A sweep's plan: each k's true speed over k = 0, repeats (with rounds: a k > 0 point may stop before its k = 0),
    the looks its rounds allow, an A/A control (its floor), and a point that failed."""
    rounds = draw(st.booleans())
    n0 = draw(st.integers(3, 6))
    return {"batch": batch, "seed": draw(st.integers(0, 2 ** 31)), "sd": draw(st.sampled_from([0.0, 0.01, 0.05])),
            "rounds": rounds, "max_repeats": draw(st.sampled_from([None, 8, 12])) if rounds else None,
            "aa": draw(st.sampled_from([None, 0.01, 0.15])),
            "speed": {0: 1.0, **{k: draw(st.sampled_from([0.7, 0.97, 0.995, 1.0, 1.005, 1.04, 1.3])) for k in sorted(draw(ks))}},
            "n": {0: n0, **{k: draw(st.integers(3, n0)) if rounds else n0 for k in range(1, 4)}},
            "failed": draw(st.sampled_from([(), (4,)]))}


def write_sweep(d: Path, plan: dict) -> Path:
    d.mkdir(parents=True)
    rng = np.random.default_rng(plan["seed"])
    ks = sorted(plan["speed"])
    cfg = SweepConfig(backend="vllm", k=tuple(ks) + plan["failed"], batch_size=plan["batch"], repeats=3,
                      max_repeats=plan["max_repeats"]).to_json()
    fp = fingerprint(cfg, VERSIONS)
    (d / "run.json").write_text(json.dumps({"config": cfg, "provenance": {"versions": VERSIONS}, "engine": {},
                                            "fingerprint": fp}))
    base = 100.0 * plan["batch"] * plan.get("scale", 1.0)
    for k in ks:
        n = plan["n"][k]
        tokps = [float(x) for x in base * plan["speed"][k] * np.exp(rng.normal(0, plan["sd"], n))]
        p = GridPoint("plain" if k == 0 else "vllm", k, 0 if k == 0 else 1)
        (d / f"{p.name}.json").write_text(json.dumps(point_file(p, tokps, plan["rounds"] and list(range(n)), fp,
                                                                rng)))
    if plan["aa"] is not None:
        n = plan["n"][0]
        copy = [float(x) for x in base * np.exp(rng.normal(0, plan["aa"], n))]
        (d / "aa-k0.json").write_text(json.dumps(point_file(GridPoint("aa", 0, 0), copy,
                                                            plan["rounds"] and list(range(n)), fp, rng)))
    for k in plan["failed"]:
        p = GridPoint("vllm", k, 1)
        (d / f"{p.name}.failure.json").write_text(json.dumps({"point": p.to_json("vllm"), "error": "boom",
                                                              "fingerprint": fp}))
    return d


# ---- reading the text back ------------------------------------------------------------------------------------


def text_table(text: str, first: str) -> list[dict]:
    """The rows of a tabulate table (header ``first`` ...) as {header: cell}, cut at the dashes' columns."""
    lines = text.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith(first) and lines[j + 1].startswith("--"))
    spans = [m.span() for m in re.finditer(r"-+", lines[i + 1])]
    heads = [lines[i][a:b].strip() for a, b in spans]
    rows = []
    for line in lines[i + 2:]:
        if not line.strip() or any(line[b:b + 2].strip() for _, b in spans[:-1] if b < len(line)):
            break
        rows.append({h: line[a:b2].strip() for h, (a, _), (b2, _) in zip(heads, spans, spans[1:] + [(None, 0)])})
    return rows


def md_table(text: str, first: str) -> list[dict]:
    lines = [line for line in text.splitlines()]
    i = next(j for j, line in enumerate(lines) if line.startswith(first))
    heads = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(heads, (c.strip() for c in line.strip().strip("|").split(" | ")))))
    return rows


class Page(HTMLParser):
    """report.html's answer paragraph, its sub-line and its tables (cells' text)."""

    def __init__(self, text: str):
        super().__init__()
        self.answer, self.sub, self.tables, self._in, self._cell = "", "", [], None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "p" and cls.startswith("answer"):
            self._in = "answer"
        elif tag == "p" and cls == "sub":
            self._in = "sub"
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "p":
            self._in = None
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        elif self._in:
            setattr(self, self._in, getattr(self, self._in) + data)

    def rows(self, first: str) -> list[dict]:
        t = next(t for t in self.tables if t and t[0] and t[0][0] == first)
        return [dict(zip(t[0], r)) for r in t[1:]]


def same(printed: str, value: float | None) -> bool:
    """``printed`` is ``value`` to the digits printed (half a unit of the last digit either way)."""
    if value is None:
        return printed in ("-", "")
    m = re.fullmatch(r"[+-]?(\d*)\.?(\d*)(e([+-]?\d+))?", printed)
    assert m, printed
    unit = 10.0 ** (-len(m[2]) + (int(m[4]) if m[3] else 0))
    return abs(float(printed) - value) <= unit / 2 * (1 + 1e-9) + 1e-12


NUM = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def side(lo: float, hi: float, null: float) -> str:
    return "above" if lo > null else "below" if hi < null else "open"


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_float(cell: str) -> float | None:
    return None if cell in ("", "None") else float(cell)


# a sweep's PNGs hold no text to read back and take most of a report's time (matplotlib's layout): one example in
# four draws them, the others leave them out (report.html is then written without its figures, its text the same)
PNGS = st.sampled_from([True, False, False, False])


def report(d: Path, pngs: bool = True) -> tuple[int, str]:
    """``mtpbench report d``: its exit code and what it printed."""
    with pytest.MonkeyPatch.context() as mp:
        if not pngs:
            mp.setattr("mtpbench.sweep.report.plots", lambda out, rows: [])
            mp.setattr("mtpbench.sweep.report.al_histogram", lambda out, points, rows: None)
        r = CliRunner().invoke(app, ["report", str(d)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


# ---- a sweep: terminal, summary.csv, summary.json, report.html ------------------------------------------------

TERM_SPEEDUP = re.compile(rf"({NUM})\*?(?: \[({NUM}), ({NUM})\])?")
PAGE_SPEEDUP = re.compile(rf"({NUM})\*?(?: \[({NUM}), ({NUM})\] (\w+), n = (\d+))?")
WORDS = {"above": "faster", "below": "slower", "open": "open"}
ENDS = 1e-4  # the files keep interval ends rounded outward to 4 decimals; the tables print them rounded


def check_speedup(cell: str, pattern: re.Pattern, row: dict, decided: str | None = None) -> tuple | None:
    """A printed speedup against its decision and the JSON row; returns (speedup, low, high, decision) as printed."""
    m = pattern.fullmatch(cell)
    assert m, cell
    assert same(m[1], row["speedup"]), (cell, row["speedup"])
    if m[2] is None:
        assert row["speedup_ci_low"] is None or row["k"] == 0
        return None
    lo, hi = float(m[2]), float(m[3])
    decided = decided if decided is not None else m[4]
    assert decided == WORDS[side(lo, hi, 1.0)], cell  # the decision is the side of 1 the printed interval lies on
    assert decided == row["speedup_decision"] and (decided != "open") == (row["speedup_p"] < ALPHA), (cell, row)
    for text, value in ((m[2], row["speedup_ci_low"]), (m[3], row["speedup_ci_high"])):
        assert abs(float(text) - value) <= 10 ** -len(text.partition(".")[2]) / 2 + ENDS, (cell, row)
    return float(m[1]), lo, hi, decided


def page_label(k: int) -> str:
    return "plain decoding" if k == 0 else f"vllm k = {k}, 1 MTP layer"


def check_headline(answer: str, printed: dict[str, tuple | None]) -> None:
    """The page's sentence against the page's own rows (label -> (speedup, low, high, decision) or None)."""
    faster = [name for name, p in printed.items() if p and p[3] == "faster"]
    if answer.startswith("Nothing can be told apart here"):  # the A/A floor at least every speedup's distance from 1
        pct = float(re.search(rf"differ by up to ({NUM}) %", answer)[1])
        assert not any(p and p[3] in ("faster", "slower") for p in printed.values()), (answer, printed)
        assert all(max(p[0] - 5e-4, 1 / (p[0] + 5e-4)) <= 1 + (pct + 0.05) / 100 for p in printed.values() if p), \
            (answer, printed)
        return
    if answer.startswith("No drafting point finished") or answer.startswith("Acceptance length peaks"):
        assert not faster
        return
    m = re.fullmatch(rf"Best: (.+?) at ({NUM})x the speed of plain decoding \[({NUM}) %: ({NUM}) to ({NUM})\](?:, "
                     rf"acceptance length {NUM})?; faster than plain decoding beyond noise at (\d+) of (\d+) timed "
                     rf"points: (.*?)\.(?: (.+?) has the highest speedup, ({NUM})x .*)?", answer)
    if m:  # every point named faster beyond noise says so in its row, and no other row does
        assert m[8].split("; ") == faster or sorted(m[8].split("; ")) == sorted(faster), (answer, printed)
        assert float(m[4]) > 1 and printed[m[1]][3] == "faster" and int(m[6]) == len(faster)
        assert int(m[7]) == len(printed)
        assert same(m[2], max(printed[n][0] for n in faster))  # the best of them (its row: 3 decimals)
        return
    assert not faster, (answer, printed)
    if answer.startswith("Drafting is slower here"):
        assert all(p and p[2] < 1 for p in printed.values()), (answer, printed)
    elif answer.startswith("No k is faster than plain decoding beyond noise"):
        assert not all(p and p[2] < 1 for p in printed.values())
    else:
        assert re.fullmatch(r"Not judged: .* \(no interval\).*", answer) and not any(printed.values()), answer


@FEW
@given(sweeps(), PNGS)
def test_a_sweeps_artifacts_agree_with_the_numbers_beside_each_claim(plan, pngs):
    with tempfile.TemporaryDirectory() as tmp:
        d = write_sweep(Path(tmp) / "s", plan)
        code, out = report(d, pngs)
        assert code == (4 if plan["failed"] else 0), out  # errors.PARTIAL where a point failed (issue 56)
        wrote = next(line for line in out.splitlines() if line.startswith("wrote "))
        assert ("plots" in wrote.split(", ")) == pngs, wrote  # "wrote plots" only where it drew them
        rows = json.loads((d / "summary.json").read_text())["rows"]
        by_k = {r["k"]: r for r in rows if r["category"] == "all"}
        for c in read_csv(d / "summary.csv"):  # the CSV prints the JSON's figures
            j = by_k[int(c["k"])]
            for key in ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup_p", "speedup_level"):
                assert same(c[key], j[key]), (key, c[key], j[key])
            assert (c["speedup_decision"] or None) == j["speedup_decision"] and c["status"] == j["status"]
        for r in text_table(out, "mode"):  # the terminal's table
            j = by_k[int(r["k"])]
            if r["status"] == "ok" and int(r["k"]) > 0:
                check_speedup(r["speedup"], TERM_SPEEDUP, j, r["decided"])
        page = Page((d / "report.html").read_text())
        table = page.rows("point")
        head = next(h for h in table[0] if h.startswith("speedup"))
        levels = {j["speedup_level"] for j in rows if j["speedup_level"]}
        shown = [float(x) / 100 for x in re.findall(rf"({NUM}) %", head)]  # the level over the column
        legend = re.search(r"its interval at (.*?) \(1 - 0.05", " ".join(out.split()))  # and under the terminal's table
        legend = [float(x) / 100 for x in re.findall(rf"({NUM}) %", legend[1])] if legend else []
        for got in (shown, legend):
            assert len(got) == len(levels) and all(abs(a - b) < 5e-5 for a, b in zip(got, sorted(levels))), \
                (head, levels)
        printed = {}
        for r in table:
            k = next(k for k in by_k if page_label(k) == r["point"])
            if by_k[k]["status"] == "ok" and k > 0 and by_k[k]["speedup"] is not None:
                printed[r["point"]] = check_speedup(r[head], PAGE_SPEEDUP, by_k[k])
                assert r[head].endswith("*") == (by_k[k]["speedup_ci_low"] is None), r  # a missing interval marked
        answer = page.answer
        if plan["failed"]:  # a partial folder says so first: how many of the points, and which failed
            n = len(plan["speed"])
            head = (f"Partial: {n} of {n + len(plan['failed'])} points measured (failed: "
                    + ", ".join(f"vllm-L1-k{k}" for k in plan["failed"]) + "). ")
            assert answer.startswith(head), answer
            answer = answer[len(head):]
        event(f"sweep headline: {answer.split(':')[0]}")
        check_headline(answer, printed)
        check_first_screen(out, page.answer)
        check_noise_line(json.loads((d / "summary.json").read_text()).get("noise"), rows, out)
        check_one_statistic(d, plan, by_k, read_csv(d / "summary.csv"), text_table(out, "mode"))


def check_one_statistic(d: Path, plan: dict, by_k: dict, csv_rows: list[dict], term: list[dict]) -> None:
    """Issue 55, case 7: a row's tok/s is the geometric mean of its point file's timed runs (computed here by logs),
    in the JSON, the CSV and the terminal; and where a point was timed in every round its k = 0 was, its speedup is
    the ratio of the two rows' tok/s (within their rounding), so the two never stand on opposite sides of 1."""
    for k, j in by_k.items():
        if j["status"] != "ok":
            continue
        runs = [r["output_tokens_per_sec"] for r in json.loads((d / f"{j_name(k)}.json").read_text())["repeats"]]
        g = math.exp(math.fsum(math.log(x) for x in runs) / len(runs))
        assert j["output_tokens_per_sec"] == pytest.approx(g, abs=0.0051), (k, runs)
        c = next(c for c in csv_rows if int(c["k"]) == k and c["category"] == "all")
        assert as_float(c["output_tokens_per_sec"]) == j["output_tokens_per_sec"]
        t = next(t for t in term if int(t["k"]) == k)
        assert t["tok/s"].split(" ")[0].rstrip("*") == f"{j['output_tokens_per_sec']:.1f}", (t["tok/s"], j)
        if k > 0 and j["speedup"] is not None and plan["n"][k] == plan["n"][0]:
            ratio = j["output_tokens_per_sec"] / by_k[0]["output_tokens_per_sec"]
            assert j["speedup"] == pytest.approx(ratio, rel=2e-4, abs=1e-4), (j["speedup"], ratio)


def j_name(k: int) -> str:
    """The point file of k as write_sweep names it."""
    return GridPoint("plain" if k == 0 else "vllm", k, 0 if k == 0 else 1).name


def check_noise_line(noise: dict | None, rows: list[dict], out: str) -> None:
    """Issue 55 case 8: the noise sentence names no floor wider than a speedup interval it stands beside: where a
    point decided at an early look kept a narrower floor, the sentence says how narrow; every interval is at least
    as wide as the narrowest floor it names (its ends rounded outward: 1e-4 of slack)."""
    if not noise or noise.get("floor") is None:
        return
    said = " ".join(out.split())
    halves = [math.log(r["speedup_ci_high"] / r["speedup_ci_low"]) / 2 for r in rows
              if r["k"] > 0 and r["category"] == "all" and r["speedup_ci_low"]]
    least = noise["floor_least"]
    assert all(h >= least - 1e-4 for h in halves), (halves, noise)
    narrower = any(h < noise["floor"] - 1e-3 for h in halves)
    if narrower:  # some interval is narrower than the final floor: the sentence must not claim otherwise
        assert f"down to {noise['floor_least_pct']:.1f} %" in said, (said, noise, halves)


def check_first_screen(out: str, answer: str) -> None:
    """The terminal starts with the page's headline (the same words), then a table no wider than 120 characters,
    every column of which a legend on screen names."""
    assert " ".join(out.split("\n\n")[0].split()) == " ".join(answer.split()), (out, answer)
    lines = out.splitlines()
    i = next(j for j, line in enumerate(lines) if line.startswith("mode") and lines[j + 1].startswith("--"))
    end = next(j for j in range(i + 2, len(lines)) if not lines[j].strip() or not lines[j][:1].isalnum()
               or lines[j].startswith(("speedup:", "columns:", "* ")))
    assert all(len(line) <= 120 for line in lines[i:end]), lines[i:end]
    heads = [h for h in re.split(r"\s{2,}", lines[i].strip())]
    said = " ".join(" ".join(lines[end:]).split())
    for h in heads:  # named in the legend, or in the line on the speedup's interval (speedup, n, decided)
        assert f" {h}: " in f" {said}".replace("columns: ", " ") or f"{h}:" in said, (h, said)


# ---- a tune: terminal, tune.md, tune.csv, tune.json, report.html ----------------------------------------------

TUNE_CELL = re.compile(rf"(\*\*)?({NUM}) \(x({NUM}) \[({NUM}), ({NUM})\] at ({NUM}) %, p ({NUM}), (\w+)\)(\*\*)?")


def tune_cells(text: str) -> dict[int, dict]:
    """The measured table (terminal and tune.md print the same): load -> {"chosen": k, k: (bold, x, low, high, p,
    decision)}, each cell checked against its own decision on the way."""
    out = {}
    for r in md_table(text, "| batch | k = 0"):
        load, cells = int(r["batch"]), {"chosen": int(r["chosen"])}
        for head, cell in r.items():
            m = TUNE_CELL.fullmatch(cell) if head.startswith("k = ") and head != "k = 0" else None
            if m:
                lo, hi, p, decided = float(m[4]), float(m[5]), float(m[7]), m[8]
                assert decided == WORDS[side(lo, hi, 1.0)] and (decided != "open") == (p < ALPHA), cell
                cells[int(head[4:])] = (bool(m[1]), m[3], lo, hi, p, decided)  # the ratio as printed
        out[load] = cells
    return out


def loads_named(text: str, what: str = "") -> set[int] | None:
    m = re.search(r"not drafting at batch ([\d, ]+) is the default", text)
    return None if m is None else {int(x) for x in m[1].split(", ")}


def ranges(decision: str) -> list[tuple[int, int]] | None:
    """The decision's (up to load, k) pieces; None for one k everywhere."""
    m = re.fullmatch(r"(run k = (\d+)|don't draft) at any load measured.*|run k = (\d+) at every load measured.*",
                     decision)
    if m:
        return [(10 ** 9, int(m[3] or 0))]
    pieces = re.findall(r"(no drafting|k = (\d+)) (?:up to (?:batch )?(\d+)|above)", decision)
    return [(int(up) if up else 10 ** 9, int(k or 0)) for _, k, up in pieces]


@st.composite
def tunes(draw) -> tuple[list[dict], bool]:
    loads = draw(st.sampled_from([(1, 4), (1, 2, 8)]))
    ks = st.sets(st.integers(1, 3), min_size=1).map(lambda s: s | {1})  # every load drafts k = 1 at least
    plans = [draw(sweeps(batch=b, ks=st.just(draw(ks)))) for b in loads]
    for p in plans:
        p["failed"] = ()
    return plans, draw(st.booleans())


@FEW
@given(tunes())
def test_a_tunes_artifacts_agree_with_the_numbers_beside_each_claim(case):
    plans, goodput = case
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [write_sweep(Path(tmp) / f"b{p['batch']}", p) for p in plans]
        t = Path(tmp) / "tune"
        t.mkdir()
        config = {"sources": [str(d) for d in dirs], "mode": None, "goodput": {"e2el": SLO_MS} if goodput else None}
        (t / "tune.json").write_text(json.dumps({"config": config}))
        code, out = report(t)
        assert code == 0, out
        md = (t / "tune.md").read_text()
        cells = tune_cells(out)
        assert cells == tune_cells(md)  # the terminal and tune.md print one table
        for load, c in cells.items():
            ks = [k for k in c if k != "chosen"]
            if c["chosen"]:  # a chosen k: its interval wholly above 1, its p below alpha, in bold
                assert c[c["chosen"]][2] > 1 and c[c["chosen"]][4] < ALPHA, (load, c)
            else:  # don't draft: no k > 0 shown above 1 there
                assert not any(c[k][2] > 1 for k in ks), (load, c)
            assert all(c[k][0] == (k == c["chosen"]) for k in ks)
        default = {b for b, c in cells.items() if not c["chosen"] and any(c[k][5] != "slower" for k in c if k != "chosen")}
        reasons = re.search(r"^not reliable: (.*)$", out, re.M)
        assert (loads_named(reasons[1]) if reasons else None) == (default or None), (out, default)
        decision = re.search(r"^decision: (.*)$", out, re.M)[1]
        if not re.search(r"^why: ", out, re.M):  # the ranges run each measured load at its chosen k
            pieces = ranges(decision)
            assert pieces, decision
            assert all(next(k for up, k in pieces if b <= up) == c["chosen"] for b, c in cells.items()), (decision, cells)
        if re.search(r"^No k beat plain decoding beyond noise", out, re.M):
            assert not any(c[k][2] > 1 for c in cells.values() for k in c if k != "chosen")
        rows = read_csv(t / "tune.csv")
        saved = json.loads((t / "tune.json").read_text())["result"]
        assert len(rows) == len(saved["rows"])
        for r, j in zip(rows, saved["rows"]):  # tune.csv prints tune.json's rows, and the table their figures
            for key in ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup_p", "goodput_ratio_ci_low"):
                assert same(r[key], j[key]), (key, r, j)
            if r["measured"] == "True" and int(r["k"]) in cells[int(r["load"])]:
                bold, x, lo, hi, p, decided = cells[int(r["load"])][int(r["k"])]
                assert r["speedup_decision"] == decided and (r["chosen"] == "True") == bold
                assert same(x, float(r["speedup"])) and abs(lo - float(r["speedup_ci_low"])) < 0.005 + ENDS
                assert abs(hi - float(r["speedup_ci_high"])) < 0.005 + ENDS
        page = Page((t / "report.html").read_text())
        said = decision[0].upper() + decision[1:] + "."
        assert page.answer in (said, f"Not reliable: {decision}.")
        assert page.answer.startswith("Not reliable") == bool(reasons)
        event(f"tune: {decision.split(' at ')[0]}{', not reliable' if reasons else ''}")
        if goodput:
            check_goodput(out, rows, cells)


def check_goodput(out: str, rows: list[dict], cells: dict) -> None:
    """The choice by goodput: a k > 0 chosen only with its goodput interval (tune.csv, beside it) wholly above 1;
    its "default" loads exactly where k = 0 is chosen beside a k > 0 not shown to have less goodput."""
    by = {(int(r["load"]), int(r["k"])): r for r in rows if r["measured"] == "True"}
    chosen = {}
    for m in re.finditer(r"^goodput: batch (\d+): k = (\d+) by goodput \(.*\), k = (\d+) by tokens/s$", out, re.M):
        load, k = int(m[1]), int(m[2])
        chosen[load] = k
        assert int(m[3]) == cells[load]["chosen"]
        event(f"goodput: k = {k}")
        if k:
            r = by[load, k]
            assert float(r["goodput_ratio_ci_low"]) > 1 and float(r["goodput_p"]) < ALPHA, r
            assert r["goodput_chosen"] == "True"
    for (load, k), r in by.items():  # each printed decision is its interval's side of 1
        if k and r["goodput_ratio_ci_low"]:
            lo, hi = float(r["goodput_ratio_ci_low"]), float(r["goodput_ratio_ci_high"])
            assert r["goodput_decision"] == {"above": "higher", "below": "lower", "open": "open"}[side(lo, hi, 1.0)], r
            assert (r["goodput_decision"] != "open") == (float(r["goodput_p"]) < ALPHA), r
    line = re.search(r"^By goodput \((.*?)\): (.*)$", out, re.M)
    assert line, out
    if chosen:
        default = {b for b, k in chosen.items() if k == 0 and any(
            kk and r["goodput_decision"] != "lower" for (bb, kk), r in by.items() if bb == b)}
        assert loads_named(line[2].partition("; not reliable: ")[2]) == (default or None), (line[2], default)


# ---- compare: terminal, compare.md, compare.csv, compare.json, report.html and the gate's exit code -------------

LOWER_IS_BETTER = ("ttft_ms_p50", "tpot_ms_p50")  # every other metric compare prints is better higher
RAW_TIMINGS = ("output_tokens_per_sec",) + LOWER_IS_BETTER
CMP_INTERVAL = re.compile(rf"\[({NUM}), ({NUM})\] at ({NUM}) %")


def verdict_of(r: dict) -> str:
    """What a row's printed B - A and interval say (docs/compare.md): better / worse where the interval lies wholly
    on the side of 0 that B - A is on, in the metric's good direction; else within noise; no interval printed and
    B - A not 0: no interval."""
    diff = float(r["B - A"])
    m = CMP_INTERVAL.fullmatch(r["interval of B - A"])
    if diff == 0:
        return "within noise"
    if not m:
        return "no interval"
    where = side(float(m[1]), float(m[2]), 0.0)
    if where == "open" or (where == "above") != (diff > 0):
        return "within noise"
    return "better" if (where == "above") != (r["metric"] in LOWER_IS_BETTER) else "worse"


@st.composite
def pairs(draw) -> tuple[dict, dict, float]:
    a, b = draw(sweeps()), draw(sweeps())
    for plan in (a, b):
        plan["n"][0] = max(plan["n"][0], draw(st.sampled_from([3, 6])))  # 6 repeats: raw timings get intervals
        plan["n"].update({k: plan["n"][0] for k in (1, 2, 3) if not plan["rounds"]})
    b["seed"] = a["seed"] + 1
    b["scale"] = draw(st.sampled_from([1.0, 1.0, 0.8]))  # the machine 20 % slower for B: its baseline drifts
    return a, b, draw(st.sampled_from([0.0, 5.0, 50.0]))


@FEW
@given(pairs())
def test_compares_artifacts_and_its_gate_agree_with_the_numbers_beside_each_verdict(case):
    plan_a, plan_b, pct = case
    with tempfile.TemporaryDirectory() as tmp:
        a, b = write_sweep(Path(tmp) / "a", plan_a), write_sweep(Path(tmp) / "b", plan_b)
        o = Path(tmp) / "cmp"
        r = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(o), "--fail-if-worse", f"{pct:g}"])
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        out = r.output
        rows = text_table(out, "point")
        for row in rows:  # the interval's level, said once in the header where the rows share one
            at = next(h for h in row if h.startswith("interval"))
            row["interval of B - A"] = row.pop(at) + at.removeprefix("interval") if row[at] != "-" else row.pop(at)
        for row in rows:  # every verdict is what its printed interval says
            assert row["verdict"] == verdict_of(row), row
        drifted = "timings drifted between the runs" in " ".join(out.split())  # notes wrap at 120 columns
        k0 = [x for x in rows if x["point"] == "k0" and x["metric"] == "output_tokens_per_sec"]
        moved = bool(k0 and k0[0]["verdict"] in ("better", "worse"))
        # the note needs the baseline made the same way in both runs (nothing in settings differs)
        assert drifted == moved if re.search(r"^differs: nothing", out, re.M) else not drifted or moved
        # the answer first, the page's words; notes before the table; the table within 120 columns
        assert " ".join(out.split("\n\n")[0].split()) == " ".join(Page((o / "report.html").read_text()).answer.split())
        head = next(i for i, line in enumerate(out.splitlines()) if line.startswith("point "))
        assert not any(line.startswith("note: ") for line in out.splitlines()[head:])
        assert all(len(line) <= 120 for line in out.splitlines()[head:head + 2 + len(rows)])
        worse = [x for x in rows if x["verdict"] == "worse" and not (drifted and x["metric"] in RAW_TIMINGS)]
        rel = [abs(float(x["(B - A) / A"].rstrip(" %"))) for x in worse]
        if any(abs(v - pct) <= 0.005 for v in rel):
            return  # the printed percentage rounds onto the threshold: either side is right
        # a point that ran in A and failed in B (one that failed in both is no change)
        failed_b = [f for f in re.findall(r"^failed: (\S+) in (A and B|A|B):", out, re.M) if f[1] == "B"]
        missing = re.findall(r"\b(\S+) \(only in A\)", (o / "compare.md").read_text())
        gate = any(v > pct for v in rel) or bool(failed_b) or bool(missing)
        assert r.exit_code == (1 if gate else 0), (out, pct)  # the gate exits on what the table prints
        event(f"compare: exit {r.exit_code}, verdicts {sorted({x['verdict'] for x in rows})}, drifted {drifted}")
        saved = json.loads((o / "compare.json").read_text())
        table = read_csv(o / "compare.csv")
        assert len(table) == len(saved["rows"]) >= len(rows)
        for c, j in zip(table, saved["rows"]):  # compare.csv prints compare.json's rows
            for key in ("a", "b", "diff", "ci_low", "ci_high", "rel_diff"):
                assert same(c[key], j[key]), (key, c, j)
            assert c["verdict"] == j["verdict"]
        printed = {(x["point"], x["metric"]): x for x in rows}
        for j in saved["rows"]:  # and the terminal their figures, and the verdicts of all prompts
            x = printed.get((j["point"], j["metric"]))
            if j["category"] != "all" or x is None:
                continue
            assert x["verdict"] == j["verdict"] and same(x["A"], j["a"]) and same(x["B"], j["b"])
            m = CMP_INTERVAL.fullmatch(x["interval of B - A"])
            assert (m is None) == (j["ci_low"] is None)
            if m:
                assert same(m[1], j["ci_low"]) and same(m[2], j["ci_high"]) and same(m[3], 100 * j["level"])
        md = md_table((o / "compare.md").read_text(), "| point | metric")
        assert [(x["point"], x["metric"], x["verdict"], x["interval of B - A"]) for x in md] == \
            [(x["point"], x["metric"], x["verdict"], x["interval of B - A"]) for x in rows]
        page = Page((o / "report.html").read_text())
        m = re.match(r"B against A: (\d+) better, (\d+) worse, (\d+) within noise(?:, (\d+) without an interval)? "
                     r"\(of (\d+) rows\)", page.answer)
        assert m, page.answer
        counts = [sum(x["verdict"] == v for x in rows) for v in ("better", "worse", "within noise", "no interval")]
        assert [int(m[i] or 0) for i in (1, 2, 3, 4)] == counts and int(m[5]) == len(rows)
        assert ("missing in B" in page.answer) == bool(missing)
        check_one_estimator(a, rows)


def check_one_estimator(a: Path, rows: list[dict]) -> None:
    """compare's A speedup of a point is the speedup A's own sweep prints for it (issue 44, case 12), within each
    figure's printed rounding and the row's own rounding to 4 decimals (summary.json's speedup, which the table prints
    again: 1.00349 is saved as 1.0035 and printed 1.004 beside compare's 1.003)."""
    code, out = report(a, pngs=False)
    assert code == (4 if list(a.glob("*.failure.json")) else 0), out  # errors.PARTIAL where a point failed
    sweep = {f"vllm-L1-k{r['k']}": r["speedup"] for r in text_table(out, "mode")}  # its rows: all prompts
    for x in rows:
        if x["metric"] == "speedup" and sweep.get(x["point"], "-") != "-":
            shown = TERM_SPEEDUP.fullmatch(sweep[x["point"]])[1]
            assert abs(float(shown) - float(x["A"])) <= 10 ** -len(shown.partition(".")[2]) / 2 + \
                10 ** -len(x["A"].partition(".")[2]) / 2 + 5e-5 + 1e-12, (shown, x)
