"""Property and known-answer tests of ``stats/intervals.py`` (issue 33's mutation item): each interval and p-value
over random data against an oracle written here from the rule in the module's docstrings, never by calling the
function under test for the expectation. Coverage on synthetic data with a known truth is test_coverage.py's.

The oracle's own pieces: the t tail in closed form for whole df (Abramowitz & Stegun 26.7.3-4, a finite sum in
theta = atan(t / sqrt(df))) and by Gauss-Legendre over theta for a fractional df, not the incomplete beta
``stats.t_sf`` uses; the exact t quantile by bisection on that tail; the bootstrap-t one resample at a time in a
loop, with the order statistic read off the sorted list, not the batched einsum and ``nanquantile``. The speedup's
Welch interval (``stats.judge``) against the exact t quantile by bisection on that tail, not ``judge.t_isf``'s
Newton steps. Where a rule names ``stats.t_quantile`` (the
bootstrap-t's floor, the Welch intervals' half-width), the oracle takes it from that function, which is checked
against the exact quantile first."""

from __future__ import annotations

import math
import warnings
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mtpbench import stats
from mtpbench.stats import judge

FAST = settings(max_examples=150, deadline=None)
SLOWER = settings(max_examples=60, deadline=None)  # an oracle that loops over resamples
NODES, WEIGHTS = np.polynomial.legendre.leggauss(400)


# --- the oracle ----------------------------------------------------------------------------------------------------

def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t. A whole df: P(|T| < t) = A in closed form (A&S 26.7.3 for odd df, 26.7.4 for
    even); a fractional df: the density over theta, P(T > t) = G((df+1)/2) / (G(df/2) sqrt(pi)) int_theta^(pi/2)
    cos^(df-1), by 400-point Gauss-Legendre (within 4e-13 from df 2; below, the end point's power loses digits)."""
    if t < 0:
        return 1 - t_tail(-t, df)
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df == int(df) and df % 2 == 1:
        term, total = c, 0.0
        for i in range(1, int(df) - 1, 2):  # cos + 2/3 cos^3 + 2 4 / (3 5) cos^5 + ...
            total += term
            term *= c * c * (i + 1) / (i + 2)
        a = 2 / math.pi * (theta + s * total)
    elif df == int(df):
        term, total = 1.0, 0.0
        for i in range(1, int(df), 2):  # 1 + 1/2 cos^2 + 1 3 / (2 4) cos^4 + ...
            total += term
            term *= c * c * i / (i + 1)
        a = s * total
    else:
        const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
        x = (NODES + 1) / 2 * (math.pi / 2 - theta) + theta
        return float(const * (math.pi / 2 - theta) / 2 * np.sum(WEIGHTS * np.cos(x) ** (df - 1)))
    return (1 - a) / 2


def t_exact_quantile(p: float, df: float) -> float:
    """The t quantile by bisection on ``t_tail``."""
    lo, hi = -1e3, 1e3
    for _ in range(64):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_tail(mid, df) > 1 - p else (lo, mid)
    return (lo + hi) / 2


def inverted_cdf(values: list[float], p: float) -> float:
    """The ceil(p m)-th smallest of m values: the smallest v with (count of values <= v) / m >= p, p m taken in
    floats (the level's (1 - 0.95) / 2 is 0.025000000000000022, so of 40 values the second is the 2.5 % point)."""
    return sorted(values)[max(math.ceil(p * len(values)), 1) - 1]


def ratio_parts(c: list[int], cols: list[list[int]]) -> tuple[float, int, int]:
    """A resample's ratio A / D and its linearized terms a_i D - d_i A, in exact integers: the standard error is
    sqrt(n / (n - 1) sum_i c_i (a_i D - d_i A)^2) / D^2 (the docstring's, times D / D)."""
    num, den = cols
    a, d = sum(ci * x for ci, x in zip(c, num)), sum(ci * x for ci, x in zip(c, den))
    return (a / d if d else math.nan), d * d, sum(ci * (x * d - y * a) ** 2 for ci, x, y in zip(c, num, den))


def diff_parts(c: list[int], cols: list[list[int]]) -> tuple[float, int, int]:
    """B's ratio minus A's: terms (b_i E - e_i B) D^2 - (a_i D - d_i A) E^2 over D^2 E^2, in exact integers."""
    num_a, den_a, num_b, den_b = cols
    a, d = sum(ci * x for ci, x in zip(c, num_a)), sum(ci * x for ci, x in zip(c, den_a))
    b, e = sum(ci * x for ci, x in zip(c, num_b)), sum(ci * x for ci, x in zip(c, den_b))
    if not d or not e:
        return math.nan, 1, 0
    terms = [(x_b * e - y_b * b) * d * d - (x_a * d - y_a * a) * e * e
             for x_a, y_a, x_b, y_b in zip(num_a, den_a, num_b, den_b)]
    return b / e - a / d, d * d * e * e, sum(ci * t * t for ci, t in zip(c, terms))


def bootstrap_t(cols: list[list[int]], counts: np.ndarray, parts, level: float = 0.95,
                flat: list | None = None) -> tuple[float, float]:
    """The studentized bootstrap of the module docstring, one resample at a time, over whole counts: the estimate,
    its delta-method se afresh in each resample, t = (estimate* - estimate) / se*; a resample with no drafts, or
    with no spread (every linearized term exactly 0) away from the estimate, left out (and listed in ``flat``);
    its t quantiles, each end at least as far out as the t interval."""
    cols = [[int(v) for v in col] for col in cols]
    n = len(cols[0])
    a = (1 - level) / 2
    theta, scale, sq = parts([1] * n, cols)
    se = math.sqrt(sq * n / (n - 1)) / scale
    ts = []
    for c in counts.astype(int).tolist():
        theta_b, scale_b, sq_b = parts(c, cols)
        if math.isnan(theta_b) or (sq_b == 0 and theta_b != theta):
            if flat is not None and not math.isnan(theta_b):
                flat.append(c)
            continue
        ts.append(0.0 if theta_b == theta else (theta_b - theta) / (math.sqrt(sq_b * n / (n - 1)) / scale_b))
    if se == 0:
        return theta, theta
    t = stats.t_quantile(1 - a, n - 1)
    return theta - max(inverted_cdf(ts, 1 - a), t) * se, theta - min(inverted_cdf(ts, a), -t) * se


def oracle_counts(n: int, resamples: int, seed: int) -> np.ndarray:
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    out = np.zeros((resamples, n))
    for b, row in enumerate(idx):
        for i in row:
            out[b, i] += 1
    return out


def welch(groups: list[tuple[float, list[float]]]) -> tuple[float, float]:
    """se and Welch-Satterthwaite df of sum(w * mean(x)) over independent groups."""
    parts = [(w * w * np.var(x, ddof=1) / len(x), len(x)) for w, x in groups]
    v = sum(c for c, _ in parts)
    return math.sqrt(v), (v * v / sum(c * c / (k - 1) for c, k in parts) if v > 0 else math.inf)


def close(a, b, rel=1e-9) -> bool:
    return (a is None) == (b is None) and (a is None or all(x == pytest.approx(y, rel=rel, abs=1e-12)
                                                            for x, y in zip(a, b)))


# --- strategies ----------------------------------------------------------------------------------------------------

timings = st.floats(50, 200, allow_nan=False)


def repeats(lo: int = 3, hi: int = 7):
    return st.lists(timings, min_size=lo, max_size=hi)


@st.composite
def prompts(draw, lo: int = 5, hi: int = 9):
    """Accepted tokens and drafts per prompt, at most k = 3 accepted a draft (a prompt may never draft)."""
    n = draw(st.integers(lo, hi))
    den = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    num = [draw(st.integers(0, 3 * d)) for d in den]
    assume(sum(den) > 0)
    return [float(v) for v in num], [float(v) for v in den]


# --- the t distribution --------------------------------------------------------------------------------------------

def test_the_oracle_tail_agrees_with_itself():
    """The closed forms against the integral, and the normal limit (a check of the oracle, not of the code)."""
    for df in (1, 2, 3, 4, 7, 10):
        for t in (-2.5, 0.3, 1.0, 4.0):
            const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
            theta = math.atan(abs(t) / math.sqrt(df))
            x = (NODES + 1) / 2 * (math.pi / 2 - theta) + theta
            upper = float(const * (math.pi / 2 - theta) / 2 * np.sum(WEIGHTS * np.cos(x) ** (df - 1)))
            assert t_tail(t, df) == pytest.approx(upper if t > 0 else 1 - upper, abs=1e-13)
    assert t_tail(1.96, 1e6) == pytest.approx(0.0249979, abs=1e-6)


@FAST
@given(st.floats(-40, 40), st.integers(1, 40))
def test_t_sf_is_the_exact_tail_at_whole_df(t, df):
    assert stats.t_sf(t, df) == pytest.approx(t_tail(t, df), rel=1e-9, abs=1e-14)


@FAST
@given(st.floats(-15, 15), st.floats(2, 60).filter(lambda d: d != int(d)))
def test_t_sf_is_the_exact_tail_at_a_fractional_df(t, df):
    assert stats.t_sf(t, df) == pytest.approx(t_tail(t, df), rel=1e-7, abs=1e-12)


def test_t_sf_at_its_edges():
    assert stats.t_sf(0.0, 3) == 0.5 and stats.t_sf(-0.0, 3) == 0.5
    assert stats.t_sf(1e200, 4) == 0.0 and stats.t_sf(-1e200, 4) == 1.0  # t^2 beyond float range
    assert stats.t_sf(1e-12, 5) == pytest.approx(0.5 - 1e-12 * 0.3796067, rel=0, abs=1e-18)  # f(0) at df 5
    assert stats.t_sf(1.959963984540054, math.inf) == pytest.approx(0.025, abs=1e-15)
    assert stats.t_sf(-1.0, math.inf) == pytest.approx(0.8413447460685429, abs=1e-15)
    assert stats.t_sf(2.0, 0.5) == pytest.approx(0.2227574451, abs=1e-9)  # df below 1: the beta function still holds


@FAST
@given(st.floats(0.51, 0.999), st.floats(1, 2))
def test_t_quantile_is_exact_at_df_1_and_2_and_linear_in_1_over_df_between(p, df):
    exact = {d: t_exact_quantile(p, d) for d in (1, 2)}
    w = (1 / df - 1 / 2) / (1 - 1 / 2)
    assert stats.t_quantile(p, df) == pytest.approx(w * exact[1] + (1 - w) * exact[2], rel=1e-9)


def cornish_fisher_g5(z: float) -> float:
    """The fifth term of the expansion (A&S 26.7.5), the one the code leaves out: its error's leading order."""
    return z * (27 * z ** 10 + 339 * z ** 8 + 930 * z ** 6 - 1782 * z ** 4 - 765 * z ** 2 + 17955) / 368640


@pytest.mark.parametrize("df", [3, 4, 5, 7, 10, 30, 100, 1000])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_from_3_df_is_cornish_fisher_to_four_terms(p, df):
    """The four-term expansion in powers of 1 / df (A&S 26.7.5, written here in powers of z^2): the value to 1e-12,
    its error against the exact quantile within 1.5 times the first term left out (within 0.01 at p <= 0.975, the
    docstring's bound; 0.046 at 3 df and p = 0.995), and odd in p - 1/2."""
    z = NormalDist().inv_cdf(p)
    y = z * z
    g = [z * (y + 1) / 4, z * ((5 * y + 16) * y + 3) / 96, z * (((3 * y + 19) * y + 17) * y - 15) / 384,
         z * ((((79 * y + 776) * y + 1482) * y - 1920) * y - 945) / 92160]
    q = stats.t_quantile(p, df)
    assert q == pytest.approx(z + g[0] / df + g[1] / df ** 2 + g[2] / df ** 3 + g[3] / df ** 4, rel=1e-12)
    err = abs(q - t_exact_quantile(p, df))
    assert err <= 1.5 * abs(cornish_fisher_g5(z)) / df ** 5 + 1e-12
    assert err < 0.01 or p > 0.975
    assert stats.t_quantile(1 - p, df) == pytest.approx(-q, rel=1e-12)


def test_t_quantile_between_whole_df_and_below_1():
    """Between whole df: linear in 1 / df (the quantile is convex in 1 / df, so that errs wide: never narrower than
    the exact quantile by more than the expansion's own error); df 1 is the Cauchy's; below 1, an error."""
    for df in (2.5, 3.2, 7.9):
        lo, hi = math.floor(df), math.ceil(df)
        w = (1 / df - 1 / hi) / (1 / lo - 1 / hi)
        expect = w * stats.t_quantile(0.975, lo) + (1 - w) * stats.t_quantile(0.975, hi)
        assert stats.t_quantile(0.975, df) == pytest.approx(expect, rel=1e-12)
        assert stats.t_quantile(0.975, df) >= t_exact_quantile(0.975, df) - 0.01
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.706204736174698, rel=1e-12)
    with pytest.raises(ValueError, match=r"^t_quantile needs df >= 1$"):
        stats.t_quantile(0.975, 0.999)


# --- one point's median, and the bootstrap's draws -----------------------------------------------------------------

@FAST
@given(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), max_size=25), st.sampled_from([0.8, 0.95, 0.99]))
def test_median_ci_is_the_narrowest_order_statistic_interval_that_reaches_the_level(values, level):
    """[x_(j), x_(n+1-j)] with the largest j whose coverage P(j <= Binomial(n, 1/2) <= n - j) reaches the level;
    None (a missing repeat) left out, and no interval where even min..max falls short."""
    x = sorted(v for v in values if v is not None)
    n = len(x)
    ok = [j for j in range(1, n // 2 + 1) if sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2 ** n >= level]
    expect = (x[max(ok) - 1], x[n - max(ok)]) if ok else None
    assert stats.median_ci(values, level) == expect
    assert stats.median(values) == (float(np.median(x)) if x else None)


def test_median_ci_at_the_sizes_where_j_steps():
    """95 %: min..max from 6 repeats (96.9 %; 5 give 93.8 %), the second from each end from 9 (96.1 %), the third
    from 12 (96.1 %, where 11 give 93.5 %)."""
    assert stats.median_ci(range(5)) is None
    assert stats.median_ci([None, 4, 3, 2, 1, 0]) is None
    assert stats.median_ci(range(6)) == (0.0, 5.0)
    assert stats.median_ci(range(8)) == (0.0, 7.0)
    assert stats.median_ci(range(9)) == (1.0, 7.0)
    assert stats.median_ci(range(11)) == (1.0, 9.0)
    assert stats.median_ci(range(12)) == (2.0, 9.0)
    assert stats.median_ci(range(6), level=0.97) is None
    assert stats.median_ci(range(5), level=0.9375) == (0.0, 4.0)  # exactly at the level: 30 / 32
    assert stats.median_ci(range(40)) == (13.0, 26.0)  # beyond n / 3 from each end: j = 14 (96.2 %)
    assert stats.median_ci(range(100)) == (39.0, 60.0)  # j = 40 (96.5 %)
    assert stats.median([None, None]) is None and stats.median([3, None, 1]) == 2.0


@pytest.mark.parametrize("n,resamples,seed", [(1, 4, 0), (5, 50, 0), (7, 30, 3)])
def test_resample_counts_are_how_often_each_prompt_is_drawn(n, resamples, seed):
    out = stats.resample_counts(n, resamples, seed)
    assert out.dtype == float and out.shape == (resamples, n)
    assert np.array_equal(out, oracle_counts(n, resamples, seed))
    assert np.array_equal(stats.resample_counts(n, resamples), oracle_counts(n, resamples, 0))


# --- acceptance: the bootstrap-t over prompts ----------------------------------------------------------------------

@SLOWER
@given(prompts(), st.integers(0, 3))
def test_ratio_ci_is_the_bootstrap_t_of_the_docstring(data, seed):
    num, den = data
    flat: list = []
    lo, hi = bootstrap_t([num, den], oracle_counts(len(num), 200, seed), ratio_parts, flat=flat)
    assume(not flat)  # as in the paired test below
    assert close(stats.ratio_ci(num, den, resamples=200, seed=seed), (max(lo, 0), hi))
    blo, bhi = stats.ratio_ci_batch([num, [-v for v in num]], [den, den], resamples=200, seed=seed)
    assert close((blo[0], bhi[0]), (max(lo, 0), hi))
    assert close((blo[1], bhi[1]), (-hi, -lo))  # a negative numerator: no floor at 0


def test_ratio_ci_at_its_edges():
    one = [3.0, 3.0, 3.0, 3.0, 3.0]
    assert stats.ratio_ci(one, [1.0] * 5) == pytest.approx((3.0, 3.0), abs=1e-12)  # one ratio everywhere: no spread
    assert stats.ratio_ci(one[:4], [1.0] * 4) is None  # fewer than MIN_PROMPTS
    assert stats.ratio_ci(one, [1.0] * 6) is None  # not paired
    assert stats.ratio_ci(one, [0.0] * 5) is None and stats.ratio_ci(one, [1, -1, 0, 0, 0]) is None  # no drafts
    num = [1, 3, 4, 5, 7]  # drafts that sum to 1 are drafts: the ratios (and t) of 5 num over 1 each
    assert close(stats.ratio_ci(num, [0.2] * 5), bootstrap_t([[5 * v for v in num], [1] * 5], oracle_counts(5, 2000, 0),
                                                             ratio_parts))
    # most resamples hold the one prompt that accepts: the low end falls below 0, and a ratio of counts cannot
    lo, hi = stats.ratio_ci([0, 0, 0, 0, 9], [1] * 5)
    assert lo == 0.0 and hi > 1.8
    lo, _ = stats.ratio_ci_batch([[0, 0, 0, 0, 9]] * 2, [[1, 1, 1, 1, -0.5], [1] * 5])  # a negative count: no floor
    assert lo[0] < 0 and lo[1] == 0.0  # each data set by its own counts
    # se exactly 1 (4 +- 1): an interval, not the point of a set with no spread
    assert close(stats.ratio_ci(num, [1] * 5), bootstrap_t([num, [1] * 5], oracle_counts(5, 2000, 0), ratio_parts))
    with np.errstate(over="ignore", invalid="ignore"):  # no finite end: no interval, not an infinite one
        assert stats.ratio_ci([1e200, 0, 0, 0, 0], [1] * 5) is None  # se beyond float range: [0, inf]
        assert stats.ratio_ci([1e308] * 5, [1] * 5) is None  # the sum beyond float range
    # a prompt with no drafts is a prompt: resamples that draw only such prompts are left out, not the prompt
    num, den = [4, 0, 7, 2, 5, 3], [2, 0, 3, 1, 2, 0]
    expect = bootstrap_t([num, den], oracle_counts(6, 2000, 0), ratio_parts)
    assert close(stats.ratio_ci(num, den), (max(expect[0], 0), expect[1]))
    expect = bootstrap_t([num, den], oracle_counts(6, 2000, 0), ratio_parts, 0.8)
    assert close(stats.ratio_ci(num, den, level=0.8), expect)
    # a resample at the estimate itself has t = 0: it counts, and at a level whose t floor is below 1 it is the end
    num, den = [0, 2, 1, 1, 1], [1] * 5
    expect = bootstrap_t([num, den], oracle_counts(5, 2000, 0), ratio_parts, 0.3)
    assert close(stats.ratio_ci(num, den, level=0.3), expect) and expect[0] == pytest.approx(0.8690354308634762)


def test_the_bootstrap_warns_of_nothing_it_leaves_out():
    """Resamples with no drafts (0 / 0, x / 0) and with no spread are left out silently: a report rebuilt from such
    data prints no numpy warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stats.ratio_ci([4, 1, 7, 2, 5, 3], [2, 0, 3, 1, 2, 0]) is not None
        assert stats.ratio_ci([0, 0, 0, 0, 9], [1, 0, 0, 0, 1]) is not None
        assert stats.paired_ratio_diff_ci([4, 1, 7, 2, 5], [2, 0, 3, 1, 0], [4, 0, 6, 2, 5], [2, 0, 3, 1, 2])


@SLOWER
@given(prompts(), st.lists(st.integers(-3, 3), min_size=9, max_size=9), st.integers(0, 2))
def test_the_paired_difference_resamples_one_set_of_prompts_for_both_runs(a, shift, seed):
    num_a, den_a = a
    n = len(num_a)
    num_b, den_b = [max(v + s, 0) for v, s in zip(num_a, shift)], [d + (s > 0) for d, s in zip(den_a, shift)]
    flat: list = []
    expect = bootstrap_t([num_a, den_a, num_b, den_b], oracle_counts(n, 200, seed), diff_parts, flat=flat)
    # a resample with no spread in exact arithmetic can keep a rounding-size se in floats, and so a huge t that is
    # not left out: such data are for the known answers (at 2000 resamples those t lie beyond the quantiles)
    assume(not flat)
    assert close(stats.paired_ratio_diff_ci(num_a, den_a, num_b, den_b, resamples=200, seed=seed), expect)


def test_the_paired_difference_at_its_edges():
    acc, drafts = [5, 9, 2, 7, 4], [4, 5, 3, 6, 4]
    assert stats.paired_ratio_diff_ci(acc, drafts, acc, drafts) == (0.0, 0.0)
    assert stats.paired_ratio_diff_ci(acc[:4], drafts[:4], acc[:4], drafts[:4]) is None
    for i in range(1, 4):  # any of the other three not paired with the first
        args = [acc, drafts, acc, drafts]
        args[i] = args[i] + [1]
        assert stats.paired_ratio_diff_ci(*args) is None
    assert stats.paired_ratio_diff_ci(acc, [0] * 5, acc, drafts) is None
    assert stats.paired_ratio_diff_ci(acc, drafts, acc, [0] * 5) is None
    assert stats.paired_ratio_diff_ci(acc, drafts, acc, [1, 1, -1, -1, 0]) is None
    one = [0.2] * 5  # drafts that sum to 1 are drafts
    for args in ([acc, one, acc, drafts], [acc, drafts, acc, one]):
        expect = bootstrap_t([[5 * v for v in a] for a in args], oracle_counts(5, 2000, 0), diff_parts)
        assert close(stats.paired_ratio_diff_ci(*args), expect)  # the data times 5: the same ratios and t


# --- speedups: stats.judge's Welch t on logs and the difference of speedups (no floor, a family of 1 or more) --------

@FAST
@given(repeats(), repeats(), st.integers(1, 8))
def test_a_speedups_p_is_welchs_two_sided_t_on_logs_times_its_family(num, den, family):
    se, df = welch([(1.0, np.log(num)), (1.0, np.log(den))])
    d = float(np.mean(np.log(num)) - np.mean(np.log(den)))
    assume(se > 0 and d != 0)
    got = judge.ratio(num + [None, 0.0, -1.0], den, family=family)
    if abs(d) <= 1e-12:  # a log ratio within float round-off is no difference, whatever spread round-off left
        assert got.p_value == 1.0 and got.decision == judge.OPEN
        return
    assert got.p_value == pytest.approx(min(1.0, 2 * family * t_tail(abs(d) / se, df)), rel=1e-7, abs=1e-13)


@SLOWER
@given(repeats(), repeats(), st.integers(1, 8))
def test_a_speedups_interval_is_the_welch_interval_on_logs_at_1_minus_alpha_over_its_family(num, den, family):
    """Centred on the ratio of geometric means (the estimate shown); the half-width on the log scale is the exact t
    quantile at 1 - 0.05 / (2 family) times se."""
    ln, ld = np.log(num), np.log(den)
    se, df = welch([(1.0, ln), (1.0, ld)])
    assume(se > 1e-9)
    c = judge.ratio(num, den, family=family)
    centre = float(ln.mean() - ld.mean())
    assert math.log(c.estimate) == pytest.approx(centre, abs=1e-12)
    assert math.log(c.low) + math.log(c.high) == pytest.approx(2 * centre, abs=1e-9)
    assert c.level == pytest.approx(1 - 0.05 / family)
    q = (math.log(c.high) - centre) / se
    assert q == pytest.approx(t_exact_quantile(1 - 0.025 / family, df), rel=1e-6)
    assert c.decision == ("above" if c.low > 1 else "below" if c.high < 1 else "open")


def test_the_welch_family_at_its_edges():
    assert judge.ratio([110.0] * 3, [100.0] * 3).p_value == 0.0  # no spread: the sign decides
    assert judge.ratio([90.0] * 3, [100.0] * 3).decision == "below"
    assert judge.ratio([100.0] * 3, [100.0] * 3).p_value == 1.0  # no difference: no evidence
    assert judge.ratio([90.0, 100.0, 110.0], [90.0, 100.0, 110.0]).p_value == 1.0
    c = judge.ratio([1.0, 2.0, 0.0], [1.0, 2.0, 3.0])  # 0 is not a timing: two repeats left, no estimate
    assert (c.estimate, c.low, c.high, c.p_value, c.decision, c.n) == (None, None, None, None, "open", 2)
    num, den = [250.0, 250.0, 318.15490486329344], [100.0, 110.0, 90.0]  # a difference of logs of exactly 1.0
    se, df = welch([(1.0, np.log(num)), (1.0, np.log(den))])
    assert judge.ratio(num, den).p_value == pytest.approx(2 * t_tail(1 / se, df), rel=1e-9)
    c = judge.ratio([120.0] * 3, [100.0] * 4)
    assert (c.low, c.high) == pytest.approx((1.2, 1.2), rel=1e-12)
    # logs 0, 0, 0 against 0, 0, 3: the variance of the mean exactly 1, df 2 (t_0.975 = 0.95 / sqrt(0.04875))
    c = judge.ratio([1.0] * 3, [1.0, 1.0, math.exp(3)])
    half = 0.95 / math.sqrt(0.04875)
    assert (math.log(c.low), math.log(c.high)) == pytest.approx((-1 - half, -1 + half))
    # 3 + 3 repeats with equal spread: df = 4 exactly, the 97.5 % quantile 2.7764451051977987
    c = judge.ratio([100 * math.e ** v for v in (-0.1, 0, 0.1)], [50 * math.e ** v for v in (0.1, 0, -0.1)])
    half = 2.7764451051977987 * math.sqrt(2 * 0.01 / 3)
    assert (math.log(c.low / 2), math.log(c.high / 2)) == pytest.approx((-half, half), rel=1e-9)


@SLOWER
@given(repeats(), repeats(), repeats(), repeats(), st.integers(1, 4))
def test_a_difference_of_speedups_is_of_ratios_of_geometric_means_with_welchs_interval(a_k, a_0, b_k, b_0, family):
    logs = [np.log(v) for v in (a_k, a_0, b_k, b_0)]
    sa, sb = math.exp(logs[0].mean() - logs[1].mean()), math.exp(logs[2].mean() - logs[3].mean())
    se, df = welch([(sa, logs[0]), (sa, logs[1]), (sb, logs[2]), (sb, logs[3])])
    half = t_exact_quantile(1 - 0.025 / family, df) * se if se > 0 else 0.0
    ga, gb, c = judge.speedup_difference(a_k + [None], a_0, b_k, b_0 + [0.0], family=family)
    assert ga == pytest.approx(sa, rel=1e-12) and gb == pytest.approx(sb, rel=1e-12)
    assert c.estimate == pytest.approx(sb - sa, rel=1e-9, abs=1e-12)
    assert close((c.low, c.high), (sb - sa - half, sb - sa + half), rel=1e-6)
    assert c.decision == ("above" if c.low > 0 else "below" if c.high < 0 else "open")


def test_a_difference_of_speedups_at_its_edges():
    three = [100.0, 100.0, 100.0]
    sa, sb, c = judge.speedup_difference(three, three, [120.0] * 3, three)
    assert (sa, sb, c.estimate, c.low, c.high) == pytest.approx((1.0, 1.2, 0.2, 0.2, 0.2), rel=1e-12)
    for i in range(4):
        args = [three] * 4
        args[i] = [100.0, 100.0, None]
        sa, sb, c = judge.speedup_difference(*args)
        assert (sa, sb, c.estimate, c.low, c.decision) == (None, None, None, None, "open")
    sa, sb, c = judge.speedup_difference([100.0, 110.0, 90.0], three, three, three)
    logs = np.log([100.0, 110.0, 90.0])
    se = sa * math.sqrt(logs.var(ddof=1) / 3)  # only A's k point varies: df = 2, t_0.975 = 0.95 / sqrt(0.04875)
    assert c.high - (sb - sa) == pytest.approx(0.95 / math.sqrt(0.04875) * se, rel=1e-9)
    assert c.low - (sb - sa) == pytest.approx(-0.95 / math.sqrt(0.04875) * se, rel=1e-9)
