"""A sweep's ``[sweep.tune]`` section: which grid axes each strategy tunes, on which seeds and
by which metric (:mod:`fedjax_sel.experiment.sweep`, its module docstring, and its
:func:`~fedjax_sel.experiment.sweep.tuned_comparison`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.input_checks import seed_list


@dataclasses.dataclass(frozen=True)
class Tuning:
    """``[sweep.tune]``: grid ``axes`` chosen per strategy by the mean of ``metric`` over the
    ``seeds`` that tune; the other seeds of the sweep compare the chosen points."""

    metric: str
    seeds: tuple[int, ...]
    axes: tuple[str, ...]


def setting_name(point: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def parse_tuning(
    tune: Any, grid: Mapping[str, list], seeds: list[int], *, own: bool = False
) -> Tuning:
    """Checks ``[sweep.tune]`` (see the module docstring) against the grid and the seeds
    (``own``: some strategy has a grid of its own, always tuned)."""
    from fedjax_sel.experiment.metric_table import DEFAULT_METRICS

    if not isinstance(tune, Mapping):
        raise ConfigError(f"sweep: [sweep.tune] must be a table, got {tune!r}")
    bad = set(tune) - {"metric", "seeds", "axes"}
    if bad:
        raise ConfigError(
            f"sweep: unknown [sweep.tune] key(s) {sorted(bad)}; use metric, seeds, axes"
        )
    metric = tune.get("metric", "final_accuracy")
    if not isinstance(metric, str) or not (
        metric in DEFAULT_METRICS or metric.startswith(("accuracy@", "rounds_to:"))
    ):
        raise ConfigError(
            f"sweep: [sweep.tune] metric {metric!r} is not one of {sorted(DEFAULT_METRICS)}, "
            "accuracy@R or rounds_to:A"
        )
    axes = tune.get("axes", list(grid))
    if isinstance(axes, str):
        axes = [axes]
    if (not axes and not own) or not set(axes) <= set(grid):
        raise ConfigError(
            f"sweep: [sweep.tune] axes {axes!r} must be grid axes; the grid has {sorted(grid)}"
        )
    chosen = tune.get("seeds", max(1, len(seeds) // 2))
    if isinstance(chosen, bool) or not isinstance(chosen, (int, list)):
        raise ConfigError(f"sweep: [sweep.tune] seeds must be a count or a list, got {chosen!r}")
    if isinstance(chosen, int) and chosen < 1:
        raise ConfigError(f"sweep: [sweep.tune] seeds must be a count >= 1, got {chosen!r}")
    tuning_seeds = (
        seeds[:chosen]
        if isinstance(chosen, int)
        else seed_list(chosen, "sweep: [sweep.tune] seeds")
    )
    unknown = sorted(set(tuning_seeds) - set(seeds))
    if unknown:
        raise ConfigError(f"sweep: [sweep.tune] seeds {unknown} are not seeds of the sweep {seeds}")
    held_out = [x for x in seeds if x not in tuning_seeds]
    if not tuning_seeds or len(held_out) < 2:
        raise ConfigError(
            f"sweep: [sweep.tune] needs at least one tuning seed and two others to compare on; "
            f"seeds {seeds}, tuning seeds {tuning_seeds}"
        )
    return Tuning(metric, tuple(tuning_seeds), tuple(axes))
