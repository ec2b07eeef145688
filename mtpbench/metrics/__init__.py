"""What a grid point measured (``records``: grid point, request and batch records, a point's run) and the one
result row every table, CSV and JSON is made from (``row``: PointResult, summarize, vLLM's formulas). The names
the backends, sweep, report and tests use are re-exported here."""

from mtpbench.metrics.records import (  # noqa: F401
    BatchRecord,
    GridPoint,
    PointRun,
    RequestRecord,
    check_requests_against_counters,
    mean_call_s,
    request_acceptance,
    request_acceptance_from_histogram,
)
from mtpbench.metrics.row import (  # noqa: F401
    PointResult,
    acceptance_by_position,
    summarize,
    without_timings,
)
