"""The progress every long command shows (cli/progress.py): off a terminal a line a step with elapsed time and an ETA
from the mean finished step, written here from that rule; on a terminal a bar that leaves nothing behind."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from mtpbench.cli.progress import Progress, clock, line


def mmss(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@given(st.integers(0, 50), st.integers(1, 50), st.floats(0, 20000, allow_nan=False))
def test_a_line_says_the_step_the_elapsed_time_and_the_time_left(i, n, elapsed):
    i = min(i, n)
    text = line(i, n, "k1 (round 2)", elapsed)
    head = f"[{min(i + 1, n)}/{n}] k1 (round 2)  elapsed {mmss(elapsed)}"
    if i == 0 or i == n:
        assert text == head  # nothing finished yet (no rate to go by), or nothing left
    else:
        assert text == f"{head}, ETA {mmss(elapsed / i * (n - i))}"


def test_clock():
    assert [clock(s) for s in (0, 41, 61, 725, 3723)] == ["0:00", "0:41", "1:01", "12:05", "1:02:03"]


def test_off_a_terminal_each_step_is_a_line_on_stderr(capsys):
    p = Progress("sweep", tty=False, warn_load=False)
    for i in range(3):
        p.on_point(i, 3, f"point {i}")
    p.on_point(3, 3, "done")
    p.stop()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 3
    assert [re.match(r"\[(\d)/3\] point (\d)", x).groups() for x in lines] == [("1", "0"), ("2", "1"), ("3", "2")]
    assert "ETA" in lines[1] and "ETA" not in lines[0]


def test_a_bar_never_started_prints_nothing(capsys):
    Progress("sweep", tty=True, warn_load=False).stop()
    assert capsys.readouterr() == ("", "")
