"""A suite's tuning as it runs and as it is recorded: the self-extending grid of each strategy
(:func:`tuning_state`), the choice and its position kept in the task's records
(:func:`record_tuned`, ``meta.tuned``), and the tuning curves published with the results
(:func:`tuning_curves`, ``OUT/tuning.json``).

A strategy's tuning starts from its initial grid (:meth:`~.suite.Suite.tuning_grid`: the same
number of configurations for every strategy) on the tuning seeds, one compiled program. While
the best mean sits at an edge of the grid run so far, the next x2 lr point beyond that edge
(at the best point's knob values) runs as one more unit of work, recorded like the others and
so resumed like them, until the best is interior, the point beyond the edge diverged, or
``[tuning] extend`` extensions were used (:func:`~fedjax_sel.experiment.tuning.choose_point`).
The record says which: ``position`` ``interior``, or ``edge`` with its ``reason``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedjax_sel.benchmark.cells import Planned, cell_key, eval_cells, tuning_cells
from fedjax_sel.benchmark.suite import SUITE_VERSION, Entry, Scenario, Suite, Task, Tuning
from fedjax_sel.experiment.metric_table import higher_is_better
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.stats import LEVEL, mean_ci
from fedjax_sel.experiment.tuning import (
    INTERIOR,
    Choice,
    Point,
    choose_point,
    point_score,
    setting_name,
)


@dataclasses.dataclass
class TuningState:
    """Where a strategy's tuning stands: the ``points`` run so far and the ``steps`` they ran
    in (0: the initial grid, ``i``: the ``i``-th extension); ``pending``, the points of step
    ``step`` still to run, or, once none are, the ``choice``."""

    points: list[Point]
    steps: list[int]
    pending: list[Point]
    step: int
    choice: Choice | None = None

    @property
    def lr(self) -> float | None:
        return None if self.choice is None else self.choice.point[0]

    @property
    def knobs(self) -> dict[str, float]:
        return {} if self.choice is None else dict(self.choice.point[1])

    def summary(self) -> dict[str, Any]:
        """The record of a finished tuning: the chosen point, its score, its position and
        why (an edge's reason), the extensions used and every point run."""
        assert self.choice is not None, "the tuning has points left to run"
        return {
            "lr": self.lr,
            "knobs": self.knobs,
            "score": self.choice.score,
            "position": self.choice.position,
            "reason": self.choice.reason,
            "extensions": max(self.steps),
            "points": [
                {"lr": lr, "knobs": dict(knobs), "step": step}
                for (lr, knobs), step in zip(self.points, self.steps, strict=True)
            ],
        }


def tuning_state(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    store: Store,
    deadline: float | None,
) -> TuningState | None:
    """``entry``'s tuning on ``task`` in ``scenario`` from the records of ``store`` (only
    records of the cells' own configurations count): the points to run next, or the choice
    (module docstring). ``None`` without tuning."""
    points = list(suite.tuning_grid(task, entry))
    if not points:
        return None
    steps = [0] * len(points)
    metric = suite.tuning.metric
    while True:
        values: dict[Point, list[float | None]] = {}
        diverged: dict[Point, bool] = {}
        missing = []
        for point, step in zip(points, steps, strict=True):
            cells = tuning_cells(suite, task, scenario, entry, Path("."), deadline, [point], step)
            records = [store.get(p.ident, cell_key(p.config)) for p in cells]
            if any(r is None for r in records):
                missing.append(point)
                continue
            diverged[point] = any(r.get("diverged") for r in records)
            values[point] = [
                None if r.get("diverged") else r["metrics"].get(metric) for r in records
            ]
        if missing:
            return TuningState(points, steps, missing, steps[points.index(missing[0])])
        choice = choose_point(
            points,
            values,
            better=higher_is_better(metric),
            extend=suite.tuning.extend,
            used=max(steps),
            diverged=diverged,
        )
        if choice.extend is None:
            return TuningState(points, steps, [], max(steps), choice)
        points.append(choice.extend)
        steps.append(max(steps) + 1)


def record_tuned(meta: dict[str, Any], scenario: str, label: str, state: TuningState | None):
    """Keeps a finished tuning in a task's record facts: ``tuned_lr`` (the chosen lr, ``None``
    without tuning) and ``tuned`` (:meth:`TuningState.summary`), keyed ``scenario/label``."""
    key = f"{scenario}/{label}"
    meta.setdefault("tuned_lr", {})[key] = None if state is None else state.lr
    if state is not None:
        meta.setdefault("tuned", {})[key] = state.summary()


def tuned_eval_cells(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    out: Path,
    state: TuningState | None,
    deadline: float | None,
) -> list[Planned]:
    """``entry``'s evaluation cells in ``scenario`` at the point its tuning ``state`` chose
    (``None``, no tuning: the task's own lr and the knobs' defaults)."""
    if state is None:
        return eval_cells(suite, task, scenario, entry, out, None, deadline)
    return eval_cells(suite, task, scenario, entry, out, state.lr, deadline, state.knobs)


def tuned_text(summary: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """A recorded tuning as a leaderboard row shows it: the chosen point (``lr=0.2`` or
    ``lr=0.2,beta=1``) and its position (``interior``, or ``edge (REASON)``)."""
    if not summary:
        return None, None
    point = setting_name({"lr": f"{summary['lr']:g}", **summary.get("knobs", {})})
    position = summary["position"]
    if position != INTERIOR:
        position = f"{position} ({summary['reason']})"
    return point, position


def tuning_curves(suite: Suite, out: str | Path) -> dict[str, Any]:
    """``tuning.json``: per task, tuning scenario and strategy, every point its tuning ran
    (the lr, the knobs, the step that added it) with the metric on each tuning seed, their mean
    and 95% Student-t interval (over the finite values; ``diverged``: the seeds whose run
    diverged), and the choice with its position; from the records alone."""
    curves = []
    for task in suite.tasks:
        store = Store(Path(out) / "per_seed" / f"{task.name}.json")
        for key, summary in sorted(store.meta.get("tuned", {}).items()):
            scenario, label = key.split("/", 1)
            points = []
            for p in summary["points"]:
                per_seed = _per_seed(store, scenario, label, p, suite.tuning)
                finite = [v for v in per_seed.values() if v is not None]
                mean, lo, hi = mean_ci(finite, LEVEL) if finite else (None, None, None)
                points.append(
                    {
                        **p,
                        "values": {str(s): v for s, v in per_seed.items()},
                        "score": point_score(list(per_seed.values())),
                        "mean": mean,
                        "ci_low": lo,
                        "ci_high": hi,
                    }
                )
            chosen, position = tuned_text(summary)
            curves.append(
                {
                    "task": task.name,
                    "scenario": scenario,
                    "strategy": label,
                    "chosen": chosen,
                    "lr": summary["lr"],
                    "knobs": summary["knobs"],
                    "position": summary["position"],
                    "reason": summary["reason"],
                    "position_text": position,
                    "extensions": summary["extensions"],
                    "points": points,
                }
            )
    return {
        "metric": suite.tuning.metric,
        "higher_is_better": higher_is_better(suite.tuning.metric),
        "seeds": list(suite.tuning.seeds),
        "extend": suite.tuning.extend,
        "level": LEVEL,
        "curves": curves,
    }


def _per_seed(
    store: Store, scenario: str, label: str, point: Mapping[str, Any], tuning: Tuning
) -> dict[int, float | None]:
    """A tuning point's metric by seed (``None``: diverged, missing, or of another version)."""
    out: dict[int, float | None] = {}
    for seed in tuning.seeds:
        ident = {"phase": "tune", "scenario": scenario, "strategy": label, "seed": seed}
        ident.update(lr=point["lr"], **({"knobs": point["knobs"]} if point["knobs"] else {}))
        r = store.lookup(ident)
        ok = r is not None and r.get("suite_version") == SUITE_VERSION and not r.get("diverged")
        v = r["metrics"].get(tuning.metric) if ok else None
        out[seed] = None if v is None or not math.isfinite(v) else float(v)
    return out
