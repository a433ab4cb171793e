"""The statistics every comparison reports, in one place: Student-t intervals, the paired
difference with its t and percentile-bootstrap intervals, the paired t-test, win rates and
Holm's step-down adjustment. Read by ``fedjax-sel compare``, the sweep's tuned comparison, the
benchmark's leaderboard and the paper studies.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

LEVEL = 0.95
BOOTSTRAP_SAMPLES = 10_000  # resamples of a paired difference's bootstrap interval


# ----------------------------------------------------------------------------- statistics
@functools.cache
def t_critical(df: int, level: float = LEVEL) -> float:
    """The two-sided Student-t critical value with ``df`` degrees of freedom (memoised: a
    reproduction's tables ask for the same few hundreds of times)."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(x: Sequence[float], level: float = LEVEL) -> tuple[float, float | None, float | None]:
    """Mean and Student-t confidence interval (``None`` bounds with fewer than 2 values)."""
    a = np.asarray(x, np.float64)
    m = float(np.mean(a))
    if a.size < 2:
        return m, None, None
    half = t_critical(a.size - 1, level) * float(np.std(a, ddof=1)) / math.sqrt(a.size)
    return m, m - half, m + half


def bootstrap_ci(
    d: Sequence[float], level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean of ``d`` (fixed generator: reproducible)."""
    a = np.asarray(d, np.float64)
    if a.size < 2:
        return None, None
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(samples, a.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def p_from_t(gap: float, se: float, df: int) -> float:
    """Two-sided t-test p-value of a mean ``gap`` away from the hypothesis, standard error
    ``se`` (``se = 0``: 1 when the gap is 0, else 0)."""
    if se == 0:
        return 1.0 if gap == 0 else 0.0
    from scipy import stats

    return float(2 * stats.t.sf(abs(gap / se), df))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest of m p-values becomes
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``; returned in the input order."""
    p = np.asarray(p_values, np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def paired_stats(
    x: Sequence[float],
    base: Sequence[float],
    *,
    higher_is_better: bool = True,
    level: float = LEVEL,
) -> dict[str, Any]:
    """Paired difference ``x - base`` over seeds: mean, t interval, bootstrap interval,
    two-sided paired t-test p-value and win rate."""
    d = np.asarray(x, np.float64) - np.asarray(base, np.float64)
    mean, lo, hi = mean_ci(d, level)
    boot_lo, boot_hi = bootstrap_ci(d, level)
    p = None
    if d.size >= 2:
        p = p_from_t(mean, float(np.std(d, ddof=1)) / math.sqrt(d.size), d.size - 1)
    signed = d if higher_is_better else -d
    wins = float(np.mean(np.where(signed > 0, 1.0, np.where(signed == 0, 0.5, 0.0))))
    return {
        "diff": mean,
        "diff_ci_low": lo,
        "diff_ci_high": hi,
        "diff_boot_ci_low": boot_lo,
        "diff_boot_ci_high": boot_hi,
        "p_value": p,
        "win_rate": wins,
        "pairs": int(d.size),
    }


def min_detectable_effect(
    sd_diff: float, pairs: int, comparisons: int = 1, *, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The smallest mean paired difference a two-sided paired t-test finds with probability
    ``power`` at Holm's strictest level ``alpha / comparisons``: ``(t_{1 - a/2} + t_{power}) *
    sd_diff / sqrt(pairs)`` with ``pairs - 1`` degrees of freedom (inf below 2 pairs)."""
    if pairs < 2:
        return math.inf
    from scipy import stats

    df = pairs - 1
    a = alpha / max(comparisons, 1)
    t = float(stats.t.ppf(1 - a / 2, df)) + float(stats.t.ppf(power, df))
    return t * sd_diff / math.sqrt(pairs)
