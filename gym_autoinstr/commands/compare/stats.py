"""The statistics ``compare`` uses, with the standard library alone (no SciPy in the install).

* ``t_quantile``: Student's t quantile, by inverting the regularized incomplete beta
  function (a continued fraction, to ~1e-12); for 1000+ degrees of freedom the
  Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5), as exact there.
* ``wilson``: the Wilson score interval of one proportion.
* ``newcombe``: Newcombe's hybrid score interval of a difference of two proportions
  (method 10 of Newcombe 1998, "Interval estimation for the difference between
  independent proportions"), built from the two Wilson intervals: the interval RL
  evaluations want for pass rates, right at 0/n and n/n where the Wald interval fails.
* ``welch``: Welch's t interval of a difference of two means (any reward; unequal
  variances).  When neither sample varies at all, the interval is the difference itself.
* ``clustered``: the mean of per-cluster (per-task) differences ± t(0.975, T-1)·sd/sqrt(T):
  the paired, clustered interval of Miller 2024 ("Adding Error Bars to Evals",
  arXiv:2411.00640), since rollouts of one task are not independent of each other.
* ``mann_whitney_p``: the two-sided p-value of the Mann-Whitney U test (normal
  approximation with the tie and continuity corrections, as SciPy's ``asymptotic``).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Sequence
from statistics import NormalDist

LEVEL = 0.95
_NORMAL = NormalDist()
Z = _NORMAL.inv_cdf(0.5 + LEVEL / 2)  # 1.959963984540054


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` (> 0, any real) degrees of freedom."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, not p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    z = _NORMAL.inv_cdf(p)
    if math.isinf(df):
        return z
    if df >= 1000:
        g1 = (z**3 + z) / 4
        g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
        g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
        g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
        return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4
    # I_x(df/2, 1/2) = 2(1-p) with x = df/(df+t^2): x falls as t grows; bisect on x
    target, low, high = 2.0 * (1.0 - p), 0.0, 1.0
    for _ in range(200):
        middle = (low + high) / 2
        if incomplete_beta(df / 2.0, 0.5, middle) > target:
            high = middle
        else:
            low = middle
        if high - low < 1e-17:
            break
    x = (low + high) / 2
    return math.sqrt(df * (1.0 - x) / x)


def wilson(successes: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``successes / n`` (n > 0)."""
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(successes_a: int, n_a: int, successes_b: int, n_b: int, z: float = Z) -> tuple[float, float]:
    """Newcombe's hybrid score interval of p_b - p_a (both n > 0)."""
    p_a, p_b = successes_a / n_a, successes_b / n_b
    low_a, high_a = wilson(successes_a, n_a, z)
    low_b, high_b = wilson(successes_b, n_b, z)
    change = p_b - p_a
    return (
        change - math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2),
        change + math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2),
    )


def _mean_variance(values: Sequence[float]) -> tuple[float, float]:
    mean = math.fsum(values) / len(values)
    return mean, math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Welch's t interval of mean(b) - mean(a); None unless each has 2 values or more."""
    if len(a) < 2 or len(b) < 2:
        return None
    mean_a, variance_a = _mean_variance(a)
    mean_b, variance_b = _mean_variance(b)
    change = mean_b - mean_a
    share_a, share_b = variance_a / len(a), variance_b / len(b)
    error = math.sqrt(share_a + share_b)
    if error == 0.0:
        return change, change
    df = (share_a + share_b) ** 2 / (share_a**2 / (len(a) - 1) + share_b**2 / (len(b) - 1))
    half = t_quantile(0.5 + LEVEL / 2, df) * error
    return change - half, change + half


def clustered(differences: Sequence[float]) -> tuple[float, float] | None:
    """mean ± t(0.975, T-1)·sd/sqrt(T) over the T per-cluster differences; None for T < 2."""
    count = len(differences)
    if count < 2:
        return None
    mean, variance = _mean_variance(differences)
    half = t_quantile(0.5 + LEVEL / 2, count - 1) * math.sqrt(variance / count)
    return mean - half, mean + half


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two-sided p-value that ``a`` and ``b`` come from one distribution (Mann-Whitney U,
    normal approximation, tie and continuity corrected); None when either is empty.  Both
    must be sorted: the loops run in C (``map``), a million values a side in about 2 s."""
    n_a, n_b = len(a), len(b)
    if not n_a or not n_b:
        return None
    merged = sorted([*a, *b])  # two sorted runs: Timsort merges them in linear time
    n = n_a + n_b
    # where a value equals the next one: the ties (none, usually, but zeros in a seam)
    tied = list(itertools.compress(range(n - 1), map(operator.eq, merged, itertools.islice(merged, 1, None))))
    # U of b: for each value of b, the values of a below it, and half those equal to it
    below = sum(map(bisect.bisect_left, itertools.repeat(a, n_b), b))
    if tied:
        at_most = sum(map(bisect.bisect_right, itertools.repeat(a, n_b), b))
    else:
        at_most = below
    u_b = (below + at_most) / 2
    ties, run = 0, 1
    for previous, position in zip([None, *tied], tied):
        if previous is not None and position == previous + 1:
            run += 1
        else:
            ties += run**3 - run
            run = 2
    ties += run**3 - run if tied else 0
    variance = n_a * n_b / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    deviation = abs(u_b - n_a * n_b / 2)
    z = max(deviation - 0.5, 0.0) / math.sqrt(variance)
    return min(1.0, 2 * _NORMAL.cdf(-z))  # (not 1 - cdf(z): that stops at 1e-16)


def percentile(ordered: Sequence[float], share: float) -> float:
    """The nearest-rank percentile of sorted values (as ``view --by-task``): the
    ``ceil(share * n)``-th smallest."""
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]
