"""Helpers of the clustered baselines with several models (IFCA, FeSEM; FedCVR-Bolt's Table 2):
``k`` cluster models stacked on a leading axis, per-slot start parameters, per-cluster
averaging of the trained models, and the paper's accuracy (each client under its own model),
which the personalized mode's IFCA reports too (:mod:`fedjax_sel.personalized.methods`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Evaluator, Params, PRNGKey
from fedjax_sel.tree import row_mask

INITS = ("shuffle", "same")


def check_clusters(num_clusters: int, init: str) -> None:
    if int(num_clusters) != num_clusters or num_clusters < 1:
        raise ConfigError(f"num_clusters must be an integer >= 1, got {num_clusters}")
    if init not in INITS:
        raise ConfigError(f"cluster model init must be one of {INITS}, got {init!r}")


def init_cluster_models(key: PRNGKey, params: Params, num_clusters: int, init: str) -> Params:
    """``num_clusters`` models stacked on axis 0.

    Model 0 is ``params``. With ``shuffle`` every other model permutes the entries of each of
    ``params``' tensors at random: the initialisers draw a tensor's entries i.i.d. (zeros for
    biases), so this is a fresh random initialisation from the same law without the model's
    ``init`` function (IFCA's MNIST code initialises its models at random). ``same`` copies
    ``params`` (the clusters then separate only through the assignment).
    """
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))

    def stack(leaf, k):
        if init == "same" or num_clusters == 1:
            return jnp.broadcast_to(leaf, (num_clusters,) + leaf.shape)
        flat = leaf.reshape(-1)
        perms = jax.vmap(lambda kk: jax.random.permutation(kk, flat.shape[0]))(
            jax.random.split(k, num_clusters - 1)
        )
        others = flat[perms].reshape((num_clusters - 1,) + leaf.shape)
        return jnp.concatenate([leaf[None], others])

    return jax.tree.unflatten(
        treedef, [stack(leaf, k) for leaf, k in zip(leaves, keys, strict=True)]
    )


def gather_models(models: Params, index: Array) -> Params:
    """The stacked models ``models[index]`` (one per entry of ``index``)."""
    return jax.tree.map(lambda m: m[index], models)


def trained_models(models: Params, slot_cluster: Array, deltas: Params) -> Params:
    """The slots' trained models: their start ``models[slot_cluster]`` plus the engine's deltas."""
    return jax.tree.map(lambda s, d: s + d, gather_models(models, slot_cluster), deltas)


def slot_sizes(num_examples: Array, cluster_weighting: str) -> Array:
    """The slots' weights in a cluster average: ``n_i`` (``size``) or 1 (``uniform``)."""
    return num_examples if cluster_weighting == "size" else jnp.ones_like(num_examples)


def cluster_weights(assign: Array, mask: Array, sizes: Array, num_clusters: int) -> Array:
    """float32[P, k]: slot ``i``'s share in cluster ``j``'s average (columns sum to one, or
    zero for a cluster without a valid slot)."""
    w = (
        jax.nn.one_hot(assign, num_clusters, dtype=jnp.float32)
        * (mask.astype(jnp.float32) * sizes.astype(jnp.float32))[:, None]
    )
    total = jnp.sum(w, axis=0, keepdims=True)
    return w / jnp.where(total > 0, total, 1.0)


def cluster_average(models: Params, stacked: Params, weights: Array) -> Params:
    """Each cluster model replaced by the ``weights``-average of the stacked slot values; a
    cluster whose column of ``weights`` is zero keeps its model."""
    has = jnp.sum(weights, axis=0) > 0

    def one(m, s):
        avg = jnp.tensordot(weights.T, s, axes=1)
        keep = row_mask(has, m)
        return jnp.where(keep, avg, m)

    return jax.tree.map(one, models, stacked)


def per_model(fn, models: Params):
    """``fn`` applied to each stacked model (``lax.map``): outputs stacked on axis 0."""
    return jax.lax.map(fn, models)


def assigned_client_metrics(
    models: Params, assign: Array, evaluator: Evaluator, *, train: bool = True
) -> dict:
    """Each client's loss / accuracy under the model it is assigned to (``assign`` int32[K]):
    float32[K] arrays ``test_*`` (NaN for clients without test data) and, with ``train``,
    ``train_*`` on the clients' training data."""
    k_ids = jnp.arange(assign.shape[0])
    out = {}
    if evaluator.client_test is not None:
        loss, acc, _ = per_model(evaluator.client_test, models)  # [k, K] each
        out["test_loss"], out["test_accuracy"] = loss[assign, k_ids], acc[assign, k_ids]
    if train:
        loss, acc = per_model(evaluator.client_train, models)
        out["train_loss"], out["train_accuracy"] = loss[assign, k_ids], acc[assign, k_ids]
    return out


def assigned_metrics(models: Params, assign: Array, evaluator: Evaluator) -> dict:
    """The paper's accuracy of a clustered method: each client's test loss / accuracy under
    the model it is assigned to (``assign`` int32[K]), averaged over the clients that hold
    test data. The keys replace the engine's global-model ``client_test_*_mean``."""
    if evaluator.client_test is None:
        return {}
    per_client = assigned_client_metrics(models, assign, evaluator, train=False)
    loss_k, acc_k = per_client["test_loss"], per_client["test_accuracy"]
    has = ~jnp.isnan(loss_k)
    n = jnp.maximum(jnp.sum(has), 1)
    used = jnp.zeros((jax.tree.leaves(models)[0].shape[0],), bool).at[assign].set(True)
    return {
        "client_test_loss_mean": jnp.sum(jnp.where(has, loss_k, 0.0)) / n,
        "client_test_accuracy_mean": jnp.sum(jnp.where(has, acc_k, 0.0)) / n,
        "clusters_used": jnp.sum(used),
    }
