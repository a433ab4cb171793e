"""The client-selection benchmark: every strategy on shared tasks and scenarios, paired seeds,
in one command (``fedjax-sel suite FILE.toml --out DIR``; docs/benchmark.md).

A suite file (TOML or JSON) names tasks, scenarios and strategies; the suite runs their product
over paired seeds. Each section's keys are :class:`~fedjax_sel.config.RunConfig` fields, plus a
few suite keys (marked *suite* below)::

    [suite]
    name = "cpu"
    seeds = 10                # evaluation seeds (or a list); every strategy runs the same ones
    baseline = "uniform"      # the strategy every other is paired against
    stable_fraction = 0.1     # stable accuracy: mean of the last 10% of rounds, each evaluated
    seeds_together = "auto"   # seeds per vmapped batch
    ranking = "headline"      # the metric ranked: each scenario's headline, or a metric name

    [tuning]                  # the same budget for every strategy: its client lr from a grid,
    lr = [0.03, 0.1, 0.3]     # chosen on separate seeds, then compared on the evaluation seeds
    seeds = [1000, 1001]
    metric = "stable_accuracy"
    scenario = "ideal"        # tuned once per task in this scenario ("each": in every scenario)

    [tasks.digits]            # RunConfig fields, and (suite) target, budgets, lr_grid
    dataset = "digits"
    target = 0.8              # suite: rounds/time to this test accuracy
    budgets = [20, 40]        # suite: accuracy after these many rounds

    [scenarios.devices]       # RunConfig fields, and (suite) headline, deadline_quantile
    system = "lognormal"
    deadline_quantile = 0.5   # suite: deadline = this quantile of a uniform round's length
    headline = "time_to_target"

    [[strategies]]            # RunConfig fields, and (suite) label, note, not_applicable
    strategy = "ca_fed"
    per_round = "all"         # every client has a slot (K of the task)
    note = "paper: every available client, weights alpha/pi"
    not_applicable = { "ideal" = "reason" }   # by scenario, task, "task/scenario" or "*"
    seeds_together = 1        # suite: this strategy's seeds per batch (a lax.cond in its select
                              # runs both branches when seeds are vmapped)

    [override]                # optional: set in every cell, last (the CLI's --set rounds=2)

Every cell (phase, task, scenario, strategy, seed) is a run folder under ``OUT/runs/`` (scratch,
resumed from its checkpoint when killed) and, once finished, a record of its metrics in
``OUT/per_seed/<task>.json``: the committed per-seed values every statistic is computed from. A
record carries the hash of its configuration and the suite's code version, and (records written
since these fields exist) the whole configuration (``config``) and how the cell ran: its vmapped
batch and client parallelism (``batch``, ``parallel``: :func:`~.records.cell_execution`); a cell
whose record matches is never rerun (a suite can be finished over several runs on several
machines), and a record of another configuration or version is never mixed in: the suite refuses
to replace it unless ``overwrite`` (``--overwrite``) is given.

This module reads suite files and defines the cells and units of work (a strategy's tuning
grid, its evaluation seeds in a scenario: one compiled program each);
:mod:`fedjax_sel.benchmark.run` runs them (in this process, as a shard, or on Ray:
:mod:`fedjax_sel.benchmark.ray_executor`), :mod:`fedjax_sel.experiment.records` keeps and
merges their records, and :mod:`fedjax_sel.benchmark.leaderboard` turns the records into
``leaderboard.json/csv/md``, ``ranking.json`` and the pictures.
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

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig, read_config_file
from fedjax_sel.experiment.metric_table import CELL_METRICS, higher_is_better
from fedjax_sel.experiment.outdir import check_distinct_folders, folder_name
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.sweep import _slug, check_together, file_table
from fedjax_sel.input_checks import seed_list

# Bump when what a cell's record means changes (a metric's definition, the engine's numbers):
# records of another version are recomputed, never mixed with this one's.
SUITE_VERSION = 1

SUITE_KEYS = {"name", "seeds", "baseline", "stable_fraction", "seeds_together", "ranking"}
TUNING_KEYS = {"lr", "seeds", "metric", "scenario"}
TASK_KEYS = {"target", "budgets", "lr_grid"}
SCENARIO_KEYS = {"headline", "deadline_quantile"}
STRATEGY_KEYS = {"label", "note", "not_applicable", "seeds_together"}


@dataclasses.dataclass
class Task:
    name: str
    fields: dict[str, Any]
    target: float | None = None
    budgets: tuple[int, ...] = ()
    lr_grid: tuple[float, ...] | None = None


@dataclasses.dataclass
class Scenario:
    name: str
    fields: dict[str, Any]
    headline: str = "stable_accuracy"
    deadline_quantile: float | None = None


@dataclasses.dataclass
class Entry:
    """One strategy of the suite: its label, RunConfig fields, note and where it cannot run."""

    label: str
    fields: dict[str, Any]
    note: str = ""
    not_applicable: dict[str, str] = dataclasses.field(default_factory=dict)
    seeds_together: int | None = None  # seeds per batch for this strategy (else the suite's)

    def reason(self, task: str, scenario: str) -> str | None:
        """Why this strategy cannot run in (task, scenario), or ``None``."""
        for key in (f"{task}/{scenario}", task, scenario, "*"):
            if key in self.not_applicable:
                return self.not_applicable[key]
        return None


@dataclasses.dataclass
class Tuning:
    lr: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    metric: str = "stable_accuracy"
    scenario: str | None = None  # None: the first scenario; "each": every scenario

    @property
    def enabled(self) -> bool:
        return bool(self.lr) and bool(self.seeds)


@dataclasses.dataclass
class Suite:
    name: str
    tasks: list[Task]
    scenarios: list[Scenario]
    strategies: list[Entry]
    seeds: list[int]
    baseline: str
    tuning: Tuning
    stable_fraction: float = 0.1
    seeds_together: int | str = "auto"
    ranking: str = "headline"
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    override: dict[str, Any] = dataclasses.field(default_factory=dict)

    def tuning_scenario(self, scenario: str) -> str:
        """The scenario whose tuning a cell of ``scenario`` uses."""
        if self.tuning.scenario == "each":
            return scenario
        return self.tuning.scenario or self.scenarios[0].name

    def rank_metric(self, scenario: Scenario) -> str:
        return scenario.headline if self.ranking == "headline" else self.ranking


# ----------------------------------------------------------------------------- parsing
def _table(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    return file_table(spec, key, "suite")


def _check_fields(where: str, fields: Mapping[str, Any]) -> None:
    names = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ConfigError(
            f"suite: {where}: unknown key(s) {unknown} (RunConfig fields or suite keys)"
        )
    for bad in ("seed", "label", "data_seed"):
        if bad in fields:
            raise ConfigError(f"suite: {where}: {bad!r} is set by the suite, not the file")


def _named_tables(spec: Mapping[str, Any], section: str, suite_keys: set[str]):
    """``(name, table, RunConfig fields)`` of each ``[section.NAME]`` table."""
    for name, table in _table(spec, section).items():
        if not isinstance(table, Mapping):
            raise ConfigError(f"suite: [{section}.{name}] must be a table")
        fields = {k: v for k, v in table.items() if k not in suite_keys}
        _check_fields(f"[{section}.{name}]", fields)
        yield str(name), table, fields


def _together(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"suite: {where}: seeds_together must be a number >= 1, got {value!r}")
    return value


def _seed_list(value: Any, where: str) -> list[int]:
    return seed_list(value, f"suite: {where}")


def _number(value: Any) -> bool:
    """A number of a file: ``true`` and ``"0.5"`` are none."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(value: Any, where: str, *, positive: bool = False) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"suite: {where} must be a non-empty list, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"suite: {where} holds {v!r}, not a number")
        if positive and v <= 0:
            raise ConfigError(f"suite: {where} holds {v!r}; every value must be positive")
        out.append(float(v))
    return tuple(out)


def parse_suite(spec: Mapping[str, Any]) -> Suite:
    """A :class:`Suite` from the mapping of a suite file (see the module docstring)."""
    unknown = set(spec) - {"suite", "tuning", "tasks", "scenarios", "strategies", "override"}
    if unknown:
        raise ConfigError(
            f"suite: unknown section(s) {sorted(unknown)}; use suite, tuning, tasks, scenarios, "
            "strategies (and override)"
        )
    override = _table(spec, "override")
    _check_fields("[override]", override)
    options = _table(spec, "suite")
    bad = set(options) - SUITE_KEYS
    if bad:
        raise ConfigError(
            f"suite: unknown [suite] key(s) {sorted(bad)}; known: {sorted(SUITE_KEYS)}"
        )
    tasks = []
    for name, table, fields in _named_tables(spec, "tasks", TASK_KEYS):
        target = table.get("target")
        if target is not None and not (_number(target) and 0 < target <= 1):
            raise ConfigError(
                f"suite: [tasks.{name}] target must be an accuracy in (0, 1], got {target!r}"
            )
        budgets = (
            tuple(
                int(b) for b in _numbers(table["budgets"], f"[tasks.{name}] budgets", positive=True)
            )
            if "budgets" in table
            else ()
        )
        lr_grid = (
            _numbers(table["lr_grid"], f"[tasks.{name}] lr_grid", positive=True)
            if "lr_grid" in table
            else None
        )
        tasks.append(
            Task(str(name), fields, None if target is None else float(target), budgets, lr_grid)
        )
    scenarios = []
    for name, table, fields in _named_tables(spec, "scenarios", SCENARIO_KEYS):
        q = table.get("deadline_quantile")
        if q is not None:
            if not (_number(q) and 0 < q < 1):
                raise ConfigError(
                    f"suite: [scenarios.{name}] deadline_quantile must be in (0, 1), got {q!r}"
                )
            if "deadline" in fields:
                raise ConfigError(
                    f"suite: [scenarios.{name}] gives deadline and deadline_quantile; give one"
                )
            if not fields.get("system"):
                raise ConfigError(
                    f"suite: [scenarios.{name}] deadline_quantile needs a system model "
                    "(system = ...)"
                )
        headline = str(table.get("headline", "stable_accuracy"))
        if headline not in CELL_METRICS:
            raise ConfigError(
                f"suite: [scenarios.{name}] headline {headline!r} is not one of "
                f"{list(CELL_METRICS)}"
            )
        scenarios.append(Scenario(str(name), fields, headline, None if q is None else float(q)))
    if not tasks or not scenarios:
        raise ConfigError("suite: needs at least one [tasks.NAME] and one [scenarios.NAME] table")
    entries = []
    raw = spec.get("strategies") or []
    if not isinstance(raw, list) or not raw:
        raise ConfigError("suite: needs a list of [[strategies]] entries")
    names = {t.name for t in tasks} | {s.name for s in scenarios}
    names |= {f"{t.name}/{s.name}" for t in tasks for s in scenarios} | {"*"}
    for entry in raw:
        if not isinstance(entry, Mapping) or "strategy" not in entry:
            raise ConfigError(
                f"suite: each [[strategies]] entry needs strategy = NAME, got {entry!r}"
            )
        fields = {k: v for k, v in entry.items() if k not in STRATEGY_KEYS}
        _check_fields(
            f"strategy {entry['strategy']!r}", {k: v for k, v in fields.items() if k != "per_round"}
        )
        na = dict(entry.get("not_applicable") or {})
        wrong = sorted(set(na) - names)
        if wrong:
            raise ConfigError(
                f"suite: strategy {entry['strategy']!r}: not_applicable names {wrong}, which are "
                "no task, scenario, task/scenario of this suite, nor '*' (everywhere)"
            )
        entries.append(
            Entry(
                str(entry.get("label") or entry["strategy"]),
                fields,
                str(entry.get("note", "")),
                {str(k): str(v) for k, v in na.items()},
                _together(entry.get("seeds_together"), f"strategy {entry['strategy']!r}"),
            )
        )
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(
            f"suite: strategy labels must be distinct (set label = ...), got {labels}"
        )
    baseline = str(options.get("baseline", "uniform"))
    if baseline not in labels:
        raise ConfigError(f"suite: baseline {baseline!r} is not one of the strategies {labels}")
    seeds = _seed_list(options.get("seeds", 10), "[suite] seeds")
    t = _table(spec, "tuning")
    bad = set(t) - TUNING_KEYS
    if bad:
        raise ConfigError(
            f"suite: unknown [tuning] key(s) {sorted(bad)}; known: {sorted(TUNING_KEYS)}"
        )
    tuning = Tuning()
    if t and "lr" not in t:
        raise ConfigError(
            "suite: [tuning] needs lr = [...], the learning rates every strategy is tuned over "
            "(or leave the [tuning] table out)"
        )
    if t:
        tuning = Tuning(
            _numbers(t["lr"], "[tuning] lr", positive=True) if "lr" in t else (),
            tuple(_seed_list(t.get("seeds", [1000, 1001]), "[tuning] seeds")),
            str(t.get("metric", "stable_accuracy")),
            None if t.get("scenario") is None else str(t["scenario"]),
        )
        if set(tuning.seeds) & set(seeds):
            raise ConfigError(
                f"suite: tuning seeds {sorted(set(tuning.seeds) & set(seeds))} are also evaluation "
                "seeds; a tuned comparison must not reuse its tuning seeds"
            )
        if tuning.metric not in CELL_METRICS:
            raise ConfigError(
                f"suite: [tuning] metric {tuning.metric!r} is not one of {list(CELL_METRICS)}"
            )
        if tuning.scenario not in (None, "each") and tuning.scenario not in {
            s.name for s in scenarios
        }:
            raise ConfigError(
                f"suite: [tuning] scenario {tuning.scenario!r} is not a scenario of the suite"
            )
    fraction = options.get("stable_fraction", 0.1)
    if not (_number(fraction) and 0 < fraction <= 1):
        raise ConfigError(f"suite: stable_fraction must be in (0, 1], got {fraction!r}")
    together = check_together(options.get("seeds_together", "auto"), "suite")
    ranking = str(options.get("ranking", "headline"))
    if ranking != "headline" and ranking not in CELL_METRICS:
        raise ConfigError(f"suite: ranking must be 'headline' or one of {list(CELL_METRICS)}")
    suite = Suite(
        str(options.get("name", "suite")),
        tasks,
        scenarios,
        entries,
        seeds,
        baseline,
        tuning,
        float(fraction),
        together,
        ranking,
        dict(spec),
        override,
    )
    check_distinct_folders([t.name for t in tasks], "suite: tasks")
    check_distinct_folders([s.name for s in scenarios], "suite: scenarios")
    check_distinct_folders([e.label for e in entries], "suite: strategy labels")
    if any(folder_name(s.name).casefold() == "tuning" for s in scenarios):
        raise ConfigError("suite: no scenario can be named 'tuning' (its folder holds tuning runs)")
    for task in suite.tasks:  # every cell's configuration is valid before anything runs
        for scenario in suite.scenarios:
            for e in suite.strategies:
                if e.reason(task.name, scenario.name) is None:
                    cell_config(suite, task, scenario, e, seed=0, lr=None, deadline=1.0).resolve()
    return suite


def load_suite(path: str | Path) -> Suite:
    return parse_suite(read_config_file(path))


# ----------------------------------------------------------------------------- cells
def cell_config(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    *,
    seed: int,
    lr: float | None,
    deadline: float | None,
) -> RunConfig:
    """The configuration of one cell: the task's fields, then the scenario's, then the
    strategy's; ``per_round = "all"`` is the task's number of clients."""
    fields = {**task.fields, **scenario.fields, **entry.fields, **suite.override}
    if fields.get("per_round") == "all":
        if task.fields.get("num_clients") is None:
            raise ConfigError(
                f"suite: strategy {entry.label!r} has per_round = 'all', so task {task.name!r} "
                "must give num_clients"
            )
        fields["per_round"] = task.fields["num_clients"]
    if lr is not None:
        fields["lr"] = lr
    if scenario.deadline_quantile is not None:
        fields["deadline"] = deadline
    rounds = fields.get("rounds", RunConfig.rounds)
    if _number(rounds) and 1 <= rounds < math.inf:  # else RunConfig names the bad value
        fields["eval_tail"] = max(1, math.ceil(suite.stable_fraction * rounds))
    if task.target is not None:
        fields["accuracy_targets"] = [task.target]
    return RunConfig.from_dict(
        {**fields, "seed": seed, "label": entry.label},
        source=f"suite cell {task.name}/{scenario.name}",
    ).validate()


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
    config = config.resolve()
    dataset = load_data_for(config)
    model = model_for(config, dataset)
    kbit = system_lib.model_kbit(jax.eval_shape(model.init, jax.random.key(0)))
    counts = jax.numpy.asarray(dataset.train.counts)
    samples, _ = system_lib.client_work(
        counts, config.batch_size, config.local_steps, config.local_epochs
    )
    model_sys = system_lib.from_spec(config.system)
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
                / _slug(task.name)
                / "tuning"
                / _slug(scenario.name)
                / _slug(entry.label)
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
    where = out / "runs" / _slug(task.name) / _slug(scenario.name) / _slug(entry.label)
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
