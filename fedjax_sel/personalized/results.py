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
from typing import Any

import numpy as np

from fedjax_sel.metrics import nanmean
from fedjax_sel.personalized.state import METHODS, EpochLog

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


def summarize(
    rounds: np.ndarray,
    per_target: dict[str, np.ndarray],
    weights: np.ndarray | None,
    clusters: Sequence[int] | None,
    targets: np.ndarray,
) -> dict[str, Any]:
    """End-of-run numbers of a personalized run (``per_target``: name -> float[E, T] at the
    evaluations of ``rounds`` (or steps); ``weights``: float[T, K] at the last one): each
    target's metrics averaged over the evaluations in the last 20% of the run (at least the
    last one), then over targets; the weight each target puts on itself, on never-observed peers
    and, with known clusters, on its own cluster; and, for peer methods, the risk bound's
    premise: ``bound_premise_fraction`` (targets whose ``L eta`` stayed within the premise at
    every step) and ``lr_times_smoothness_max``. ``risk_bound`` (the mean over those targets)
    is present only when some target's premise held."""
    rounds = np.asarray(rounds)
    keep = rounds > 0.8 * rounds[-1]
    keep[-1] = True

    def final(name):
        return nanmean(np.asarray(per_target[name], np.float64)[keep], axis=0)

    acc = final("test_accuracy")
    out: dict[str, Any] = {
        "target_accuracy": float(nanmean(acc)),
        "worst_target_accuracy": float(np.min(acc)) if np.all(np.isfinite(acc)) else None,
        "target_test_loss": float(nanmean(final("test_loss"))),
    }
    if weights is not None:
        w = np.asarray(weights)
        ids = np.asarray(targets)
        out["self_weight"] = float(np.mean(self_weight(w, ids)))
        out["peers_with_weight"] = float(np.mean(np.sum(w > 1e-3, axis=1)))
        if clusters is not None:
            out["own_cluster_mass"] = float(np.mean(own_cluster_mass(w, clusters, ids)))
    if "bound_premise" in per_target:
        last = {k: np.asarray(v[-1], np.float64) for k, v in per_target.items()}
        premise = last["bound_premise"]
        out["unobserved_weight"] = float(nanmean(last["unobserved_weight"]))
        out["bound_premise_fraction"] = float(np.mean(premise))
        out["lr_times_smoothness_max"] = float(np.max(last["lr_times_smoothness"]))
        if np.any(premise > 0):  # the bound, and the observed risk, of those targets only
            held = premise > 0
            out["risk_bound"] = float(np.mean(last["risk_bound"][held]))
            out["risk_bound_train_loss"] = float(nanmean(last["train_loss"][held]))
            out["risk_bound_targets"] = int(np.sum(held))
    return out


def summary_row(result: MethodResult) -> dict[str, Any]:
    """:func:`summarize` of one :class:`MethodResult`, with its label and wall time."""
    weights = None if result.weights is None else result.weights[-1]
    numbers = summarize(result.steps, result.metrics, weights, result.clusters, result.target_ids)
    return {"method": result.label, **numbers, "seconds": result.seconds}
