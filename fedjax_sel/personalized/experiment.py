"""One entry point for every method of the personalized comparison, with one result type.

>>> ds = load_dataset("clustered_mnist", num_clients=20, num_clusters=2, transform="permute")
>>> model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
>>> res = run_method("sp_cacw", ds, model, epochs=30, eval_every=5)
>>> res.mean("test_accuracy")[-1]      # mean over targets at the last evaluation

Methods: the peer weightings of :class:`PersonalizedSimulation` (``sp_cacw``, ``local``,
``uniform``, ``oracle``, ``similarity``) and the model-averaging baselines (``fedavg``,
``ifca``). Time is counted in local SGD steps per client: one step of a target, one local step
of FedAvg/IFCA; a FedAvg/IFCA round is one lazy-update period (``update_every`` steps: one local
epoch of the median client by default).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.models import Model
from fedjax_sel.personalized import baselines
from fedjax_sel.personalized.simulator import (
    METHODS,
    EpochLog,
    PersonalizedConfig,
    PersonalizedSimulation,
    check_targets,
)

ALL_METHODS = METHODS + ("fedavg", "ifca")


@dataclasses.dataclass
class MethodResult:
    """A method's run.

    Attributes:
      method: the method's name; ``label`` a display name.
      steps: int[E] local SGD steps per client at each evaluation (0 = the initial model).
      metrics: name -> float[E, T] per-target values at each evaluation (``test_accuracy``,
        ``test_loss``, ``train_loss``, ``train_accuracy``; peer methods add ``bound`` and
        ``risk_bound`` and, with ``track_bound``, the exact terms ``bound_true``,
        ``grad_error``, ``bias_term``, ``grad_norm_sq``).
      target_ids: int[T].
      weights: float[E, T, K] peer weights at each evaluation (peer methods), else ``None``.
      logs: the per-epoch :class:`EpochLog` (peer methods), else ``None``.
      seconds: wall time of the run (compilation included).
      clusters: the clients' true clusters when known (for the weight analyses), else ``None``.
    """

    method: str
    label: str
    steps: np.ndarray
    metrics: dict[str, np.ndarray]
    target_ids: np.ndarray
    weights: np.ndarray | None
    logs: EpochLog | None
    seconds: float
    clusters: list[int] | None = None

    def mean(self, name: str) -> np.ndarray:
        """float[E]: the metric averaged over targets at each evaluation."""
        return nanmean(self.metrics[name], axis=1)

    def final(self, name: str = "test_accuracy", tail: float = 0.2) -> np.ndarray:
        """float[T]: each target's metric averaged over the evaluations in the last ``tail``
        fraction of the run (at least the last one)."""
        last = self.steps[-1]
        keep = self.steps > (1.0 - tail) * last
        keep[-1] = True
        return nanmean(self.metrics[name][keep], axis=0)


def nanmean(x: np.ndarray, axis=None) -> np.ndarray:
    """Mean over the non-NaN entries; NaN (without a warning) where all are NaN, e.g. the
    accuracy of a regression task."""
    x = np.asarray(x, np.float64)
    count = np.sum(~np.isnan(x), axis=axis)
    total = np.nansum(x, axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def epoch_steps(dataset: FederatedDataset, batch_size: int, update_every: int | None) -> int:
    """Steps per lazy-update period: ``update_every``, or one epoch of the median client."""
    if update_every is not None:
        return int(update_every)
    median = float(np.median(np.asarray(dataset.train.counts)))
    return max(1, math.ceil(median / batch_size))


def _stack(evals: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([np.asarray(e[k], np.float64) for e in evals]) for k in evals[0]}


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
    """Runs ``method`` for ``epochs`` lazy-update periods, evaluating every ``eval_every``.

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
    cfg = dataclasses.replace(config or PersonalizedConfig(), method=method)
    if method in ("fedavg", "ifca"):
        cfg = dataclasses.replace(cfg, method="uniform")
    cfg.validate()
    if clusters is None:
        clusters = dataset.info.get("cluster")
    t0 = time.perf_counter()
    u = epoch_steps(dataset, cfg.batch_size, cfg.update_every)
    common = dict(
        lr=cfg.lr, batch_size=cfg.batch_size, local_steps=u, rounds=epochs,
        eval_every=eval_every, seed=seed, targets=targets,
    )  # fmt: skip
    weights, logs = None, None
    if method == "fedavg":
        steps, evals = baselines.run_fedavg(dataset, model, **common)
        ids = check_targets(dataset, targets)
    elif method == "ifca":
        if num_clusters is None:
            num_clusters = int(dataset.info.get("num_clusters", 2))
        steps, evals = baselines.run_ifca(dataset, model, num_clusters=num_clusters, **common)
        ids = check_targets(dataset, targets)
    else:
        sim = PersonalizedSimulation(dataset, model, cfg, targets=targets, clusters=clusters)
        state = sim.init(seed)
        steps = [0]
        evals = [sim.evaluate(state, track_bound)]
        weight_list = [sim.weights(state)]
        log_list = []
        done = 0
        while done < epochs:
            n = min(eval_every, epochs - done)
            state, log = sim.run_epochs(state, n)
            log_list.append(log)
            done += n
            steps.append(done * sim.update_every)
            evals.append(sim.evaluate(state, track_bound))
            weight_list.append(sim.weights(state))
        weights = np.stack(weight_list)
        logs = EpochLog(*(np.concatenate(parts) for parts in zip(*log_list, strict=True)))
        ids = np.asarray(sim.target_ids)
    return MethodResult(
        method=method,
        label=label or method,
        steps=np.asarray(steps),
        metrics=_stack(evals),
        target_ids=np.asarray(ids),
        weights=weights,
        logs=logs,
        seconds=time.perf_counter() - t0,
        clusters=None if clusters is None else list(np.asarray(clusters).tolist()),
    )


def own_cluster_mass(
    weights: np.ndarray, clusters: Sequence[int], target_ids: np.ndarray
) -> np.ndarray:
    """float[T]: the weight each target puts on clients of its own true cluster (itself
    included); ``weights`` float[T, K]."""
    c = np.asarray(clusters)
    same = c[np.asarray(target_ids)][:, None] == c[None, :]
    return np.sum(np.where(same, weights, 0.0), axis=1)


def self_weight(weights: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
    """float[T]: each target's weight on its own gradient."""
    return weights[np.arange(len(target_ids)), np.asarray(target_ids)]


def summary_row(result: MethodResult) -> dict:
    """End-of-run numbers of one run: mean/min over targets of the final test accuracy, final
    test loss, and for peer methods the weight on the target itself and (clusters known) on its
    own cluster."""
    acc = result.final("test_accuracy")
    row = {
        "method": result.label,
        "test_accuracy": float(nanmean(acc)),
        "worst_target_accuracy": float(np.min(acc)) if np.all(np.isfinite(acc)) else None,
        "test_loss": float(nanmean(result.final("test_loss"))),
        "train_loss": float(nanmean(result.final("train_loss"))),
        "seconds": result.seconds,
    }
    if result.weights is not None:
        w = result.weights[-1]
        row["self_weight"] = float(np.mean(self_weight(w, result.target_ids)))
        row["peers_with_weight"] = float(np.mean(np.sum(w > 1e-3, axis=1)))
        if result.clusters is not None:
            row["own_cluster_mass"] = float(
                np.mean(own_cluster_mass(w, result.clusters, result.target_ids))
            )
    return row
