"""The one run loop: from configurations to finished run folders.

:func:`run_group` runs several configurations that share one compiled program (they differ
only in their seed) in lockstep: their states are stacked on a leading seed axis and every
chunk of rounds is one vmapped call (:meth:`Simulation.run_rounds_batch`); a group of one runs
unbatched. Each member writes its own folder (:mod:`.outputs`) and checkpoints its own slice of
the state every ``checkpoint_every`` chunks (:mod:`.checkpoint`), so a killed run or sweep
resumes where it stopped and produces the same files, bit for bit, as one that was never
interrupted (timings aside). :func:`run_experiment` is the group of one behind
``fedjax-sel run``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel import metrics as metrics_lib
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset, load_dataset
from fedjax_sel.experiment import checkpoint as ckpt
from fedjax_sel.experiment.outputs import (
    CHECKPOINT,
    CONFIG,
    CURVES,
    METRICS,
    SUMMARY,
    dumps,
    plot_curves,
    read_json,
    read_metrics,
    write_json,
)
from fedjax_sel.models import Model, make_model
from fedjax_sel.simulation import (
    NotStackable,
    RoundLog,
    SimData,
    SimState,
    Simulation,
    default_mesh,
    stack_sim_data,
    stack_states,
    unstack_state,
)
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training.local import LocalConfig
from fedjax_sel.training.server import server_optimizer


# ----------------------------------------------------------------------------- building
def load_data_for(config: RunConfig) -> FederatedDataset:
    """The data set of ``config`` (partitioned with its data seed)."""
    return load_dataset(
        config.dataset,
        num_clients=config.num_clients,
        partition=config.partition,
        seed=config.seed if config.data_seed is None else config.data_seed,
        data_path=config.data_path,
        test_fraction=config.test_fraction,
        layout=config.layout,
        server_fraction=config.server_fraction,
        **config.dataset_args,
    )


def local_config(config: RunConfig) -> LocalConfig:
    return LocalConfig(
        batch_size=config.batch_size,
        lr=float(config.lr),
        local_steps=config.local_steps,
        local_epochs=config.local_epochs,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        prox_mu=config.prox_mu,
    )


def model_for(config: RunConfig, dataset: FederatedDataset) -> Model:
    return make_model(
        config.model or dataset.default_model,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        **config.model_args,
    )


def build_simulation(
    config: RunConfig,
    dataset: FederatedDataset | None = None,
    *,
    model: Model | None = None,
    n_max: int | None = None,
) -> Simulation:
    """The :class:`Simulation` of ``config`` (loading the data unless given; ``model``
    replaces the configured one, e.g. a user's own flax model)."""
    config.resolve()
    dataset = dataset if dataset is not None else load_data_for(config)
    return Simulation(
        dataset,
        model if model is not None else model_for(config, dataset),
        make_strategy(config.strategy, config.per_round, **config.strategy_args),
        local=local_config(config),
        per_round=config.per_round,
        num_rounds=config.rounds,
        availability=availability_lib.from_spec(config.availability),
        server_tx=server_optimizer(
            config.server,
            config.server_lr,
            momentum=config.server_momentum,
            weight_decay=config.server_weight_decay,
        ),
        parallel=config.parallel,
        persistent_client_state=config.persistent_client_state,
        chunk_size=config.eval_every,
        mesh=default_mesh(),
        n_max=n_max,
    )


# ----------------------------------------------------------------------------- engines
class Engine(Protocol):
    """What the run loop drives: ``n`` members (seeds) advancing in lockstep."""

    task: str

    def advance(self, n: int) -> tuple[list[dict], dict[str, float]]:
        """Runs ``n`` rounds; per member the chunk's record fields (``train_loss``,
        ``selected`` ... and ``_client_updates``, ``_bad_round``), and phase seconds."""

    def evaluate(self) -> list[dict[str, float]]:
        """Per member, the evaluation's scalars."""

    def member_state(self, i: int) -> Any:
        """Member ``i``'s state (what a checkpoint holds)."""

    def summary(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Member ``i``'s engine-specific summary fields (``records``: its evaluations)."""

    def describe(self) -> dict[str, Any]:
        """The resolved settings for ``config.json``."""


# diagnostics that are running totals: a chunk reports its last round's value (the others: the
# mean over the chunk's rounds)
LAST_VALUE_DIAGNOSTICS = frozenset({"never_picked"})


def chunk_fields(logs: RoundLog, index: int | None = None) -> dict[str, Any]:
    """Record fields of one member's round logs (``index`` into a stacked batch)."""
    if index is not None:
        logs = jax.tree.map(lambda a: a[index], logs)
    bad = (~logs.finite) | ((logs.num_selected > 0) & ~np.isfinite(logs.train_loss))
    finite = np.isfinite(logs.train_loss)
    diagnostics = {
        k: (np.asarray(v)[-1] if k in LAST_VALUE_DIAGNOSTICS else np.mean(v, axis=0)).tolist()
        for k, v in logs.diagnostics.items()
    }
    return {
        "diagnostics": diagnostics,
        "train_loss": float(np.mean(logs.train_loss[finite])) if np.any(finite) else None,
        "num_available_mean": float(np.mean(logs.num_available)),
        "num_selected_mean": float(np.mean(logs.num_selected)),
        "selected": [row[m].tolist() for row, m in zip(logs.clients, logs.mask, strict=True)],
        "_client_updates": int(np.sum(logs.num_selected)),
        "_bad_round": int(logs.round[np.argmax(bad)]) if np.any(bad) else None,
    }


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
        self.sim, self.task, self.profile = sim, sim.model.task, profile
        self.batched = len(states) > 1
        self.data = data
        self.states = stack_states(states) if self.batched else states[0]

    def advance(self, n: int) -> tuple[list[dict], dict[str, float]]:
        t0 = time.perf_counter()
        if self.batched:
            self.states, logs = self.sim.run_rounds_batch(self.states, self.data, n)
            jax.block_until_ready(self.states.params)
            members = logs.round.shape[0]
            fields = [chunk_fields(logs, i) for i in range(members)]
            return fields, {"rounds": time.perf_counter() - t0}
        if self.profile:
            self.states, logs, phases = self.sim.run_rounds_profiled(self.states, n, self.data)
        else:
            self.states, logs = self.sim.run_rounds(self.states, n, self.data)
            jax.block_until_ready(self.states.params)
            phases = {"rounds": time.perf_counter() - t0}
        return [chunk_fields(logs)], phases

    def evaluate(self) -> list[dict[str, float]]:
        if self.batched:
            return self.sim.evaluate_batch(self.states, self.data)
        return [self.sim.evaluate(self.states, self.data)]

    def member_state(self, i: int) -> SimState:
        return unstack_state(self.states, i) if self.batched else self.states

    def summary(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        del records
        state = self.member_state(i)
        counts = np.asarray(state.selection_counts)
        return {
            **metrics_lib.selection_summary(counts),
            "selection_counts": counts.tolist(),
            "weight_sums": np.asarray(state.weight_sums).tolist(),
            "client_parallelism": list(self.sim.parallel),
        }

    def describe(self) -> dict[str, Any]:
        return {"model": self.sim.model.name, "client_parallelism": list(self.sim.parallel)}


# ----------------------------------------------------------------------------- members
@dataclasses.dataclass
class RunResult:
    """A finished run: its configuration, evaluation records and summary (``state`` and
    ``simulation`` when it ran in this process, ``None`` when read from a finished folder)."""

    config: RunConfig
    evals: list[dict[str, Any]]
    summary: dict[str, Any]
    state: Any = None
    simulation: Any = None
    out_dir: Path | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Member:
    config: RunConfig
    out: Path | None
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    done: int = 0
    client_updates: int = 0
    train_seconds: float = 0.0
    chunks: list[list[float]] = dataclasses.field(default_factory=list)
    diverged: dict[str, Any] | None = None
    start: float = dataclasses.field(default_factory=time.perf_counter)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.diverged is None and self.done < self.config.rounds

    def bookkeeping(self) -> dict[str, Any]:
        return {
            "round": self.done,
            "records": len(self.records),
            "client_updates": self.client_updates,
            "train_seconds": self.train_seconds,
            "chunks": self.chunks,
        }


def finished_result(config: RunConfig, out: Path) -> RunResult | None:
    """The stored result of ``out`` when it holds a finished run of exactly ``config``
    (every setting that can change the results equal), else ``None``."""
    if not (out / SUMMARY).exists() or not (out / CONFIG).exists():
        return None
    try:
        stored = RunConfig.from_dict(read_json(out / CONFIG)["config"]).resolve()
    except (ConfigError, KeyError, TypeError):
        return None
    if stored.results_key() != config.results_key():
        return None
    return RunResult(config, read_metrics(out / METRICS), read_json(out / SUMMARY), out_dir=out)


def _write_config(member: _Member, dataset: FederatedDataset, engine_info: dict) -> None:
    if member.out is None:
        return
    member.out.mkdir(parents=True, exist_ok=True)
    write_json(
        member.out / CONFIG,
        {
            "config": member.config.to_dict(),
            "dataset": {"name": dataset.name, "num_clients": dataset.num_clients, **dataset.info},
            **engine_info,
            **member.info,
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "jax_version": jax.__version__,
        },
    )


def _restore(member: _Member, template: Any, echo: Callable) -> Any | None:
    """Loads ``member``'s checkpoint (state, bookkeeping; ``metrics.jsonl`` cut back to the
    checkpoint's records) or returns ``None`` when there is none."""
    if member.out is None or not (member.out / CHECKPOINT).exists():
        return None
    state, header = ckpt.load_checkpoint(
        member.out / CHECKPOINT, template, results_key=member.config.results_key()
    )
    member.records = read_metrics(member.out / METRICS, header["records"])
    if len(member.records) != header["records"]:
        raise ConfigError(
            f"{member.out / METRICS} holds {len(member.records)} complete records but the "
            f"checkpoint expects {header['records']}"
        )
    member.done = header["round"]
    member.client_updates = header["client_updates"]
    member.train_seconds = header["train_seconds"]
    member.chunks = header["chunks"]
    (member.out / METRICS).write_text("".join(dumps(r) + "\n" for r in member.records))
    echo(f"resuming {member.out} at round {member.done}")
    return state


def _summary(member: _Member, engine: Engine, i: int) -> dict[str, Any]:
    config, evals = member.config, member.records
    steady = member.chunks[1:] or member.chunks
    seconds = sum(c[2] for c in steady)
    summary: dict[str, Any] = {
        "strategy": config.strategy,
        "label": config.display_name,
        "dataset": config.dataset,
        "seed": config.seed,
        "rounds_completed": member.done,
        **(
            metrics_lib.accuracy_summary([e.get("test_accuracy") for e in evals])
            if engine.task == "classification"
            else {}
        ),
        **metrics_lib.loss_summary([e.get("test_loss") for e in evals]),
        **(
            {"final_client_test_accuracy_mean": evals[-1]["client_test_accuracy_mean"]}
            if evals and evals[-1].get("client_test_accuracy_mean") is not None
            else {}
        ),
        **engine.summary(i, evals),
        "wall_seconds": time.perf_counter() - member.start,
        "train_seconds": member.train_seconds,
        "rounds_per_second": sum(c[0] for c in steady) / seconds if seconds > 0 else None,
        "client_updates_per_second": sum(c[1] for c in steady) / seconds if seconds > 0 else None,
        "first_chunk_seconds": member.chunks[0][2] if member.chunks else None,
        "diverged": member.diverged is not None,
    }
    if member.diverged is not None:
        summary["diverged_at_round"] = member.diverged["round"]
        summary["message"] = member.diverged["message"]
    return summary


def _finish(member: _Member, engine: Engine, i: int, echo: Callable) -> RunResult:
    summary = _summary(member, engine, i)
    if member.diverged is not None:
        echo(member.diverged["message"])
    if member.out is not None:
        write_json(member.out / SUMMARY, summary)
        if member.records:
            plot_curves(
                {member.config.display_name: member.records},
                member.out / CURVES,
                task=engine.task,
            )
        (member.out / CHECKPOINT).unlink(missing_ok=True)
    return RunResult(
        member.config, member.records, summary, engine.member_state(i), None, member.out
    )


def drive(
    engine: Engine,
    members: list[_Member],
    *,
    bar: Any = None,
    echo: Callable = print,
) -> list[RunResult]:
    """The loop: chunks of ``eval_every`` rounds, evaluation, records, checkpoints, divergence
    (a member whose loss or parameters turn non-finite stops, keeping what it wrote)."""
    config = members[0].config
    files = [(m.out / METRICS).open("a") if m.out is not None else None for m in members]
    results: list[RunResult | None] = [None] * len(members)
    chunk_index = 0
    try:
        while any(m.running for m in members):
            done = members[0].done
            n = min(config.eval_every, config.rounds - done)
            fields, phases = engine.advance(n)
            t1 = time.perf_counter()
            scores = engine.evaluate()
            phases = dict(phases, eval=time.perf_counter() - t1)
            share = sum(phases.get(k, 0.0) for k in ("rounds", "select", "train", "aggregate"))
            share /= len(members)
            chunk_index += 1
            for i, m in enumerate(members):
                if not m.running:
                    continue
                f = fields[i]
                m.done = done + n
                m.client_updates += f["_client_updates"]
                m.train_seconds += share
                m.chunks.append([n, f["_client_updates"], share])
                record = {"round": m.done, **scores[i]}
                record.update({k: v for k, v in f.items() if not k.startswith("_")})
                record["seconds"] = phases
                m.records.append(record)
                if files[i] is not None:
                    files[i].write(dumps(record) + "\n")
                    files[i].flush()
                loss = scores[i].get("test_loss")
                if f["_bad_round"] is not None or loss is None or not math.isfinite(loss):
                    first = f["_bad_round"] if f["_bad_round"] is not None else m.done - 1
                    m.diverged = {
                        "round": first,
                        "message": (
                            f"run {m.config.display_name} (seed {m.config.seed}) diverged at "
                            f"round {first}: non-finite training loss or parameters "
                            f"(lr={m.config.lr}, server_lr={m.config.server_lr}); stopped, "
                            f"metrics up to round {m.done} are kept"
                        ),
                    }
                if not m.running:
                    if files[i] is not None:
                        files[i].close()
                        files[i] = None
                    results[i] = _finish(m, engine, i, echo)
                elif (
                    m.out is not None
                    and m.config.checkpoint_every > 0
                    and chunk_index % m.config.checkpoint_every == 0
                ):
                    ckpt.save_checkpoint(
                        m.out / CHECKPOINT,
                        engine.member_state(i),
                        {"results_key": m.config.results_key(), **m.bookkeeping()},
                    )
            if bar is not None:
                bar.update(n * len(members))
                acc = [s.get("test_accuracy") for s in scores]
                acc = [a for a in acc if a is not None and math.isfinite(a)]
                if acc:
                    bar.set_postfix(acc=f"{np.mean(acc):.4f}")
    finally:
        for f in files:
            if f is not None:
                f.close()
    return [r for r in results if r is not None]


# ----------------------------------------------------------------------------- groups
def program_key(config: RunConfig) -> str:
    """Configurations with the same key share one compiled program: they differ only in the
    seed (and the data seed that follows it) and in settings that do not change results."""
    return config.replace(seed=0, data_seed=None, label=None).results_key()


def _memory_budget() -> float:
    """Bytes a batch of seeds may use: half the device's free memory (the host's on CPU)."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 (backends without memory statistics)
        stats = {}
    if stats.get("bytes_limit"):
        return 0.5 * float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        return 0.5 * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4e9


def _nbytes(tree: Any) -> int:
    return sum(
        x.size * x.dtype.itemsize
        for x in jax.tree.leaves(tree)
        if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )


def member_bytes(config: RunConfig, state: SimState, data_bytes: int) -> int:
    """A rough upper estimate of one seed's memory in a vmapped batch: its state four times
    (inputs, outputs and transients of the chunk), its own data when seeds do not share it, and
    three models per trained slot (parameters, optimizer state, delta)."""
    return 4 * _nbytes(state) + data_bytes + 3 * config.per_round * _nbytes(state.params)


def batch_size(
    seeds_together: int | str, config: RunConfig, state: SimState, data_bytes: int, n: int
) -> int:
    """Seeds per vmapped batch: ``seeds_together``, or with ``"auto"`` as many as fit half the
    free memory by :func:`member_bytes` (at least one, at most ``n``)."""
    if seeds_together != "auto":
        return max(1, min(n, int(seeds_together)))
    per = max(member_bytes(config, state, data_bytes), 1)
    return int(max(1, min(n, _memory_budget() // per)))


def run_group(
    configs: Sequence[RunConfig],
    outs: Sequence[Path | None],
    *,
    infos: Sequence[dict[str, Any]] | None = None,
    seeds_together: int | str = "auto",
    dataset: FederatedDataset | None = None,
    model: Model | None = None,
    bar: Any = None,
    echo: Callable = print,
    resume: bool = True,
) -> list[RunResult]:
    """Runs configurations that share one compiled program (same :func:`program_key`), their
    seeds together: vmapped in batches of ``seeds_together`` (``"auto"``: by memory) with the
    whole simulation state stacked on a leading seed axis. Members resume from their
    checkpoints (``resume``); those at the same round run together.

    Args:
      infos: extra ``config.json`` entries per member (a sweep's label and setting).
      dataset: an already loaded data set, used when every member's data seed is the same.
      model: replaces the configured model (every member).
    """
    if not configs:
        return []
    for c in configs:
        c.resolve()
    if len({program_key(c) for c in configs}) > 1:
        raise ConfigError("run_group: the configurations differ in more than their seeds")
    infos = list(infos) if infos is not None else [{} for _ in configs]
    if configs[0].mode == "personalized":
        from fedjax_sel.experiment.personalized import run_personalized

        return [
            r
            for c, o, info in zip(configs, outs, infos, strict=True)
            for r in run_personalized(
                c, o, info=info, dataset=dataset, bar=bar, echo=echo, resume=resume
            )
        ]
    data_seeds = [c.seed if c.data_seed is None else c.data_seed for c in configs]
    shared = len(set(data_seeds)) == 1
    if shared:
        datasets = [dataset if dataset is not None else load_data_for(configs[0])] * len(configs)
    else:
        datasets = [load_data_for(c) for c in configs]
    sim = build_simulation(
        configs[0], datasets[0], model=model, n_max=max(d.train.n_max for d in datasets)
    )
    members = [
        _Member(c, None if o is None else Path(o), info=info)
        for c, o, info in zip(configs, outs, infos, strict=True)
    ]
    states = []
    for m, d in zip(members, datasets, strict=True):
        fresh = sim.init(m.config.seed, dataset=None if shared else d)
        restored = _restore(m, fresh, echo) if resume else None
        if restored is None and m.out is not None:
            m.out.mkdir(parents=True, exist_ok=True)
            (m.out / METRICS).write_text("")
            (m.out / CHECKPOINT).unlink(missing_ok=True)
        states.append(fresh if restored is None else restored)
    data_bytes = 0 if shared else _nbytes(datasets[0].train)
    size = batch_size(seeds_together, configs[0], states[0], data_bytes, len(members))
    batches: list[list[int]] = []
    for r in sorted({m.done for m in members}):  # members resumed at the same round together
        same = [i for i, m in enumerate(members) if m.done == r]
        batches += [same[j : j + size] for j in range(0, len(same), size)]
    results: dict[int, RunResult] = {}
    for batch in batches:
        try:
            data = None
            if len(batch) > 1 and not shared:
                data = stack_sim_data([SimData.of(datasets[i]) for i in batch])
            parts = [batch]
        except NotStackable as e:
            echo(f"seeds run one by one: {e}")
            parts = [[i] for i in batch]
        for part in parts:
            if len(part) > 1:
                part_data = data
            else:
                part_data = None if shared else sim.place(SimData.of(datasets[part[0]]))
            engine = GlobalEngine(
                sim,
                [states[i] for i in part],
                part_data,
                profile=configs[0].profile and len(part) == 1,
            )
            for i in part:
                _write_config(members[i], datasets[i], engine.describe())
            if bar is not None and members[part[0]].done:
                bar.update(members[part[0]].done * len(part))
            for i, r in zip(
                part, drive(engine, [members[i] for i in part], bar=bar, echo=echo), strict=True
            ):
                r.simulation = sim
                results[i] = r
    return [results[i] for i in range(len(members))]


def run_experiment(
    config: RunConfig,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    dataset: FederatedDataset | None = None,
    model: Model | None = None,
    echo: Callable = print,
    resume: bool = False,
) -> RunResult:
    """Runs ``config`` to the end (or to divergence) and writes its folder (nothing is written
    when ``out_dir`` is ``None``). ``resume``: continue from ``out_dir``'s checkpoint when it
    has one (a finished run is returned as it is)."""
    out = None if out_dir is None else Path(out_dir)
    config.resolve()
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
            [config], [out], dataset=dataset, model=model, bar=bar, echo=echo, resume=resume
        )
    finally:
        if bar is not None:
            bar.close()
    return result
