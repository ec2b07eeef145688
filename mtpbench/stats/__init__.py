"""Statistics from saved numbers (numpy only: no torch, no I/O): ``intervals`` (a point's intervals and a
difference between two runs) and ``lossless`` (check-lossless's tests and verdict). Both are re-exported here:
``from mtpbench import stats; stats.ratio_ci(...)``."""

from mtpbench.stats.intervals import (  # noqa: F401
    LEVEL, RESAMPLES, SEED, MIN_PROMPTS, MIN_REPEATS, MIN_REPEATS_RATIO, t_quantile, resample_counts,
    ratio_ci_batch, ratio_ci, median_ci, median, paired_ratio_diff_ci, median_diff_ci, log_ratio_t_ci,
    rank_ratio_ci, median_ratio_ci, speedup_diff, speedup_diff_ci,
)

from mtpbench.stats.lossless import (  # noqa: F401
    PERMUTATIONS, ALPHA, ALPHA_AA, DEFAULT_PROMPTS, DEFAULT_PER_PROMPT, POWER, MIN_CONTINUATIONS, LOGPROB_FLOOR,
    ENDED, LosslessTest, lossless_arrays, permuted_labels, lossless_test_arrays, lossless_test, ScoreTest,
    score_test, LOSSLESS, LOSSY, INCONCLUSIVE, MISSING, AA_REJECTS, SCORER, TOO_FEW, UNDERPOWERED,
    detectable_shift, lossless_verdict,
)
