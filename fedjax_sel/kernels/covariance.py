"""FedCVR-Bolt's streaming covariance and value vector without ``K x K x D`` matrices
(FedCVR-Bolt, arXiv:2506.02897, eqs. 5, 6 and 11).

For each model coordinate ``d`` the paper tracks a ``K x K`` covariance ``C^d`` with the
Robbins-Monro update (eq. 11)

    C^d(t+1) = (1 - gamma_t) C^d(t) + gamma_t u^d (u^d)^T,   u^d = theta^d(t+1) - theta_bar^d(t+1),

and scores client k by the total variance reduction (eqs. 5-6)

    v_k = sum_d (C^d alpha)_k^2 / C^d_kk.

Only ``C^d alpha`` and the diagonal of ``C^d`` enter ``v``, and eq. 11 maps them to themselves:

    (C^d alpha) <- (1 - gamma) (C^d alpha) + gamma u^d (u^d . alpha)
    diag(C^d)   <- (1 - gamma) diag(C^d)   + gamma (u^d)^2

so the state is two ``float32[K, D]`` arrays (``c_alpha[k, d] = (C^d alpha)_k``,
``c_diag[k, d] = C^d_kk``) and each update costs ``O(K D)``: exactly the paper's numbers, not an
approximation. With ``gamma_t = 1/t`` the estimate after ``t`` updates is the plain mean of the
``t`` outer products (the initial ``C(1)`` only matters before the first update).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array


class StreamingCovariance(NamedTuple):
    """Attributes: ``c_alpha`` float32[K, D] (``(C^d alpha)_k``); ``c_diag`` float32[K, D]
    (``C^d_kk``); ``count`` int32, updates applied so far (``gamma_t = 1 / (count + 1)``)."""

    c_alpha: Array
    c_diag: Array
    count: Array


def init_covariance(alpha: Array, dim: int, scale: float = 1.0) -> StreamingCovariance:
    """The state of ``C^d(1) = scale * I`` for every coordinate (Algorithm 1's input ``C(1)``)."""
    alpha = jnp.asarray(alpha, jnp.float32)
    k = alpha.shape[0]
    return StreamingCovariance(
        c_alpha=jnp.broadcast_to(scale * alpha[:, None], (k, dim)).astype(jnp.float32),
        c_diag=jnp.full((k, dim), scale, jnp.float32),
        count=jnp.zeros((), jnp.int32),
    )


def robbins_monro_gamma(count: Array) -> Array:
    """``gamma_t = 1 / t`` for the ``t = count + 1``-th update (appendix C.1)."""
    return 1.0 / (jnp.asarray(count, jnp.float32) + 1.0)


@jax.jit
def covariance_update(
    state: StreamingCovariance, residual: Array, alpha: Array, gamma: Array | None = None
) -> StreamingCovariance:
    """One Robbins-Monro step of eq. 11 on the ``(C alpha, diag C)`` state.

    Args:
      state: the current statistics.
      residual: float32[K, D], ``u[k, d] = theta_k^d(t+1) - theta_bar_k^d(t+1)``.
      alpha: float32[K] the global weights (``n_k / sum n``).
      gamma: the step (``1 / (count + 1)`` when ``None``).
    """
    chex.assert_equal_shape([state.c_alpha, residual])
    gamma = robbins_monro_gamma(state.count) if gamma is None else gamma
    proj = jnp.asarray(alpha, jnp.float32) @ residual  # [D]: u^d . alpha
    return StreamingCovariance(
        c_alpha=(1.0 - gamma) * state.c_alpha + gamma * residual * proj[None, :],
        c_diag=(1.0 - gamma) * state.c_diag + gamma * jnp.square(residual),
        count=state.count + 1,
    )


@jax.jit
def value_vector(c_alpha: Array, c_diag: Array) -> Array:
    """``v_k = sum_d (C^d alpha)_k^2 / C^d_kk`` (eqs. 5-6), float32[K].

    A zero variance ``C^d_kk = 0`` forces ``(C^d alpha)_k = 0`` for a covariance matrix
    (Cauchy-Schwarz), and observing a constant tells nothing: that term counts 0, not NaN.
    """
    chex.assert_equal_shape([c_alpha, c_diag])
    ok = c_diag > 0
    terms = jnp.where(ok, jnp.square(c_alpha) / jnp.where(ok, c_diag, 1.0), 0.0)
    return jnp.sum(terms, axis=1)
