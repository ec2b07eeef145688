"""sweep --law as its artifacts show it (issue 46): each k > 0 point file's acceptance against its law (the block
``metrics.law`` makes, here from verify steps drawn at random, some from an engine that over-accepts at one
position, some greedy, some not observable) reaches summary.json's row, summary.csv, the terminal's lines after the
table and report.html with the same verdict and the same numbers, read back from the text; a sweep without --law
shows none of it. No engine, no model."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpbench.metrics import GridPoint
from mtpbench.metrics.law import LAW_HEADERS, law_lines, law_summary
from mtpbench.sweep.page import label
from mtpbench.sweep.table import LAW_HEAD
from tests.unit.test_artifact_consistency import Page, read_csv, report, same, sweeps, write_sweep

NOT_OBSERVABLE = "the server does not serve mtpbench's law routes"


def steps_drawn(k: int, rng, over: int | None, greedy: bool) -> list[tuple]:
    """A point's verify steps (``metrics.law``'s 9-tuples): each request row reaches its draft positions in turn
    while they are accepted; a draft is accepted with the law's probability a (greedy: a certain 0 or 1), or, at
    position ``over``, with a + 0.4 (an engine that keeps drafts the law rejects)."""
    steps = []
    for row in range(int(rng.integers(20, 80))):
        for i in range(k):
            a = float(rng.integers(0, 2)) if greedy else round(float(rng.uniform(0.05, 0.6)), 4)
            x = int(rng.random() < (min(1.0, a + 0.4) if i == over else a))
            steps.append((row, i, x, a, None, None, 1.0, int(rng.integers(1, 300)), int(rng.integers(0, 40))))
            if not x:
                break
    return steps


@st.composite
def law_sweeps(draw) -> tuple[dict, dict]:
    """A sweep's plan (test_artifact_consistency's) and, per k > 0, how its law was read: None (no --law), or
    (observable, the position it over-accepts at or None, greedy)."""
    plan = draw(sweeps())
    law = draw(st.booleans())
    how = {k: (draw(st.booleans()) or k == 1, draw(st.sampled_from([None] + list(range(k)))), draw(st.booleans()))
           if law else None for k in plan["speed"] if k > 0}
    return plan, how


def add_law(d: Path, plan: dict, how: dict) -> dict[int, dict]:
    """Each k > 0 point file of ``d`` with its block, as a sweep with --law writes it (``metrics.law.law_block``)."""
    blocks = {}
    rng = np.random.default_rng(plan["seed"])
    for k, h in how.items():
        if h is None:
            continue
        observable, over, greedy = h
        blocks[k] = law_summary(steps_drawn(k, rng, over, greedy)) if observable else \
            law_summary([], NOT_OBSERVABLE)
        path = d / f"{GridPoint('vllm', k, 1).name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "acceptance_law": blocks[k]}))
    return blocks


def terminal_law(out: str) -> dict[str, str]:
    """The terminal's law lines after the table: point name -> its line, continuation lines joined."""
    if LAW_HEAD not in out:
        return {}
    lines = out.split(LAW_HEAD + "\n", 1)[1].split("\n\n", 1)[0].splitlines()
    said: dict[str, str] = {}
    for line in lines:
        if line.startswith("    "):  # a wrapped point line goes on
            said[last] += " " + line.strip()
        else:
            last, _, rest = line.strip().partition(": ")
            said[last] = rest
    return said


def check_terminal(line: str, block: dict, k: int) -> None:
    """A point's terminal line against its block: the verdict as law_lines says it, each position's numbers."""
    verdict, _, cells = line.partition("; ")
    assert f"acceptance against its law: {verdict}" == law_lines(block)[0], (line, block)
    at = {t["position"]: t for t in block["positions"]}
    if not block["observable"]:
        assert not cells
        return
    printed = cells.split(", pos ")
    assert len(printed) == k
    for i, cell in enumerate(printed):
        cell = cell.removeprefix("pos ")
        if i not in at:
            assert cell == f"{i} no step"
            continue
        m = re.fullmatch(rf"{i} (\S+) / (\S+) \((\d+) steps, (certain|z (\S+))\)", cell)
        assert m, cell
        t = at[i]
        assert same(m[1], t["observed"]) and same(m[2], t["expected"]) and int(m[3]) == t["steps"], (cell, t)
        assert (m[4] == "certain") == (t["z"] is None) and (t["z"] is None or same(m[5], t["z"])), (cell, t)
        # and word for word as the law's own terminal lines write that position's z (check-lossless, trace-layers)
        said = next(x for x in law_lines(block) if x.startswith(f"  pos {i}: "))
        assert f" steps, {m[4]})" in said or f" steps, {m[4]}, TV" in said, (cell, said)


def check_page(html: str, blocks: dict[str, dict]) -> None:
    """report.html: under "Acceptance against its law" a heading a point (``blocks``' keys, its label, in the rows'
    order), its verdict, and the test's table with the block's numbers."""
    if not blocks:
        assert "Acceptance against its law" not in html and "--law" not in html
        return
    tables = [t for t in Page(html).tables if t and t[0] == LAW_HEADERS]
    observable = [b for b in blocks.values() if b["observable"]]
    assert len(tables) == len(observable)
    for name, b in blocks.items():
        said = f"<p>{b['verdict'].capitalize()}: " if b["observable"] else f"<p>Not observable: {b['why']}."
        assert f"<h3>{name}</h3>{said}".replace("'", "&#x27;") in html
    for table, b in zip(tables, observable):
        rows = [dict(zip(table[0], r)) for r in table[1:]]
        assert len(rows) == len(b["positions"]) + 1 and rows[-1]["position"] == "all"
        for r, t in zip(rows, b["positions"] + [b["joint"]]):
            assert int(r["steps"]) == t["steps"] and r["decision"] == t["decision"], (r, t)
            assert same(r["observed"], t["observed"]) and same(r["expected"], t["expected"]), (r, t)
            # no z: "certain", and a certain departure's drafts counted (issue 55)
            sure = [f"{t[k]} {w}" for k, w in (("certain_over", "accepted with probability 0"),
                                                  ("certain_under", "rejected with probability 1")) if t.get(k)]
            want = "certain" + (": " + ", ".join(sure) if sure else "")
            assert (r["z"] == want) if t["z"] is None else same(r["z"], t["z"]), (r, t)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(law_sweeps())
def test_every_artifact_shows_each_points_law_as_its_block_says(case):
    plan, how = case
    with tempfile.TemporaryDirectory() as tmp:
        d = write_sweep(Path(tmp) / "s", plan)
        blocks = add_law(d, plan, how)
        code, out = report(d, pngs=False)
        assert code == (4 if plan["failed"] else 0), out  # errors.PARTIAL where a point failed
        summary = json.loads((d / "summary.json").read_text())
        rows = {r["k"]: r for r in summary["rows"] if r["category"] == "all" and r["status"] == "ok"}
        assert [b["point"]["k"] for b in summary["acceptance_law"]] == sorted(blocks)
        csv_rows = {int(c["k"]): c for c in read_csv(d / "summary.csv") if c["status"] == "ok"}
        said = terminal_law(out)
        assert set(said) == {GridPoint("vllm", k, 1).name for k in blocks}
        for k, row in rows.items():
            c = csv_rows[k]
            b = blocks.get(k)
            if b is None:  # k = 0, or a sweep without --law: nothing in any file
                assert row["law_verdict"] is None and c["law_verdict"] == ""
                assert all(row[f"law_{x}_per_pos"] == [] and c[f"law_{x}_per_pos"] == ""
                           for x in ("steps", "observed", "expected", "z"))
                continue
            assert f"acceptance against its law: {row['law_verdict']}" == law_lines(b)[0]
            assert c["law_verdict"] == row["law_verdict"]
            at = {t["position"]: t for t in b["positions"]}
            for x in ("steps", "observed", "expected", "z"):
                want = [at[i][x] if i in at else None for i in range(k)] if b["observable"] else []
                assert row[f"law_{x}_per_pos"] == want, (x, row, b)
                cell = c[f"law_{x}_per_pos"]
                cells = cell.split(";") if want else [cell] if cell else []
                assert len(cells) == len(want) and all(v == "" if w is None else same(v, w)
                                                        for v, w in zip(cells, want)), (x, cells, want)
            check_terminal(said[GridPoint("vllm", k, 1).name], b, k)
        check_page((d / "report.html").read_text(),
                   {label({"k": k, "mode": "vllm", "mtp_layers": 1}): blocks[k] for k in sorted(blocks)})


@given(st.one_of(st.none(), st.floats(-50, 50), st.sampled_from([-0.0, -0.004, -0.005, -0.0049999, 0.005, 0.0])))
def test_a_z_is_written_with_two_decimals_and_a_sign_and_never_minus_zero(z):
    """The rule (metrics.law.z_text, every terminal line of the law): None is "certain"; else "z" and the value at
    two decimals with its sign, where a value that shows as zero is "+0.00"."""
    from mtpbench.metrics.law import z_text

    if z is None:
        want = "certain"
    else:
        digits = f"{abs(z):.2f}"
        want = "z " + ("+" if z >= 0 or digits == "0.00" else "-") + digits
    assert z_text(z) == want
