"""The run loop's engine for ``mode="personalized"`` (SP-CACW and its baselines).

Each evaluation record holds the mean over targets of every per-target metric (so tables,
sweeps and ``compare`` treat a personalized run like any other), the worst target's accuracy,
the per-target values under ``per_target`` and, for peer-weighting methods, the weights
``[targets, clients]`` under ``weights`` and the method's own quantities: the weight on the
target itself, on its own true cluster and on peers never observed, the fraction of clients
observed, ``L eta`` and whether the risk bound's premise held (``bound_premise``; the
``risk_bound`` is reported only for targets where it did). ``diagnostics`` holds the chunk's
per-epoch means (:func:`epoch_diagnostics`). A round is one lazy-update period.

Seeds of one configuration with one data seed reuse one built (and compiled) program: the
programs take the seed only in ``init``. :func:`run_method` is the Python shortcut: one method
through the same loop, its records as a :class:`~fedjax_sel.personalized.results.MethodResult`.

>>> ds = load_dataset("clustered_mnist", num_clients=20, num_clusters=2, transform="permute")
>>> model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
>>> res = run_method("sp_cacw", ds, model, epochs=30, eval_every=5)
>>> res.mean("test_accuracy")[-1]      # mean over targets at the last evaluation
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.experiment import build as build_lib
from fedjax_sel.experiment import loop as run_lib
from fedjax_sel.experiment.outputs import CHECKPOINT, METRICS, append_line
from fedjax_sel.experiment.resolve import Resolved
from fedjax_sel.metrics import nanmean
from fedjax_sel.models import Model
from fedjax_sel.personalized.methods import PERSONALIZED_METHODS, build_program, epoch_steps
from fedjax_sel.personalized.results import (
    ALL_METHODS,
    MethodResult,
    result_from_records,
    summarize,
)
from fedjax_sel.personalized.state import METHODS, PersonalizedConfig

# (program key, data seed) -> (dataset, program): the last built programs, reused by the next
# seed of the same configuration (a new program would compile again)
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_KEPT = 2


class PersonalizedEngine:
    """Drives one :class:`~fedjax_sel.personalized.methods.PersonalizedProgram`."""

    task = "classification"

    def __init__(self, program, state, config: RunConfig, dataset: FederatedDataset):
        self.program, self.state = program, state
        self.task = dataset.task
        self.clusters = dataset.info.get("cluster")
        self.steps_per_epoch = epoch_steps(dataset, config.batch_size, None)
        self.logs: list = []
        self.evaluations = 0

    def advance(self, n: int) -> tuple[list[dict], dict[str, float]]:
        t0 = time.perf_counter()
        self.state, log = self.program.advance(self.state, n)
        if log is not None:
            self.logs.append(log)
        fields = {"_client_updates": n * len(self.program.target_ids), "_bad_round": None}
        if log is not None:
            fields["diagnostics"] = epoch_diagnostics(log)
            loss = np.asarray(log.train_loss)  # [n, T]
            fields["train_loss"] = float(nanmean(loss))
            bad = ~np.all(np.isfinite(loss), axis=1)
            if np.any(bad):
                fields["_bad_round"] = int(self.state.epoch) - n + int(np.argmax(bad))
        return [fields], {"rounds": time.perf_counter() - t0}

    def evaluate(self) -> list[dict[str, Any]]:
        per_target = self.program.evaluate(self.state)
        out: dict[str, Any] = {k: float(nanmean(v)) for k, v in per_target.items()}
        acc = np.asarray(per_target.get("test_accuracy", np.nan))
        out["worst_target_accuracy"] = float(np.min(acc)) if np.all(np.isfinite(acc)) else None
        out["per_target"] = {k: np.asarray(v).tolist() for k, v in per_target.items()}
        if self.program.weights is not None:
            out["weights"] = np.asarray(self.program.weights(self.state)).tolist()
        return [out]

    def member_state(self, i: int) -> Any:
        return self.state

    def summary(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **personalized_summary(records, self.clusters, self.program.target_ids),
            **self.describe(),
        }

    def describe(self) -> dict[str, Any]:
        """``update_every`` steps per round, the median client's ``steps_per_epoch`` and their
        ratio ``update_period_epochs`` (1 = the paper's once-per-epoch lazy update)."""
        return {
            "update_every": self.program.update_every,
            "steps_per_epoch": self.steps_per_epoch,
            "update_period_epochs": self.program.update_every / self.steps_per_epoch,
            "targets": self.program.target_ids.tolist(),
        }


def epoch_diagnostics(log) -> dict[str, float]:
    """Means over a chunk's epochs and targets of the peer methods' per-epoch quantities
    (:class:`~fedjax_sel.personalized.state.EpochLog`): the smoothness estimate ``L``, the
    step, ``L eta`` (and its largest value), ``lambda_reg``, the bound ``Phi(alpha)``, the
    squared gradient norm estimate, the weight on unobserved peers and, at the chunk's end,
    the fraction of targets whose risk-bound premise has held so far."""
    lr_l = np.asarray(log.smoothness, np.float64) * np.asarray(log.lr, np.float64)
    return {
        "smoothness": float(nanmean(log.smoothness)),
        "lr": float(nanmean(log.lr)),
        "lr_times_smoothness": float(nanmean(lr_l)),
        "lr_times_smoothness_max": float(np.nanmax(lr_l)),
        "lam": float(nanmean(log.lam)),
        "bound": float(nanmean(log.bound)),
        "grad_norm_sq": float(nanmean(log.grad_norm_sq)),
        "unobserved_weight": float(nanmean(log.unobserved_weight)),
        "bound_premise": float(np.mean(np.asarray(log.premise)[-1])),
    }


def personalized_summary(records: list[dict[str, Any]], clusters, targets) -> dict[str, Any]:
    """End-of-run numbers of a personalized run's evaluation records
    (:func:`fedjax_sel.personalized.results.summarize`)."""
    per_target = {
        k: np.stack([np.asarray(r["per_target"][k], np.float64) for r in records])
        for k in records[-1]["per_target"]
    }
    # float64: a diverged run's last weights are null (NaN here, null again in summary.json)
    weights = np.asarray(records[-1]["weights"], np.float64) if "weights" in records[-1] else None
    rounds = np.asarray([r["round"] for r in records])
    return summarize(rounds, per_target, weights, clusters, targets)


def cached_program(config: RunConfig, dataset: FederatedDataset | None = None):
    """``(dataset, program)`` of ``config``: built, or the one built for an earlier seed of the
    same configuration and data seed (``dataset`` given: always built on it)."""
    data_seed = config.seed if config.data_seed is None else config.data_seed
    key = (run_lib.program_key(config), data_seed)
    if dataset is None and key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    given = dataset is not None
    dataset = dataset if given else build_lib.load_data_for(config)
    program = build_program(
        config.strategy,
        dataset,
        build_lib.model_for(config, dataset),
        lr=config.lr,
        batch_size=config.batch_size,
        update_every=config.local_steps,
        seed=config.seed,
        **dict(config.strategy_args),
    )
    if not given:
        _PROGRAMS[key] = (dataset, program)
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return dataset, program


def run_personalized(
    resolved: Resolved,
    out: Path | None,
    *,
    info: dict[str, Any] | None = None,
    dataset: FederatedDataset | None = None,
    bar: Any = None,
    echo: Callable = print,
    resume: bool = True,
) -> list[run_lib.RunResult]:
    """Runs one resolved personalized configuration through
    :func:`fedjax_sel.experiment.loop.drive`."""
    config = resolved.config
    dataset, program = cached_program(config, dataset)
    member = run_lib.Member(config, None if out is None else Path(out), info=dict(info or {}))
    fresh = program.init(config.seed)
    restored = run_lib.restore_member(member, fresh, echo) if resume else None
    if restored is None and member.out is not None:
        member.out.mkdir(parents=True, exist_ok=True)
        (member.out / METRICS).write_text("")
        (member.out / CHECKPOINT).unlink(missing_ok=True)
    engine = PersonalizedEngine(program, fresh if restored is None else restored, config, dataset)
    run_lib.write_config(member, dataset, engine.describe())
    if restored is None:  # the initial model, evaluated (round 0)
        t0 = time.perf_counter()
        record = {"round": 0, **engine.evaluate()[0]}
        member.records.append(record)
        member.phase_seconds.append({"round": 0, "seconds": {"eval": time.perf_counter() - t0}})
        if member.out is not None:
            with (member.out / METRICS).open("ab", buffering=0) as f:
                append_line(f, record)
    (result,) = run_lib.drive(engine, [member], bar=bar, echo=echo)
    result.extras = {"epoch_logs": engine.logs, "program": program}
    return [result]


def run_method(
    method: str,
    dataset: FederatedDataset,
    model: Model,
    *,
    epochs: int,
    eval_every: int = 1,
    seed: int = 0,
    targets: Sequence[int] | None = None,
    clusters: Sequence[int] | None = None,
    config: PersonalizedConfig | None = None,
    num_clusters: int | None = None,
    track_bound: bool = False,
    label: str | None = None,
) -> MethodResult:
    """Runs ``method`` for ``epochs`` lazy-update periods, evaluating every ``eval_every``
    (through the experiment layer's run loop; nothing is written).

    Args:
      method: one of :data:`ALL_METHODS`.
      dataset, model: the federated data set (with per-client test splits) and the model.
      epochs: periods of ``update_every`` steps (FedAvg/IFCA: rounds of that many local steps).
      eval_every: periods between evaluations.
      seed: the run's seed (data sampling, initial model shared by all methods).
      targets: target client ids (all when ``None``).
      clusters: true clusters (``oracle``; default ``dataset.info["cluster"]``).
      config: :class:`PersonalizedConfig` (its ``method`` is overridden by ``method``); its
        ``lr``, ``batch_size`` and ``update_every`` also drive FedAvg and IFCA.
      num_clusters: IFCA's number of cluster models (default: the data set's true number, else 2).
      track_bound: evaluate the bound's exact terms (peer methods; see
        :meth:`PersonalizedSimulation.evaluate`).
      label: display name (default ``method``).
    """
    if method not in ALL_METHODS:
        raise ConfigError(f"unknown personalized method {method!r}; known: {ALL_METHODS}")
    if not (isinstance(epochs, int) and epochs >= 1):
        raise ConfigError(f"epochs must be a positive integer, got {epochs!r}")
    if not (isinstance(eval_every, int) and eval_every >= 1):
        raise ConfigError(f"eval_every must be a positive integer, got {eval_every!r}")
    cfg = dataclasses.replace(config or PersonalizedConfig(), method="uniform")
    cfg.validate()
    if clusters is None:
        clusters = dataset.info.get("cluster")
    options: dict = {"targets": None if targets is None else tuple(int(t) for t in targets)}
    if method in METHODS:
        names = set(PERSONALIZED_METHODS[method].options) - {"targets", "track_bound"}
        options.update({k: getattr(cfg, k) for k in names}, track_bound=track_bound)
    elif method == "ifca":
        options["num_clusters"] = num_clusters
    t0 = time.perf_counter()
    program = build_program(
        method,
        dataset,
        model,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        update_every=cfg.update_every,
        clusters=clusters,
        **options,
    )
    run = RunConfig(
        mode="personalized",
        strategy=method,
        rounds=epochs,
        eval_every=eval_every,
        seed=seed,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        local_steps=program.update_every,
        checkpoint_every=0,
    )
    engine = PersonalizedEngine(program, program.init(seed), run, dataset)
    member = run_lib.Member(run, None)
    member.records.append({"round": 0, **engine.evaluate()[0]})
    (result,) = run_lib.drive(engine, [member], echo=lambda *_: None)
    return result_from_records(
        method,
        label or method,
        result.evals,
        program.target_ids,
        program.update_every,
        engine.logs,
        time.perf_counter() - t0,
        clusters,
    )
