"""Tuning: choosing a grid point per strategy by the mean of a metric over tuning seeds.

* A sweep's ``[sweep.tune]`` section (:func:`parse_tuning`): which grid axes each strategy
  tunes, on which seeds and by which metric (:mod:`fedjax_sel.experiment.sweep`, its module
  docstring, and its :func:`~fedjax_sel.experiment.sweep.tuned_comparison`).
* The choice both the sweep and the benchmark suite make (:func:`point_score`,
  :func:`best_index`): the best mean over the tuning seeds, a diverged run the worst.
* The suite's learning-rate grids (:mod:`fedjax_sel.benchmark.suite`): log grids in x2 steps
  (:func:`doubling_grid`, :func:`parse_doubling_grid`) that extend themselves while the best
  point sits at an edge (:func:`choose_point`), until it is interior, the point beyond the edge
  diverged, or the extensions allowed are spent.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

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


# ----------------------------------------------------------------------------- choosing
def point_score(values: Sequence[float | None]) -> float | None:
    """A grid point's score: the mean of its metric over the tuning seeds, or ``None`` (the
    worst) when a seed has no finite value (a diverged run, a metric it never reached)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite and len(finite) == len(values) else None


def best_index(scores: Sequence[float | None], better: bool) -> int:
    """The index of the best score (``better``: higher is better); ``None`` is the worst and
    ties go to the first, so the grid's order breaks them."""
    worst = -math.inf if better else math.inf
    keyed = np.asarray([worst if s is None else s for s in scores], np.float64)
    return int(np.argmax(keyed) if better else np.argmin(keyed))


# ----------------------------------------------------------------------------- x2 grids
MAX_GRID_POINTS = 64  # 2**63 between a grid's ends: far past any learning rate that trains


def doubling_grid(center: float, points: int) -> tuple[float, ...]:
    """``points`` values in x2 steps: ``center``, ``(points - 1) // 2`` halvings below it and
    the rest doublings above (``0.1, 5`` -> ``0.025 .. 0.4``; ``0.1, 2`` -> ``0.1, 0.2``).
    Powers of two scale a float exactly, so a grid's points and its extensions meet."""
    low = (points - 1) // 2
    return tuple(float(center) * 2.0 ** (j - low) for j in range(points))


def grid_center(grid: Sequence[float]) -> float:
    """The center :func:`doubling_grid` builds ``grid`` around (its ``(n - 1) // 2``-th)."""
    return float(grid[(len(grid) - 1) // 2])


def parse_doubling_grid(value: Any, where: str) -> tuple[float, ...]:
    """A grid in x2 steps from a file: ``{center = C, points = N}`` or an ascending list whose
    every point is twice the one before (anything else is an error naming it)."""
    if isinstance(value, Mapping):
        bad = sorted(set(value) - {"center", "points"})
        center, points = value.get("center"), value.get("points")
        if bad or not _positive(center) or not _count(points) or points > MAX_GRID_POINTS:
            raise ConfigError(
                f"{where} must be {{center = C, points = N}} (C > 0, N a whole number in 1 .. "
                f"{MAX_GRID_POINTS}) or a list in x2 steps, got {dict(value)!r}"
            )
        return doubling_grid(float(center), int(points))
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= MAX_GRID_POINTS
        or not all(_positive(v) for v in value)
    ):
        raise ConfigError(
            f"{where} must be a list of 1 .. {MAX_GRID_POINTS} positive numbers in x2 steps or "
            f"{{center = C, points = N}}, got {value!r}"
        )
    grid = tuple(float(v) for v in value)
    if any(not math.isclose(b / a, 2.0, rel_tol=1e-9) for a, b in itertools.pairwise(grid)):
        raise ConfigError(
            f"{where} {list(value)} is not a grid in x2 steps (ascending, each point twice the "
            f"one before): write e.g. {list(doubling_grid(grid_center(sorted(grid)), len(grid)))} "
            f"or {{center = {grid_center(sorted(grid)):g}, points = {len(grid)}}}"
        )
    return doubling_grid(grid_center(grid), len(grid))  # exact x2 steps from here on


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# ----------------------------------------------------------------------------- extension
Point = tuple[float, tuple[tuple[str, float], ...]]  # (lr, ((knob, value), ...))

INTERIOR = "interior"
EDGE = "edge"
NEXT_DIVERGED = "next point diverged"
NEXT_WORST = "next point scored worst (its metric missing on a tuning seed)"
ALL_WORST = "every point diverged or scored worst"


def limit_reason(extend: int) -> str:
    return f"extension limit {extend} reached"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A tuning grid's choice so far: the best ``point`` (its ``score``) and its ``position``
    on its lr line (the points run with its knob values): ``interior``, or ``edge`` with the
    ``reason`` no better point can lie beyond; ``extend``: the point to run next (the x2 step
    beyond the edge the best sits at), ``None`` once the choice is final."""

    point: Point
    score: float | None
    position: str
    reason: str | None
    extend: Point | None


def choose_point(
    points: Sequence[Point],
    values: Mapping[Point, Sequence[float | None]],
    *,
    better: bool,
    extend: int,
    used: int,
    diverged: Mapping[Point, bool] | None = None,
) -> Choice:
    """One step of a self-extending x2 grid (``points`` in the order they ran, the initial
    grid first; ``values``: each point's metric on every tuning seed, ``None`` where a run
    diverged or lacks it; ``diverged``: whether a seed's run of the point diverged).

    The best mean (:func:`point_score`, :func:`best_index`) is chosen. On its lr line, a
    missing neighbour means the best sits at the edge of the grid run so far: while fewer than
    ``extend`` extensions were ``used``, the x2 point beyond that edge is the next to run;
    else the choice stands at the edge, at the extension limit. A neighbour that diverged (or
    scored worst) stops the search on its side: the choice stands at the edge, "next point
    diverged". Otherwise the best is interior. When every point diverged, the grid extends
    below its lowest lr (on the first knob setting's line)."""
    scores = [point_score(values[p]) for p in points]
    i = best_index(scores, better)
    best, score = points[i], scores[i]
    lr, knobs = best
    if score is None:  # every point diverged or scored worst: look below the lowest lr
        best = (min(p[0] for p in points if p[1] == knobs), knobs)
        if used < extend:
            return Choice(best, None, EDGE, None, (best[0] / 2.0, knobs))
        return Choice(best, None, EDGE, ALL_WORST, None)
    line = sorted(p[0] for p in points if p[1] == knobs)
    at = line.index(lr)
    beyond = {"up": line[at + 1] if at + 1 < len(line) else None}
    beyond["down"] = line[at - 1] if at > 0 else None
    open_side = next((side for side in ("up", "down") if beyond[side] is None), None)
    if open_side is not None:
        if used < extend:
            step = lr * 2.0 if open_side == "up" else lr / 2.0
            return Choice(best, score, EDGE, None, (step, knobs))
        return Choice(best, score, EDGE, limit_reason(extend), None)
    by_point = dict(zip(points, scores, strict=True))
    stopped = [(v, knobs) for v in beyond.values() if by_point[(v, knobs)] is None]
    if stopped:
        gone = any((diverged or {}).get(p, False) for p in stopped)
        return Choice(best, score, EDGE, NEXT_DIVERGED if gone else NEXT_WORST, None)
    return Choice(best, score, INTERIOR, None, None)
