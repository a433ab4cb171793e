"""Normalised-Laplacian spectral embedding and spectral clustering on device (FedCVR-Bolt's
coalition formation, arXiv:2506.02897, Algorithm 1 line 5 and section 4).

Given an affinity ``W`` (``K x K``, possibly not symmetric, e.g. the row-normalised eq. 4), the
embedding follows von Luxburg (2007) and scikit-learn's ``spectral_embedding``:

1. ``S = (W + W^T) / 2`` (scikit-learn symmetrises the same way), negative entries clipped to 0
   (cosine and sigmoid kernels can be negative; a graph needs non-negative weights);
2. degrees ``d = S 1`` and ``M = D^{-1/2} S D^{-1/2}``, so the normalised Laplacian is
   ``L = I - M`` (a node of degree 0 gets a zero row);
3. the eigenvectors ``U`` of the ``P`` largest eigenvalues of ``M`` (the ``P`` smallest of
   ``L``), the first one included (scikit-learn's ``SpectralClustering`` keeps it);
4. rows scaled: ``degree`` divides by ``sqrt(d)`` (scikit-learn's ``norm_laplacian`` embedding,
   the random-walk eigenvectors), ``row`` normalises rows (Ng, Jordan and Weiss 2002), ``none``.

Eigensolvers: ``eigh`` (dense, ``O(K^3)``) or ``krylov``: randomized block Krylov iteration
(Musco and Musco 2015) with full re-orthogonalisation and a Rayleigh-Ritz step: ``steps + 1``
products of ``M`` with a ``K x b`` block (``b = P + oversample``), ``O(K^2 b steps)`` time.
``auto`` uses ``eigh`` up to :data:`EIGH_MAX` clients. The landmark (Nystrom) path that needs
only ``O(K m)`` memory (:func:`landmark_spectral_embedding`) takes its eigenpairs from
:mod:`fedjax_sel.kernels.nystrom`, which does not import this module.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey
from fedjax_sel.kernels.affinity import check_affinity, kernel_values
from fedjax_sel.kernels.kmeans import kmeans
from fedjax_sel.kernels.nystrom import landmark_eigenpairs

SOLVERS = ("auto", "eigh", "krylov")
SCALINGS = ("degree", "row", "none")
METHODS = ("auto", "exact", "landmark")
EIGH_MAX = 512  # auto: dense eigh up to this many clients, block Krylov above
EXACT_MAX = 10_000  # auto: the exact K x K path up to this many clients, landmarks above
# auto on the landmark path: k-means fitted on 20 sampled clients per coalition, then every
# client assigned and one Lloyd step on all (K = 20,000, P = 100 planted clusters in 100-D,
# noise 0.3 and 0.5: inertia +8.7% and +2.2% over the full fit, ARI against the truth 0.99 and
# 0.97 where the full fit reaches 1.00 and 0.98)
KMEANS_SAMPLE_PER_CLUSTER = 20


def normalized_adjacency(affinity: Array, clip_negative: bool = True) -> tuple[Array, Array]:
    """``(M, d^{-1/2})``: ``M = D^{-1/2} S D^{-1/2}`` with ``S = (W + W^T) / 2`` (steps 1-2)."""
    s = 0.5 * (affinity + affinity.T)
    if clip_negative:
        s = jnp.maximum(s, 0.0)
    deg = jnp.sum(s, axis=1)
    inv_sqrt = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
    return inv_sqrt[:, None] * s * inv_sqrt[None, :], inv_sqrt


def kernel_normalized_adjacency(
    kernel: Array, row_normalize: bool, clip_negative: bool = True
) -> tuple[Array, Array]:
    """``(M, d^{-1/2})`` as :func:`normalized_adjacency`, for ``W = R^{-1} E`` (or ``W = E``)
    with a symmetric kernel matrix ``E``: ``S = (W + W^T) / 2`` has entries
    ``(1/r_i + 1/r_j) E_ij / 2`` and degrees ``(1 + E r^{-1}) / 2``, so ``M`` is one
    elementwise pass over ``E`` (a ``K x K`` transpose is slow on CPU)."""
    e = jnp.maximum(kernel, 0.0) if clip_negative else kernel
    if row_normalize:
        r = jnp.sum(e, axis=1)
        inv_r = jnp.where(r > 0, 1.0 / jnp.where(r > 0, r, 1.0), 0.0)
        deg = 0.5 * (r * inv_r + e @ inv_r)
    else:
        deg = jnp.sum(e, axis=1)
    inv_sqrt = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
    if row_normalize:
        a, b = inv_sqrt * inv_r, inv_sqrt
        return 0.5 * (a[:, None] * e * b[None, :] + b[:, None] * e * a[None, :]), inv_sqrt
    return inv_sqrt[:, None] * e * inv_sqrt[None, :], inv_sqrt


_SIGNED = ("cosine", "sigmoid")  # kernels that can be negative (the others need no clipping)


def kernel_adjacency_operator(kernel: Array, row_normalize: bool, clip_negative: bool = True):
    """``(v -> M v, d^{-1/2})`` for the ``M`` of :func:`kernel_normalized_adjacency`, applied
    through ``E`` without forming ``M``: ``M v = (a * E(b * v) + b * E(a * v)) / 2`` with
    ``a = d^{-1/2} / r``, ``b = d^{-1/2}`` (row-normalised), else ``d^{-1/2} * E(d^{-1/2} * v)``.
    Both products go through ``E`` in one matrix product with twice the columns."""
    e = jnp.maximum(kernel, 0.0) if clip_negative else kernel
    r = jnp.sum(e, axis=1)
    if row_normalize:
        inv_r = jnp.where(r > 0, 1.0 / jnp.where(r > 0, r, 1.0), 0.0)
        deg = 0.5 * (r * inv_r + e @ inv_r)
    else:
        deg = r
    inv_sqrt = jnp.where(deg > 0, jax.lax.rsqrt(jnp.where(deg > 0, deg, 1.0)), 0.0)
    if not row_normalize:
        return (lambda v: inv_sqrt[:, None] * (e @ (inv_sqrt[:, None] * v))), inv_sqrt
    a, b = inv_sqrt * inv_r, inv_sqrt

    def matmul(v):
        width = v.shape[1]
        both = e @ jnp.concatenate([b[:, None] * v, a[:, None] * v], axis=1)
        return 0.5 * (a[:, None] * both[:, :width] + b[:, None] * both[:, width:])

    return matmul, inv_sqrt


def _svqb(y: Array, scale: Array) -> Array:
    """Orthonormal columns spanning ``y`` through the Gram matrix (SVQB, Stathopoulos and Wu
    2002): only matrix products and a ``b x b`` eigh, no LAPACK QR of a tall matrix. Directions
    with singular value below ``1e-4 * sqrt(scale)`` (already in the span) become zero."""
    lam, v = jnp.linalg.eigh(y.T @ y)
    keep = lam > 1e-8 * scale
    inv = jnp.where(keep, jax.lax.rsqrt(jnp.where(keep, lam, 1.0)), 0.0)
    return y @ (v * inv[None, :])


def _orthonormal(y: Array, basis: Array | None) -> Array:
    """Columns of ``y`` made orthonormal and orthogonal to ``basis`` (projected twice, then two
    SVQB passes); columns numerically inside ``span(basis)`` come back as zeros."""
    scale = jnp.maximum(jnp.max(jnp.sum(jnp.square(y), axis=0)), 1e-30)
    if basis is not None:
        for _ in range(2):  # "twice is enough" (Giraud et al. 2005)
            y = y - basis @ (basis.T @ y)
    y = _svqb(y, scale)
    return _svqb(y, jnp.ones((), y.dtype))


def rayleigh_ritz(q: Array, aq: Array, k: int) -> tuple[Array, Array]:
    """Top-``k`` Ritz pairs of ``A`` on the orthonormal basis ``q`` given ``aq = A q``."""
    t = q.T @ aq
    vals, vecs = jnp.linalg.eigh(0.5 * (t + t.T))
    order = jnp.argsort(-vals)[:k]
    return vals[order], q @ vecs[:, order]


def block_krylov_top(
    matmul, n: int, k: int, key: PRNGKey, *, oversample: int = 5, steps: int = 8
) -> tuple[Array, Array]:
    """Top-``k`` eigenpairs of a symmetric ``n x n`` operator given by ``matmul(v[n, b])``.

    Randomized block Krylov (Musco and Musco 2015): the basis ``[Q_0, A Q_0, ..., A^steps Q_0]``
    built block by block with re-orthogonalisation, then Rayleigh-Ritz on it. Returns
    ``(values float32[k] descending, vectors float32[n, k])``.
    """
    b = min(n, k + oversample)
    blocks = max(1, min(steps + 1, n // b))
    q = _orthonormal(jax.random.normal(key, (n, b), jnp.float32), None)
    basis = jnp.zeros((n, b * blocks), jnp.float32).at[:, :b].set(q)
    images = jnp.zeros((n, b * blocks), jnp.float32)

    def step(i, carry):
        basis, images = carry
        q = jax.lax.dynamic_slice_in_dim(basis, i * b, b, axis=1)
        aq = matmul(q)
        images = jax.lax.dynamic_update_slice_in_dim(images, aq, i * b, axis=1)
        nxt = _orthonormal(aq, basis)  # zero columns of unfilled blocks do not matter
        basis = jnp.where(
            i + 1 < blocks,
            jax.lax.dynamic_update_slice_in_dim(basis, nxt, (i + 1) * b, axis=1),
            basis,
        )
        return basis, images

    basis, images = jax.lax.fori_loop(0, blocks, step, (basis, images))
    return rayleigh_ritz(basis, images, k)


def top_eigenvectors(
    m: Array, k: int, key: PRNGKey | None = None, solver: str = "auto", steps: int = 8
) -> tuple[Array, Array]:
    """``(values[k] descending, vectors[n, k])`` of the symmetric matrix ``m``."""
    if solver not in SOLVERS:
        raise ConfigError(f"eigensolver must be one of {SOLVERS}, got {solver!r}")
    n = m.shape[0]
    if solver == "eigh" or (solver == "auto" and n <= EIGH_MAX):
        vals, vecs = jnp.linalg.eigh(m)
        return vals[::-1][:k], vecs[:, ::-1][:, :k]
    key = jax.random.key(0) if key is None else key
    return block_krylov_top(lambda v: m @ v, n, k, key, steps=steps)


def scale_embedding(vectors: Array, inv_sqrt_degree: Array, scaling: str) -> Array:
    """Step 4 of the module docstring."""
    if scaling not in SCALINGS:
        raise ConfigError(f"embedding scaling must be one of {SCALINGS}, got {scaling!r}")
    if scaling == "degree":
        return vectors * inv_sqrt_degree[:, None]
    if scaling == "row":
        norm = jnp.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / jnp.maximum(norm, 1e-12)
    return vectors


class Embedding(NamedTuple):
    """A spectral embedding: ``points`` float32[K, P] (rows to cluster), ``eigenvalues``
    float32[P] of ``M`` (descending; ``1 - eigenvalue`` are the Laplacian's)."""

    points: Array
    eigenvalues: Array


def _embed(m, inv_sqrt, num_components, key, scaling, solver, steps) -> Embedding:
    if not 1 <= num_components <= m.shape[0]:
        raise ConfigError(
            f"spectral embedding needs 1 <= components <= {m.shape[0]}, got {num_components}"
        )
    vals, vecs = top_eigenvectors(m, num_components, key, solver, steps)
    return Embedding(scale_embedding(vecs, inv_sqrt, scaling), vals)


def spectral_embedding(
    affinity: Array,
    num_components: int,
    key: PRNGKey | None = None,
    *,
    scaling: str = "degree",
    solver: str = "auto",
    clip_negative: bool = True,
    steps: int = 8,
) -> Embedding:
    """The normalised-Laplacian embedding of any affinity matrix (module docstring, steps 1-4).

    Args:
      affinity: float[K, K] ``W`` (need not be symmetric).
      num_components: P eigenvectors.
      key: starts the Krylov solver.
      scaling: row scaling (:data:`SCALINGS`).
      solver: :data:`SOLVERS`.
      clip_negative: zero negative entries of ``S``.
      steps: Krylov steps.
    """
    chex.assert_rank(affinity, 2)
    chex.assert_equal(affinity.shape[0], affinity.shape[1])
    m, inv_sqrt = normalized_adjacency(jnp.asarray(affinity, jnp.float32), clip_negative)
    return _embed(m, inv_sqrt, num_components, key, scaling, solver, steps)


def kernel_spectral_embedding(
    x: Array,
    num_components: int,
    key: PRNGKey | None = None,
    *,
    kind: str = "rbf",
    gamma: float = 1.0,
    coef0: float = 1.0,
    row_normalize: bool | None = None,
    scaling: str = "degree",
    solver: str = "auto",
    steps: int = 8,
) -> Embedding:
    """The exact-path embedding of the rows of ``x`` under an affinity kernel: the same result
    as ``spectral_embedding(affinity_matrix(x, kind, ...))`` without a ``K x K`` transpose
    (see :func:`kernel_normalized_adjacency`). ``row_normalize=None``: eq. 4's normalisation
    for ``rbf`` only."""
    if row_normalize is None:
        row_normalize = kind == "rbf"
    e = kernel_values(x, x, kind, gamma=gamma, coef0=coef0)
    n = e.shape[0]
    if solver not in SOLVERS:
        raise ConfigError(f"eigensolver must be one of {SOLVERS}, got {solver!r}")
    if solver == "eigh" or (solver == "auto" and n <= EIGH_MAX):
        m, inv_sqrt = kernel_normalized_adjacency(e, row_normalize)
        return _embed(m, inv_sqrt, num_components, key, scaling, solver, steps)
    # Krylov: apply M through E without forming it (one fewer K x K pass and array)
    matmul, inv_sqrt = kernel_adjacency_operator(e, row_normalize, clip_negative=kind in _SIGNED)
    if not 1 <= num_components <= n:
        raise ConfigError(f"spectral embedding needs 1 <= components <= {n}, got {num_components}")
    key = jax.random.key(0) if key is None else key
    vals, vecs = block_krylov_top(matmul, n, num_components, key, steps=steps)
    return Embedding(scale_embedding(vecs, inv_sqrt, scaling), vals)


@functools.partial(
    jax.jit,
    static_argnames=("num_components", "num_landmarks", "kind", "gamma", "coef0", "scaling"),
)
def landmark_spectral_embedding(
    x: Array,
    num_components: int,
    key: PRNGKey,
    *,
    num_landmarks: int = 256,
    kind: str = "rbf",
    gamma: float = 1.0,
    coef0: float = 1.0,
    scaling: str = "degree",
    landmarks: Array | None = None,
) -> Embedding:
    """The spectral embedding of :func:`spectral_embedding` through landmarks
    (:func:`fedjax_sel.kernels.nystrom.landmark_eigenpairs`): memory ``O(K m)`` instead of
    ``O(K^2)``.

    Args:
      x: float32[K, D] rows.
      num_components: P.
      key: draws the landmarks (unless ``landmarks`` gives their ids).
      num_landmarks: m (capped at K).
      kind, gamma, coef0: the affinity kernel.
      scaling: embedding row scaling.
      landmarks: int32[m] landmark ids (overrides the random draw).
    """
    vals, vecs, inv_sqrt = landmark_eigenpairs(
        x,
        num_components,
        key,
        num_landmarks=num_landmarks,
        kind=kind,
        gamma=gamma,
        coef0=coef0,
        landmarks=landmarks,
    )
    return Embedding(scale_embedding(vecs, inv_sqrt, scaling), vals)


class CoalitionConfig(NamedTuple):
    """Static settings of :func:`spectral_clustering` (hashable; closed over by strategies).

    Attributes:
      affinity: kernel (``fedjax_sel.kernels.affinity.AFFINITIES``).
      gamma, coef0: kernel parameters.
      method: ``exact`` (``K x K`` affinity), ``landmark`` (Nystrom, ``O(K m)`` memory) or
        ``auto`` (exact up to :data:`EXACT_MAX` clients).
      landmarks: m, landmark clients of the Nystrom path.
      scaling: embedding row scaling (:data:`SCALINGS`).
      solver: eigensolver of the exact path (:data:`SOLVERS`).
      n_init, max_iter: k-means seedings and iteration budget.
      kmeans_sample: rows the k-means centers are fitted on before every row is assigned
        (:func:`fedjax_sel.kernels.kmeans.kmeans`): ``0`` every row, ``-1`` (auto) every row on
        the exact path and :data:`KMEANS_SAMPLE_PER_CLUSTER` per cluster on the landmark path.
      krylov_steps: block Krylov steps of the exact path's iterative eigensolver.
    """

    affinity: str = "rbf"
    gamma: float = 1.0
    coef0: float = 1.0
    method: str = "auto"
    landmarks: int = 256
    scaling: str = "degree"
    solver: str = "auto"
    n_init: int = 10
    max_iter: int = 300
    kmeans_sample: int = -1
    krylov_steps: int = 6

    def validate(self) -> CoalitionConfig:
        check_affinity(self.affinity, self.gamma, self.coef0)
        if self.method not in METHODS:
            raise ConfigError(f"coalition method must be one of {METHODS}, got {self.method!r}")
        if self.scaling not in SCALINGS:
            raise ConfigError(f"embedding scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.solver not in SOLVERS:
            raise ConfigError(f"eigensolver must be one of {SOLVERS}, got {self.solver!r}")
        if self.landmarks < 2:
            raise ConfigError(f"landmarks must be >= 2, got {self.landmarks}")
        if self.krylov_steps < 1:
            raise ConfigError(f"krylov_steps must be >= 1, got {self.krylov_steps}")
        if self.n_init < 1 or self.max_iter < 1:
            raise ConfigError(
                f"k-means needs n_init >= 1 and max_iter >= 1, got {self.n_init}, {self.max_iter}"
            )
        if self.kmeans_sample < -1:
            raise ConfigError(
                f"kmeans_sample must be -1 (auto), 0 (every client) or >= the number of "
                f"coalitions, got {self.kmeans_sample}"
            )
        return self

    def uses_landmarks(self, num_clients: int) -> bool:
        if self.method == "auto":
            return num_clients > EXACT_MAX
        return self.method == "landmark"

    def kmeans_rows(self, num_clients: int, num_clusters: int) -> int:
        """The ``sample`` k-means gets: 0 (every row) or a row count below ``num_clients``."""
        sample = self.kmeans_sample
        if sample == -1:
            if not self.uses_landmarks(num_clients):
                return 0
            sample = KMEANS_SAMPLE_PER_CLUSTER * num_clusters
        if sample != 0 and sample < num_clusters:
            raise ConfigError(
                f"kmeans_sample={sample} is below the number of coalitions ({num_clusters})"
            )
        return 0 if sample >= num_clients else sample


DEFAULT_COALITIONS = CoalitionConfig()


def coalition_embedding(
    x: Array, num_clusters: int, key: PRNGKey, config: CoalitionConfig = DEFAULT_COALITIONS
) -> Embedding:
    """The spectral embedding (``num_clusters`` components) that :func:`spectral_clustering`
    clusters under ``config``: the Nystrom landmark path or the exact path, by
    :meth:`CoalitionConfig.uses_landmarks`. Its ``eigenvalues`` say how many components carry
    structure above rounding (``benchmarks/coalition_conditioning.py``)."""
    x = jnp.asarray(x, jnp.float32)
    chex.assert_rank(x, 2)
    config.validate()
    if config.uses_landmarks(x.shape[0]):
        return landmark_spectral_embedding(
            x,
            num_clusters,
            key,
            num_landmarks=config.landmarks,
            kind=config.affinity,
            gamma=config.gamma,
            coef0=config.coef0,
            scaling=config.scaling,
        )
    return kernel_spectral_embedding(
        x,
        num_clusters,
        key,
        kind=config.affinity,
        gamma=config.gamma,
        coef0=config.coef0,
        scaling=config.scaling,
        solver=config.solver,
        steps=config.krylov_steps,
    )


@functools.partial(jax.jit, static_argnames=("num_clusters", "config"))
def spectral_clustering(
    x: Array, num_clusters: int, key: PRNGKey, config: CoalitionConfig = DEFAULT_COALITIONS
) -> Array:
    """Coalitions of the rows of ``x``: affinity, spectral embedding with ``num_clusters``
    components (:func:`coalition_embedding`), k-means with ``num_clusters`` clusters. Returns
    int32[K] labels (a label may be unused when the points have fewer than ``num_clusters``
    distinct positions)."""
    k_embed, k_means = jax.random.split(key)
    emb = coalition_embedding(x, num_clusters, k_embed, config)
    return kmeans(
        k_means,
        emb.points,
        num_clusters,
        n_init=config.n_init,
        max_iter=config.max_iter,
        sample=config.kmeans_rows(x.shape[0], num_clusters),
    ).labels
