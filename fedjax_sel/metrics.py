"""Run metrics: accuracy summaries, stability and selection fairness.

Definitions (HeteRo-Select, arXiv:2508.06692, section V; docs/hetero_select.md, "Metrics"):

* ``final_accuracy``: test accuracy at the last evaluation.
* ``peak_accuracy``: the highest test accuracy over all evaluations.
* ``stable_accuracy``: mean test accuracy over the last ``window`` (10) evaluations, which is
  the paper's "last 10 rounds" when every round is evaluated (``--eval-every 1``); given the
  evaluation ``rounds``, :func:`accuracy_summary` averages over the last ``window`` rounds.
* ``stability_drop``: ``peak_accuracy - final_accuracy``.
* selection counts per client, their standard deviation (population, ``ddof=0``; Fig. 6 of
  the paper), their coefficient of variation ``std / mean`` (comparable across run lengths),
  Jain's fairness index ``J = (sum_k c_k)^2 / (K * sum_k c_k^2)`` (1 when every client is
  selected equally often, ``1/K`` when one client takes every slot) and the total variation
  distance of the clients' shares of the selections from uniform, ``1/2 sum_k |c_k / sum c -
  1/K|`` (0 for even selection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def nanmean(x, axis=None) -> np.ndarray:
    """Mean over the non-NaN entries; NaN (without a warning) where all are NaN, e.g. the
    accuracy of a regression task."""
    x = np.asarray(x, np.float64)
    count = np.sum(~np.isnan(x), axis=axis)
    return np.where(count > 0, np.nansum(x, axis=axis) / np.maximum(count, 1), np.nan)


def jain_index(counts: Sequence[float]) -> float:
    """Jain's fairness index of non-negative ``counts``; 1.0 for an all-zero vector."""
    c = np.asarray(counts, np.float64)
    if c.size == 0:
        raise ValueError("jain_index of an empty vector")
    sq = float(np.sum(c * c))
    return 1.0 if sq == 0 else float(np.sum(c) ** 2 / (c.size * sq))


def selection_summary(counts: Sequence[int]) -> dict[str, float]:
    """Statistics of per-client selection counts."""
    c = np.asarray(counts, np.float64)
    return {
        "selection_count_mean": float(c.mean()),
        "selection_count_std": float(c.std()),
        "selection_count_cv": float(c.std() / c.mean()) if c.mean() > 0 else float("nan"),
        "selection_count_min": float(c.min()),
        "selection_count_max": float(c.max()),
        "clients_never_selected": int(np.sum(c == 0)),
        "jain_fairness": jain_index(c),
        "selection_tv_from_uniform": (
            float(0.5 * np.sum(np.abs(c / c.sum() - 1.0 / c.size))) if c.sum() > 0 else 0.0
        ),
    }


def accuracy_summary(
    accuracies: Sequence[float], window: int = 10, rounds: Sequence[int] | None = None
) -> dict[str, float]:
    """Final, peak and stable accuracy and the stability drop of an accuracy curve.

    ``stable_accuracy`` averages the last ``window`` evaluations, or, when the evaluation
    ``rounds`` are given, the evaluations of the last ``window`` rounds (``round > last -
    window``).
    """
    a = np.asarray(accuracies, np.float64)
    if a.size == 0 or np.all(np.isnan(a)):
        return {}
    final = float(a[-1])
    peak = float(np.nanmax(a))
    if rounds is None:
        tail = a[-window:]
    else:
        r = np.asarray(rounds)
        if r.shape != a.shape:
            raise ValueError(f"rounds {r.shape} and accuracies {a.shape} differ in length")
        tail = a[r > r[-1] - window]
    stable = float(np.nanmean(tail))
    return {
        "final_accuracy": final,
        "peak_accuracy": peak,
        "stable_accuracy": stable,
        "stability_drop": peak - final if math.isfinite(final) else float("nan"),
    }


def loss_summary(losses: Sequence[float], window: int = 10) -> dict[str, float]:
    """Final, best (lowest) and stable test loss."""
    a = np.asarray(losses, np.float64)
    if a.size == 0:
        return {}
    finite = a[np.isfinite(a)]
    tail = a[-window:][np.isfinite(a[-window:])]
    return {
        "final_test_loss": float(a[-1]),
        "best_test_loss": float(finite.min()) if finite.size else float("nan"),
        "stable_test_loss": float(tail.mean()) if tail.size else float("nan"),
    }
