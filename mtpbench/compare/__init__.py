"""``mtpbench compare A B``: ``run`` (compare two saved sweeps), ``pair`` (points, rows and requests paired, one
metric's interval and verdict), ``checks`` (can they be compared, what differs as a whole), ``report`` (CSV, JSON,
markdown, plot). The names the CLI and tests use are re-exported here."""

from mtpbench.compare.checks import drift_notes, execution_notes  # noqa: F401
from mtpbench.compare.pair import GEOMETRIC, TABLE, CompareRow  # noqa: F401
from mtpbench.compare.report import HEADERS, markdown, table_lines, terminal_table  # noqa: F401
from mtpbench.compare.run import compare, unjudged_beyond, worse_beyond  # noqa: F401
