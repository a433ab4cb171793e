"""SP-CACW's bound and weight rules, and the peer-weighting baselines (pure array functions).

Notation (SP-CACW, arXiv:2606.29322, appendix D): a target client 0 with objective ``f_0`` mixes the
stochastic gradients ``g_i`` of M clients (itself included) taken at its own model ``w_t``:
``G_t(alpha) = sum_i alpha_i z_i / p_i g_i`` (``z_i ~ Bernoulli(p_i)``, appendix E). Peer i's
bias is ``b_i = grad f_i(w_t) - grad f_0(w_t)`` (``b_0 = 0``) and ``B = [b_0 ... b_{M-1}]``.
Since ``alpha`` lies on the simplex, ``E G_t = grad f_0 + B alpha`` and (appendix D.1 and E)

    Var G_t(alpha) = sum_i alpha_i^2 v_i,   v_i = sigma_i^2 + (1/p_i - 1) E||g_i||^2.

With an ``L``-smooth ``f_0`` and step ``eta``, the descent lemma gives, conditionally on ``w_t``,

    E f_0(w_{t+1}) <= f_0(w_t) + eta/2 [ -a ||grad f_0||^2 + Phi_t(alpha) ],
    Phi_t(alpha) = c_b ||B alpha||^2 + L eta sum_i alpha_i^2 v_i = alpha^T H_t alpha,
    H_t = c_b B^T B + L eta diag(v),

with two variants (``bound=``):

* ``"appendix_d"`` (default, the paper's): appendix D.1 bounds the squared norm of ``E G`` by
  ``||x + y||^2 <= 2||x||^2 + 2||y||^2``, and ``<grad f, grad f + B alpha> >= (||grad f||^2 -
  ||B alpha||^2) / 2``: ``a = 1 - 2 L eta``, ``c_b = 1 + 2 L eta`` (a descent guarantee needs
  ``eta < 1/(2L)``).
* ``"descent"`` (option, ours): expand ``E||G||^2 = ||grad f_0 + B alpha||^2 + Var`` exactly;
  for ``eta <= 1/L``: ``a = 1``, ``c_b = 1`` (tighter: less weight on the bias term).

The alpha-dependent part is the quadratic loss ``L_t(alpha) = alpha^T H_t alpha`` of appendix D.2
(convex, exp-concave on the simplex). SP-CACW picks ``alpha`` by minimising it plus the cubic
regulariser ``lambda_reg sum_i alpha_i^3`` (appendix F) over the simplex, by
follow-the-approximate-leader over the history of bounds (``solver="ftal"``, the paper's rule,
appendix D.2; Hazan, Agarwal and Kale 2007), whose inner problem is solved by PGD, or by
projected gradient descent on the latest bound only (``solver="pgd"``, an option).

Partial participation: a peer that has never participated has no estimates (its bias, variance
and norm EMAs are still 0, so ``H_ii = 0``): it would look like a noiseless copy of the target
and draw the weight. The weight rules therefore take a ``mask`` of the peers observed so far and
put weight only there. Every function here handles ONE target; the simulator vmaps over targets.
"""

from __future__ import annotations

import math

import chex
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError
from fedjax_sel.kernels.simplex import minimize_quadratic_cubic

BOUNDS = ("descent", "appendix_d")
SOLVERS = ("ftal", "pgd")
SIMPLEX_DIAMETER = math.sqrt(2.0)  # max ||a - b||_2 over the probability simplex


def bound_coefficients(bound: str, lr_times_l: Array) -> tuple[Array, Array]:
    """``(a, c_b)``: the coefficients of ``-||grad f_0||^2`` and ``||B alpha||^2`` in the
    descent bound (module docstring) for ``L eta = lr_times_l``."""
    if bound == "descent":
        one = jnp.ones_like(lr_times_l)
        return one, one
    if bound == "appendix_d":
        return 1.0 - 2.0 * lr_times_l, 1.0 + 2.0 * lr_times_l
    raise ConfigError(f"bound must be one of {BOUNDS}, got {bound!r}")


def peer_variances(var: Array, sq_norm: Array, participation: Array) -> Array:
    """``v_i = sigma_i^2 + (1/p_i - 1) E||g_i||^2``: the variance of peer i's term of the
    aggregate under Bernoulli(p_i) participation with 1/p_i scaling (appendix E, Lemma E.1
    plus the minibatch noise)."""
    return var + (1.0 / participation - 1.0) * sq_norm


def bound_matrix(
    bias: Array, v: Array, bias_coef: Array, lr_times_l: Array, noise: Array | None = None
) -> Array:
    """``H = c_b B^T B + L eta diag(v)``: float32[M, M] from ``bias`` float32[M, d] (row i is
    ``b_i``) and ``v`` float32[M].

    ``noise`` (float32[M, M], optional) is subtracted from the Gram matrix ``B^T B`` first (the
    EMA noise of :func:`ema_noise_gram`); the result is then clipped to the nearest positive
    semi-definite matrix (eigenvalues at 0), so the weight problem stays convex.
    """
    chex.assert_rank(bias, 2)
    chex.assert_shape(v, (bias.shape[0],))
    gram = bias @ bias.T
    if noise is not None:
        chex.assert_equal_shape([gram, noise])
        evals, evecs = jnp.linalg.eigh(gram - noise)
        gram = (evecs * jnp.maximum(evals, 0.0)) @ evecs.T
    return bias_coef * gram + lr_times_l * jnp.diag(v)


def ema_noise_gram(var: Array, num_obs: Array, beta: float, self_index: Array) -> Array:
    """Expected noise part of ``B_hat^T B_hat`` when ``b_hat_i`` is the EMA (rate ``beta``,
    started at the first observation) of ``g_i - g_0`` with independent minibatch noise:
    ``E[b_hat_i . b_hat_j] = b_i . b_j + kappa_ij (sigma_0^2 + [i = j] sigma_i^2)`` for peers
    ``i, j != 0`` under full participation, where ``kappa`` is the sum of the squared EMA
    weights: ``kappa_n = (1-beta)^(2(n-1)) + beta/(2-beta) (1 - (1-beta)^(2(n-1)))`` after n
    observations (``kappa_ij`` uses ``min(n_i, n_j)``). Row and column 0 (the target) are 0.
    Under partial participation the cross terms are smaller; this is then an over-correction
    of the off-diagonal, which the PSD clipping in :func:`bound_matrix` keeps harmless."""
    decay = jnp.power(1.0 - beta, 2.0 * jnp.maximum(num_obs - 1, 0).astype(jnp.float32))
    kappa = decay + beta / (2.0 - beta) * (1.0 - decay)
    kappa = jnp.where(num_obs > 0, kappa, 0.0)
    pair = jnp.minimum(kappa[:, None], kappa[None, :])
    is_peer = jnp.arange(var.shape[0]) != self_index
    both = is_peer[:, None] & is_peer[None, :]
    noise = pair * (var[self_index] + jnp.diag(var))
    return jnp.where(both, noise, 0.0)


def bound_value(alpha: Array, bias: Array, v: Array, bias_coef: Array, lr_times_l: Array) -> Array:
    """``Phi(alpha) = c_b ||B alpha||^2 + L eta sum_i alpha_i^2 v_i`` in O(M d), without the
    M x M matrix."""
    mixed = alpha @ bias
    return bias_coef * jnp.sum(jnp.square(mixed)) + lr_times_l * jnp.sum(jnp.square(alpha) * v)


def regularization(gamma: float, target_var: Array) -> Array:
    """``lambda_reg = gamma * sigma_0^2`` (appendix F "Dynamic Regularization": scales with the
    target's gradient variance, so the penalty decays as the model converges; gamma = 1)."""
    return gamma * target_var


def ftal_step(
    quad: Array, lin: Array, h: Array, lam: Array, alpha: Array, mask: Array | None = None
) -> tuple[Array, Array, Array]:
    """Adds round t's FTAL surrogate of ``ell_t(a) = a^T H a + lam sum a^3`` at ``alpha_t``:

        ell~_t(a) = grad_t . a + (beta_t / 2) (a - alpha_t)^T grad_t grad_t^T (a - alpha_t),

    ``beta_t = min(1 / (4 G_t D), gamma_t) / 2`` (Hazan et al. 2007, Thm 2) with ``D = sqrt 2``
    the simplex diameter, ``G_t = 2 max_i ||H e_i|| + 3 lam`` a bound of the gradient norm on the
    simplex and ``gamma_t = 1 / (2 max_i H_ii)`` the exp-concavity of ``a^T H a`` on the simplex
    (appendix D.2: ``2H >= 4 gamma H a a^T H`` holds for ``gamma <= 1 / (2 max_a a^T H a)``, and
    the maximum of the convex quadratic sits at a vertex).

    ``mask`` (bool[M], the peers observed so far): the loss of an unobserved peer is unknown
    (its row of ``H`` is 0, which would make it look ideal and, once it is observed, keep an
    advantage of every round it missed in the accumulated sum). Its gradient coordinate is
    imputed pessimistically with the largest coordinate among the observed peers (ours: the
    paper does not treat partial participation in FTAL).

    Returns:
      ``(quad, lin, beta)``: the accumulated surrogate is ``a^T quad a + lin . a`` (+ const).
    """
    grad = 2.0 * h @ alpha + 3.0 * lam * jnp.square(alpha)
    if mask is not None:
        worst = jnp.max(jnp.where(mask, grad, -jnp.inf))
        grad = jnp.where(mask, grad, worst)
    g_bound = 2.0 * jnp.max(jnp.linalg.norm(h, axis=0)) + 3.0 * lam
    gamma = 1.0 / jnp.maximum(2.0 * jnp.max(jnp.diag(h)), 1e-30)
    beta = 0.5 * jnp.minimum(1.0 / jnp.maximum(4.0 * g_bound * SIMPLEX_DIAMETER, 1e-30), gamma)
    outer = jnp.outer(grad, grad)
    quad = quad + 0.5 * beta * outer
    lin = lin + grad - beta * grad * jnp.vdot(grad, alpha)
    return quad, lin, beta


def sp_cacw_weights(
    h: Array,
    lam: Array,
    alpha: Array,
    quad: Array,
    lin: Array,
    *,
    solver: str,
    num_steps: int,
    mask: Array | None = None,
) -> tuple[Array, Array, Array]:
    """One lazy weight update of SP-CACW for one target.

    Args:
      h: float32[M, M] the current bound matrix ``H_t``.
      lam: ``lambda_reg``.
      alpha: float32[M] the current weights (PGD's warm start; FTAL's linearisation point).
      quad, lin: FTAL's accumulated surrogate (ignored by ``pgd``).
      solver: ``"ftal"`` (the paper's: follow-the-approximate-leader over the history of
        bounds) or ``"pgd"`` (argmin of the current bound only).
      num_steps: PGD iterations.
      mask: bool[M] peers that may get weight: the peers observed so far (module docstring).

    Returns:
      ``(alpha, quad, lin)``.
    """
    if solver == "pgd":
        return minimize_quadratic_cubic(h, lam, alpha, num_steps, mask), quad, lin
    if solver == "ftal":
        quad, lin, _ = ftal_step(quad, lin, h, lam, alpha, mask)
        new = minimize_quadratic_cubic(quad, lam, alpha, num_steps, mask, linear=lin)
        return new, quad, lin
    raise ConfigError(f"solver must be one of {SOLVERS}, got {solver!r}")


def similarity_weights(grads: Array, self_index: Array, mask: Array | None = None) -> Array:
    """Cosine-similarity baseline: ``alpha_i ∝ max(cos(g_i, g_0), 0)`` (negative similarity gets
    no weight; the target itself has cosine 1, so the weights are always defined).

    Args:
      grads: float32[M, d] (averaged) gradients of the M clients at the target's model.
      self_index: the target's row.
      mask: bool[M] eligible peers: the peers observed so far (an unobserved peer's row is the
        target's own gradient estimate, cosine 1); the target itself always counts.
    """
    norms = jnp.linalg.norm(grads, axis=1)
    own = grads[self_index]
    cos = grads @ own / jnp.maximum(norms * norms[self_index], 1e-30)
    w = jnp.maximum(cos, 0.0)
    if mask is not None:
        w = jnp.where(mask, w, 0.0)
    w = w.at[self_index].set(1.0)
    return w / jnp.sum(w)


def cluster_weights(clusters: Array, target_cluster: Array) -> Array:
    """Oracle baseline: uniform weights on the clients of the target's true cluster."""
    same = (clusters == target_cluster).astype(jnp.float32)
    return same / jnp.sum(same)


def uniform_weights(num: int) -> Array:
    return jnp.full((num,), 1.0 / num, jnp.float32)


__all__ = [
    "BOUNDS",
    "SOLVERS",
    "bound_coefficients",
    "bound_matrix",
    "bound_value",
    "cluster_weights",
    "ema_noise_gram",
    "ftal_step",
    "peer_variances",
    "regularization",
    "similarity_weights",
    "sp_cacw_weights",
    "uniform_weights",
]
