"""Affinity (proximity) matrices between client models: FedCVR-Bolt's homophily influence matrix
(arXiv:2506.02897, eq. 4) and the kernels of its ablation (appendix B.1, Table 4).

For rows ``x_k`` (client model sketches, usually normalised to unit length as Algorithm 1
line 3 does):

* ``rbf``: ``W_kj = exp(-gamma ||x_k - x_j||^2) / sum_m exp(-gamma ||x_k - x_m||^2)`` (eq. 4,
  row-normalised; ``row_normalize=False`` gives the plain RBF kernel);
* ``cosine``: ``<x_k, x_j> / (||x_k|| ||x_j||)``;
* ``laplacian``: ``exp(-gamma ||x_k - x_j||_1)``;
* ``sigmoid``: ``tanh(gamma <x_k, x_j> + coef0)``.

``gamma = 0`` picks a scale-free value from the data: one over the mean pairwise distance
(squared L2 for ``rbf``, L1 for ``laplacian``) or over the mean absolute inner product
(``sigmoid``). The defaults ``gamma = 1``, ``coef0 = 1`` are scikit-learn's
``SpectralClustering`` defaults, which the paper's 300-iteration k-means suggests its code used.

Every function is a pure jittable function of its array arguments; ``kind``, ``gamma``,
``coef0`` and ``row_normalize`` are static Python values.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError

AFFINITIES = ("rbf", "cosine", "laplacian", "sigmoid")


def _precision():
    """Full float32 products on accelerators (no TF32 in distances); the CPU default is
    already exact and HIGHEST only slows it down."""
    return None if jax.default_backend() == "cpu" else jax.lax.Precision.HIGHEST


def check_affinity(kind: str, gamma: float, coef0: float = 1.0) -> None:
    """Raises :class:`ConfigError` for an unknown kernel or a negative/non-finite gamma."""
    if kind not in AFFINITIES:
        raise ConfigError(f"affinity must be one of {AFFINITIES}, got {kind!r}")
    if not (gamma >= 0 and math.isfinite(gamma)):
        raise ConfigError(f"affinity gamma must be >= 0 (0 = automatic), got {gamma!r}")
    if not math.isfinite(coef0):
        raise ConfigError(f"affinity coef0 must be finite, got {coef0!r}")


def normalize_rows(x: Array, eps: float = 1e-12) -> Array:
    """``x_k / ||x_k||`` (Algorithm 1 line 3); an all-zero row stays zero."""
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / jnp.maximum(norm, eps)


def squared_distances(x: Array, y: Array) -> Array:
    """``||x_i - y_j||^2`` (float32[n, m]) through one matrix product, clamped at 0."""
    xx = jnp.sum(jnp.square(x), axis=1)
    yy = jnp.sum(jnp.square(y), axis=1)
    # -2 scales the small operand (exact: a power of two), not the n x m product, which
    # XLA:CPU would otherwise feed a materialised n x m broadcast of the constant
    d2 = xx[:, None] + yy[None, :] + jnp.matmul(x, -2.0 * y.T, precision=_precision())
    return jnp.maximum(d2, 0.0)


def l1_distances(x: Array, y: Array, block_elements: int = 1 << 24) -> Array:
    """``||x_i - y_j||_1`` (float32[n, m]); rows of ``x`` go in blocks so that no more than
    about ``block_elements`` differences exist at once (never an ``n x m x D`` array)."""
    n, d = x.shape
    m = y.shape[0]
    rows = max(1, min(n, block_elements // max(m * d, 1)))
    blocks = -(-n // rows)
    xp = jnp.pad(x, ((0, blocks * rows - n), (0, 0))).reshape(blocks, rows, d)

    def one(xb):
        return jnp.sum(jnp.abs(xb[:, None, :] - y[None, :, :]), axis=-1)

    out = one(xp[0]) if blocks == 1 else jax.lax.map(one, xp).reshape(blocks * rows, m)
    return out[:n]


def _inner(x: Array, y: Array) -> Array:
    return jnp.matmul(x, y.T, precision=_precision())


def _auto(gamma, stat: Array) -> Array:
    """``gamma`` itself, or ``1 / stat`` when ``gamma == 0`` (1 when ``stat`` is 0)."""
    if not isinstance(gamma, (int, float)) or gamma > 0:
        return jnp.asarray(gamma, jnp.float32)
    return jnp.where(stat > 0, 1.0 / jnp.maximum(stat, 1e-30), 1.0)


def kernel_and_gamma(
    x: Array, y: Array, kind: str = "rbf", *, gamma=1.0, coef0: float = 1.0
) -> tuple[Array, Array]:
    """``(k(x_i, y_j) float32[n, m], gamma used)``: :func:`kernel_values` and the resolved
    ``gamma`` (the automatic one when ``gamma == 0``), so another block can reuse it."""
    if isinstance(gamma, (int, float)):
        check_affinity(kind, gamma, coef0)
    elif kind not in AFFINITIES:
        raise ConfigError(f"affinity must be one of {AFFINITIES}, got {kind!r}")
    x = jnp.asarray(x, jnp.float32)
    y = jnp.asarray(y, jnp.float32)
    if kind == "rbf":
        d2 = squared_distances(x, y)
        g = _auto(gamma, jnp.mean(d2))
        return jnp.exp(-g * d2), g
    if kind == "laplacian":
        d1 = l1_distances(x, y)
        g = _auto(gamma, jnp.mean(d1))
        return jnp.exp(-g * d1), g
    if kind == "cosine":
        return jnp.clip(_inner(normalize_rows(x), normalize_rows(y)), -1.0, 1.0), _auto(1.0, 0)
    ip = _inner(x, y)
    g = _auto(gamma, jnp.mean(jnp.abs(ip)))
    return jnp.tanh(g * ip + coef0), g


def kernel_values(x: Array, y: Array, kind: str = "rbf", *, gamma=1.0, coef0: float = 1.0) -> Array:
    """The un-normalised kernel ``k(x_i, y_j)`` (float32[n, m]) of appendix B.1.

    Args:
      x: float[n, D] rows.
      y: float[m, D] rows.
      kind: one of :data:`AFFINITIES`.
      gamma: kernel scale (0: automatic, see the module docstring; the statistic is taken over
        the ``n x m`` block computed here); a traced scalar is used as is.
      coef0: the sigmoid kernel's offset.
    """
    return kernel_and_gamma(x, y, kind, gamma=gamma, coef0=coef0)[0]


@functools.partial(jax.jit, static_argnames=("kind", "gamma", "coef0", "row_normalize"))
def affinity_matrix(
    x: Array,
    kind: str = "rbf",
    *,
    gamma: float = 1.0,
    coef0: float = 1.0,
    row_normalize: bool | None = None,
) -> Array:
    """The ``K x K`` affinity between the rows of ``x``.

    Args:
      x: float[K, D] client model sketches.
      kind: one of :data:`AFFINITIES`.
      gamma, coef0: kernel parameters (see :func:`kernel_values`).
      row_normalize: divide each row by its sum (eq. 4); ``None`` means ``True`` for ``rbf``
        (the paper's homophily matrix) and ``False`` for the other kernels.

    Returns:
      float32[K, K]. The row-normalised RBF matrix is not symmetric (each row sums to one).
    """
    if row_normalize is None:
        row_normalize = kind == "rbf"
    if kind == "rbf" and row_normalize:
        # eq. 4 as a softmax over each row: exact, and free of underflow for large gamma
        x = jnp.asarray(x, jnp.float32)
        check_affinity(kind, gamma, coef0)
        d2 = squared_distances(x, x)
        return jax.nn.softmax(-_auto(gamma, jnp.mean(d2)) * d2, axis=1)
    w = kernel_values(x, x, kind, gamma=gamma, coef0=coef0)
    if row_normalize:
        s = jnp.sum(w, axis=1, keepdims=True)
        w = w / jnp.where(s == 0, 1.0, s)
    return w
