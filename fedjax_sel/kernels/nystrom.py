"""Landmark (Nystrom) spectral embedding: coalitions of ``K = 10^5`` clients in ``O(K m)``
memory (Fowlkes, Belongie, Chung and Malik 2004).

With ``m`` landmark clients ``L`` drawn uniformly without replacement, the kernel matrix is
approximated by ``K_hat = C A C^T`` with ``C = k(X, L)`` (``K x m``) and ``A = k(L, L)^+``. The
normalised adjacency of :mod:`fedjax_sel.kernels.spectral` is then an exact low-rank product
``M = F G F^T`` that is never formed:

* plain kernels: ``S = K_hat``, degrees ``d = C (A (C^T 1))``, ``F = D^{-1/2} C``, ``G = A``;
* the row-normalised RBF of eq. 4: with row sums ``r = K_hat 1``,
  ``S = (R^{-1} K_hat + K_hat R^{-1}) / 2``, ``d = (1 + K_hat r^{-1}) / 2``,
  ``F = D^{-1/2} [R^{-1} C, C]`` and ``G = [[0, A], [A, 0]] / 2``.

Its top eigenvectors come from ``F^T F = V Lambda V^T`` (``r x r``): with
``F = U_F Lambda^{1/2} V^T``, ``M = U_F T U_F^T`` where ``T = Lambda^{1/2} V^T G V Lambda^{1/2}``,
so ``eigh(T) = Z Theta Z^T`` gives ``U = F V Lambda^{-1/2} Z``. Directions with
``lambda < rel_tol * max(lambda)`` are dropped (duplicate landmarks, identical clients).
``F`` is not formed either: its column blocks are row scalings of ``C``
(:class:`LandmarkFactor`), so ``F^T F`` is assembled from ``C``'s weighted Gram blocks and ``U``
from one product with ``C``. With ``m = K`` landmarks the factorisation reproduces the exact
path. Negative kernel values
(cosine, sigmoid) are clipped to 0 in both blocks, as the exact path clips ``S``; the product
``K_hat`` can still hold small negative entries, so degrees are clamped at zero.

This module is the low-rank linear algebra only (eigenpairs and degrees); the embedding and the
clustering built on it live in :mod:`fedjax_sel.kernels.spectral`
(:func:`~fedjax_sel.kernels.spectral.landmark_spectral_embedding`), which imports this module:
the dependency goes one way.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey
from fedjax_sel.kernels.affinity import check_affinity, kernel_and_gamma, kernel_values
from fedjax_sel.kernels.sampling import uniform_subset


def pseudo_inverse_sym(a: Array, rel_tol: float = 1e-6) -> Array:
    """Pseudo-inverse of a symmetric matrix through its eigendecomposition."""
    vals, vecs = jnp.linalg.eigh(0.5 * (a + a.T))
    cut = rel_tol * jnp.max(jnp.abs(vals))
    inv = jnp.where(jnp.abs(vals) > cut, 1.0 / jnp.where(vals == 0, 1.0, vals), 0.0)
    return (vecs * inv[None, :]) @ vecs.T


class LandmarkFactor(NamedTuple):
    """``D^{-1/2} S D^{-1/2} ~= F G F^T`` with ``F = [diag(s_1) C, ..., diag(s_j) C]``: every
    column block of ``F`` is a row scaling of the one kernel block ``C``, so ``F`` (``K x j m``)
    is never formed (module docstring).

    Attributes:
      c: float32[K, m] the kernel block ``k(X, L)`` (negative values clipped).
      scales: float32[j, K] the row scalings ``s_i`` (``j = 1``: ``d^{-1/2}``; eq. 4's
        row-normalised RBF, ``j = 2``: ``d^{-1/2} / r`` and ``d^{-1/2}``).
      g: float32[j m, j m] the symmetric middle matrix ``G``.
      inv_sqrt_degree: float32[K] ``d^{-1/2}``.
    """

    c: Array
    scales: Array
    g: Array
    inv_sqrt_degree: Array


def landmark_factor(
    x: Array,
    landmarks: Array,
    kind: str = "rbf",
    *,
    gamma: float = 1.0,
    coef0: float = 1.0,
    row_normalize: bool | None = None,
) -> LandmarkFactor:
    """The factor ``F G F^T`` of ``D^{-1/2} S D^{-1/2}`` (:class:`LandmarkFactor`).

    Args:
      x: float32[K, D] rows.
      landmarks: float32[m, D] landmark rows.
      kind, gamma, coef0: the kernel (:func:`~fedjax_sel.kernels.affinity.kernel_values`);
        ``gamma = 0`` is resolved on the ``K x m`` block and reused for ``k(L, L)``.
      row_normalize: eq. 4's row normalisation (``None``: only for ``rbf``).
    """
    check_affinity(kind, gamma, coef0)
    if row_normalize is None:
        row_normalize = kind == "rbf"
    c, gamma_used = kernel_and_gamma(x, landmarks, kind, gamma=gamma, coef0=coef0)
    w_ll = kernel_values(landmarks, landmarks, kind, gamma=gamma_used, coef0=coef0)
    # the exact path clips negative affinities; clip both blocks alike (a no-op for rbf/laplacian)
    c, w_ll = jnp.maximum(c, 0.0), jnp.maximum(w_ll, 0.0)
    a = pseudo_inverse_sym(w_ll)
    ones = jnp.ones((x.shape[0],), jnp.float32)

    def k_hat(v):  # K_hat @ v in O(K m)
        return c @ (a @ (c.T @ v))

    if row_normalize:
        r = k_hat(ones)
        r = jnp.maximum(r, 1e-6 * jnp.mean(jnp.abs(r)) + 1e-30)
        inv_sqrt = _inv_sqrt(0.5 * (1.0 + k_hat(1.0 / r)))
        z = jnp.zeros_like(a)
        g = 0.5 * jnp.block([[z, a], [a, z]])
        return LandmarkFactor(c, jnp.stack([inv_sqrt / r, inv_sqrt]), g, inv_sqrt)
    inv_sqrt = _inv_sqrt(k_hat(ones))
    return LandmarkFactor(c, inv_sqrt[None], a, inv_sqrt)


def _inv_sqrt(deg: Array) -> Array:
    """``d^{-1/2}``, 0 where the degree is not positive."""
    return jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)


def lowrank_top_eigenvectors(
    factor: LandmarkFactor, k: int, rel_tol: float = 1e-6
) -> tuple[Array, Array]:
    """Top-``k`` eigenpairs ``(values desc, vectors[K, k])`` of ``F G F^T`` (``G`` symmetric).

    ``F^T F`` is assembled from its blocks ``(s_i C)^T (s_j C)``, ``i <= j`` (3 ``K m^2``
    products for eq. 4's two blocks, not the 4 of a ``K x 2m`` Gram matrix), and ``F Q`` as
    ``sum_i s_i (C Q_i)`` from one product ``C [Q_1, ..., Q_j]``: no ``K x j m`` array.
    """
    c, scales, g, _ = factor
    j, m = scales.shape[0], c.shape[1]
    scaled = [c * s[:, None] for s in scales]
    blocks = {(a, b): scaled[a].T @ scaled[b] for a in range(j) for b in range(a, j)}
    gram = jnp.block(
        [[blocks[(a, b)] if a <= b else blocks[(b, a)].T for b in range(j)] for a in range(j)]
    )
    lam, v = jnp.linalg.eigh(gram)
    keep = lam > rel_tol * jnp.max(lam)
    root = jnp.where(keep, jnp.sqrt(jnp.where(keep, lam, 1.0)), 0.0)
    inv_root = jnp.where(keep, 1.0 / jnp.where(keep, root, 1.0), 0.0)
    vg = v.T @ g @ v
    t = root[:, None] * vg * root[None, :]
    theta, z = jnp.linalg.eigh(0.5 * (t + t.T))
    order = jnp.argsort(-theta)[:k]
    q = v @ (inv_root[:, None] * z[:, order])  # (j m) x k: U = F q
    cq = c @ jnp.concatenate([q[i * m : (i + 1) * m] for i in range(j)], axis=1)
    vectors = sum(scales[i][:, None] * cq[:, i * k : (i + 1) * k] for i in range(j))
    return theta[order], vectors


def landmark_indices(key: PRNGKey, num_clients: int, num_landmarks: int) -> Array:
    """``min(m, K)`` distinct client ids, a uniformly random subset in increasing order (int32;
    :func:`~fedjax_sel.kernels.sampling.uniform_subset`, ``O(m^2)``, nothing of order K)."""
    return uniform_subset(key, num_clients, min(num_landmarks, num_clients))


@functools.partial(
    jax.jit, static_argnames=("num_components", "num_landmarks", "kind", "gamma", "coef0")
)
def landmark_eigenpairs(
    x: Array,
    num_components: int,
    key: PRNGKey,
    *,
    num_landmarks: int = 256,
    kind: str = "rbf",
    gamma: float = 1.0,
    coef0: float = 1.0,
    landmarks: Array | None = None,
) -> tuple[Array, Array, Array]:
    """Top eigenpairs of the landmark approximation of the normalised adjacency ``M``.

    Args:
      x: float32[K, D] rows.
      num_components: P.
      key: draws the landmarks (unless ``landmarks`` gives their ids).
      num_landmarks: m (capped at K).
      kind, gamma, coef0: the affinity kernel.
      landmarks: int32[m] landmark ids (overrides the random draw).

    Returns:
      ``(values float32[P] descending, vectors float32[K, P], d^{-1/2} float32[K])``.
    """
    x = jnp.asarray(x, jnp.float32)
    n = x.shape[0]
    if not 1 <= num_components <= n:
        raise ConfigError(f"spectral embedding needs 1 <= components <= {n}, got {num_components}")
    ids = landmark_indices(key, n, num_landmarks) if landmarks is None else landmarks
    factor = landmark_factor(x, x[ids], kind, gamma=gamma, coef0=coef0)
    vals, vecs = lowrank_top_eigenvectors(factor, num_components)
    return vals, vecs, factor.inv_sqrt_degree
