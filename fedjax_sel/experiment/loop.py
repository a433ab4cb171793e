"""The one run loop shared by every kind of run (global-model simulations, seeds vmapped
together, the personalized mode): chunks of rounds, evaluation records written as they come,
checkpoints, divergence, summaries, and the cache of finished run folders.

An :class:`Engine` advances its members (seeds) in lockstep; :func:`drive` writes each
member's folder (:mod:`.outputs`): ``config.json``, ``metrics.jsonl`` flushed per evaluation,
``summary.json`` and ``curves.png`` at the end, and every ``checkpoint_every`` chunks a
checkpoint of the member's state (:mod:`.checkpoint`) from which :func:`restore_member`
continues bit for bit; wall-clock timings go to ``timings.json`` only, so that
``metrics.jsonl`` and ``summary.json`` are the same bytes whenever the same configuration
runs again (on one machine, in the same batch of seeds).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from fedjax_sel import metrics as metrics_lib
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.distributed import is_primary, to_host
from fedjax_sel.engine.log import RoundLog
from fedjax_sel.engine.system import overcommitted
from fedjax_sel.experiment import checkpoint as ckpt
from fedjax_sel.experiment.outdir import stored_config
from fedjax_sel.experiment.outputs import (
    CHECKPOINT,
    CONFIG,
    CURVES,
    METRICS,
    SUMMARY,
    TIMINGS,
    append_line,
    plot_curves,
    read_json,
    read_metrics,
    read_timings,
    write_json,
    write_jsonl,
)
from fedjax_sel.experiment.provenance import code_record, same_code
from fedjax_sel.strategies.registry import traced_values
from fedjax_sel.training.hparams import TRACED_FIELDS


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


# the cost axes: running totals over the rounds so far in every evaluation record (a round's
# own values: fedjax_sel/engine/cost.py)
COST_FIELDS = ("client_updates", "uplink_bytes", "client_flops")

# diagnostics that are running totals: a chunk reports its last round's value (the others: the
# mean over the chunk's rounds)
LAST_VALUE_DIAGNOSTICS = frozenset({"never_picked", "model_version"})


def cost_totals(costs: dict[str, float]) -> dict[str, float | int]:
    """A record's running cost totals (client updates as a whole number)."""
    return {k: int(round(v)) if k == "client_updates" else float(v) for k, v in costs.items()}


def chunk_fields(logs: RoundLog, index: int | None = None, timed: bool = False) -> dict[str, Any]:
    """Record fields of one member's round logs (``index`` into a stacked batch); ``timed``:
    the simulation has a system model (the virtual clock and each round's duration)."""
    if index is not None:
        logs = jax.tree.map(lambda a: a[index], logs)
    timing = {}
    if timed:
        timing = {
            "sim_time_s": float(logs.sim_time[-1]),
            "round_seconds": np.asarray(logs.duration, np.float64).tolist(),
            "dropped": int(np.sum(logs.dropped)),
            "stragglers": int(np.sum(logs.stragglers)),
        }
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
        **timing,
        "_client_updates": int(np.sum(logs.num_selected)),
        "_cost": {k: float(np.sum(np.asarray(getattr(logs, k), np.float64))) for k in COST_FIELDS},
        "_bad_round": int(logs.round[np.argmax(bad)]) if np.any(bad) else None,
    }


# ----------------------------------------------------------------------------- members
@dataclasses.dataclass
class RunResult:
    """A finished run: its configuration, evaluation records and summary (``state`` and
    ``simulation`` when it ran in this process, ``None`` when read from a finished folder),
    and its wall-clock ``timings`` (what ``timings.json`` holds: ``wall_seconds``,
    ``train_seconds``, ``rounds_per_second``, ``client_updates_per_second``,
    ``first_chunk_seconds``, ``peak_host_memory_bytes`` and, under ``evaluations``, each
    evaluation's ``round`` and phase ``seconds``)."""

    config: RunConfig
    evals: list[dict[str, Any]]
    summary: dict[str, Any]
    state: Any = None
    simulation: Any = None
    out_dir: Path | None = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Member:
    config: RunConfig
    out: Path | None
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    done: int = 0
    client_updates: int = 0  # slots trained (throughput), not the cost axis below
    costs: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COST_FIELDS, 0.0)
    )
    train_seconds: float = 0.0
    chunks: list[list[float]] = dataclasses.field(default_factory=list)
    # per evaluation {"round", "seconds": phase -> wall seconds}: timings.json, not the records
    phase_seconds: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    diverged: dict[str, Any] | None = None
    start: float = dataclasses.field(default_factory=time.perf_counter)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    readonly: bool = False  # reads its folder (resume) but writes nothing: not process 0
    plots: bool = True  # curves.png when it finishes (a suite's cells leave them out)

    @property
    def writes(self) -> bool:
        return self.out is not None and not self.readonly

    @property
    def running(self) -> bool:
        return self.diverged is None and self.done < self.config.rounds

    def bookkeeping(self) -> dict[str, Any]:
        return {
            "round": self.done,
            "records": len(self.records),
            "client_updates": self.client_updates,
            "costs": self.costs,
            "train_seconds": self.train_seconds,
            "chunks": self.chunks,
            "phase_seconds": self.phase_seconds,
        }


def finished_result(config: RunConfig, out: Path) -> RunResult | None:
    """The stored result of ``out`` when it holds a finished run of exactly ``config``
    (every setting that can change the results equal) made by this code
    (:func:`~fedjax_sel.experiment.provenance.same_code`), else ``None``."""
    if finished_by_other_code(config, out) is not False:
        return None
    return RunResult(
        config,
        read_metrics(out / METRICS),
        read_json(out / SUMMARY),
        out_dir=out,
        timings=read_timings(out),
    )


def finished_by_other_code(config: RunConfig, out: Path) -> bool | None:
    """``None`` when ``out`` holds no finished run of exactly ``config``; else whether other
    code made it (its ``config.json`` records another source digest, or none)."""
    if not (out / SUMMARY).exists() or not (out / CONFIG).exists():
        return None
    try:
        info = read_json(out / CONFIG)
        stored = stored_config(info)
    except (ConfigError, KeyError, TypeError):
        return None
    if stored.results_key() != config.results_key():
        return None
    return not same_code(info.get("code"))


def write_config(
    member: Member,
    dataset: FederatedDataset,
    engine_info: dict,
    seeds_vmapped: list[int] | None = None,
) -> None:
    """Writes ``config.json``; ``seeds_vmapped``: the seeds run in one batch with ``member``
    (default its own alone), recorded because a run's bits can depend on its batch (XLA's CPU
    reductions are shaped by it)."""
    if not member.writes:
        return
    member.out.mkdir(parents=True, exist_ok=True)
    engine_info = dict(engine_info)
    config = {**member.config.to_dict(), **engine_info.pop("resolved_config", {})}
    write_json(
        member.out / CONFIG,
        {
            "config": config,
            "dataset": {"name": dataset.name, "num_clients": dataset.num_clients, **dataset.info},
            **engine_info,
            "seeds_vmapped": seeds_vmapped or [member.config.seed],
            "code": code_record(),
            **member.info,
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "jax_version": jax.__version__,
        },
    )


def restore_member(member: Member, template: Any, echo: Callable) -> Any | None:
    """Loads ``member``'s checkpoint (state, bookkeeping; ``metrics.jsonl`` cut back to the
    checkpoint's records) or returns ``None`` when there is none."""
    if member.out is None or not (member.out / CHECKPOINT).exists():
        return None
    if (member.out / CONFIG).exists() and not same_code(read_json(member.out / CONFIG).get("code")):
        echo(f"{member.out}'s checkpoint was written by other code: starting it over")
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
    member.costs = dict(header["costs"])
    member.train_seconds = header["train_seconds"]
    member.chunks = header["chunks"]
    member.phase_seconds = header.get("phase_seconds", [])[: len(member.records)]
    if member.writes:  # the lines after the checkpoint's records (maybe cut short) go
        write_jsonl(member.out / METRICS, member.records)
    echo(f"resuming {member.out} at round {member.done}")
    return state


# summary fields that describe the model at the end of the run: null when the run diverged (the
# model is then non-finite, and its accuracy, about chance, would read as a result)
AFTER_DIVERGENCE = (
    "final_accuracy",
    "stable_accuracy",
    "stability_drop",
    "final_test_loss",
    "stable_test_loss",
    "final_client_test_accuracy_mean",
    "final_client_test_loss_mean",
    "final_client_test_accuracy_std",
    "final_client_test_accuracy_bottom10",
    "target_accuracy",
    "worst_target_accuracy",
    "target_test_loss",
)
# per-client means, spread and bottom-10% mean of the last evaluation, in the summary as
# final_<key>
FINAL_CLIENT_KEYS = (
    "client_test_accuracy_mean",
    "client_test_loss_mean",
    "client_test_accuracy_std",
    "client_test_accuracy_bottom10",
)


def nulled(scores: Any) -> Any:
    """``scores`` with every value ``None`` and its shape kept (the evaluation of a diverged
    model: nothing it measured describes the run)."""
    if isinstance(scores, dict):
        return {k: nulled(v) for k, v in scores.items()}
    if isinstance(scores, (list, tuple)):
        return [nulled(v) for v in scores]
    return None


def _summary(member: Member, engine: Engine, i: int) -> dict[str, Any]:
    """The run's ``summary.json`` (no wall-clock field: :func:`_timings`).

    A diverged run has ``diverged: true``, ``diverged_at_round`` and a ``message``, and the
    fields of :data:`AFTER_DIVERGENCE` null (its last evaluation's test metrics are null in
    the records too); ``peak_accuracy``, ``best_test_loss`` and the rounds (and simulated
    seconds) to each target accuracy come from the evaluations before the divergence."""
    config, evals = member.config, member.records
    summary: dict[str, Any] = {
        "strategy": config.strategy,
        "label": config.display_name,
        "dataset": config.dataset,
        "seed": config.seed,
        "rounds_completed": member.done,
        **(
            metrics_lib.accuracy_summary(
                [e.get("test_accuracy") for e in evals],
                **(
                    {"window": config.eval_tail, "rounds": [e["round"] for e in evals]}
                    if config.eval_tail > 0
                    else {}
                ),
            )
            if engine.task == "classification"
            else {}
        ),
        "stable_window": (
            f"last {config.eval_tail} rounds, each evaluated"
            if config.eval_tail > 0
            else "last 10 evaluations"
        ),
        **metrics_lib.loss_summary([e.get("test_loss") for e in evals]),
        **{
            f"final_{key}": evals[-1][key]
            for key in FINAL_CLIENT_KEYS
            if evals and evals[-1].get(key) is not None
        },
        **engine.summary(i, evals),
        **targets_summary(evals, config.accuracy_targets),
        "diverged": member.diverged is not None,
    }
    if member.diverged is not None:
        after = {k for k in AFTER_DIVERGENCE if k in summary}
        after |= {"final_test_loss", "stable_test_loss"}
        if engine.task == "classification":
            after |= {"final_accuracy", "stable_accuracy", "stability_drop"}
        after |= {f"final_{k}" for k in FINAL_CLIENT_KEYS if any(k in e for e in evals)}
        summary.update(dict.fromkeys(k for k in AFTER_DIVERGENCE if k in after))
        summary["diverged_at_round"] = member.diverged["round"]
        summary["message"] = member.diverged["message"]
    return summary


def _timings(member: Member) -> dict[str, Any]:
    """The run's ``timings.json``: wall-clock totals (the speed after the first chunk, which
    compiles), the process's peak memory, and each evaluation's phase seconds."""
    steady = member.chunks[1:] or member.chunks
    seconds = sum(c[2] for c in steady)
    return {
        "wall_seconds": time.perf_counter() - member.start,
        "train_seconds": member.train_seconds,
        "rounds_per_second": sum(c[0] for c in steady) / seconds if seconds > 0 else None,
        "client_updates_per_second": sum(c[1] for c in steady) / seconds if seconds > 0 else None,
        "first_chunk_seconds": member.chunks[0][2] if member.chunks else None,
        "peak_host_memory_bytes": peak_host_memory_bytes(),
        "evaluations": member.phase_seconds,
    }


def peak_host_memory_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def targets_summary(evals: list[dict[str, Any]], targets) -> dict[str, Any]:
    """For each target accuracy, the first evaluated round and (with a virtual clock) the
    simulated seconds at which the test accuracy reached it (``None``: never)."""
    out: dict[str, Any] = {}
    if evals and "sim_time_s" in evals[-1]:
        out["sim_time_s"] = evals[-1]["sim_time_s"]
    if not targets:
        return out
    rounds, seconds = {}, {}
    for a in targets:
        hit = next((e for e in evals if (e.get("test_accuracy") or -1.0) >= a), None)
        rounds[f"{a:g}"] = None if hit is None else hit["round"]
        seconds[f"{a:g}"] = None if hit is None else hit.get("sim_time_s")
    out["rounds_to_accuracy"] = rounds
    if evals and "sim_time_s" in evals[-1]:
        out["time_to_accuracy_s"] = seconds
    return out


def _finish(member: Member, engine: Engine, i: int, echo: Callable) -> RunResult:
    summary = _summary(member, engine, i)
    timings = _timings(member)
    if member.diverged is not None:
        echo(member.diverged["message"])
    if member.writes:
        write_json(member.out / TIMINGS, timings)  # first: a folder with a summary has both
        write_json(member.out / SUMMARY, summary)
        if member.records and member.plots:
            curves = {member.config.display_name: member.records}
            plot_curves(curves, member.out / CURVES, task=engine.task)
            if "sim_time_s" in member.records[-1]:
                plot_curves(
                    curves, member.out / "curves_time.png", task=engine.task, x="sim_time_s"
                )
        (member.out / CHECKPOINT).unlink(missing_ok=True)
    return RunResult(
        member.config,
        member.records,
        summary,
        engine.member_state(i),
        None,
        member.out,
        timings=timings,
    )


def drive(
    engine: Engine,
    members: list[Member],
    *,
    bar: Any = None,
    echo: Callable = print,
    trace_dir: str | Path | None = None,
) -> list[RunResult]:
    """The loop: chunks of ``eval_every`` rounds, evaluation, records, checkpoints, divergence
    (a member whose loss or parameters turn non-finite stops, keeping what it wrote).

    ``trace_dir``: a ``jax.profiler`` trace of the second chunk (the first compiles) and its
    evaluation, with a named scope per phase of the round, for Perfetto or TensorBoard.
    """
    config = members[0].config
    # unbuffered: each record reaches the file in one write call of its whole line
    files = [(m.out / METRICS).open("ab", buffering=0) if m.writes else None for m in members]
    results: list[RunResult | None] = [None] * len(members)
    chunk_index = 0
    tracing = False
    try:
        while any(m.running for m in members):
            done = members[0].done
            n = chunk_length(config, done)
            if trace_dir is not None and chunk_index == 1:
                jax.profiler.start_trace(str(trace_dir))
                tracing = True
            fields, phases = engine.advance(n)
            t1 = time.perf_counter()
            scores = engine.evaluate()
            phases = dict(phases, eval=time.perf_counter() - t1)
            if tracing:
                jax.profiler.stop_trace()
                tracing = False
                for text in getattr(engine, "compiled_texts", lambda: [])():
                    module = text.split(",", 1)[0].split()[-1]
                    if is_primary():
                        (Path(trace_dir) / f"hlo_{module}.txt").write_text(text)
                echo(f"profiler trace of rounds {done + 1}-{done + n} written under {trace_dir}")
            share = sum(phases.get(k, 0.0) for k in ("rounds", "select", "train", "aggregate"))
            share /= len(members)
            chunk_index += 1
            for i, m in enumerate(members):
                if not m.running:
                    continue
                f = fields[i]
                m.done = done + n
                m.client_updates += f["_client_updates"]
                for key, value in f.get("_cost", {}).items():
                    m.costs[key] += value
                m.train_seconds += share
                m.chunks.append([n, f["_client_updates"], share])
                loss = scores[i].get("test_loss")
                if f["_bad_round"] is not None or loss is None or not math.isfinite(loss):
                    first = f["_bad_round"] if f["_bad_round"] is not None else m.done - 1
                    m.diverged = {
                        "round": first,
                        "message": (
                            f"run {m.config.display_name} (seed {m.config.seed}) diverged at "
                            f"round {first}: non-finite training loss or parameters "
                            f"(lr={m.config.lr}, server_lr={m.config.server_lr}); stopped, the "
                            f"evaluations before it kept, round {m.done}'s test metrics null"
                        ),
                    }
                # a diverged model's evaluation is no result: its test metrics are null
                score = nulled(scores[i]) if m.diverged is not None else scores[i]
                record = {"round": m.done, **score}
                record.update({k: v for k, v in f.items() if not k.startswith("_")})
                if "_cost" in f:
                    record.update(cost_totals(m.costs))
                m.records.append(record)
                m.phase_seconds.append({"round": m.done, "seconds": phases})
                if files[i] is not None:
                    append_line(files[i], record)
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
                    state = to_host(engine.member_state(i))  # every process: a collective
                    if m.writes:
                        ckpt.save_checkpoint(
                            m.out / CHECKPOINT,
                            state,
                            {"results_key": m.config.results_key(), **m.bookkeeping()},
                        )
            if bar is not None:
                bar.update(n * len(members))
                acc = [s.get("test_accuracy") for s in scores]
                acc = [a for a in acc if a is not None and math.isfinite(a)]
                if acc:
                    bar.set_postfix(acc=f"{np.mean(acc):.4f}")
    finally:
        if tracing:
            jax.profiler.stop_trace()
        for f in files:
            if f is not None:
                f.close()
    return [r for r in results if r is not None]


def chunk_length(config: RunConfig, done: int) -> int:
    """Rounds of the next chunk after ``done``: ``eval_every``, cut at the start of the last
    ``eval_tail`` rounds, inside which every round is its own chunk (and evaluation)."""
    tail_start = config.rounds - min(config.eval_tail, config.rounds)
    if done >= tail_start:
        return 1
    return min(config.eval_every, tail_start - done)


def program_key(config: RunConfig) -> str:
    """Configurations with the same key share one compiled program: they differ only in the
    seed (and the data seed that follows it), in settings that do not change results, and (in
    the global mode) in the traced hyperparameters (:class:`~fedjax_sel.training.hparams.
    HParams`: client and server learning rates, FedProx mu as long as it stays > 0; and the
    strategy's own, :func:`~fedjax_sel.strategies.hyperparams.inject_hyperparams`)."""
    config = config.replace(seed=0, data_seed=None, label=None)
    if config.mode != "personalized":
        traced = {name: 0.0 for name in TRACED_FIELDS}
        strategy_traced = strategy_hyperparams(config)
        args = {k: v for k, v in config.strategy_args.items() if k not in strategy_traced}
        config = config.replace(
            **{**traced, "prox_mu": float(config.prox_mu > 0), "strategy_args": args}
        )
    return config.results_key()


def traced_settings(config: RunConfig) -> dict[str, float]:
    """The values of ``config``'s traced hyperparameters: the engine's
    (:data:`~fedjax_sel.training.hparams.TRACED_FIELDS`) and its strategy's (prefixed
    ``strategy.``)."""
    out = {name: float(getattr(config, name)) for name in TRACED_FIELDS}
    values = strategy_hyperparams(config)
    return {**out, **{f"strategy.{k}": v for k, v in values.items()}}


def strategy_hyperparams(config: RunConfig) -> dict[str, float]:
    """``config``'s strategy's traced hyperparameters and their values: those of the strategy
    it builds, with the slots a run fills (``per_round`` over-committed; capped by the number
    of clients where the configuration gives it)."""
    slots = overcommitted(config.per_round, config.overcommit, config.num_clients or sys.maxsize)
    return traced_values(config.strategy, slots, config.strategy_args)
