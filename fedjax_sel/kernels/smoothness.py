"""Smoothness constant of a loss by power iteration with Hessian-vector products.

SP-CACW (arXiv:2606.29322, appendix F "Lipschitz Constant Estimation") estimates the
smoothness constant ``L`` "dynamically using local curvature information ... the spectral norm
of the Hessian via power iteration, computing Hessian-vector products using the method of
Pearlmutter [1994]". ``H v`` is the forward-mode derivative of the gradient along ``v``
(``jax.jvp`` of ``jax.grad``): one HVP costs about two gradients and never materialises H.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_sel.base import Array, Params, PRNGKey


def power_iteration(
    matvec: Callable[[Array], Array], v0: Array, num_iters: int
) -> tuple[Array, Array]:
    """Largest-magnitude eigenvalue of a symmetric linear map by power iteration.

    Args:
      matvec: ``v[d] -> A v`` for a symmetric ``A``.
      v0: float[d] start vector (a random one: it must not be orthogonal to the top
        eigenvector).
      num_iters: iterations (static).

    Returns:
      ``(|lambda|, v)``: the Rayleigh quotient's magnitude ``|v^T A v|`` at the last unit
      iterate ``v``; it converges to the spectral norm ``max_i |lambda_i(A)|`` at the rate
      ``(|lambda_2| / |lambda_1|)^iters``.
    """
    chex.assert_rank(v0, 1)
    tiny = jnp.finfo(jnp.float32).tiny

    def normalise(v):
        return v / jnp.maximum(jnp.linalg.norm(v), tiny)

    def body(_, v):
        return normalise(matvec(v))

    v = jax.lax.fori_loop(0, int(num_iters), body, normalise(jnp.asarray(v0, jnp.float32)))
    return jnp.abs(jnp.vdot(v, matvec(v))), v


def hvp(loss_fn: Callable[[Params], Array], params: Params, v: Params) -> Params:
    """Hessian-vector product ``(d^2 loss / d params^2) v`` (Pearlmutter's R-operator as
    forward-over-reverse: the directional derivative of the gradient along ``v``)."""
    return jax.jvp(jax.grad(loss_fn), (params,), (v,))[1]


def hessian_spectral_norm(
    loss_fn: Callable[[Params], Array], params: Params, key: PRNGKey, num_iters: int = 20
) -> Array:
    """Estimated smoothness constant ``L ~ ||Hess loss(params)||_2`` at ``params``.

    Args:
      loss_fn: scalar loss of a parameter pytree (closes over its batch).
      params: the point where the curvature is measured.
      key: draws the Gaussian start vector.
      num_iters: power iterations, each one Hessian-vector product.

    Returns:
      float32 scalar, the magnitude of the Hessian's dominant eigenvalue (a lower estimate of
      the spectral norm that tightens with ``num_iters``).
    """
    flat, unravel = ravel_pytree(params)

    def matvec(v):
        return ravel_pytree(hvp(loss_fn, params, unravel(v)))[0]

    v0 = jax.random.normal(key, flat.shape, jnp.float32)
    return power_iteration(matvec, v0, num_iters)[0]
