"""FedCVR-Bolt: homophily coalitions and variance-reduction Boltzmann selection (Licciardi,
Raineri, Proskurnikov, Rondoni and Zino; arXiv:2506.02897, Algorithm 1).

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
  online); ``C(1) = init_cov * I`` (with ``gamma_1 = 1`` it only shapes ``v``
  before the first update);
* the table starts at the initial global model for every client (Algorithm 1's input
  ``theta_k(1)``).

The two mechanisms can be taken apart: ``beta = 0`` makes every coalition's law uniform
(coalition-stratified sampling: one uniformly drawn client per coalition, the value vector
unused), and ``value_scale="standardized"`` (ours, not the paper's) standardises the values
within each coalition (mean 0, standard deviation 1 over its available members) before eq. 8, so
that ``beta`` is scale-free: ``v`` is in squared-parameter units, and at the paper's
``beta = 1`` its spread inside a coalition can be so small that eq. 8 is uniform in practice.

Diagnostics (``Selection.diagnostics``, every round; per-coalition arrays are ordered by
coalition size, largest first, so that their means over rounds stay meaningful):

* ``law``: the inclusion law the round was drawn from (``pi_p(k)`` of each client's coalition;
  uniform over the available clients during the warm-up); the engine reports its entropy ratio
  and largest probability over uniform;
* ``coalition_sizes`` float32[P]: clients per coalition; ``coalitions_used``;
* ``coalition_entropy_ratio`` and ``coalition_max_over_uniform`` float32[P]: how far each
  coalition's eq. 8 law is from uniform on its available members (computed in the warm-up too:
  the law the round would have used); ``logit_spread``: the largest ``beta (max v - min v)``
  inside a coalition (the values after standardisation when that option is on);
* ``ari_dominant_label``: adjusted Rand index of the coalitions against each client's dominant
  training label (classification only: from ``SimSpec.label_counts``);
  ``ari_previous_round``: against the previous round's coalitions (their stability);
* ``value_max``, ``value_mean`` (over the available clients) and ``in_warmup``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey, Selection, SimSpec, Strategy
from fedjax_sel.kernels import gumbel_top_k, uniform_without_replacement
from fedjax_sel.kernels.affinity import normalize_rows
from fedjax_sel.kernels.boltzmann import (
    boltzmann_logits,
    coalition_law_stats,
    coalition_probabilities,
    fill_slots,
    sample_per_coalition,
    standardize_within,
)
from fedjax_sel.kernels.covariance import (
    StreamingCovariance,
    covariance_update,
    init_covariance,
    value_vector,
)
from fedjax_sel.kernels.kmeans import adjusted_rand_index, contingency_ari
from fedjax_sel.kernels.spectral import (
    DEFAULT_COALITIONS,
    CoalitionConfig,
    spectral_clustering,
)
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies._sketch import (
    check_sketch,
    sketch_coordinates,
    sketch_one,
    sketch_stacked,
)
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

VALUE_SCALES = ("raw", "standardized")


class FedCVRState(NamedTuple):
    """Attributes:
    table: float32[K, D] the last model sketch seen from each client (``theta_k(t)``).
    cov: the streaming covariance statistics (``C^d alpha`` and ``diag C^d``).
    alpha: float32[K] global weights ``n_k / sum n``.
    coords: int32[D] flattened-parameter indices of the sketch.
    labels: int32[K] the coalitions of the latest round (eq. 9 needs them in ``update``).
    dominant: bool[K, C] one-hot of each client's most frequent training label (the reference
      of the ``ari_dominant_label`` diagnostic), ``None`` without label counts."""

    table: Array
    cov: StreamingCovariance
    alpha: Array
    coords: Array
    labels: Array
    dominant: Array | None = None


class BoltRound(NamedTuple):
    """One selection: ``clients`` int32[P], ``mask`` bool[P], and the round's ``labels``
    (int32[K]), ``values`` (eq. 6), ``scores`` (the values eq. 8 used: ``values`` or their
    standardisation) and ``probs`` (eq. 8, float32[K])."""

    clients: Array
    mask: Array
    labels: Array
    values: Array
    scores: Array
    probs: Array


def select_clients(
    key: PRNGKey,
    table: Array,
    cov: StreamingCovariance,
    available: Array,
    *,
    per_round: int,
    beta: float = 1.0,
    value_scale: str = "raw",
    coalitions: CoalitionConfig = DEFAULT_COALITIONS,
    fill_empty: bool = True,
) -> BoltRound:
    """Algorithm 1 lines 3-8 (no warm-up): coalitions, value vector, one Boltzmann draw per
    coalition among the ``available`` clients (empty slots filled when ``fill_empty``);
    ``value_scale="standardized"`` standardises the values within each coalition first."""
    chex.assert_rank(table, 2)
    chex.assert_shape(available, (table.shape[0],))
    if value_scale not in VALUE_SCALES:  # a kernel called directly, not through the registry
        raise ConfigError(f"value_scale must be one of {VALUE_SCALES}, got {value_scale!r}")
    k_coal, k_draw, k_fill = jax.random.split(key, 3)
    labels = spectral_clustering(normalize_rows(table), per_round, k_coal, coalitions)
    values = value_vector(cov.c_alpha, cov.c_diag)
    scores = values
    if value_scale == "standardized":
        scores = standardize_within(values, labels, per_round, available)
    probs = coalition_probabilities(scores, labels, per_round, beta, available)
    clients, ok = sample_per_coalition(k_draw, scores, labels, per_round, beta, available)
    if fill_empty:
        taken = jnp.zeros(available.shape, bool).at[clients].max(ok)
        logits = boltzmann_logits(scores, beta, available & ~taken)
        backup, backup_ok = gumbel_top_k(k_fill, logits, per_round)
        clients, ok = fill_slots(clients, ok, backup, backup_ok, per_round)
    return BoltRound(clients, ok, labels, values, scores, probs)


def bolt_diagnostics(
    bolt: BoltRound,
    available: Array,
    in_warmup: Array,
    *,
    per_round: int,
    beta: float,
    previous_labels: Array,
    dominant: Array | None = None,
) -> dict[str, Array]:
    """The round's diagnostics (module docstring)."""
    labels = bolt.labels
    n_avail = jnp.maximum(jnp.sum(available), 1).astype(jnp.float32)
    uniform = available.astype(jnp.float32) / n_avail
    law = jnp.where(in_warmup, uniform, bolt.probs)
    stats = coalition_law_stats(bolt.probs, labels, per_round, available)
    sizes = jax.ops.segment_sum(jnp.ones(labels.shape, jnp.float32), labels, per_round)
    order = jnp.argsort(-sizes, stable=True)
    ok = available & jnp.isfinite(bolt.scores)
    hi = jax.ops.segment_max(jnp.where(ok, bolt.scores, -jnp.inf), labels, per_round)
    lo = jax.ops.segment_min(jnp.where(ok, bolt.scores, jnp.inf), labels, per_round)
    spread = jnp.where(jnp.isfinite(hi) & jnp.isfinite(lo), beta * (hi - lo), 0.0)
    values_ok = available & jnp.isfinite(bolt.values)
    out = {
        "law": law,
        "coalition_sizes": sizes[order],
        "coalitions_used": jnp.sum(sizes > 0).astype(jnp.float32),
        "coalition_entropy_ratio": stats.entropy_ratio[order],
        "coalition_max_over_uniform": stats.max_over_uniform[order],
        "logit_spread": jnp.max(spread),
        "ari_previous_round": adjusted_rand_index(labels, previous_labels, per_round, per_round),
        "value_max": jnp.max(jnp.where(values_ok, bolt.values, -jnp.inf)),
        "value_mean": jnp.sum(jnp.where(values_ok, bolt.values, 0.0)) / n_avail,
        "in_warmup": in_warmup.astype(jnp.float32),
    }
    if dominant is not None:
        # coalition x label counts by a segment sum: no K x P one-hot
        table = jax.ops.segment_sum(dominant.astype(jnp.float32), labels, per_round)
        out["ari_dominant_label"] = contingency_ari(table)
    return out


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


def dominant_labels(label_counts: Array | None) -> Array | None:
    """bool[K, C]: one-hot of each client's most frequent label (``None`` without counts)."""
    if label_counts is None:
        return None
    counts = jnp.asarray(label_counts)
    return jax.nn.one_hot(jnp.argmax(counts, axis=1), counts.shape[1], dtype=bool)


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
    value_scale: Literal["raw", "standardized"] = "raw",
    warmup: int = 30,
    affinity: str = "rbf",
    gamma: float = 1.0,
    coef0: float = 1.0,
    coalitions: str = "auto",
    landmarks: int = 256,
    scaling: str = "degree",
    kmeans_init: int = 10,
    kmeans_iters: int = 300,
    kmeans_sample: int = -1,
    sketch: str = "last_layer",
    sketch_dim: int = 0,
    init_cov: float = 1.0,
    fill_empty: bool = True,
    weighting: Weighting = "size",
) -> Strategy:
    """FedCVR-Bolt client selection (module docstring).

    Args:
      per_round: P, coalitions and clients per round.
      beta: Boltzmann inverse temperature (eq. 8; 1 in the paper; 0: uniform within each
        coalition, i.e. coalition-stratified sampling).
      value_scale: ``raw`` (eq. 8 on ``v``, the paper's) or ``standardized`` (ours: ``v``
        standardised within each coalition, a scale-free ``beta``).
      warmup: rounds of uniform sampling before Boltzmann selection (30 in the paper).
      affinity: ``rbf`` (eq. 4, row-normalised), ``cosine``, ``laplacian`` or ``sigmoid``.
      gamma, coef0: kernel parameters (``gamma = 0``: automatic scale).
      coalitions: ``exact`` (``K x K``), ``landmark`` (Nystrom, ``O(K m)``) or ``auto``
        (exact up to 10,000 clients).
      landmarks: m, landmark clients of the Nystrom path.
      scaling: spectral embedding row scaling, ``degree`` (scikit-learn), ``row`` or ``none``.
      kmeans_init, kmeans_iters: k-means++ seedings and Lloyd budget (10 and 300).
      kmeans_sample: fit k-means on this many sampled clients and assign every client to the
        nearest center (an approximation for 10^5-10^6 clients); 0 fits on every client; -1
        (auto): every client on the exact path, 20 per coalition on the landmark path.
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
    if kmeans_sample not in (-1, 0) and not kmeans_sample >= per_round:
        raise ConfigError(
            f"fedcvr_bolt kmeans_sample must be -1 (auto), 0 (every client) or >= per_round "
            f"({per_round}), got {kmeans_sample}"
        )
    check_sketch(sketch, sketch_dim)
    config = CoalitionConfig(
        affinity=affinity,
        gamma=float(gamma),
        coef0=float(coef0),
        method=coalitions,
        landmarks=int(landmarks),
        scaling=scaling,
        n_init=int(kmeans_init),
        max_iter=int(kmeans_iters),
        kmeans_sample=int(kmeans_sample),
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
            dominant=dominant_labels(spec.label_counts),
        )

    def build(beta):  # a float, or a traced scalar inside the round
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
                value_scale=value_scale,
                coalitions=config,
                fill_empty=fill_empty,
            )
            warm_clients, warm_mask = uniform_without_replacement(
                k_warm, inputs.available, per_round
            )
            in_warmup = inputs.round < warmup
            clients = jnp.where(in_warmup, warm_clients, bolt.clients)
            mask = jnp.where(in_warmup, warm_mask, bolt.mask)
            weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            diagnostics = bolt_diagnostics(
                bolt,
                inputs.available,
                in_warmup,
                per_round=per_round,
                beta=beta,
                previous_labels=state.labels,
                dominant=state.dominant,
            )
            state = state._replace(labels=bolt.labels)
            return Selection(clients, mask, weights, diagnostics=diagnostics), state

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

        return Strategy(init, select, update)

    return inject_hyperparams(build, beta=beta)
