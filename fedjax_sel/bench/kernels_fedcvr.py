"""Kernel benchmarks of one FedCVR-Bolt selection (Algorithm 1 lines 3-8): normalisation,
affinity (eq. 4), spectral embedding, k-means (10 seedings, 300 iterations), value vector
(eqs. 5-6) and one Boltzmann draw per coalition (eq. 8), for K clients, ``D = 300`` sketch
coordinates and ``P = 10`` coalitions.

* ``fedcvr_select``: the exact path (``K x K`` affinity; dense ``eigh`` up to 512 clients, block
  Krylov above), ``O(K^2 D)`` time and ``O(K^2)`` memory;
* ``fedcvr_select_landmark``: the landmark (Nystrom) path with ``m = 256`` landmarks,
  ``O(K m D)`` time and ``O(K m)`` memory.

The client sketches are ``P`` planted directions plus noise (as trained client models are), and
the covariance statistics random positive values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.bench.kernels import register_kernel
from fedjax_sel.kernels.covariance import StreamingCovariance
from fedjax_sel.kernels.spectral import CoalitionConfig
from fedjax_sel.strategies.fedcvr_bolt import select_clients

SKETCH_DIM = 300
COALITIONS = 10


def _inputs(k: int):
    keys = jax.random.split(jax.random.key(0), 5)
    centers = jax.random.normal(keys[0], (COALITIONS, SKETCH_DIM))
    group = jax.random.randint(keys[1], (k,), 0, COALITIONS)
    table = centers[group] + 0.3 * jax.random.normal(keys[2], (k, SKETCH_DIM))
    cov = StreamingCovariance(
        c_alpha=jax.random.normal(keys[3], (k, SKETCH_DIM)) / k,
        c_diag=jax.random.uniform(keys[4], (k, SKETCH_DIM), minval=0.1, maxval=1.0),
        count=jnp.int32(40),
    )
    return table, cov, jnp.ones((k,), bool)


def _build(k: int, method: str):
    table, cov, available = _inputs(k)
    config = CoalitionConfig(method=method)

    def select(key, table, cov, available):
        out = select_clients(key, table, cov, available, per_round=COALITIONS, coalitions=config)
        return out.clients, out.mask

    return select, (jax.random.key(1), table, cov, available)


@register_kernel(
    "fedcvr_select",
    default_clients=(10**2, 10**3, 10**4),
    description="one FedCVR-Bolt selection, exact K x K spectral path (D = 300, P = 10)",
    max_clients=30_000,  # the K x K affinity: 3.6 GB of float32 at 30,000 clients
)
def _fedcvr_select(k: int):
    return _build(k, "exact")


@register_kernel(
    "fedcvr_select_landmark",
    default_clients=(10**2, 10**3, 10**4, 10**5),
    description="one FedCVR-Bolt selection, landmark (Nystrom, m = 256) path (D = 300, P = 10)",
)
def _fedcvr_select_landmark(k: int):
    return _build(k, "landmark")
