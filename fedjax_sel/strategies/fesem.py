"""FeSEM, multi-center federated learning by stochastic expectation maximisation (Long, Xie,
Shen, Zhou, Wang and Jiang 2023; docs/fedcvr_bolt.md, "Baselines"), a clustered baseline of
FedCVR-Bolt's Table 2.

The server keeps ``k`` centers ``W~_1..W~_k`` (full models) and, for each client, the sketch of
the last local model it reported (``W_i``) and its assignment ``r_i``. Each round:

1. ``per_round`` clients are drawn uniformly among the available ones (FedCVR-Bolt's budget);
2. each trains from its center ``W~_{r_i}`` (``Strategy.start_params``);
3. E-step: the participants' new local models ``W_i`` are assigned to the nearest center,
   ``r_i = argmin_c ||W_i - W~_c||^2`` (on the model sketch);
4. M-step: each center becomes the mean of the new local models assigned to it (``size``-weighted
   as the reference code's ``update_model_wmode``, or ``uniform``); a center without
   participants keeps its model.

Choices the paper leaves open, as in the reference code: the clustering features are a sketch of
the model (``sketch="all"`` is the paper's full-model distance, ``last_layer`` is the code's one
layer), initial assignments are uniform at random (the code's random initial features make the
first assignment random), and only participants are re-assigned (the others keep stale
features). Diagnostics: the uniform ``law`` and ``cluster_sizes`` (clients per center, largest
first). Accuracy is reported as in FedCVR-Bolt: each client scored on its own test split under
its center ``r_i`` (``client_test_accuracy_mean`` replaces the engine's global-model value).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params, Selection, Strategy
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.kernels.affinity import squared_distances
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies._sketch import check_sketch, sketch_coordinates, sketch_stacked
from fedjax_sel.strategies.cluster_models import (
    assigned_metrics,
    check_clusters,
    cluster_average,
    cluster_weights,
    gather_models,
    init_cluster_models,
    slot_sizes,
    trained_models,
)
from fedjax_sel.strategies.registry import register_strategy


class FeSEMState(NamedTuple):
    """Attributes: ``centers`` stacked ``[k, ...]`` models; ``assign`` int32[K] each client's
    center; ``coords`` int32[D] the sketch; ``slot_cluster`` int32[P] the centers the latest
    selection trained from."""

    centers: Params
    assign: Array
    coords: Array
    slot_cluster: Array


def nearest_center(features: Array, centers: Array) -> Array:
    """E-step: ``argmin_c ||features_i - centers_c||^2``, int32[n]."""
    return jnp.argmin(squared_distances(features, centers), axis=1).astype(jnp.int32)


@register_strategy(
    "fesem",
    description="k centers; participants assigned to the nearest center (L2 on weights), "
    "centers = mean of their models (EM)",
    reference="Long et al. 2023, Multi-center federated learning: clients clustering for better "
    "personalization (FeSEM)",
)
def fesem(
    *,
    per_round: int,
    num_clusters: int = 2,
    init: str = "shuffle",
    sketch: str = "all",
    sketch_dim: int = 0,
    cluster_weighting: Weighting = "size",
    weighting: Weighting = "size",
) -> Strategy:
    """FeSEM (module docstring).

    Args:
      per_round: clients drawn uniformly each round.
      num_clusters: k centers.
      init: center initialisation, ``shuffle`` or ``same``
        (:func:`~fedjax_sel.strategies.cluster_models.init_cluster_models`).
      sketch, sketch_dim: the weights the distances use (``all`` or ``last_layer``; a random
        subset of ``sketch_dim`` of them when > 0).
      cluster_weighting: the M-step mean: ``size`` (reference code) or ``uniform``.
      weighting: the engine's global-model aggregation weights (unused by FeSEM itself).
    """
    check_clusters(num_clusters, init)
    check_sketch(sketch, sketch_dim)
    if init == "same" and num_clusters > 1:
        raise ConfigError("fesem needs distinct initial centers: init='shuffle'")
    k = int(num_clusters)

    def init_fn(key, spec):
        k_models, k_assign, k_sketch = jax.random.split(key, 3)
        return FeSEMState(
            centers=init_cluster_models(k_models, spec.params, k, init),
            assign=jax.random.randint(k_assign, (spec.num_clients,), 0, k, jnp.int32),
            coords=sketch_coordinates(k_sketch, spec.params, sketch, int(sketch_dim)),
            slot_cluster=jnp.zeros((spec.per_round,), jnp.int32),
        )

    def select(state: FeSEMState, inputs, oracle, key):
        del oracle
        clients, mask = uniform_without_replacement(key, inputs.available, per_round)
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        sizes = jax.ops.segment_sum(jnp.ones(state.assign.shape, jnp.float32), state.assign, k)
        diagnostics = {  # uniform selection; the clients per center, largest first
            "law": inputs.available.astype(jnp.float32),
            "cluster_sizes": -jnp.sort(-sizes),
        }
        selection = Selection(clients, mask, weights, diagnostics=diagnostics)
        return selection, state._replace(slot_cluster=state.assign[clients])

    def start_params(state: FeSEMState, selection, global_params):
        del selection, global_params
        return gather_models(state.centers, state.slot_cluster)

    def update(state: FeSEMState, selection, feedback) -> FeSEMState:
        trained = trained_models(state.centers, state.slot_cluster, feedback.deltas)
        new_assign = nearest_center(
            sketch_stacked(trained, state.coords), sketch_stacked(state.centers, state.coords)
        )
        sizes = slot_sizes(feedback.num_examples, cluster_weighting)
        w = cluster_weights(new_assign, selection.mask, sizes, k)
        idx = jnp.where(selection.mask, selection.clients, state.assign.shape[0])
        return state._replace(
            centers=cluster_average(state.centers, trained, w),
            assign=state.assign.at[idx].set(new_assign, mode="drop"),
        )

    def metrics(state: FeSEMState, params, evaluator) -> dict:
        del params
        return assigned_metrics(state.centers, state.assign, evaluator)

    return Strategy(init_fn, select, update, start_params=start_params, metrics=metrics)
