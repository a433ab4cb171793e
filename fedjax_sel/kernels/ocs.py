"""Optimal Client Sampling's probabilities (Chen, Horvath and Richtarik, TMLR 2022,
arXiv:2010.13723): independent participation probabilities ``p_i`` over a cohort of ``n_c``
clients, proportional to the norms ``u_i = ||w_i U_i||`` of their weighted updates below a cap at
one, with ``sum_i p_i = m``. Pure, jittable, fixed shapes (the cohort is a fixed-size array with
a ``valid`` mask; an invalid entry gets ``p = 0``).

Both minimise the variance ``sum_i (1 - p_i) / p_i * u_i^2`` of the unbiased estimator
``sum_i (b_i / p_i) w_i U_i`` (``b_i ~ Bernoulli(p_i)`` independently) subject to
``sum_i p_i = m``, ``0 <= p_i <= 1``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array

# AOCS stops after a rescale by C <= 1 + STOP_TOLERANCE (the code: C <= 1; see
# aocs_probabilities)
STOP_TOLERANCE = 1e-6


def _effective(valid: Array, m: Array) -> tuple[Array, Array]:
    n = jnp.sum(valid).astype(jnp.float32)
    return n, jnp.minimum(jnp.asarray(m, jnp.float32), n)


def ocs_probabilities(u: Array, valid: Array, m: Array) -> Array:
    """Exact OCS (the paper's closed form): sort ``u_(1) <= ... <= u_(n)``, let ``l`` be the
    largest integer in ``1..n`` with ``0 < m + l - n <= sum_{j<=l} u_(j) / u_(l)``; then
    ``p_(i) = (m + l - n) u_(i) / sum_{j<=l} u_(j)`` for ``i <= l`` and 1 above. Equivalently
    ``p_i = min(1, c u_i)`` with ``c`` such that ``sum p = m`` (water-filling).

    A sort, a cumulative sum and a masked argmax over the ``n_c`` slots. ``m`` may be a traced
    float; it is capped at the number of valid entries. A zero norm gets ``p = 0`` (its update is
    zero: nothing to send); when fewer than ``m`` norms are positive, every positive one gets 1
    (then ``sum p < m``).

    Args:
      u: float32[n_c] the weighted update norms.
      valid: bool[n_c] cohort entries (the others get 0).
      m: the expected number of participants.
    """
    u = jnp.asarray(u, jnp.float32)
    n, m = _effective(valid, m)
    us = jnp.sort(jnp.where(valid, u, jnp.inf))
    finite = jnp.isfinite(us)
    cum = jnp.cumsum(jnp.where(finite, us, 0.0))
    ell = jnp.arange(1, u.shape[0] + 1, dtype=jnp.float32)
    room = m + ell - n
    ok = finite & (room > 0) & (us > 0) & (room * us <= cum * (1.0 + 1e-6))
    best = jnp.max(jnp.where(ok, jnp.arange(u.shape[0]), -1))
    found = best >= 0
    c = jnp.where(found, room[best] / jnp.where(cum[best] > 0, cum[best], 1.0), jnp.inf)
    p = jnp.minimum(1.0, c * u)
    return jnp.where(valid & (u > 0), p, 0.0)


def aocs_probabilities(u: Array, valid: Array, m: Array, j_max: int) -> tuple[Array, Array]:
    """Approximate OCS (the reference code's ``simple_fedavg_tff.py``), where each client
    computes its own ``p_i`` from broadcast scalars:

        p_i <- min(1, m u_i / sum_j u_j)                       (one secure sum of u)
        repeat j_max times:
            I = #{p_i < 1},  P = sum_{p_i < 1} p_i              (one secure sum of 2 scalars)
            C = (m - n + I) / P;  p_i <- min(1, C p_i)
            if C <= 1: stop                                     (after the rescale, as the code)

    A ``fori_loop(j_max)`` whose ``done`` flag freezes ``p`` after the first ``C <= 1``; the
    same as the code's ``break``, up to :data:`STOP_TOLERANCE`: at the fixed point ``C = 1``
    exactly, which float32 rounds to either side (a no-op extra rescale, and one more secure sum,
    half of the time). Guards the code lacks: ``sum u = 0`` gives the uniform
    ``m / n``, and ``P = 0`` (every probability capped) stops.

    Returns:
      ``(p float32[n_c], iterations int32)``: the probabilities and the rescales done.
    """
    u = jnp.asarray(u, jnp.float32)
    n, m = _effective(valid, m)
    u = jnp.where(valid, u, 0.0)
    total = jnp.sum(u)
    p = jnp.where(total > 0, jnp.minimum(1.0, m * u / jnp.where(total > 0, total, 1.0)), m / n)
    p = jnp.where(valid, p, 0.0)

    def body(_, carry):
        p, done, it = carry
        below = valid & (p < 1.0)
        count = jnp.sum(below).astype(jnp.float32)
        mass = jnp.sum(jnp.where(below, p, 0.0))
        stop = done | (mass <= 0)
        c = (m - n + count) / jnp.where(mass > 0, mass, 1.0)
        new = jnp.where(valid, jnp.minimum(1.0, c * p), 0.0)
        p = jnp.where(stop, p, new)
        return p, stop | (c <= 1.0 + STOP_TOLERANCE), it + jnp.where(stop, 0, 1)

    p, _, it = jax.lax.fori_loop(0, j_max, body, (p, jnp.zeros((), bool), jnp.zeros((), jnp.int32)))
    return p, it


def estimator_variance(p: Array, u: Array, valid: Array) -> Array:
    """``sum_i (1 - p_i) / p_i * u_i^2`` over the valid entries with ``p_i > 0`` (the
    estimator's variance about the full-cohort update; entries with ``u_i = 0`` add nothing)."""
    live = valid & (p > 0)
    return jnp.sum(jnp.where(live, (1.0 - p) / jnp.where(live, p, 1.0) * u * u, 0.0))
