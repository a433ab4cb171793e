"""Clustered Sampling (Fraboni, Vidal, Kameni and Lorenzi, ICML 2021, "Clustered Sampling:
Low-Variance and Improved Representativity for Clients Selection in Federated Learning").

MD sampling draws ``m`` clients i.i.d. from ``p_i = n_i / sum_j n_j``. Clustered sampling builds
``m`` distributions ("urns") ``W_k = (r_{k,i})_i`` with ``sum_k r_{k,i} = m p_i`` and draws one
client from each, independently; the server averages with weight ``1/m`` per draw. With
``omega_i = (1/m) #{k : l_k = i}``:

    E[omega_i] = (1/m) sum_k r_{k,i} = p_i                               (unbiased)
    Var[omega_i] = (1/m^2) sum_k r_{k,i} (1 - r_{k,i}) <= p_i (1 - p_i) / m = Var_MD[omega_i]

(the paper's unbiasedness and variance-reduction properties, derived from its construction;
the paper's own equation numbers were not available: docs/comparators/clustered_sampling.md).

* ``clustered_size`` (Algorithm 1): urns from the sample sizes alone; clients in decreasing
  ``p_i`` fill the urns one after the other (:func:`fedjax_sel.kernels.urns.size_layout`).
* ``clustered_similarity`` (Algorithm 2): every round, a Ward hierarchical clustering of the
  clients' latest representative gradients ``G_i = theta_i^local - theta_t`` (zero before a
  client's first participation), cut into the maximal subtrees of mass ``<= 1/m``; the ``m``
  heaviest clusters seed the urns, the others are poured into the residual capacities
  (:func:`fedjax_sel.kernels.urns.cluster_layout`).

**Fixed shapes.** The urns are a layout of ``2K`` pieces on a line of length ``m`` and each urn's
draw is a ``searchsorted`` (:mod:`fedjax_sel.kernels.urns`): no ``m x K`` matrix. Ward is a
``fori_loop`` of ``R - 1`` merges over an ``R x R`` distance matrix with a live mask, keeping each
row's nearest neighbour (``O(R^2)`` time typically, ``O(R^3)`` at worst, ``O(R^2)`` memory;
:func:`fedjax_sel.kernels.urns.ward_flat_clusters`); the cut is taken during the merges. The exact
path clusters all ``R = K`` clients (unavailable ones not live). ``pool = R < K`` is the large-K
path: ``R`` representatives are drawn uniformly among the available clients each round, every
available client joins its nearest representative under the chosen dissimilarity (``O(K R D)``; a
client never selected, ``G = 0``, joins a representative never selected), and Ward runs on the ``R``
groups as weighted points (a group of ``s`` clients counts as ``s`` coincident points at its
representative, ``ward_weight``). It approximates the exact dendrogram by forcing the clients of one
group into one leaf (and, with ``ward_input="rows"``, by describing a representative by its
dissimilarities to the ``R`` representatives instead of to all ``K`` clients); the urns satisfy
``sum_k r_{k,i} = m p_i`` exactly, so the estimator stays unbiased: only the variance reduction is
approximated.

**Duplicates.** A client drawn from several urns is trained once, with weight ``count / m``: the
same expectation as the reference's independent copies each weighted ``1/m``, but not the same
variance. The reference mode cannot be run here: the engine trains each client with
``fold_in(key, client)`` (two slots of one client would train identically) and a selection holds
no duplicate slot.

**Availability** (not in the reference): ``p`` is renormalised over the available clients
(``n_i = 0`` for the others), so "unbiased" refers to the objective over the available clients.

**Asks of clients:** ``clustered_size`` nothing beyond training (the server knows ``n_i``);
``clustered_similarity`` only the selected clients' updates, which are sent anyway. Server:
``O(K log K)`` per round for Algorithm 1; for Algorithm 2 ``O(K D)`` memory for ``G`` (``D``: the
sketch), ``O(K^2 D)`` dissimilarities, ``O(K^3)`` for the row distances of
``ward_input="rows"`` and ``O(K^2)`` (typical) for Ward per round (exact: 0.4 s at K = 2000 on a
2-core CPU), or ``O(K R D + R^3)`` with a pool.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ConfigError,
    RoundInputs,
    Selection,
    SimSpec,
    Strategy,
    init_empty_state,
    update_identity,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.kernels.urns import (
    MEASURES,
    WARD_INPUTS,
    Measure,
    WardInput,
    cluster_layout,
    dissimilarity,
    merge_duplicates,
    sample_urns,
    size_layout,
    squared_row_distances,
    ward_flat_clusters,
    ward_weight,
)
from fedjax_sel.strategies._sketch import sketch_coordinates
from fedjax_sel.strategies.registry import register_strategy
from fedjax_sel.tree import flatten_stacked

REFERENCE = (
    "Fraboni, Vidal, Kameni, Lorenzi 2021, Clustered Sampling: Low-Variance and Improved "
    "Representativity for Clients Selection in Federated Learning (ICML)"
)


def _available_sizes(inputs: RoundInputs) -> Array:
    return jnp.where(inputs.available, inputs.num_examples, 0).astype(jnp.int32)


def _selection(draws, valid, sizes, diagnostics) -> Selection:
    clients, mask, weights = merge_duplicates(draws, valid)
    total = jnp.maximum(jnp.sum(sizes), 1).astype(jnp.float32)
    diagnostics = {
        "law": sizes.astype(jnp.float32) / total,
        "distinct": jnp.sum(mask).astype(jnp.float32),
        **diagnostics,
    }
    return Selection(clients, mask, weights, diagnostics=diagnostics)


@register_strategy(
    "clustered_size",
    description="Clustered Sampling, Algorithm 1: m urns from the sample sizes "
    "(sum_k r_ki = m p_i), one client drawn from each, weights count/m",
    reference=REFERENCE,
)
def clustered_size(*, per_round: int) -> Strategy:
    """Clustered sampling by sample size (Algorithm 1; reference ``get_clusters_with_alg1``).

    ``per_round`` urns; clients in decreasing ``p_i`` (over the available clients) fill them in
    turn, so urn ``k`` is the interval ``[k, k+1)`` of the cumulative masses ``m p``. One client
    is drawn from each urn; a client drawn ``c`` times trains once with weight ``c / m``. The
    urns are rebuilt every round from the available clients (the reference builds them once,
    from everybody): ``O(K log K)``. Asks nothing of the clients beyond training.
    """

    def select(state, inputs, oracle, key):
        del oracle
        sizes = _available_sizes(inputs)
        draws, valid = sample_urns(size_layout(sizes, per_round), key)
        return _selection(draws, valid, sizes, {}), state

    return Strategy(init_empty_state, select, update_identity, reads_deltas=False)


class ClusteredSimilarityState(NamedTuple):
    """``grads``: float32[K, D] each client's latest representative gradient
    ``theta_i^local - theta_t`` (on the sketch's coordinates; zero before its first update);
    ``coords``: int32[D] the flattened-parameter coordinates kept."""

    grads: Array
    coords: Array


@register_strategy(
    "clustered_similarity",
    description="Clustered Sampling, Algorithm 2: urns from a Ward clustering of the clients' "
    "latest updates (arccos/L2/L1), one client drawn from each, weights count/m",
    reference=REFERENCE,
)
def clustered_similarity(
    *,
    per_round: int,
    measure: Measure = "arccos",
    ward_input: WardInput = "rows",
    sketch_dim: int = 0,
    pool: int = 0,
) -> Strategy:
    """Clustered sampling by model similarity (Algorithm 2; reference ``get_clusters_with_alg2``
    and ``FedProx_clustered_sampling``).

    Each round: the dissimilarities ``D`` of the clients' latest representative gradients
    (``measure``); Ward's hierarchical clustering (``ward_input``); the cut into the maximal
    subtrees of mass ``<= 1/m`` (mass ``sum p_i``); the ``m`` heaviest clusters seed the urns,
    the others (ascending mass, clients shuffled) are poured into the rest; one client drawn
    from each urn (duplicates train once, weight ``count / m``). After training, each selected
    client's ``G_i`` becomes its update.

    Args:
      per_round: m, the urns (one draw each).
      measure: ``arccos`` (the paper's main runs), ``l2`` (squared) or ``l1``.
      ward_input: ``rows`` (the reference's ``linkage(D, "ward")`` on the square matrix: Ward on
        the ``K`` row vectors ``D[i, :]``) or ``condensed`` (Ward on ``D`` itself as the
        distances, ``linkage(squareform(D), "ward")``).
      sketch_dim: store and compare ``G`` on this many random coordinates (fixed at init);
        ``0``: the whole update (memory ``K x |theta|``).
      pool: ``R``, the representatives of the large-K path (module docstring); ``0``, or at
        least K, clusters every client (``O(K^3)`` per round with ``rows``; use a pool above
        about 2000 clients).
    """
    if measure not in MEASURES:
        raise ConfigError(
            f"clustered_similarity measure must be one of {MEASURES}, got {measure!r}"
        )
    if ward_input not in WARD_INPUTS:
        raise ConfigError(
            f"clustered_similarity ward_input must be one of {WARD_INPUTS}, got {ward_input!r}"
        )
    sketch_dim, pool = int(sketch_dim), int(pool)
    if sketch_dim < 0 or pool < 0:
        raise ConfigError(
            f"clustered_similarity sketch_dim and pool must be >= 0, got {sketch_dim}, {pool}"
        )

    def init(key, spec: SimSpec) -> ClusteredSimilarityState:
        coords = sketch_coordinates(key, spec.params, "all", sketch_dim)
        return ClusteredSimilarityState(
            grads=jnp.zeros((spec.num_clients, coords.shape[0]), jnp.float32),
            coords=coords,
        )

    def exact_labels(grads, available, sizes, limit):
        d = dissimilarity(grads, grads, measure)
        if ward_input == "rows":
            sq = squared_row_distances(jnp.where(available[None, :], d, 0.0))
        else:
            sq = jnp.square(d)
        ones = jnp.ones(sizes.shape, jnp.float32)
        labels, _ = ward_flat_clusters(sq, ones, sizes.astype(jnp.float32), available, limit)
        return labels

    def pooled_labels(grads, available, sizes, limit, key):
        k = sizes.shape[0]
        reps, rep_ok = uniform_without_replacement(key, available, pool)
        d = dissimilarity(grads, grads[reps], measure)  # [K, R]
        # nearest representative by the dissimilarity itself (for a metric, arccos or L1, a
        # client's row of D then differs from its representative's by at most their distance:
        # |D(i, j) - D(r, j)| <= D(i, r)); O(K R), where the rows' own distances would be O(K R^2)
        assign = jnp.argmin(jnp.where(rep_ok[None, :], d, jnp.inf), axis=1)
        # a client never selected (G = 0) is at arccos-distance 0 from everybody (the
        # reference's convention): it joins a representative never selected, if there is one
        zero = ~jnp.any(grads != 0, axis=1)
        zero_rep = rep_ok & zero[reps]
        assign = jnp.where(zero & jnp.any(zero_rep), jnp.argmax(zero_rep), assign)
        if ward_input == "rows":
            between = squared_row_distances(jnp.where(rep_ok[None, :], d[reps], 0.0))
        else:
            between = jnp.square(d[reps])
        # a representative joins its own group (another one at distance 0 could win the argmin)
        assign = assign.at[reps].set(jnp.where(rep_ok, jnp.arange(pool), assign[reps]))
        counts = jax.ops.segment_sum(available.astype(jnp.float32), assign, pool)
        masses = jax.ops.segment_sum(sizes.astype(jnp.float32), assign, pool)
        rep_labels, _ = ward_flat_clusters(
            ward_weight(counts) * between, counts, masses, rep_ok & (counts > 0), limit
        )
        return jnp.where(available, rep_labels[assign], k)

    def select(state: ClusteredSimilarityState, inputs: RoundInputs, oracle, key):
        del oracle
        k_pool, k_shuffle, k_draw = jax.random.split(key, 3)
        k = state.grads.shape[0]
        sizes = _available_sizes(inputs)
        available = inputs.available
        limit = jnp.sum(sizes).astype(jnp.float32) / per_round * (1.0 + 1e-6)
        if 0 < pool < k:
            labels = pooled_labels(state.grads, available, sizes, limit, k_pool)
        else:
            labels = jnp.where(available, exact_labels(state.grads, available, sizes, limit), k)
        layout = cluster_layout(sizes, labels, per_round, k_shuffle)
        draws, valid = sample_urns(layout, k_draw)
        mass = jax.ops.segment_sum(sizes, labels, k + 1)[:k]
        clusters = jnp.sum(mass > 0).astype(jnp.float32)
        return _selection(draws, valid, sizes, {"clusters": clusters}), state

    def update(state: ClusteredSimilarityState, selection: Selection, feedback):
        k = state.grads.shape[0]
        idx = jnp.where(selection.mask, selection.clients, k)
        rows = flatten_stacked(feedback.deltas)[:, state.coords]
        return state._replace(grads=state.grads.at[idx].set(rows, mode="drop"))

    return Strategy(init, select, update)
