"""A suite's tuning settings: the ``[tuning]`` section and the strategies' ``tune`` knobs
(:mod:`fedjax_sel.benchmark.suite`'s module docstring shows both).

Every strategy tunes over the same number of configurations (``configurations``, by default
the lr grid's points): a strategy without knobs over that many lr points, one whose knobs take
``k`` value combinations over ``configurations / k`` lr points (an error when it does not
divide, or leaves fewer than 2). The lr points are a log grid in x2 steps around the grid's
center (:func:`~fedjax_sel.experiment.tuning.doubling_grid`), extended by up to ``extend`` x2
steps while the best point sits at an edge (:func:`~fedjax_sel.experiment.tuning.
choose_point`; :mod:`fedjax_sel.benchmark.tuned` runs and records it). Knobs must be traced
hyperparameters of the strategy (:func:`~fedjax_sel.strategies.hyperparams.
inject_hyperparams`), so a strategy's whole grid runs as one compiled program.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.metric_table import CELL_METRICS
from fedjax_sel.experiment.tuning import parse_doubling_grid
from fedjax_sel.input_checks import seed_list

TUNING_KEYS = {"lr", "seeds", "metric", "scenario", "configurations", "extend"}
DEFAULT_SEEDS = (1000, 1001, 1002)
MIN_TUNING_SEEDS = 3
MAX_KNOBS = 2  # strategy knobs tuned beside the lr
DEFAULT_EXTEND = 4


@dataclasses.dataclass
class Tuning:
    """``[tuning]``: the lr grid in x2 steps, the tuning seeds, the metric and scenario the
    choice is made on, the ``configurations`` every strategy tunes over (``None``: the grid's
    points) and the x2 steps a grid may ``extend`` by beyond an edge."""

    lr: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    metric: str = "stable_accuracy"
    scenario: str | None = None  # None: the first scenario; "each": every scenario
    configurations: int | None = None
    extend: int = DEFAULT_EXTEND

    @property
    def enabled(self) -> bool:
        return bool(self.lr) and bool(self.seeds)


def _whole(value: Any, where: str, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"suite: {where} must be a whole number >= {least}, got {value!r}")
    return value


def parse_tuning(
    t: Mapping[str, Any], eval_seeds: Sequence[int], scenarios: Sequence[str]
) -> Tuning:
    """The ``[tuning]`` table ``t`` (empty: no tuning), checked against the suite's
    evaluation seeds and scenario names."""
    bad = set(t) - TUNING_KEYS
    if bad:
        raise ConfigError(
            f"suite: unknown [tuning] key(s) {sorted(bad)}; known: {sorted(TUNING_KEYS)}"
        )
    if not t:
        return Tuning()
    if "lr" not in t:
        raise ConfigError(
            "suite: [tuning] needs lr = {center = C, points = N} (or a list in x2 steps), the "
            "learning rates every strategy is tuned over (or leave the [tuning] table out)"
        )
    tuning = Tuning(
        parse_doubling_grid(t["lr"], "suite: [tuning] lr"),
        tuple(seed_list(t.get("seeds", list(DEFAULT_SEEDS)), "suite: [tuning] seeds")),
        str(t.get("metric", "stable_accuracy")),
        None if t.get("scenario") is None else str(t["scenario"]),
        _whole(t.get("configurations"), "[tuning] configurations", 2),
        _whole(t.get("extend", DEFAULT_EXTEND), "[tuning] extend", 0),
    )
    if len(tuning.seeds) < MIN_TUNING_SEEDS:
        raise ConfigError(
            f"suite: [tuning] seeds {list(tuning.seeds)}: a tuned choice needs at least "
            f"{MIN_TUNING_SEEDS} tuning seeds (their mean picks the point)"
        )
    if set(tuning.seeds) & set(eval_seeds):
        raise ConfigError(
            f"suite: tuning seeds {sorted(set(tuning.seeds) & set(eval_seeds))} are also "
            "evaluation seeds; a tuned comparison must not reuse its tuning seeds"
        )
    if tuning.metric not in CELL_METRICS:
        raise ConfigError(
            f"suite: [tuning] metric {tuning.metric!r} is not one of {list(CELL_METRICS)}"
        )
    if tuning.scenario not in (None, "each", *scenarios):
        raise ConfigError(
            f"suite: [tuning] scenario {tuning.scenario!r} is not a scenario of the suite"
        )
    return tuning


def parse_knobs(
    entry: Mapping[str, Any], fields: Mapping[str, Any]
) -> dict[str, tuple[float, ...]]:
    """A strategy entry's ``tune = { knob = [values] }``: at most :data:`MAX_KNOBS` knobs,
    each a list of distinct numbers the entry does not also fix in ``strategy_args``."""
    value = entry.get("tune")
    where = f"suite: strategy {entry['strategy']!r}: tune"
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"{where} must be a table {{knob = [values]}}, got {value!r}")
    if len(value) > MAX_KNOBS:
        raise ConfigError(
            f"{where} names {sorted(value)}: at most {MAX_KNOBS} knobs are tuned beside the lr"
        )
    out = {}
    for name, values in value.items():
        if not isinstance(values, list) or not values or not all(map(_finite, values)):
            raise ConfigError(f"{where} {name} must be a non-empty list of numbers, got {values!r}")
        if len(set(values)) != len(values):
            raise ConfigError(f"{where} {name} repeats a value: {values}")
        out[str(name)] = tuple(float(v) for v in values)
    fixed = sorted(set(out) & set(fields.get("strategy_args") or {}))
    if fixed:
        raise ConfigError(f"{where} varies {fixed}, which its strategy_args also set; leave them")
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_configurations(
    tuning: Tuning,
    grids: Mapping[str, Sequence[float]],
    knobs: Mapping[str, Mapping[str, Sequence[float]]],
) -> None:
    """Every strategy tunes over the same number of configurations: its lr points times its
    knob value combinations, at least 2 lr points each (module docstring). ``grids``: each
    task's own lr grid (empty: the suite's); ``knobs``: each strategy's tuned knob values."""
    if not tuning.enabled:
        return
    for task, grid in grids.items():
        total = tuning.configurations or len(grid or tuning.lr)
        given = "[tuning] configurations" if tuning.configurations else "the lr grid's points"
        for label, tune in knobs.items():
            combos = math.prod(map(len, tune.values()))
            if total % combos or total // combos < 2:
                raise ConfigError(
                    f"suite: every strategy tunes over {total} configurations on task "
                    f"{task!r} ({given}); strategy {label!r} tunes {combos} knob "
                    f"value combination(s) ({dict(tune)}), so {total} must be a multiple of "
                    f"{combos} with at least 2 lr points each: set [tuning] configurations to "
                    f"a multiple of {combos} (and of every other strategy's), at least {2 * combos}"
                )


def check_traced(label: str, tune: Mapping[str, Sequence[float]], config: RunConfig) -> None:
    """Strategy ``label``'s tuned knobs (``tune``) are traced hyperparameters of its strategy
    (so its grid runs as one program), and each of their value combinations builds."""
    from fedjax_sel.experiment.loop import strategy_hyperparams

    traced = strategy_hyperparams(config)
    untraced = sorted(set(tune) - set(traced))
    if untraced:
        raise ConfigError(
            f"suite: strategy {label!r}: tune names {untraced}, which "
            f"{config.strategy!r} does not trace (its traced hyperparameters: "
            f"{sorted(traced) or 'none'}); only a traced knob runs in the grid's one program"
        )
    args = dict(config.strategy_args)
    for values in itertools.product(*tune.values()):
        point = dict(zip(tune, values, strict=True))
        strategy_hyperparams(config.replace(strategy_args={**args, **point}))
