"""Euclidean projection onto the probability simplex and projected gradient descent on it.

SP-CACW (arXiv:2606.29322, appendix F "Numerical Solver (PGD)") chooses aggregation
weights on the simplex ``Delta = {a : a_i >= 0, sum_i a_i = 1}`` by projected gradient descent,
"strictly enforcing the simplex constraint via Euclidean projection". The projection is the
sort-based algorithm of Held, Wolfe and Crowder (1974) / Duchi et al. (2008, Fig. 1):
``u = sort(v, descending)``, ``rho = max{j : u_j - (sum_{r<=j} u_r - z) / j > 0}``,
``theta = (sum_{r<=rho} u_r - z) / rho``, ``proj(v) = max(v - theta, 0)``: O(M log M), fixed
shapes, on device. A mask restricts the simplex to a subset of coordinates (the others are 0).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array


def project_simplex(v: Array, mask: Array | None = None, radius: float = 1.0) -> Array:
    """Euclidean projection of ``v`` onto ``{a >= 0, sum(a) = radius}`` along the last axis.

    Args:
      v: float[..., M] points (any leading batch shape).
      mask: bool[..., M]; coordinates with ``mask == False`` are fixed at 0 (the projection is
        onto the face of the simplex spanned by the masked-in vertices). All in when ``None``.
        A row with an empty mask comes back all zeros.
      radius: ``z > 0``, the sum of the projection.

    Returns:
      float32[..., M], the nearest point of the (masked) simplex.
    """
    v = jnp.asarray(v, jnp.float32)
    if mask is None:
        mask = jnp.ones(v.shape, bool)
    chex.assert_equal_shape([v, mask])
    m = v.shape[-1]
    # Masked-out entries sort last (-inf) and never enter the threshold.
    u = -jnp.sort(-jnp.where(mask, v, -jnp.inf), axis=-1)
    valid = jnp.isfinite(u)
    u0 = jnp.where(valid, u, 0.0)
    css = jnp.cumsum(u0, axis=-1) - radius
    j = jnp.arange(1, m + 1, dtype=jnp.float32)
    cond = valid & (u0 - css / j > 0)
    # cond holds on a prefix of the sorted entries (Duchi et al., Lemma 2): rho = its length.
    rho = jnp.maximum(jnp.sum(cond, axis=-1, keepdims=True), 1)
    theta = jnp.take_along_axis(css, rho - 1, axis=-1) / rho.astype(jnp.float32)
    out = jnp.maximum(v - theta, 0.0)
    return jnp.where(mask & jnp.any(mask, axis=-1, keepdims=True), out, 0.0)


def projected_gradient_descent(
    grad_fn: Callable[[Array], Array],
    x0: Array,
    step_size: Array | float,
    num_steps: int,
    mask: Array | None = None,
    momentum: bool = True,
) -> Array:
    """Minimises a smooth convex function over the (masked) simplex by projected gradient
    descent: ``x <- proj(y - step * grad(y))``.

    With ``momentum`` it is FISTA (Beck and Teboulle 2009): ``y`` extrapolates from the last
    two iterates with the ``(t_k - 1) / t_{k+1}`` schedule, restarted whenever the step goes
    uphill along the last move (O'Donoghue and Candes 2015), which keeps it monotone in
    practice; without, plain PGD (the paper's solver). ``step_size`` must be at most ``1/L``
    with ``L`` the gradient's Lipschitz constant on the simplex.

    Args:
      grad_fn: ``x[M] -> gradient[M]``.
      x0: float[M] starting point (projected first; warm starts keep the last weights).
      step_size: scalar step.
      num_steps: iterations (static).
      mask: bool[M] feasible coordinates (see :func:`project_simplex`).
      momentum: FISTA acceleration with adaptive restart.

    Returns:
      float32[M], the last iterate (on the simplex).
    """
    x = project_simplex(x0, mask)

    def body(_, carry):
        x, y, t = carry
        x_new = project_simplex(y - step_size * grad_fn(y), mask)
        if not momentum:
            return x_new, x_new, t
        t_new = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
        restart = jnp.vdot(y - x_new, x_new - x) > 0
        y_new = jnp.where(restart, x_new, x_new + ((t - 1.0) / t_new) * (x_new - x))
        return x_new, y_new, jnp.where(restart, 1.0, t_new)

    x, _, _ = jax.lax.fori_loop(0, int(num_steps), body, (x, x, jnp.ones((), jnp.float32)))
    return x


def quadratic_cubic_grad(h: Array, lam: Array, alpha: Array, linear: Array | None = None) -> Array:
    """Gradient of ``alpha^T H alpha + lam * sum(alpha^3) (+ linear . alpha)`` for symmetric H."""
    g = 2.0 * h @ alpha + 3.0 * lam * jnp.square(alpha)
    return g if linear is None else g + linear


def quadratic_lipschitz(h: Array, lam: Array) -> Array:
    """An upper bound of the Lipschitz constant of :func:`quadratic_cubic_grad` on the simplex:
    the Hessian is ``2H + 6 lam diag(alpha) <= 2 lambda_max(H) + 6 lam`` (``alpha_i <= 1``) and
    ``lambda_max(H) <= max_i sum_j |H_ij|`` (Gershgorin)."""
    return 2.0 * jnp.max(jnp.sum(jnp.abs(h), axis=-1)) + 6.0 * jnp.abs(lam)


def minimize_quadratic_cubic(
    h: Array,
    lam: Array | float,
    alpha0: Array,
    num_steps: int,
    mask: Array | None = None,
    linear: Array | None = None,
    momentum: bool = True,
) -> Array:
    """``argmin_{alpha in Delta} alpha^T H alpha + lam sum_i alpha_i^3 (+ linear . alpha)`` by
    (accelerated) PGD from ``alpha0`` with step ``1 / L`` (:func:`quadratic_lipschitz`).

    Args:
      h: float[M, M] symmetric positive semi-definite.
      lam: cubic regularisation ``lambda_reg >= 0``.
      alpha0: float[M] warm start.
      num_steps: PGD iterations (static).
      mask: bool[M] feasible coordinates.
      linear: optional float[M] linear term (FTAL's surrogate).
      momentum: see :func:`projected_gradient_descent`.
    """
    h = jnp.asarray(h, jnp.float32)
    chex.assert_rank(h, 2)
    chex.assert_shape(alpha0, (h.shape[0],))
    lam = jnp.asarray(lam, jnp.float32)
    step = 1.0 / jnp.maximum(quadratic_lipschitz(h, lam), 1e-30)
    return projected_gradient_descent(
        lambda a: quadratic_cubic_grad(h, lam, a, linear), alpha0, step, num_steps, mask, momentum
    )
