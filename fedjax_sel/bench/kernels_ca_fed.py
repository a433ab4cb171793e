"""Kernel benchmarks of CA-Fed's per-round server work (with ``markov_step``, the availability
step, in :mod:`fedjax_sel.bench.kernels_engine`):

* ``availability_estimate``: one round of the Beta-prior estimators (section IV-B): add the
  round's availability mask to the counts and compute ``(pi_hat, lambda_hat)`` for K clients,
  ``O(K)``.
* ``ca_fed_get``: Algorithm 1's lines 5-7 on the paper's population: both greedy passes of
  ``get()`` (by descending ``lambda_hat``, then ascending ``pi_hat``), each a sort plus one
  ``lax.scan``, ``O(K log K)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.availability import estimators as est
from fedjax_sel.availability.markov_population import ca_fed_population
from fedjax_sel.bench.kernels import register_kernel
from fedjax_sel.kernels.ca_fed import ca_fed_exclusions


def _estimate_round(counts: est.AvailabilityCounts, available: jax.Array):
    counts = est.update_counts(counts, available)
    pi_hat, lam_hat = est.estimate(counts)
    return pi_hat, lam_hat, counts


@register_kernel(
    "availability_estimate",
    description="one round of the Beta-prior pi/lambda estimators for K clients",
)
def _availability_estimate(k: int):
    key_pop, key_mask = jax.random.split(jax.random.key(0))
    pi, _ = ca_fed_population(key_pop, k)
    counts = est.update_counts(est.init_counts(k), jax.random.bernoulli(key_mask, pi))
    available = jax.random.bernoulli(jax.random.fold_in(key_mask, 1), pi)
    return _estimate_round, (counts, available)


def _get_both_passes(alpha, gap, pi_hat, lam_hat, kappa2):
    return ca_fed_exclusions(alpha, gap, pi_hat, lam_hat, kappa2=kappa2)


@register_kernel(
    "ca_fed_get",
    description="CA-Fed's two greedy get() passes (sort + scan each) on the paper's population",
)
def _ca_fed_get(k: int):
    key_pop, key_gap = jax.random.split(jax.random.key(0))
    pi, lam = ca_fed_population(key_pop, k)
    alpha = jnp.full((k,), 1.0 / k, jnp.float32)
    gap = jax.random.uniform(key_gap, (k,))
    return _get_both_passes, (alpha, gap, pi, lam, jnp.float32(1.0))
