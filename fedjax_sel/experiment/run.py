"""Global-model runs: :func:`run_group` runs configurations that share one compiled program
(they differ only in their seed) in lockstep, their states stacked on a leading seed axis and
every chunk of rounds one vmapped call (:meth:`Simulation.run_rounds_batch`); a group of one
runs unbatched. Each member writes its own folder and resumes from its own checkpoint, so a
killed run or sweep produces, once resumed, the same files bit for bit as one that was never
interrupted (timings aside). :func:`run_experiment` is the group of one behind
``fedjax-sel run``; ``mode="personalized"`` runs go to :mod:`.personalized`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import jax

from fedjax_sel import metrics as metrics_lib
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.distributed import is_primary, to_host
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.state import (
    NotStackable,
    SimData,
    SimState,
    stack_sim_data,
    stack_states,
    unstack_state,
)
from fedjax_sel.experiment.batching import BatchChoice, measured_batch
from fedjax_sel.experiment.build import build_simulation, load_data_for
from fedjax_sel.experiment.loop import (
    Member,
    RunResult,
    chunk_fields,
    drive,
    finished_result,
    program_key,
    restore_member,
    traced_settings,
    write_config,
)
from fedjax_sel.experiment.outdir import claim, owned
from fedjax_sel.experiment.outputs import CHECKPOINT, METRICS
from fedjax_sel.experiment.personalized import run_personalized
from fedjax_sel.experiment.resolve import Resolved, resolve
from fedjax_sel.models import Model
from fedjax_sel.strategies.registry import traced_values
from fedjax_sel.training.hparams import HParams
from fedjax_sel.tree import nbytes


class GlobalEngine:
    """One global-model simulation per member; several members run vmapped over seeds.

    ``data``: the members' stacked data (several members), a single member's own data, or
    ``None`` (the simulation's).
    """

    def __init__(
        self,
        sim: Simulation,
        states: list[SimState],
        data: SimData | None = None,
        *,
        profile: bool = False,
    ):
        self.sim, self.task, self.profile = sim, sim.spec.model.task, profile
        self.timed = sim.spec.system is not None
        self.batched = len(states) > 1
        self.data = data
        self.states = stack_states(states) if self.batched else states[0]

    def advance(self, n: int) -> tuple[list[dict], dict[str, float]]:
        t0 = time.perf_counter()
        if self.batched:
            self.states, logs = self.sim.run_rounds_batch(self.states, self.data, n)
            jax.block_until_ready(self.states.params)
            members = logs.round.shape[0]
            fields = [chunk_fields(logs, i, self.timed) for i in range(members)]
            return fields, {"rounds": time.perf_counter() - t0}
        # the driver holds the only reference to its state: the rounds may reuse its buffers
        if self.profile:
            self.states, logs, phases = self.sim.run_rounds_profiled(
                self.states, n, self.data, donate=True
            )
        else:
            self.states, logs = self.sim.run_rounds(self.states, n, self.data, donate=True)
            jax.block_until_ready(self.states.params)
            phases = {"rounds": time.perf_counter() - t0}
        return [chunk_fields(logs, timed=self.timed)], phases

    def evaluate(self) -> list[dict[str, float]]:
        if self.batched:
            return self.sim.evaluate_batch(self.states, self.data)
        return [self.sim.evaluate(self.states, self.data)]

    def compiled_texts(self) -> list[str]:
        """The compiled programs of a chunk and of the evaluation (for trace analysis)."""
        return self.sim.compiled_texts(self.states, self.data, batched=self.batched)

    def member_state(self, i: int) -> SimState:
        return unstack_state(self.states, i) if self.batched else self.states

    def summary(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        del records
        state = self.member_state(i)
        counts, weight_sums = to_host((state.selection_counts, state.weight_sums))
        return {
            **metrics_lib.selection_summary(counts),
            "selection_counts": counts.tolist(),
            "weight_sums": weight_sums.tolist(),
            "client_parallelism": list(self.sim.spec.trainer.parallel[:2]),  # mode, chunk
        }

    def describe(self) -> dict[str, Any]:
        choice = self.sim.parallel_choice
        return {
            "model": self.sim.spec.model.name,
            "client_parallelism": list(self.sim.spec.trainer.parallel[:2]),
            "parallel_choice": None if choice is None else choice.to_dict(),
            # config.json reruns the mode this run used, whatever a new measurement would pick
            "resolved_config": {"parallel": self.sim.spec.trainer.parallel.text()},
        }


# ----------------------------------------------------------------------------- groups
def _memory_budget() -> float:
    """Bytes a batch of seeds may use: half the device's memory (its ``bytes_limit``; the
    host's physical memory on CPU). The total, not what is free now: the bound is part of the
    batch cache's key, so on one machine the same configuration always gets the same batches
    (what is free changes from run to run, and a run's last bits can depend on its batch)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 (backends without memory statistics)
        stats = {}
    if stats.get("bytes_limit"):
        return 0.5 * float(stats["bytes_limit"])
    try:
        return 0.5 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4e9


def member_bytes(config: RunConfig, state: SimState, data_bytes: int) -> int:
    """A rough upper estimate of one seed's memory in a vmapped batch: its state four times
    (inputs, outputs and transients of the chunk), its own data when seeds do not share it, and
    three models per trained slot (parameters, optimizer state, delta)."""
    return 4 * nbytes(state) + data_bytes + 3 * config.per_round * nbytes(state.params)


def batch_size(
    seeds_together: int | str, config: RunConfig, state: SimState, data_bytes: int, n: int
) -> int:
    """Seeds per vmapped batch: ``seeds_together``, or with ``"auto"`` as many as fit half the
    device's memory (:func:`_memory_budget`) by :func:`member_bytes` (at least one, at most
    ``n``): the bound within which
    :func:`fedjax_sel.experiment.batching.measured_batch` then measures."""
    if seeds_together != "auto":
        return max(1, min(n, int(seeds_together)))
    per = max(member_bytes(config, state, data_bytes), 1)
    return int(max(1, min(n, _memory_budget() // per)))


class _GroupData:
    """The members' data as the simulation reads it: every batch, and every member alone,
    padded to the group's largest shapes, so all of them run one compiled program (padding is
    masked: each member computes what it computes unpadded)."""

    def __init__(self, sim: Simulation, datasets: list[FederatedDataset], shared: bool):
        self.sim, self.datasets, self.shared = sim, datasets, shared
        self.group = [SimData.of(d) for d in {id(d): d for d in datasets}.values()]

    def batch(self, members: list[int]) -> SimData | None:
        """Stacked data of ``members`` (``None``: shared); raises :class:`NotStackable`."""
        if self.shared:
            return None
        parts = [SimData.of(self.datasets[i]) for i in members]
        return stack_sim_data(parts, pad_like=self.group)

    def alone(self, i: int) -> SimData | None:
        if self.shared:
            return None
        try:
            padded = jax.tree.map(lambda x: x[0], self.batch([i]))
        except NotStackable:
            padded = SimData.of(self.datasets[i])
        return self.sim.place(padded)

    def round_seconds(self, state: SimState, b: int) -> float:
        """Seconds of one round per member, ``b`` copies of ``state`` (on the first member's
        data) vmapped together: the program the run then uses for that batch size."""
        if b == 1:
            return self.sim.time_round(state, self.alone(0))
        data = self.batch([0] * b)
        return self.sim.time_round(stack_states([state] * b), data, batched=True) / b


def run_group(
    configs: Sequence[RunConfig | Resolved],
    outs: Sequence[Path | None],
    *,
    infos: Sequence[dict[str, Any]] | None = None,
    seeds_together: int | str = "auto",
    dataset: FederatedDataset | None = None,
    model: Model | None = None,
    bar: Any = None,
    echo: Callable = print,
    resume: bool = True,
    trace_dir: str | Path | None = None,
    data_memo: MutableMapping[str, FederatedDataset] | None = None,
    plots: bool = True,
) -> list[RunResult]:
    """Runs configurations that share one compiled program (same :func:`program_key`: they
    differ in seed and traced hyperparameters) together: vmapped in batches of
    ``seeds_together`` members (``"auto"``: measured within the memory bound,
    :mod:`.batching`) with the whole simulation state stacked on a leading member axis.
    Members resume from their checkpoints (``resume``); those at the same round run together.
    Each configuration is resolved once, here (:func:`~fedjax_sel.experiment.resolve.resolve`;
    a :class:`Resolved` is taken as it is).

    Args:
      infos: extra ``config.json`` entries per member (a sweep's label and setting).
      dataset: an already loaded data set, used when every member's data seed is the same.
      model: replaces the configured model (every member).
      data_memo: data sets loaded before, reused and added to
        (:func:`~fedjax_sel.experiment.build.load_data_for`).
      plots: write each finished member's curves (``curves.png``) to its folder.
    """
    if not configs:
        return []
    resolved = [resolve(c) for c in configs]
    if len({program_key(r.config) for r in resolved}) > 1:
        raise ConfigError(
            "run_group: the configurations differ in more than their seeds and traced "
            "hyperparameters"
        )
    # every program of the group is traced (and cached) under the configured precision;
    # "default" keeps the process's own (jax.default_matmul_precision or its environment
    # variable; unset, XLA's: TensorFloat-32 products on recent NVIDIA GPUs)
    precision = resolved[0].config.matmul_precision
    with (
        contextlib.nullcontext()
        if precision == "default"
        else jax.default_matmul_precision(precision)
    ):
        options = dict(resume=resume, trace_dir=trace_dir, data_memo=data_memo, plots=plots)
        return _run_group(
            resolved, outs, infos, seeds_together, dataset, model, bar, echo, **options
        )


def _run_group(
    resolved,
    outs,
    infos,
    seeds_together,
    dataset,
    model,
    bar,
    echo,
    *,
    resume,
    trace_dir,
    data_memo,
    plots,
) -> list[RunResult]:
    infos = list(infos) if infos is not None else [{} for _ in resolved]
    if resolved[0].config.mode == "personalized":
        return [
            r
            for c, o, info in zip(resolved, outs, infos, strict=True)
            for r in run_personalized(
                c, o, info=info, dataset=dataset, bar=bar, echo=echo, resume=resume
            )
        ]
    configs = [r.config for r in resolved]
    data_seeds = [c.seed if c.data_seed is None else c.data_seed for c in configs]
    shared = len(set(data_seeds)) == 1
    if shared:
        first = dataset if dataset is not None else load_data_for(configs[0], data_memo)
        datasets = [first] * len(configs)
    else:  # members differ only in seed and traced hyperparameters: one load per data seed
        loaded: dict[int, FederatedDataset] = {}
        for c, s in zip(configs, data_seeds, strict=True):
            if s not in loaded:
                loaded[s] = load_data_for(c, data_memo)
        datasets = [loaded[s] for s in data_seeds]
    sim = build_simulation(
        resolved[0], datasets[0], model=model, n_max=max(d.train.n_max for d in datasets)
    )
    members = [
        Member(c, None if o is None else Path(o), info=info, readonly=not is_primary(), plots=plots)
        for c, o, info in zip(configs, outs, infos, strict=True)
    ]
    states = []
    for m, d in zip(members, datasets, strict=True):
        fresh = sim.init(
            m.config.seed,
            dataset=None if shared else d,
            hparams=HParams.from_config(m.config),
            strategy_hparams=traced_values(
                m.config.strategy, sim.spec.slots, m.config.strategy_args
            ),
        )
        restored = restore_member(m, fresh, echo) if resume else None
        if restored is None and m.writes:
            m.out.mkdir(parents=True, exist_ok=True)
            (m.out / METRICS).write_text("")
            (m.out / CHECKPOINT).unlink(missing_ok=True)
        states.append(fresh if restored is None else restored)
    data_bytes = 0 if shared else nbytes(datasets[0].train)
    size = batch_size(seeds_together, configs[0], states[0], data_bytes, len(members))
    group = _GroupData(sim, datasets, shared)
    choice = None
    if seeds_together == "auto" and len(members) > 1:
        choice = measured_batch(
            f"{program_key(configs[0])}/{sim.spec.model.name}",
            size,
            lambda b: group.round_seconds(states[0], b),
            echo=echo,
        )
        size = choice.size
    elif len(members) > 1:  # recorded too: a rerun with this size reproduces the batches
        choice = BatchChoice(size, "given", size)
    batches: list[list[int]] = []
    for r in sorted({m.done for m in members}):  # members resumed at the same round together
        same = [i for i, m in enumerate(members) if m.done == r]
        batches += [same[j : j + size] for j in range(0, len(same), size)]
    results: dict[int, RunResult] = {}
    for batch in batches:
        try:
            data = group.batch(batch) if len(batch) > 1 else None
            parts = [batch]
        except NotStackable as e:
            echo(f"seeds run one by one: {e}")
            parts = [[i] for i in batch]
        for part in parts:
            part_data = data if len(part) > 1 else group.alone(part[0])
            engine = GlobalEngine(
                sim,
                [states[i] for i in part],
                part_data,
                profile=configs[0].profile and len(part) == 1,
            )
            together = [members[i].config.seed for i in part]
            points = [traced_settings(members[i].config) for i in part]
            for i in part:
                if any(p != points[0] for p in points):  # grid points in one batch: say which
                    members[i].info["hparams_vmapped"] = points
                if choice is not None:
                    members[i].info["batch_choice"] = choice.to_dict()
                write_config(members[i], datasets[i], engine.describe(), together)
            if bar is not None and members[part[0]].done:
                bar.update(members[part[0]].done * len(part))
            finished = drive(
                engine, [members[i] for i in part], bar=bar, echo=echo, trace_dir=trace_dir
            )
            for i, r in zip(part, finished, strict=True):
                r.simulation = sim
                results[i] = r
    return [results[i] for i in range(len(members))]


def run_experiment(
    config: RunConfig | Resolved,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    dataset: FederatedDataset | None = None,
    model: Model | None = None,
    echo: Callable = print,
    resume: bool = False,
    trace_dir: str | Path | None = None,
    overwrite: bool = False,
) -> RunResult:
    """Runs ``config`` to the end (or to divergence) and writes its folder (nothing is written
    when ``out_dir`` is ``None``). ``resume``: continue from ``out_dir``'s checkpoint when it
    has one (a finished run is returned as it is). ``config`` is resolved once, here (a
    :class:`Resolved` is taken as it is).

    ``out_dir`` is locked while the run writes (:mod:`.outdir`: a second writer is refused),
    and a folder holding results of another configuration is refused unless ``overwrite``."""
    out = None if out_dir is None else Path(out_dir)
    resolved = resolve(config)
    with owned(out, echo):
        if out is not None:
            key = resolved.config.results_key()
            claim([(out, key)], "this run", overwrite=overwrite, echo=echo)
        return _run_experiment(resolved, out, progress, dataset, model, echo, resume, trace_dir)


def _run_experiment(
    resolved: Resolved,
    out: Path | None,
    progress: bool,
    dataset: FederatedDataset | None,
    model: Model | None,
    echo: Callable,
    resume: bool,
    trace_dir: str | Path | None,
) -> RunResult:
    config = resolved.config
    if resume and out is not None:
        done = finished_result(config, out)
        if done is not None:
            echo(f"{out} already holds this finished run; nothing to do")
            return done
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.rounds, desc=config.display_name, unit="round", leave=True)
    try:
        (result,) = run_group(
            [resolved],
            [out],
            dataset=dataset,
            model=model,
            bar=bar,
            echo=echo,
            resume=resume,
            trace_dir=trace_dir,
        )
    finally:
        if bar is not None:
            bar.close()
    return result
