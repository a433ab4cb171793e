"""One table of the metrics runs, sweeps and suites report, and what each means: whether more
is better, whether it is an accuracy (reported in percent, its differences in percentage
points), its unit, and whether it is a cost to reach a target. ``compare``, ``sweep``, the
suite and its leaderboard read it, so a metric means one thing everywhere.

Names outside the table follow its patterns: ``accuracy@R`` (the accuracy after round R),
``accuracy@updates:U`` (the accuracy held at U client updates),
``rounds_to:A`` and ``time_to:A`` (rounds or simulated seconds to accuracy A), and any other
number of a run's summary: a loss, a standard deviation (``_std``) or coefficient of
variation (``_cv``) is better smaller, the rest larger; it is an accuracy when its name says
``accuracy``.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric: ``name``; ``higher_is_better``; ``unit`` (``accuracy``: a fraction in
    [0, 1]; ``accuracy spread``: a standard deviation of accuracies; ``loss``, ``rounds``,
    ``seconds``, ``share``, ``index``, ``count``, ``ratio``, ``fraction``); ``target``:
    ``rounds`` or ``seconds`` for a cost to reach an accuracy target; ``default``: compared by
    ``fedjax-sel compare`` when no ``--metric`` is given; ``cell``: recorded by every suite
    cell (in the table's order)."""

    name: str
    higher_is_better: bool
    unit: str
    target: str | None = None
    default: bool = False
    cell: bool = False

    @property
    def is_accuracy(self) -> bool:
        """Reported in percent (differences in percentage points)."""
        return self.unit in ("accuracy", "accuracy spread")


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("final_accuracy", True, "accuracy", default=True, cell=True),
        Metric("peak_accuracy", True, "accuracy", default=True, cell=True),
        Metric("stable_accuracy", True, "accuracy", default=True, cell=True),
        # mean accuracy held over [0, B] client updates (fedjax_sel.benchmark.cells.update_auc)
        Metric("update_auc", True, "accuracy", cell=True),
        Metric("rounds_to_target", False, "rounds", target="rounds", cell=True),
        Metric("time_to_target", False, "seconds", target="seconds", cell=True),
        Metric("jain_fairness", True, "index", cell=True),
        Metric("client_accuracy_mean", True, "accuracy", cell=True),
        Metric("client_accuracy_std", False, "accuracy spread", cell=True),
        Metric("client_accuracy_bottom10", True, "accuracy", cell=True),
        Metric("deadline_hit_share", False, "share", cell=True),
        Metric("final_client_test_accuracy_mean", True, "accuracy", default=True),
        Metric("final_client_test_loss_mean", False, "loss", default=True),
        Metric("target_accuracy", True, "accuracy", default=True),
        Metric("final_test_loss", False, "loss", default=True),
        Metric("stable_test_loss", False, "loss", default=True),
        Metric("final_client_test_accuracy_std", False, "accuracy spread"),
        Metric("final_client_test_accuracy_bottom10", True, "accuracy"),
        Metric("selection_count_std", False, "count"),
        Metric("selection_count_cv", False, "ratio"),
        Metric("selection_tv_from_uniform", False, "share"),
        Metric("clients_never_selected", False, "count"),
        Metric("stability_drop", False, "fraction"),
        Metric("best_test_loss", False, "loss"),
        Metric("target_test_loss", False, "loss"),
    )
}

DEFAULT_METRICS = tuple(m.name for m in METRICS.values() if m.default)
CELL_METRICS = tuple(m.name for m in METRICS.values() if m.cell)
TARGET_METRICS = tuple(m.name for m in METRICS.values() if m.cell and m.target)


def metric(name: str) -> Metric:
    """The :class:`Metric` of ``name``: from the table, else by its pattern (module
    docstring)."""
    if name in METRICS:
        return METRICS[name]
    if name.startswith("rounds_to:"):
        return Metric(name, False, "rounds", target="rounds")
    if name.startswith("time_to"):  # time_to:A, and a summary's time_to_accuracy_s
        return Metric(name, False, "seconds", target="seconds")
    if name.startswith("accuracy@"):
        return Metric(name, True, "accuracy")
    lower = any(part in name for part in ("loss", "_std", "_cv"))
    unit = ("accuracy spread" if lower else "accuracy") if "accuracy" in name else "value"
    return Metric(name, not lower, unit)


def higher_is_better(name: str) -> bool:
    """Whether a larger value of metric ``name`` is better: accuracies and fairness yes;
    losses, spreads across clients, instability and rounds or seconds to a target no."""
    return metric(name).higher_is_better


def is_accuracy(name: str) -> bool:
    """Whether metric ``name`` is an accuracy or a spread of accuracies (``accuracy@R``
    included; rounds or seconds to an accuracy are not): reported in percent."""
    return metric(name).is_accuracy
