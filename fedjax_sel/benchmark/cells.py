"""A suite's cells and units of work.

A cell is one (phase, task, scenario, strategy, seed): a :class:`~fedjax_sel.config.RunConfig`
(:func:`~fedjax_sel.benchmark.suite.cell_config`), the hash its record is keyed by
(:func:`cell_key`) and the metrics its record keeps (:func:`cell_metrics`). A unit of work is
one compiled program: a strategy's tuning grid on a task (:func:`tuning_cells`), or its
evaluation seeds in one scenario at the learning rate its tuning chose (:func:`eval_cells`,
:func:`tuned_lr`); a job is a strategy on a task, its tuning and then its evaluations
(:func:`jobs`, :func:`job_units`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.benchmark.suite import (
    SUITE_VERSION,
    Entry,
    Scenario,
    Suite,
    Task,
    Tuning,
    cell_config,
)
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.metric_table import higher_is_better
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.resolve import resolve


# ----------------------------------------------------------------------------- cells
def cell_key(config: RunConfig) -> str:
    """What a cell's record must match to be reused: every setting that can change its results
    (but not where the data files live) and the suite's code version."""
    d = config.to_dict()
    for f in dataclasses.fields(RunConfig):
        if not f.metadata.get("results", True) or f.name == "data_path":
            d.pop(f.name, None)
    d["suite_version"] = SUITE_VERSION
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_metrics(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    config: RunConfig,
    *,
    target: float | None,
    budgets: Sequence[int],
) -> dict[str, float | None]:
    """A finished run's metrics as the suite records them (``None``: not applicable, or a
    target never reached)."""
    out: dict[str, float | None] = {}
    for key in ("final_accuracy", "peak_accuracy", "stable_accuracy", "jain_fairness"):
        v = summary.get(key)
        out[key] = None if v is None else float(v)
    std = summary.get("final_client_test_accuracy_std")
    out["client_accuracy_std"] = None if std is None else float(std)
    for b in budgets:
        before = [e for e in records if e["round"] <= b and e.get("test_accuracy") is not None]
        out[f"accuracy@{b}"] = float(before[-1]["test_accuracy"]) if before else None
    timed = bool(records) and "sim_time_s" in records[-1]
    if target is not None:
        hit = next((e for e in records if (e.get("test_accuracy") or -1.0) >= target), None)
        out["rounds_to_target"] = None if hit is None else float(hit["round"])
        if timed:
            out["time_to_target"] = None if hit is None else float(hit["sim_time_s"])
        out["reached_target"] = 0.0 if hit is None else 1.0
    if timed:
        out["sim_time_s"] = float(records[-1]["sim_time_s"])
        if config.deadline is not None:
            seconds = [s for e in records for s in e.get("round_seconds", [])]
            hits = sum(1 for s in seconds if s >= config.deadline * (1 - 1e-6))
            out["deadline_hit_share"] = hits / len(seconds) if seconds else None
    return out


def deadline_for(suite: Suite, task: Task, scenario: Scenario, draws: int = 4000) -> float:
    """The deadline at ``scenario.deadline_quantile`` of a round's length when the task's
    ``per_round`` clients are drawn uniformly, from the system model's device profiles (pooled
    over the evaluation seeds' profiles), with the scenario's over-commitment."""
    import jax

    from fedjax_sel.engine import system as system_lib
    from fedjax_sel.experiment.build import load_data_for, model_for

    baseline = next(e for e in suite.strategies if e.label == suite.baseline)
    config = cell_config(
        suite, task, scenario, baseline, seed=suite.seeds[0], lr=None, deadline=1.0
    )
    resolved = resolve(config)
    config = resolved.config
    dataset = load_data_for(config)
    model = model_for(config, dataset)
    kbit = system_lib.model_kbit(jax.eval_shape(model.init, jax.random.key(0)))
    counts = jax.numpy.asarray(dataset.train.counts)
    samples, _ = system_lib.client_work(
        counts, config.batch_size, config.local_steps, config.local_epochs
    )
    model_sys = resolved.system.build(system_lib.SYSTEMS)
    k = dataset.num_clients
    slots = system_lib.overcommitted(config.per_round, config.overcommit, k)
    rng = np.random.default_rng(0)
    lengths = []
    for seed in suite.seeds:
        state = model_sys.init(jax.random.key(seed), k)
        compute, comm = system_lib.durations(
            state.ms_per_example, state.bandwidth_kbps, samples, kbit
        )
        full = np.asarray(compute + comm, np.float64)
        for _ in range(max(1, draws // len(suite.seeds))):
            chosen = np.sort(full[rng.choice(k, size=slots, replace=False)])
            lengths.append(chosen[config.per_round - 1])  # the per_round-th finisher
    return float(np.round(np.quantile(lengths, scenario.deadline_quantile), 1))


# ----------------------------------------------------------------------------- units of work
@dataclasses.dataclass
class Planned:
    """A cell to run or reuse."""

    ident: dict[str, Any]
    config: RunConfig
    out: Path
    task: Task
    together: int | None = None  # the strategy's own seeds per batch


def tuning_cells(
    suite: Suite, task: Task, scenario: Scenario, entry: Entry, out: Path, deadline: float | None
) -> list[Planned]:
    """The tuning cells of ``entry`` on ``task`` in ``scenario``: every grid point on every
    tuning seed, one compiled program (the grid points are traced). Empty without tuning."""
    grid = task.lr_grid or suite.tuning.lr
    if not suite.tuning.enabled or not grid:
        return []
    planned = []
    for lr in grid:
        for seed in suite.tuning.seeds:
            config = cell_config(suite, task, scenario, entry, seed=seed, lr=lr, deadline=deadline)
            ident = {
                "phase": "tune",
                "scenario": scenario.name,
                "strategy": entry.label,
                "seed": seed,
                "lr": lr,
            }
            where = (
                out
                / "runs"
                / folder_name(task.name)
                / "tuning"
                / folder_name(scenario.name)
                / folder_name(entry.label)
                / f"lr={lr:g}"
                / f"seed{seed}"
            )
            planned.append(Planned(ident, config, where, task, entry.seeds_together))
    return planned


def eval_cells(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    out: Path,
    lr: float | None,
    deadline: float | None,
) -> list[Planned]:
    """The evaluation cells of ``entry`` on ``task`` in ``scenario`` at the tuned ``lr``
    (``None``: the task's own): one per evaluation seed, one compiled program."""
    planned = []
    where = (
        out
        / "runs"
        / folder_name(task.name)
        / folder_name(scenario.name)
        / folder_name(entry.label)
    )
    for seed in suite.seeds:
        config = cell_config(suite, task, scenario, entry, seed=seed, lr=lr, deadline=deadline)
        ident = {"phase": "eval", "scenario": scenario.name, "strategy": entry.label, "seed": seed}
        planned.append(Planned(ident, config, where / f"seed{seed}", task, entry.seeds_together))
    return planned


def jobs(suite: Suite, tasks: Sequence[Task]) -> list[tuple[Task, Entry]]:
    """The suite's jobs in file order: each strategy on each task where it runs somewhere.
    A job keeps a strategy's tuning and the evaluations that use it together, so it is the
    unit a shard takes (:func:`fedjax_sel.experiment.records.shard_share`)."""
    return [
        (task, entry)
        for task in tasks
        for entry in suite.strategies
        if any(entry.reason(task.name, s.name) is None for s in suite.scenarios)
    ]


def tuned_scenarios(suite: Suite, task: Task, entry: Entry) -> dict[str, list[Scenario]]:
    """The scenarios ``entry`` is tuned in on ``task``, each with the scenarios evaluated at
    its tuned lr, in file order."""
    out: dict[str, list[Scenario]] = {}
    for scenario in suite.scenarios:
        if entry.reason(task.name, scenario.name) is None:
            out.setdefault(suite.tuning_scenario(scenario.name), []).append(scenario)
    return out


def job_units(suite: Suite, task: Task, entry: Entry) -> list[tuple[Scenario, int]]:
    """The units of ``entry``'s job on ``task`` in the order they run, each as its scenario
    and its number of cells: a tuning grid (grid points x tuning seeds), then the evaluations
    at the lr it chose (the evaluation seeds), for each scenario it is tuned in."""
    by_name = {s.name: s for s in suite.scenarios}
    grid = task.lr_grid or suite.tuning.lr
    points = len(grid) * len(suite.tuning.seeds) if suite.tuning.enabled and grid else 0
    units = []
    for tune_name, scenarios in tuned_scenarios(suite, task, entry).items():
        if points:
            units.append((by_name[tune_name], points))
        units += [(s, len(suite.seeds)) for s in scenarios]
    return units


def choose_lr(
    store: Store, scenario: str, label: str, grid: Sequence[float], tuning: Tuning
) -> float:
    """The grid point with the best mean of ``tuning.metric`` over the tuning seeds (a
    diverged or missing value counts as the worst)."""
    better = higher_is_better(tuning.metric)
    scores = []
    for lr in grid:
        values = []
        for seed in tuning.seeds:
            r = store.lookup(
                {"phase": "tune", "scenario": scenario, "strategy": label, "seed": seed, "lr": lr}
            )
            v = None if r is None or r.get("diverged") else r["metrics"].get(tuning.metric)
            values.append(-math.inf if v is None and better else math.inf if v is None else v)
        scores.append(float(np.mean(values)))
    best = int(np.argmax(scores) if better else np.argmin(scores))
    return float(grid[best])


def tuned_lr(suite: Suite, task: Task, scenario: Scenario, entry: Entry, store: Store):
    """``entry``'s chosen lr on ``task`` from its tuning records in ``scenario`` (``None``
    without tuning: the task's own lr)."""
    grid = task.lr_grid or suite.tuning.lr
    if not suite.tuning.enabled or not grid:
        return None
    return choose_lr(store, scenario.name, entry.label, grid, suite.tuning)
