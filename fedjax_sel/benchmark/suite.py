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
    tracks = ["selection", "bundle"]  # (suite) the ranked track first; :mod:`.tracks`

    [tuning]                  # the same budget for every strategy: its client lr (and knobs)
    lr = { center = 0.1, points = 5 }  # from a log grid in x2 steps (0.025 .. 0.4), or a list
                              # in x2 steps; chosen on separate seeds, compared on the others
    configurations = 6        # per strategy: lr points x knob values (default: lr's points)
    extend = 4                # x2 steps added beyond an edge while the best sits there
    seeds = [1000, 1001, 1002]  # at least 3, never evaluation seeds
    metric = "stable_accuracy"
    scenario = "ideal"        # tuned once per task in this scenario ("each": in every scenario)

    [tasks.digits]            # RunConfig fields, and (suite) target, budgets, lr_grid
    dataset = "digits"
    target = 0.8              # suite: rounds/time to this test accuracy
    budgets = [20, 40]        # suite: accuracy after these many rounds
    update_budgets = [100, 200]  # suite: accuracy after these many client updates (default:
                              # per_round x each round budget and x rounds); the last is the
                              # range of the area under accuracy against client updates
    scenarios = ["ideal"]     # suite: the scenarios this task runs in (default: all); the
                              # others are not-applicable rows with the reason
    tracks = ["selection"]    # suite: the tracks this task runs (default: the suite's)

    [scenarios.devices]       # RunConfig fields, and (suite) headline, deadline_quantile
    system = "lognormal"
    deadline_quantile = 0.5   # suite: deadline = this quantile of a uniform round's length
    headline = "time_to_target"

    [[strategies]]            # RunConfig fields, and (suite) label, note, not_applicable, tune
    strategy = "ca_fed"
    tune = { tau = [0.5, 1] } # suite: at most two traced knobs tuned with the lr (their
                              # values x the lr points = configurations)
    per_round = "all"         # every client has a slot (K of the task)
    note = "paper: every available client, weights alpha/pi"
    not_applicable = { "ideal" = "reason" }   # by scenario, task, "task/scenario" or "*"
    bundle = { aggregation = "strategy" }    # suite: its paper's bundle (the bundle track)
    reference = false         # suite: true = reported against the baseline, never ranked
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

Tuning gives every strategy the same budget: the same number of ``configurations`` (lr points
in x2 steps around the grid's center, times the values of the at most two traced knobs its
entry names to ``tune``), on at least 3 tuning seeds the evaluation never uses; a grid whose
best point sits at an edge extends itself by x2 steps (up to ``extend``) until the best is
interior or the point beyond it diverged, and the record says which
(:mod:`fedjax_sel.benchmark.tuning` reads the settings, :mod:`fedjax_sel.benchmark.tuned` runs
and records the choice and the curves).

This module reads suite files; :mod:`fedjax_sel.benchmark.cells` defines the cells and units
of work (a strategy's tuning grid or one extension of it, its evaluation seeds in a scenario:
one compiled program each); :mod:`fedjax_sel.benchmark.run` runs them (in this process, as a
shard, or on Ray: :mod:`fedjax_sel.benchmark.ray_executor`), :mod:`fedjax_sel.experiment.
records` keeps and merges their records, and :mod:`fedjax_sel.benchmark.leaderboard` turns the
records into ``leaderboard.json/csv/md``, ``ranking.json`` and the pictures.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.tracks import check_budget, expand, parse_tracks
from fedjax_sel.benchmark.tuning import (
    Tuning,
    check_configurations,
    check_traced,
    parse_knobs,
    parse_tuning,
)
from fedjax_sel.config import RunConfig, read_config_file
from fedjax_sel.experiment.metric_table import CELL_METRICS
from fedjax_sel.experiment.outdir import check_distinct_folders, folder_name
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.sweep import check_together, file_table
from fedjax_sel.experiment.tuning import (
    Point,
    doubling_grid,
    grid_center,
    parse_doubling_grid,
)
from fedjax_sel.input_checks import seed_list

# Bump when what a cell's record means changes (a metric's definition, the engine's numbers):
# records of another version are recomputed, never mixed with this one's.
SUITE_VERSION = 2  # 2: cost series, accuracy at client-update budgets, interpolated targets

SUITE_KEYS = {
    "name",
    "seeds",
    "baseline",
    "stable_fraction",
    "seeds_together",
    "ranking",
    "tracks",
    "bundle_scenarios",
}
TASK_KEYS = {"target", "budgets", "update_budgets", "lr_grid", "scenarios", "tracks"}
SCENARIO_KEYS = {"headline", "deadline_quantile"}
STRATEGY_KEYS = {
    "label",
    "note",
    "not_applicable",
    "seeds_together",
    "tune",
    "bundle",
    "reference",
}


@dataclasses.dataclass
class Task:
    name: str
    fields: dict[str, Any]
    target: float | None = None
    budgets: tuple[int, ...] = ()
    lr_grid: tuple[float, ...] | None = None
    # client updates at which accuracy is read; the last is the range of ``update_auc``
    update_budgets: tuple[int, ...] = ()
    # where this task runs (default: every scenario, every track): sized for the machine
    scenarios: tuple[str, ...] | None = None
    tracks: tuple[str, ...] | None = None


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
    tune: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)  # knob values
    track: str = "bundle"  # :mod:`fedjax_sel.benchmark.tracks`
    reference: bool = False  # reported against the baseline, never ranked
    strategy_label: str | None = None  # a bundle-track entry: the selection entry's label

    @property
    def name(self) -> str:
        """The strategy's label without its track's suffix."""
        return self.strategy_label or self.label

    def reason(self, task: str, scenario: str) -> str | None:
        """Why this strategy cannot run in (task, scenario), or ``None``."""
        for key in (f"{task}/{scenario}", task, scenario, "*"):
            if key in self.not_applicable:
                return self.not_applicable[key]
        return None


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
    tracks: tuple[str, ...] = ("bundle",)
    # where the bundle track's own entries run (default: every scenario)
    bundle_scenarios: tuple[str, ...] | None = None

    def track_scenarios(self, track: str) -> list[Scenario]:
        """The scenarios ``track`` is ranked in: the bundle track's ``bundle_scenarios`` when
        the suite names them (its own entries run nowhere else), else every scenario."""
        if track == "bundle" and self.bundle_scenarios is not None and "selection" in self.tracks:
            return [s for s in self.scenarios if s.name in self.bundle_scenarios]
        return list(self.scenarios)

    def track_tasks(self, track: str) -> list[Task]:
        """The tasks ``track`` is ranked on: those whose ``tracks`` name it (default: all)."""
        return [t for t in self.tasks if t.tracks is None or track in t.tracks]

    def tuning_scenario(self, scenario: str) -> str:
        """The scenario whose tuning a cell of ``scenario`` uses."""
        if self.tuning.scenario == "each":
            return scenario
        return self.tuning.scenario or self.scenarios[0].name

    def rank_metric(self, scenario: Scenario) -> str:
        return scenario.headline if self.ranking == "headline" else self.ranking

    def lr_points(self, task: Task, entry: Entry) -> int:
        """How many lr points ``entry`` tunes over on ``task``: the configurations (every
        strategy's the same) over its knob values (0 without tuning)."""
        base = task.lr_grid or self.tuning.lr
        if not self.tuning.enabled or not base:
            return 0
        return (self.tuning.configurations or len(base)) // math.prod(map(len, entry.tune.values()))

    def tuning_grid(self, task: Task, entry: Entry) -> list[Point]:
        """``entry``'s initial tuning configurations on ``task``, lr-major: its
        :meth:`lr_points` in x2 steps around the grid's center (the task's ``lr_grid`` or
        ``[tuning] lr``), each with every combination of its knob values."""
        base = task.lr_grid or self.tuning.lr
        n = self.lr_points(task, entry)
        if not n:
            return []
        knobs = [
            tuple(zip(entry.tune, values, strict=True))
            for values in itertools.product(*entry.tune.values())
        ]
        return [(lr, k) for lr in doubling_grid(grid_center(base), n) for k in knobs]


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


def default_update_budgets(fields: Mapping[str, Any], budgets: Sequence[int]) -> tuple[int, ...]:
    """A task's client-update budgets when it names none: ``per_round`` times each round
    budget and times ``rounds`` (none when ``per_round`` is not a number of clients)."""
    per_round = fields.get("per_round", RunConfig.per_round)
    rounds = fields.get("rounds", RunConfig.rounds)
    if not (_number(per_round) and _number(rounds)):
        return ()
    return tuple(int(per_round) * int(r) for r in (*budgets, rounds))


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
            parse_doubling_grid(table["lr_grid"], f"suite: [tasks.{name}] lr_grid")
            if "lr_grid" in table
            else None
        )
        if "update_budgets" in table:
            where = f"[tasks.{name}] update_budgets"
            update_budgets = tuple(
                int(b) for b in _numbers(table["update_budgets"], where, positive=True)
            )
        else:
            update_budgets = default_update_budgets(fields, budgets)
        tasks.append(
            Task(
                str(name),
                fields,
                None if target is None else float(target),
                budgets,
                lr_grid,
                tuple(sorted(set(update_budgets))),
                _names(table, "scenarios", name),
                _names(table, "tracks", name),
            )
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
                parse_knobs(entry, fields),
                reference=_flag(entry.get("reference", False), entry["strategy"]),
            )
        )
    tracks = parse_tracks(options.get("tracks"))
    entries = expand(entries, tracks, raw)
    bundle_scenarios = options.get("bundle_scenarios")
    if bundle_scenarios is not None:
        known = [s.name for s in scenarios]
        if (
            not isinstance(bundle_scenarios, list)
            or not bundle_scenarios
            or any(n not in known for n in bundle_scenarios)
            or "selection" not in tracks
        ):
            raise ConfigError(
                f"suite: bundle_scenarios must be a non-empty list of scenarios of the suite "
                f"{known}, with tracks = ['selection', 'bundle'], got {bundle_scenarios!r}"
            )
        bundle_scenarios = tuple(str(n) for n in bundle_scenarios)
        reason = (
            f"the bundle track runs in {', '.join(bundle_scenarios)} only ([suite] "
            "bundle_scenarios): sized for the suite's machine"
        )
        entries = [
            dataclasses.replace(
                e,
                not_applicable={
                    **{n: reason for n in known if n not in bundle_scenarios},
                    **e.not_applicable,
                },
            )
            if e.strategy_label is not None
            else e
            for e in entries
        ]
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ConfigError(
            f"suite: strategy labels must be distinct (set label = ...), got {labels}"
        )
    baseline = str(options.get("baseline", "uniform"))
    if baseline not in labels:
        raise ConfigError(f"suite: baseline {baseline!r} is not one of the strategies {labels}")
    seeds = _seed_list(options.get("seeds", 10), "[suite] seeds")
    tuning = parse_tuning(_table(spec, "tuning"), seeds, [s.name for s in scenarios])
    entries = _task_limits(
        tasks, [s.name for s in scenarios], tracks, tuning.scenario or scenarios[0].name, entries
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
        tracks,
        bundle_scenarios,
    )
    check_distinct_folders([t.name for t in tasks], "suite: tasks")
    check_distinct_folders([s.name for s in scenarios], "suite: scenarios")
    check_distinct_folders([e.label for e in entries], "suite: strategy labels")
    if any(folder_name(s.name).casefold() == "tuning" for s in scenarios):
        raise ConfigError("suite: no scenario can be named 'tuning' (its folder holds tuning runs)")
    knobs_checked = set()
    for task in suite.tasks:  # every cell's configuration is valid before anything runs
        for scenario in suite.scenarios:
            for e in suite.strategies:
                if e.reason(task.name, scenario.name) is None:
                    config = cell_config(suite, task, scenario, e, seed=0, lr=None, deadline=1.0)
                    resolve(config)
                    check_budget(task, e, config.per_round)
                    if e.tune and (task.name, e.label) not in knobs_checked:
                        check_traced(e.label, e.tune, config)
                        knobs_checked.add((task.name, e.label))
    check_configurations(  # the knobs are traced: now count them
        tuning, {t.name: t.lr_grid or () for t in tasks}, {e.label: e.tune for e in entries}
    )
    return suite


def _names(table: Mapping[str, Any], key: str, task: str) -> tuple[str, ...] | None:
    """A task's ``scenarios`` or ``tracks`` list (checked against the suite's later)."""
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"suite: [tasks.{task}] {key} must be a non-empty list of names, got {value!r}"
        )
    return tuple(value)


def _task_limits(
    tasks: Sequence[Task],
    scenarios: Sequence[str],
    tracks: Sequence[str],
    tuned_in: str,
    entries: list[Entry],
) -> list[Entry]:
    """Each task's ``scenarios`` and ``tracks``, checked against the suite's (and against
    ``tuned_in``, the tuning scenario), as not-applicable reasons on the entries (the ranking
    and coverage count them as such)."""
    for task in tasks:
        for key, known in (("scenarios", scenarios), ("tracks", tracks)):
            given = getattr(task, key)
            if given is not None and (set(given) - set(known) or len(set(given)) != len(given)):
                raise ConfigError(
                    f"suite: [tasks.{task.name}] {key} {list(given)} must be distinct "
                    f"{key} of the suite {list(known)}"
                )
        if task.tracks is not None and tracks[0] not in task.tracks:
            raise ConfigError(
                f"suite: [tasks.{task.name}] tracks {list(task.tracks)} leave out the ranked "
                f"track {tracks[0]!r}"
            )
        if task.scenarios is not None and tuned_in != "each" and tuned_in not in task.scenarios:
            raise ConfigError(
                f"suite: [tasks.{task.name}] scenarios {list(task.scenarios)} leave out the "
                f"tuning scenario {tuned_in!r}, where every strategy's lr is chosen"
            )
    out = []
    for e in entries:
        reasons: dict[str, str] = {}
        for task in tasks:
            if task.tracks is not None and e.track not in task.tracks:
                reasons[task.name] = (
                    f"the {e.track} track does not run on {task.name} ([tasks.{task.name}] "
                    "tracks): sized for the suite's machine"
                )
                continue  # the task's reason, in every scenario
            for name in scenarios:
                if task.scenarios is not None and name not in task.scenarios:
                    reasons[f"{task.name}/{name}"] = (
                        f"{task.name} runs in {', '.join(task.scenarios)} only ([tasks."
                        f"{task.name}] scenarios): sized for the suite's machine"
                    )
        out.append(
            dataclasses.replace(e, not_applicable={**e.not_applicable, **reasons}) if reasons else e
        )
    return out


def _flag(value: Any, strategy: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"suite: strategy {strategy!r}: reference must be true or false")
    return value


def cell_config(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    *,
    seed: int,
    lr: float | None,
    deadline: float | None,
    knobs: Mapping[str, float] | None = None,
) -> RunConfig:
    """The configuration of one cell: the task's fields, then the scenario's, then the
    strategy's; ``per_round = "all"`` is the task's number of clients; ``knobs``: values of
    the strategy's tuned knobs (``strategy_args``)."""
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
    if knobs:
        fields["strategy_args"] = {**(fields.get("strategy_args") or {}), **knobs}
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


def load_suite(path: str | Path) -> Suite:
    return parse_suite(read_config_file(path))
