"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin and Ramchandran 2020,
arXiv:2006.04088; docs/fedcvr_bolt.md, "Baselines"), a clustered baseline of FedCVR-Bolt's Table 2.

The server keeps ``k`` cluster models ``theta_1..theta_k``. Each round:

1. ``per_round`` clients are drawn uniformly among the available ones (FedCVR-Bolt's budget of
   P clients a round);
2. each selected client estimates its cluster ``j(i) = argmin_j F_i(theta_j)``, ``F_i`` the
   mean loss on its whole training set (ties to the lowest index, as ``np.argmin``);
3. it trains from ``theta_{j(i)}`` (``Strategy.start_params``);
4. ``theta_j`` becomes the average of the trained models of the clients assigned to ``j``
   (``uniform`` mean as the reference code, or ``size``-weighted); a cluster without clients
   keeps its model.

Accuracy is reported as in FedCVR-Bolt: every client is assigned by the same argmin rule on its
training data and scored on its own test split under its model (``client_test_accuracy_mean``
replaces the engine's global-model value). The engine's global model still receives the usual
weighted average of the deltas; IFCA never reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, Params, Selection, Strategy
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.cluster_models import (
    assigned_metrics,
    check_clusters,
    cluster_average,
    cluster_weights,
    gather_models,
    init_cluster_models,
    per_model,
    slot_sizes,
    trained_models,
)
from fedjax_sel.strategies.registry import register_strategy


class IFCAState(NamedTuple):
    """Attributes: ``models`` the cluster models stacked on axis 0 (``[k, ...]`` leaves);
    ``slot_cluster`` int32[P], the cluster each slot of the latest selection trained from."""

    models: Params
    slot_cluster: Array


def assign_by_loss(losses: Array) -> Array:
    """``argmin_j`` over axis 0 of ``losses`` float32[k, n] (first index on ties; NaN loses)."""
    return jnp.argmin(jnp.where(jnp.isnan(losses), jnp.inf, losses), axis=0).astype(jnp.int32)


@register_strategy(
    "ifca",
    description="k cluster models; each selected client trains the one with its lowest loss",
    reference="Ghosh, Chung, Yin, Ramchandran 2020, An Efficient Framework for Clustered "
    "Federated Learning (IFCA)",
)
def ifca(
    *,
    per_round: int,
    num_clusters: int = 2,
    init: str = "shuffle",
    cluster_weighting: Weighting = "uniform",
    weighting: Weighting = "size",
) -> Strategy:
    """IFCA (module docstring).

    Args:
      per_round: clients drawn uniformly each round.
      num_clusters: k cluster models.
      init: ``shuffle`` (independent random models, see
        :func:`~fedjax_sel.strategies.cluster_models.init_cluster_models`) or ``same``.
      cluster_weighting: averaging inside a cluster: ``uniform`` (reference code) or ``size``.
      weighting: the engine's global-model aggregation weights (unused by IFCA itself).
    """
    check_clusters(num_clusters, init)
    k = int(num_clusters)

    def init_fn(key, spec):
        models = init_cluster_models(key, spec.params, k, init)
        return IFCAState(models, jnp.zeros((spec.per_round,), jnp.int32))

    def select(state: IFCAState, inputs, oracle, key):
        k_pick, k_loss = jax.random.split(key)
        clients, mask = uniform_without_replacement(k_pick, inputs.available, per_round)
        losses = per_model(lambda m: oracle.loss(m, clients, k_loss), state.models)  # [k, P]
        chex.assert_shape(losses, (k, per_round))
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        return Selection(clients, mask, weights), state._replace(
            slot_cluster=assign_by_loss(losses)
        )

    def start_params(state: IFCAState, selection, global_params):
        del selection, global_params
        return gather_models(state.models, state.slot_cluster)

    def update(state: IFCAState, selection, feedback) -> IFCAState:
        trained = trained_models(state.models, state.slot_cluster, feedback.deltas)
        sizes = slot_sizes(feedback.num_examples, cluster_weighting)
        w = cluster_weights(state.slot_cluster, selection.mask, sizes, k)
        return state._replace(models=cluster_average(state.models, trained, w))

    def metrics(state: IFCAState, params, evaluator) -> dict:
        del params
        train_loss, _ = per_model(evaluator.client_train, state.models)  # [k, K]
        return assigned_metrics(state.models, assign_by_loss(train_loss), evaluator)

    return Strategy(init_fn, select, update, start_params=start_params, metrics=metrics)
