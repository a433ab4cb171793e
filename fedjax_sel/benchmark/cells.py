"""A suite's cells and units of work.

A cell is one (phase, task, scenario, strategy, seed): a :class:`~fedjax_sel.config.RunConfig`
(:func:`~fedjax_sel.benchmark.suite.cell_config`), the hash its record is keyed by
(:func:`cell_key`) and the metrics its record keeps (:func:`cell_metrics`). A unit of work is
one compiled program: a strategy's tuning grid on a task (:func:`tuning_cells`), or its
evaluation seeds in one scenario at the point its tuning chose (:func:`eval_cells`;
:mod:`fedjax_sel.benchmark.tuned` extends the grid and chooses); a job is a strategy on a
task, its tuning and then its evaluations (:func:`jobs`, :func:`job_units`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedjax_sel.base import AvailabilityModel
from fedjax_sel.benchmark.suite import (
    SUITE_VERSION,
    Entry,
    Scenario,
    Suite,
    Task,
    cell_config,
)
from fedjax_sel.config import RunConfig
from fedjax_sel.engine.system import SystemModel
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.tuning import Point, setting_name


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


# a cell's cost series, per evaluation: the record's field -> metrics.jsonl's field (running
# totals; docs/time.md says what each counts)
SERIES_FIELDS = {
    "round": "round",
    "test_accuracy": "test_accuracy",
    "client_updates": "client_updates",
    "uplink_bytes": "uplink_bytes",
    "client_flops": "client_flops",
    "sim_seconds": "sim_time_s",
}


def cell_series(records: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """A run's evaluations as columns (:data:`SERIES_FIELDS`): the round, the test accuracy
    and the cumulative client updates, uploaded bytes, client FLOPs and simulated seconds
    (the last only where the run has a clock) at each evaluation."""
    out: dict[str, list[float | None]] = {}
    for name, field in SERIES_FIELDS.items():
        if records and all(field in e for e in records):
            out[name] = [None if e[field] is None else float(e[field]) for e in records]
    return out


def crossing(
    xs: Sequence[float], accuracies: Sequence[float | None], target: float
) -> float | None:
    """Where an accuracy curve first reaches ``target``, interpolated linearly between the
    evaluation below it and the first at or above it (``xs``: rounds or seconds at each
    evaluation); the first evaluation's own ``x`` when it already reaches it (an upper bound:
    nothing was evaluated before); ``None`` when no evaluation does."""
    previous = None
    for x, a in zip(xs, accuracies, strict=True):
        if a is None or not np.isfinite(a):
            continue
        if a >= target:
            if previous is None:
                return float(x)
            x0, a0 = previous
            return float(x0 + (target - a0) / (a - a0) * (x - x0))
        previous = (x, a)
    return None


def held_accuracy(
    updates: Sequence[float], accuracies: Sequence[float | None], budget: float
) -> float | None:
    """The accuracy held at ``budget`` client updates: that of the last evaluation made
    within the budget (what a run stopped there reports); ``None`` before the first."""
    held = None
    for u, a in zip(updates, accuracies, strict=True):
        if u > budget:
            break
        if a is not None and np.isfinite(a):
            held = float(a)
    return held


def update_auc(
    updates: Sequence[float], accuracies: Sequence[float | None], budget: float
) -> float | None:
    """The area under held accuracy (:func:`held_accuracy`) against client updates over
    ``[0, budget]``, divided by ``budget``: the mean accuracy held across the budget, 0
    before the first evaluation (so a run that spends more updates before it is evaluated
    scores less, and one evaluated only beyond the budget scores 0); ``None`` for a run
    with no finite evaluation at all."""
    if not any(a is not None and np.isfinite(a) for a in accuracies):
        return None
    area, held, at = 0.0, 0.0, 0.0
    for u, a in zip(updates, accuracies, strict=True):
        if u > budget:
            break
        area += held * (u - at)
        at = float(u)
        if a is not None and np.isfinite(a):
            held = float(a)
    return (area + held * (budget - at)) / budget


def cell_metrics(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    config: RunConfig,
    task: Task,
) -> dict[str, float | None]:
    """A finished run's metrics as the suite records them (``None``: not applicable, or a
    target never reached): the summary's accuracies and spreads; the accuracy after each of
    ``task.budgets`` rounds and held at each of ``task.update_budgets`` client updates; the
    area under accuracy against client updates up to the largest of those; and the rounds
    and simulated seconds to ``task.target`` (:func:`crossing`: interpolated between
    evaluations)."""
    out: dict[str, float | None] = {}
    for key in ("final_accuracy", "peak_accuracy", "stable_accuracy", "jain_fairness"):
        v = summary.get(key)
        out[key] = None if v is None else float(v)
    for key, field in (
        ("client_accuracy_mean", "final_client_test_accuracy_mean"),
        ("client_accuracy_std", "final_client_test_accuracy_std"),
        ("client_accuracy_bottom10", "final_client_test_accuracy_bottom10"),
    ):
        v = summary.get(field)
        out[key] = None if v is None else float(v)
    for b in task.budgets:
        before = [e for e in records if e["round"] <= b and e.get("test_accuracy") is not None]
        out[f"accuracy@{b}"] = float(before[-1]["test_accuracy"]) if before else None
    series = cell_series(records)
    accuracy = series.get("test_accuracy", [])
    updates = series.get("client_updates")
    if updates is not None and task.update_budgets:
        for b in task.update_budgets:
            out[f"accuracy@updates:{b}"] = held_accuracy(updates, accuracy, b)
        out["update_auc"] = update_auc(updates, accuracy, max(task.update_budgets))
    timed = "sim_seconds" in series
    if task.target is not None:
        out["rounds_to_target"] = crossing(series.get("round", []), accuracy, task.target)
        if timed:
            out["time_to_target"] = crossing(series["sim_seconds"], accuracy, task.target)
        out["reached_target"] = 0.0 if out["rounds_to_target"] is None else 1.0
    if timed:
        out["sim_time_s"] = float(records[-1]["sim_time_s"])
        if config.deadline is not None:
            seconds = [s for e in records for s in e.get("round_seconds", [])]
            hits = sum(1 for s in seconds if s >= config.deadline * (1 - 1e-6))
            out["deadline_hit_share"] = hits / len(seconds) if seconds else None
    return out


def per_seed(store: Store, scenario: str, strategy: str, seeds: Sequence[int]) -> dict[int, dict]:
    """The evaluation records of one strategy in one scenario, by seed (seeds of the suite)."""
    out = {}
    for s in seeds:
        r = store.records.get(
            Store.id({"phase": "eval", "scenario": scenario, "strategy": strategy, "seed": s})
        )
        if r is not None and r.get("suite_version") == SUITE_VERSION:
            out[s] = r
    return out


# a scenario's deadline must cut between these shares of the realised uniform rounds
DEADLINE_CUT_BOUNDS = (0.25, 0.75)


class Deadline(NamedTuple):
    """A scenario's deadline in seconds and the share of the realised uniform rounds (without
    a deadline) longer than it: the rounds it cuts."""

    seconds: float
    cut_share: float


class _RoundClock(NamedTuple):
    """What the engine's per-round keys read of a SimState (``phases.round_key``)."""

    key: Any
    round: Any


def uniform_rounds(
    availability: AvailabilityModel,
    system: SystemModel,
    kbit: float,
    *,
    rounds: int,
    per_round: int,
    slots: int,
    dropout: float,
) -> Callable[..., np.ndarray]:
    """``lengths(sim_key, samples, steps, sim=None) -> float32[rounds]``: the length of each
    round of one simulation without a deadline when ``slots`` clients are drawn uniformly
    among the available ones (the ``uniform`` strategy's draw), with the engine's keys
    (``sim_key``: the simulation's key, ``fold_in(key(seed), 2)``), availability process,
    per-round device speeds and :func:`~fedjax_sel.engine.system.round_timing` (dropouts; the
    round lasts until the ``per_round``-th live finisher, or the last live one when fewer
    are alive; 0 s when none is). ``samples``/``steps``: each client's local work
    (:func:`~fedjax_sel.engine.system.client_work`); ``sim``: the simulation's
    :class:`~fedjax_sel.engine.state.SimSpec`, for availability models whose ``init`` reads
    it."""
    import jax
    import jax.numpy as jnp

    from fedjax_sel.engine import phases
    from fedjax_sel.engine import system as system_lib
    from fedjax_sel.engine.state import environment_states
    from fedjax_sel.kernels import uniform_without_replacement

    @jax.jit
    def scan(sim_key, avail_state, system_state, samples, steps):
        def one(avail_state, r):
            clock = _RoundClock(sim_key, r)
            k_avail, k_select, _ = phases.round_keys(clock)
            available, avail_state = availability.step(avail_state, k_avail)
            # the engine's own per-purpose tags, so each draw is the run's
            ms, bw = system.step(system_state, phases.system_key(clock))
            compute, comm = system_lib.durations(ms, bw, samples, kbit)
            clients, mask = uniform_without_replacement(k_select, available, slots)
            timing = system_lib.round_timing(
                mask,
                compute[clients],
                comm[clients],
                steps[clients],
                phases.dropout_key(clock),
                keep_count=per_round,
                deadline=None,
                dropout=dropout,
            )
            return avail_state, timing.duration

        return jax.lax.scan(one, avail_state, jnp.arange(rounds, dtype=jnp.int32))[1]

    def lengths(sim_key, samples, steps, sim=None) -> np.ndarray:
        avail_state, system_state = environment_states(
            availability, system, sim_key, samples.shape[0], sim
        )
        return np.asarray(scan(sim_key, avail_state, system_state, samples, steps))

    return lengths


def cut_share(lengths: Sequence[float] | np.ndarray, deadline: float) -> float:
    """The share of rounds a ``deadline`` cuts: those longer than it (a round whose slowest
    kept client finishes after the deadline ends at the deadline)."""
    return float(np.mean(np.asarray(lengths, np.float64) > deadline))


def realised_uniform_rounds(
    suite: Suite, task: Task, scenario: Scenario, data_memo: MutableMapping[str, Any] | None = None
) -> np.ndarray:
    """The length of every round of ``task`` in ``scenario`` on every evaluation seed
    (float32[seeds, rounds]), as each seed's simulation runs it without a deadline when
    ``uniform`` picks its slots (:func:`uniform_rounds`: the scenario's availability, per-round
    device speeds, over-commitment and dropouts; each seed's own data partition and keys).
    ``data_memo``: data sets loaded before (:func:`~fedjax_sel.experiment.build.
    load_data_for`), reused and added to."""
    import jax

    from fedjax_sel.availability import AVAILABILITY
    from fedjax_sel.engine import system as system_lib
    from fedjax_sel.engine.state import seed_keys, sim_spec
    from fedjax_sel.experiment.build import load_data_for, model_for

    baseline = next(e for e in suite.strategies if e.label == suite.baseline)
    lengths, run = [], None
    memo = {} if data_memo is None else data_memo  # each data seed loaded once
    for seed in suite.seeds:
        resolved = resolve(
            cell_config(suite, task, scenario, baseline, seed=seed, lr=None, deadline=1.0)
        )
        config = resolved.config
        dataset = load_data_for(config, memo)
        model = model_for(config, dataset)
        k = dataset.num_clients
        slots = system_lib.overcommitted(config.per_round, config.overcommit, k)
        availability = resolved.availability.build(AVAILABILITY)
        if run is None:
            kbit = system_lib.model_kbit(jax.eval_shape(model.init, jax.random.key(0)))
            run = uniform_rounds(
                availability,
                resolved.system.build(system_lib.SYSTEMS),
                kbit,
                rounds=config.rounds,
                per_round=config.per_round,
                slots=slots,
                dropout=config.dropout,
            )
        samples, steps = system_lib.client_work(
            jax.numpy.asarray(dataset.train.counts),
            config.batch_size,
            config.local_steps,
            config.local_epochs,
        )
        model_key, sim_key = seed_keys(seed)  # the simulation's keys, as Simulation.init's
        sim = None
        if availability.needs_spec:
            params = model.init(model_key)
            sim = sim_spec(dataset, params, per_round=slots, num_rounds=config.rounds)
        lengths.append(run(sim_key, samples, steps, sim))
    return np.stack(lengths)


def deadline_for(
    suite: Suite, task: Task, scenario: Scenario, data_memo: MutableMapping[str, Any] | None = None
) -> Deadline:
    """The deadline at ``scenario.deadline_quantile`` of the realised uniform rounds' lengths
    (:func:`realised_uniform_rounds`, pooled over the seeds; rounded to 0.1 s) and the share of
    those rounds it cuts."""
    realised = realised_uniform_rounds(suite, task, scenario, data_memo)
    realised = realised.astype(np.float64).ravel()
    seconds = float(np.round(np.quantile(realised, scenario.deadline_quantile), 1))
    return Deadline(seconds, cut_share(realised, seconds))


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
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    out: Path,
    deadline: float | None,
    points: Sequence[Point] | None = None,
    step: int = 0,
) -> list[Planned]:
    """The tuning cells of ``entry`` on ``task`` in ``scenario``: each configuration of
    ``points`` (default: the initial grid, :meth:`~.suite.Suite.tuning_grid`) on every tuning
    seed, one compiled program (the lr and the knobs are traced). ``step``: 0 for the initial
    grid, ``i`` for its ``i``-th extension (:mod:`.tuned`). Empty without tuning."""
    if points is None:
        points = suite.tuning_grid(task, entry)
    if not suite.tuning.enabled or not points:
        return []
    planned = []
    for lr, knob_pairs in points:
        knobs = dict(knob_pairs)
        setting = folder_name(setting_name({"lr": f"{lr:g}", **knobs}))
        for seed in suite.tuning.seeds:
            config = cell_config(
                suite, task, scenario, entry, seed=seed, lr=lr, deadline=deadline, knobs=knobs
            )
            ident = {
                "phase": "tune",
                "scenario": scenario.name,
                "strategy": entry.label,
                "seed": seed,
                "lr": lr,
                **({"knobs": knobs} if knobs else {}),
                "step": step,
            }
            where = (
                out
                / "runs"
                / folder_name(task.name)
                / "tuning"
                / folder_name(scenario.name)
                / folder_name(entry.label)
                / setting
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
    knobs: Mapping[str, float] | None = None,
) -> list[Planned]:
    """The evaluation cells of ``entry`` on ``task`` in ``scenario`` at the tuned ``lr`` and
    ``knobs`` (``None``: the task's own lr, the knobs' defaults): one per evaluation seed, one
    compiled program."""
    planned = []
    where = (
        out
        / "runs"
        / folder_name(task.name)
        / folder_name(scenario.name)
        / folder_name(entry.label)
    )
    for seed in suite.seeds:
        config = cell_config(
            suite, task, scenario, entry, seed=seed, lr=lr, deadline=deadline, knobs=knobs
        )
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
    and its number of cells: a tuning grid (configurations x tuning seeds; the extensions it
    may add are not known ahead), then the evaluations at the point it chose (the evaluation
    seeds), for each scenario it is tuned in."""
    by_name = {s.name: s for s in suite.scenarios}
    points = len(suite.tuning_grid(task, entry)) * len(suite.tuning.seeds)
    units = []
    for tune_name, scenarios in tuned_scenarios(suite, task, entry).items():
        if points:
            units.append((by_name[tune_name], points))
        units += [(s, len(suite.seeds)) for s in scenarios]
    return units
