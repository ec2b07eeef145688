"""``mtpbench check-lossless``: ``run`` (the greedy and sampling checks, arm by arm), ``config`` (CheckConfig, its
defaults and validation, the backends' check protocol), ``verdict`` (greedy classes, A/A, exit codes; pure),
``report`` (summary, lossless.json/md/png). The names the CLI, benchmarks and tests use are re-exported here."""

from mtpbench.lossless.config import CHECK_DEFAULTS, DEFAULT_MAX_MDE, SUBTLE_FACTOR, CheckConfig  # noqa: F401
from mtpbench.lossless.report import summary  # noqa: F401
from mtpbench.lossless.run import run_check, run_greedy, run_sampling  # noqa: F401
from mtpbench.lossless.verdict import (  # noqa: F401
    NUMERICAL,
    classify,
    dtype_floor,
    exit_code,
    failed,
    greedy_verdict,
    numerical_threshold,
)
