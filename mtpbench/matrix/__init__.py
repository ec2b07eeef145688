"""``mtpbench trace-matrix``: ``run`` (one engine per architecture, in parallel workers), ``cells`` (the verdict of each
cell, pure), ``report`` (matrix.json/csv/md/png, and their rebuild from matrix.json). The names the CLI and tests use
are re-exported here."""

from mtpbench.matrix.cells import DRAFTING, Cell, vllm_check  # noqa: F401
from mtpbench.matrix.report import headers, markdown, rebuild, rows, write_matrix  # noqa: F401
from mtpbench.matrix.run import MatrixInterrupted, run_arch, run_matrix  # noqa: F401
