"""``mtpbench sweep`` and ``mtpbench report``: ``run`` (the grid and its point files), ``load`` (a sweep directory
read back into result rows), ``table`` (terminal table, summary.csv), ``plots`` (the PNGs), ``report`` (rebuild
everything from the saved files)."""

from mtpbench.sweep.run import run_sweep  # noqa: F401
