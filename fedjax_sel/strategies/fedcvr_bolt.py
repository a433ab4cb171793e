"""FedCVR-Bolt: homophily coalitions and variance-reduction Boltzmann selection (Licciardi,
Raineri, Proskurnikov, Rondoni and Zino; ``papers/fedcvr_bolt.txt`` Algorithm 1).

Every round ``t`` (Algorithm 1, with the server's table ``theta_k(t)`` of the last model it saw
from each client, sketched to ``D`` coordinates):

1. normalise ``theta~_k = theta_k / ||theta_k||`` (line 3);
2. coalitions ``C_1..C_P``: spectral clustering of the ``theta~_k`` with the homophily affinity
   of eq. 4 (or a kernel of appendix B.1), ``P = per_round`` (line 5;
   :func:`fedjax_sel.kernels.spectral.spectral_clustering`, exact or landmark path);
3. value vector ``v_k = sum_d (C^d alpha)_k^2 / C^d_kk`` (eqs. 5-6, line 6) from the streaming
   statistics of :mod:`fedjax_sel.kernels.covariance`, ``alpha_k = n_k / sum n``;
4. one client per coalition drawn from ``pi_p(k) = exp(beta v_k) / sum_{j in C_p} exp(beta v_j)``
   (eq. 8, lines 7-8); during the first ``warmup`` rounds (30, appendix C.2) the ``P`` clients
   are drawn uniformly instead, while steps 2 and 5 run as usual;
5. after local training (line 10), the table takes the selected clients' new models, the means
   of eq. 9 ``theta_bar_k = rho_{k, j_p} theta_{j_p}(t+1)`` (``rho`` the cosine similarity of
   line 4 at round ``t``) and the Robbins-Monro covariance update of eq. 11 with
   ``gamma_t = 1/t`` (lines 12-17);
6. the server aggregates with ``n_j / sum_selected n`` (line 18): ``weighting="size"``.

Where the paper leaves a case open (it assumes every client is online and P non-empty
coalitions):

* a coalition without an available member leaves its slot empty; with ``fill_empty=True``
  (default) such slots are filled by Boltzmann draws (``softmax(beta v)``) over the remaining
  available clients, so P clients still train (e.g. k-means finds fewer than P distinct points
  when the table has fewer distinct directions, as with a one-parameter model in the first
  rounds);
* eq. 9 names the coalition's selected client ``j_p``; when ``k``'s coalition has none
  (warm-up rounds, an empty slot) ``k`` is paired with the selected client of largest
  ``rho_{k, j}``. With one selected client per coalition this is exactly eq. 9;
* ``gamma_t = 1/t`` counts rounds with at least one trained client (every round when all are
  online); ``C(1) = init_cov * I`` (design section 7; with ``gamma_1 = 1`` it only shapes ``v``
  before the first update);
* the table starts at the initial global model for every client (Algorithm 1's input
  ``theta_k(1)``).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey, Selection, SimSpec, Strategy
from fedjax_sel.kernels import gumbel_top_k, uniform_without_replacement
from fedjax_sel.kernels.affinity import normalize_rows
from fedjax_sel.kernels.boltzmann import (
    boltzmann_logits,
    coalition_probabilities,
    fill_slots,
    sample_per_coalition,
)
from fedjax_sel.kernels.covariance import (
    StreamingCovariance,
    covariance_update,
    init_covariance,
    value_vector,
)
from fedjax_sel.kernels.spectral import (
    DEFAULT_COALITIONS,
    CoalitionConfig,
    spectral_clustering,
)
from fedjax_sel.strategies._common import check_weighting, fedavg_weights
from fedjax_sel.strategies._sketch import (
    check_sketch,
    sketch_coordinates,
    sketch_one,
    sketch_stacked,
)
from fedjax_sel.strategies.registry import register_strategy


class FedCVRState(NamedTuple):
    """Attributes:
    table: float32[K, D] the last model sketch seen from each client (``theta_k(t)``).
    cov: the streaming covariance statistics (``C^d alpha`` and ``diag C^d``).
    alpha: float32[K] global weights ``n_k / sum n``.
    coords: int32[D] flattened-parameter indices of the sketch.
    labels: int32[K] the coalitions of the latest round.
    values: float32[K] the value vector of the latest round.
    probs: float32[K] the Boltzmann probabilities of the latest round (eq. 8, available
      clients; the warm-up rounds sample uniformly instead)."""

    table: Array
    cov: StreamingCovariance
    alpha: Array
    coords: Array
    labels: Array
    values: Array
    probs: Array


class BoltRound(NamedTuple):
    """One selection: ``clients`` int32[P], ``mask`` bool[P], and the round's ``labels``,
    ``values`` and ``probs`` (float32[K])."""

    clients: Array
    mask: Array
    labels: Array
    values: Array
    probs: Array


def select_clients(
    key: PRNGKey,
    table: Array,
    cov: StreamingCovariance,
    available: Array,
    *,
    per_round: int,
    beta: float = 1.0,
    coalitions: CoalitionConfig = DEFAULT_COALITIONS,
    fill_empty: bool = True,
) -> BoltRound:
    """Algorithm 1 lines 3-8 (no warm-up): coalitions, value vector, one Boltzmann draw per
    coalition among the ``available`` clients (empty slots filled when ``fill_empty``)."""
    chex.assert_rank(table, 2)
    chex.assert_shape(available, (table.shape[0],))
    k_coal, k_draw, k_fill = jax.random.split(key, 3)
    labels = spectral_clustering(normalize_rows(table), per_round, k_coal, coalitions)
    values = value_vector(cov.c_alpha, cov.c_diag)
    probs = coalition_probabilities(values, labels, per_round, beta, available)
    clients, ok = sample_per_coalition(k_draw, values, labels, per_round, beta, available)
    if fill_empty:
        taken = jnp.zeros(available.shape, bool).at[clients].max(ok)
        logits = boltzmann_logits(values, beta, available & ~taken)
        backup, backup_ok = gumbel_top_k(k_fill, logits, per_round)
        clients, ok = fill_slots(clients, ok, backup, backup_ok, per_round)
    return BoltRound(clients, ok, labels, values, probs)


def conditional_means(
    table: Array, labels: Array, clients: Array, mask: Array, new_rows: Array
) -> Array:
    """``theta_bar_k = rho_{k, j} theta_j(t+1)`` (eq. 9), float32[K, D].

    ``rho`` is the cosine similarity of the round-``t`` table (Algorithm 1 line 4), a ``K x P``
    block; ``j`` is the selected client of ``k``'s coalition, or the selected client with the
    largest ``rho_{k, j}`` when the coalition has none (module docstring).
    """
    unit = normalize_rows(table)
    # a client paired with itself has rho = 1 exactly (float32 rounding of ||unit||^2 would
    # leave a ~1e-7 residual whose 0/0-like ratio in v is noise)
    itself = jnp.arange(table.shape[0])[:, None] == clients[None, :]
    rho = jnp.where(itself, 1.0, unit @ unit[clients].T)
    same = labels[:, None] == labels[clients][None, :]
    score = jnp.where(mask[None, :], rho + 4.0 * same, -jnp.inf)  # |rho| <= 1: same wins
    j = jnp.argmax(score, axis=1)
    return jnp.take_along_axis(rho, j[:, None], axis=1) * new_rows[j]


def observe(
    table: Array,
    cov: StreamingCovariance,
    alpha: Array,
    labels: Array,
    clients: Array,
    mask: Array,
    new_rows: Array,
) -> tuple[Array, StreamingCovariance]:
    """Algorithm 1 lines 12-17: the new table and covariance statistics after the selected
    clients reported ``new_rows`` (float32[P, D]); unchanged when no slot trained."""
    mean = conditional_means(table, labels, clients, mask, new_rows)
    idx = jnp.where(mask, clients, table.shape[0])
    new_table = table.at[idx].set(new_rows, mode="drop")
    new_cov = covariance_update(cov, new_table - mean, alpha)
    seen = jnp.any(mask)
    new_cov = jax.tree.map(lambda n, o: jnp.where(seen, n, o), new_cov, cov)
    return new_table, new_cov


@register_strategy(
    "fedcvr_bolt",
    description="homophily coalitions (spectral clustering) + one Boltzmann draw per coalition "
    "on the variance-reduction value vector",
    reference="Licciardi, Raineri, Proskurnikov, Rondoni, Zino 2025, Socially Inspired Coalition "
    "Formation and Client Selection in Federated Learning (FedCVR-Bolt)",
)
def fedcvr_bolt(
    *,
    per_round: int,
    beta: float = 1.0,
    warmup: int = 30,
    affinity: str = "rbf",
    gamma: float = 1.0,
    coef0: float = 1.0,
    coalitions: str = "auto",
    landmarks: int = 256,
    scaling: str = "degree",
    kmeans_init: int = 10,
    kmeans_iters: int = 300,
    sketch: str = "last_layer",
    sketch_dim: int = 0,
    init_cov: float = 1.0,
    fill_empty: bool = True,
    weighting: str = "size",
) -> Strategy:
    """FedCVR-Bolt client selection (module docstring).

    Args:
      per_round: P, coalitions and clients per round.
      beta: Boltzmann inverse temperature (eq. 8; 1 in the paper).
      warmup: rounds of uniform sampling before Boltzmann selection (30 in the paper).
      affinity: ``rbf`` (eq. 4, row-normalised), ``cosine``, ``laplacian`` or ``sigmoid``.
      gamma, coef0: kernel parameters (``gamma = 0``: automatic scale).
      coalitions: ``exact`` (``K x K``), ``landmark`` (Nystrom, ``O(K m)``) or ``auto``
        (exact up to 10,000 clients).
      landmarks: m, landmark clients of the Nystrom path.
      scaling: spectral embedding row scaling, ``degree`` (scikit-learn), ``row`` or ``none``.
      kmeans_init, kmeans_iters: k-means++ seedings and Lloyd budget (10 and 300).
      sketch: coordinates tracked per client: ``last_layer`` (appendix C.2) or ``all``.
      sketch_dim: keep a fixed random subset of that many sketch coordinates (300 for CIFAR in
        the paper); 0 keeps them all.
      init_cov: ``C(1) = init_cov * I``.
      fill_empty: fill the slots of coalitions without an available client.
      weighting: aggregation weights: ``size`` (Algorithm 1 line 18) or ``uniform``.
    """
    if not beta >= 0:
        raise ConfigError(f"fedcvr_bolt beta must be >= 0, got {beta}")
    if int(warmup) != warmup or warmup < 0:
        raise ConfigError(f"fedcvr_bolt warmup must be an integer >= 0, got {warmup}")
    if not init_cov > 0:
        raise ConfigError(f"fedcvr_bolt init_cov must be > 0, got {init_cov}")
    check_sketch(sketch, sketch_dim)
    check_weighting(weighting)
    config = CoalitionConfig(
        affinity=affinity,
        gamma=float(gamma),
        coef0=float(coef0),
        method=coalitions,
        landmarks=int(landmarks),
        scaling=scaling,
        n_init=int(kmeans_init),
        max_iter=int(kmeans_iters),
    ).validate()

    def init(key, spec: SimSpec) -> FedCVRState:
        k = spec.num_clients
        coords = sketch_coordinates(key, spec.params, sketch, int(sketch_dim))
        row = sketch_one(spec.params, coords)
        n = jnp.asarray(spec.num_examples, jnp.float32)
        alpha = n / jnp.sum(n)
        return FedCVRState(
            table=jnp.broadcast_to(row, (k, row.shape[0])).astype(jnp.float32),
            cov=init_covariance(alpha, row.shape[0], float(init_cov)),
            alpha=alpha,
            coords=coords,
            labels=jnp.zeros((k,), jnp.int32),
            values=jnp.zeros((k,), jnp.float32),
            probs=jnp.zeros((k,), jnp.float32),
        )

    def select(state: FedCVRState, inputs, oracle, key):
        del oracle
        k_bolt, k_warm = jax.random.split(key)
        bolt = select_clients(
            k_bolt,
            state.table,
            state.cov,
            inputs.available,
            per_round=per_round,
            beta=beta,
            coalitions=config,
            fill_empty=fill_empty,
        )
        warm_clients, warm_mask = uniform_without_replacement(k_warm, inputs.available, per_round)
        in_warmup = inputs.round < warmup
        clients = jnp.where(in_warmup, warm_clients, bolt.clients)
        mask = jnp.where(in_warmup, warm_mask, bolt.mask)
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        state = state._replace(labels=bolt.labels, values=bolt.values, probs=bolt.probs)
        return Selection(clients, mask, weights), state

    def update(state: FedCVRState, selection: Selection, feedback) -> FedCVRState:
        rows = sketch_one(feedback.params, state.coords)[None, :] + sketch_stacked(
            feedback.deltas, state.coords
        )
        table, cov = observe(
            state.table,
            state.cov,
            state.alpha,
            state.labels,
            selection.clients,
            selection.mask,
            rows,
        )
        return state._replace(table=table, cov=cov)

    def metrics(state: FedCVRState, params, evaluator) -> dict:
        del params, evaluator
        used = jnp.zeros((per_round,), bool).at[state.labels].set(True)
        return {"coalitions_used": jnp.sum(used), "value_max": jnp.max(state.values)}

    return Strategy(init, select, update, metrics=metrics)
