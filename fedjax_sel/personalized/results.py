"""One result type for every method of the personalized comparison, and its end-of-run
numbers (:func:`fedjax_sel.experiment.personalized.run_method` runs a method and returns one).

Methods: the peer weightings of :class:`PersonalizedSimulation` (``sp_cacw``, ``local``,
``uniform``, ``oracle``, ``similarity``) and the model-averaging baselines (``fedavg``,
``ifca``). Time is counted in local SGD steps per client: one step of a target, one local step
of FedAvg/IFCA; a FedAvg/IFCA round is one lazy-update period (``update_every`` steps: one local
epoch of the median client by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedjax_sel.metrics import nanmean
from fedjax_sel.personalized.simulator import METHODS, EpochLog

ALL_METHODS = METHODS + ("fedavg", "ifca")


@dataclasses.dataclass
class MethodResult:
    """A method's run.

    Attributes:
      method: the method's name; ``label`` a display name.
      steps: int[E] local SGD steps per client at each evaluation (0 = the initial model).
      metrics: name -> float[E, T] per-target values at each evaluation (``test_accuracy``,
        ``test_loss``, ``train_loss``, ``train_accuracy``; peer methods add ``bound``,
        ``risk_bound`` (NaN where its premise failed), ``bound_premise``,
        ``lr_times_smoothness``, ``self_weight``, ``unobserved_weight``, ``observed_fraction``,
        ``own_cluster_weight`` (clusters known) and, with ``track_bound``, the exact terms
        ``bound_true``, ``grad_error``, ``bias_term``, ``grad_norm_sq``).
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


def result_from_records(
    method: str,
    label: str,
    records: list[dict],
    target_ids: np.ndarray,
    update_every: int,
    logs: list[EpochLog],
    seconds: float,
    clusters: Sequence[int] | None = None,
) -> MethodResult:
    """A :class:`MethodResult` from a personalized run's evaluation records."""
    names = records[0]["per_target"]
    metrics = {
        k: np.stack([np.asarray(r["per_target"][k], np.float64) for r in records]) for k in names
    }
    weights = None
    if "weights" in records[0]:
        weights = np.stack([np.asarray(r["weights"], np.float32) for r in records])
    epoch_logs = None
    if logs:
        epoch_logs = EpochLog(*(np.concatenate(parts) for parts in zip(*logs, strict=True)))
    return MethodResult(
        method=method,
        label=label,
        steps=np.asarray([r["round"] * update_every for r in records]),
        metrics=metrics,
        target_ids=np.asarray(target_ids),
        weights=weights,
        logs=epoch_logs,
        seconds=seconds,
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
    test loss, and for peer methods the weight on the target itself, on never-observed peers
    and (clusters known) on its own cluster, and the fraction of targets whose risk-bound
    premise held throughout (``bound_premise``)."""
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
        if "bound_premise" in result.metrics:
            row["bound_premise"] = float(np.mean(result.metrics["bound_premise"][-1]))
            row["unobserved_weight"] = float(np.mean(result.metrics["unobserved_weight"][-1]))
        if result.clusters is not None:
            row["own_cluster_mass"] = float(
                np.mean(own_cluster_mass(w, result.clusters, result.target_ids))
            )
    return row
