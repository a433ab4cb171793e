"""Spatially correlated availability: one two-state Markov chain per cluster of clients
(CA-Fed, Rodio et al. 2023, section V-B e).

All clients of a cluster are online or offline together; the clusters' chains are independent.
The paper's setting (the defaults): ``C = 10`` clusters of equal size; clusters ``0..C/2-1`` are
"more available" (``pi_c = 0.9``, ``lambda_c = 0``), clusters ``C/2..C-1`` are "less available,
correlated" (``pi_c = 0.1``, ``lambda_c = c / C``, i.e. 0.5 ... 0.9 for C = 10). Clients are
assigned to clusters in contiguous blocks of ids (client ``k`` is in cluster ``k * C // K``).

CLI: ``--availability markov_clustered`` or ``markov_clustered:clusters=10,pi_high=0.9,pi_low=0.1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel.availability import markov_lambda_range, markov_transition
from fedjax_sel.base import Array, AvailabilityModel, AvailabilityParams, ConfigError, PRNGKey


class ClusteredMarkovState(NamedTuple):
    """One chain per cluster: ``on`` bool[C], ``pi`` and ``lam`` float32[C], and the cluster
    of every client ``cluster`` int32[K]."""

    on: Array
    pi: Array
    lam: Array
    cluster: Array


def cluster_of_clients(num_clients: int, num_clusters: int) -> np.ndarray:
    """Contiguous blocks: client ``k`` belongs to cluster ``k * C // K``."""
    if not 1 <= num_clusters <= num_clients:
        raise ConfigError(
            f"markov_clustered needs 1 <= clusters <= clients, got {num_clusters} clusters for "
            f"{num_clients} clients"
        )
    return (np.arange(num_clients) * num_clusters // num_clients).astype(np.int32)


def paper_cluster_params(
    num_clusters: int = 10, pi_high: float = 0.9, pi_low: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """Section V-B e: the first ``C // 2`` clusters have ``(pi_high, 0)``, cluster ``c`` of the
    rest has ``(pi_low, c / C)``."""
    c = np.arange(num_clusters)
    more = c < num_clusters // 2
    return np.where(more, pi_high, pi_low), np.where(more, 0.0, c / num_clusters)


def markov_clustered(
    clusters: int = 10,
    pi_high: float = 0.9,
    pi_low: float = 0.1,
    *,
    cluster_pi: Sequence[float] | None = None,
    cluster_lam: Sequence[float] | None = None,
) -> AvailabilityModel:
    """Clustered Markov availability (see the module docstring).

    Args:
      clusters: C, the number of clusters (ignored when ``cluster_pi`` is given).
      pi_high, pi_low: availabilities of the paper's two cluster classes.
      cluster_pi, cluster_lam: explicit per-cluster ``pi_c`` and ``lambda_c`` (Python API);
        both or neither.
    """
    if (cluster_pi is None) != (cluster_lam is None):
        raise ConfigError("markov_clustered: give both cluster_pi and cluster_lam, or neither")
    if cluster_pi is None:
        if int(clusters) != clusters or clusters < 1:
            raise ConfigError(f"markov_clustered clusters must be a positive integer: {clusters!r}")
        pi_c, lam_c = paper_cluster_params(int(clusters), float(pi_high), float(pi_low))
    else:
        pi_c = np.asarray(cluster_pi, np.float64)
        lam_c = np.asarray(cluster_lam, np.float64)
        if pi_c.ndim != 1 or pi_c.shape != lam_c.shape or len(pi_c) == 0:
            raise ConfigError(
                f"cluster_pi and cluster_lam must be equal-length 1-D sequences, got shapes "
                f"{pi_c.shape} and {lam_c.shape}"
            )
    if np.any(~np.isfinite(pi_c)) or np.any(pi_c <= 0) or np.any(pi_c >= 1):
        raise ConfigError(f"markov_clustered cluster availabilities must lie in (0, 1): {pi_c}")
    lo, hi = markov_lambda_range(pi_c)
    bad = ~np.isfinite(lam_c) | (lam_c < lo - 1e-12) | (lam_c > hi)
    if np.any(bad):
        raise ConfigError(
            f"markov_clustered lambda {lam_c[bad].tolist()} outside the valid range "
            f"[max(1 - 1/pi, 1 - 1/(1 - pi)), 1] of clusters {np.flatnonzero(bad).tolist()}"
        )
    num_clusters = len(pi_c)

    def init(key: PRNGKey, num_clients: int) -> ClusteredMarkovState:
        cluster = jnp.asarray(cluster_of_clients(num_clients, num_clusters))
        pi = jnp.asarray(pi_c, jnp.float32)
        return ClusteredMarkovState(
            jax.random.bernoulli(key, pi), pi, jnp.asarray(lam_c, jnp.float32), cluster
        )

    def step(state: ClusteredMarkovState, key: PRNGKey) -> tuple[Array, ClusteredMarkovState]:
        on = jax.random.bernoulli(key, markov_transition(state.on, state.pi, state.lam))
        return on[state.cluster], state._replace(on=on)

    def true_params(state: ClusteredMarkovState) -> AvailabilityParams:
        # each client's marginal process is its cluster's chain
        return AvailabilityParams(state.pi[state.cluster], state.lam[state.cluster])

    info = {"clusters": num_clusters, "cluster_pi": pi_c.tolist(), "cluster_lam": lam_c.tolist()}
    return AvailabilityModel(init, step, "markov_clustered", info, true_params)


availability_lib.register_availability(
    "markov_clustered",
    markov_clustered,
    {
        "clusters": "number of clusters C (default 10), one Markov chain each",
        "pi_high": "availability of the first C/2 clusters (lambda 0; default 0.9)",
        "pi_low": "availability of the other clusters (lambda c/C; default 0.1)",
    },
)
