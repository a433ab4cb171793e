"""k-means on device: greedy k-means++ seeding, Lloyd iterations with a fixed budget, empty
cluster relocation, best of several seedings; and the adjusted Rand index.

FedCVR-Bolt clusters the spectral embedding with k-means (arXiv:2506.02897, section 4,
"I = 300 iterations"): these are the semantics of scikit-learn's ``KMeans`` (which its
``SpectralClustering`` calls with ``n_init=10``), rewritten with fixed shapes:

* seeding: greedy k-means++ (Arthur and Vassilvitskii 2007), ``2 + floor(log k)`` candidates per
  center drawn with probability proportional to ``D(x)^2``, keeping the one that lowers the
  potential most; when every point coincides with a center the draw is uniform;
* Lloyd iterations inside a ``lax.while_loop``: at most ``max_iter``; stop when the labels stop
  changing or the squared center shift falls below ``tol`` times the mean feature variance;
* an empty cluster is moved onto one of the points farthest from their centers (distinct
  points for distinct empty clusters), as scikit-learn does;
* ``n_init`` seedings run one after another (``lax.map``) and the lowest inertia wins.

At large ``n`` (FedCVR-Bolt at 10^5-10^6 clients) the Lloyd iterations dominate: each costs
``O(n k d)`` and their number grows with ``n`` (about 20 at n = 10^3 and 60-90 at 10^4 for
k = 100). ``sample = s`` fits the centers on ``s`` rows drawn uniformly without replacement and
then runs one Lloyd step on every row (assign, recenter, assign):
``O(n_init iters s k d + n k d)``
(the sampling approximation of scikit-learn's ``MiniBatchKMeans`` initialisation and of
Bachem et al. 2018's coresets, without the weights). ``tests/test_fedcvr_kernels.py`` states
how close it stays to the full fit. Above :data:`BLOCK_ELEMENTS` point-center pairs the
assignment runs over blocks of rows and the recentering sums by segment, so that no ``n x k``
array exists: the same labels, distances and centers up to float rounding.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey
from fedjax_sel.kernels.affinity import squared_distances
from fedjax_sel.kernels.sampling import uniform_subset


class KMeansResult(NamedTuple):
    """Attributes: ``labels`` int32[n]; ``centers`` float32[k, d]; ``inertia`` (sum of squared
    distances to the assigned centers); ``iterations`` (Lloyd steps run)."""

    labels: Array
    centers: Array
    inertia: Array
    iterations: Array


def check_kmeans(k: int, n: int, n_init: int = 1, max_iter: int = 1) -> None:
    if not 1 <= k <= n:
        raise ConfigError(f"k-means needs 1 <= k <= number of points ({n}), got k={k}")
    if n_init < 1 or max_iter < 1:
        raise ConfigError(f"k-means needs n_init >= 1 and max_iter >= 1, got {n_init}, {max_iter}")


def kmeans_plusplus(key: PRNGKey, x: Array, k: int, num_trials: int | None = None) -> Array:
    """Greedy k-means++ seeding: float32[k, d] centers taken among the rows of ``x``."""
    n = x.shape[0]
    check_kmeans(k, n)
    trials = 2 + int(math.log(k)) if num_trials is None else int(num_trials)
    key, k_first = jax.random.split(key)
    first = jax.random.randint(k_first, (), 0, n)
    centers = jnp.zeros((k,) + x.shape[1:], x.dtype).at[0].set(x[first])
    closest = squared_distances(x, x[first][None])[:, 0]

    def add_center(i, carry):
        centers, closest, key = carry
        key, sub = jax.random.split(key)
        # draws proportional to D(x)^2 by inverse CDF (uniform when every D(x) is 0)
        total = jnp.sum(closest)
        weight = jnp.where(total > 0, closest, 1.0)
        cdf = jnp.cumsum(weight)
        u = jax.random.uniform(sub, (trials,)) * cdf[-1]
        cand = jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, n - 1)
        trial_closest = jnp.minimum(closest[:, None], squared_distances(x, x[cand]))
        best = jnp.argmin(jnp.sum(trial_closest, axis=0))
        return centers.at[i].set(x[cand[best]]), trial_closest[:, best], key

    centers, _, _ = jax.lax.fori_loop(1, k, add_center, (centers, closest, key))
    return centers


# Above this many point-center pairs, the assignment runs over blocks of rows and the
# recentering sums by segment: no n x k array (distances, one-hot, and the broadcasts XLA:CPU
# materialises for its matmul fusions) of more than about 2^22 elements (16 MB) exists at
# once. At 10^6 points and k = 100 each such array is 400 MB. Below it, one pass as before.
BLOCK_ELEMENTS = 1 << 22


def _block_rows(n: int, k: int) -> int | None:
    """Rows per assignment block, or ``None`` when ``n x k`` fits in one block."""
    rows = max(1, BLOCK_ELEMENTS // max(k, 1))
    return None if n <= rows else rows


def _assign_all(x: Array, centers: Array) -> tuple[Array, Array]:
    d2 = squared_distances(x, centers)
    return jnp.argmin(d2, axis=1).astype(jnp.int32), jnp.min(d2, axis=1)


def _assign(x: Array, centers: Array) -> tuple[Array, Array]:
    """Each row's nearest center (int32[n]) and squared distance to it (float32[n])."""
    n = x.shape[0]
    rows = _block_rows(n, centers.shape[0])
    if rows is None:
        return _assign_all(x, centers)

    def block(i, carry):
        labels, nearest = carry
        # the last block starts early enough to stay inside x (it recomputes a few rows of
        # the block before it, with the same result): no padded copy of x
        start = jnp.minimum(i * rows, n - rows)
        lab, near = _assign_all(jax.lax.dynamic_slice_in_dim(x, start, rows), centers)
        return (
            jax.lax.dynamic_update_slice_in_dim(labels, lab, start, 0),
            jax.lax.dynamic_update_slice_in_dim(nearest, near, start, 0),
        )

    init = (jnp.zeros((n,), jnp.int32), jnp.zeros((n,), x.dtype))
    return jax.lax.fori_loop(0, -(-n // rows), block, init)


def _recenter(x: Array, labels: Array, nearest: Array, k: int) -> Array:
    if _block_rows(x.shape[0], k) is None:
        onehot = jax.nn.one_hot(labels, k, dtype=x.dtype)
        counts = jnp.sum(onehot, axis=0)
        sums = onehot.T @ x
    else:  # no n x k one-hot (sums in another order: equal up to float rounding)
        counts = jax.ops.segment_sum(jnp.ones(labels.shape, x.dtype), labels, k)
        sums = jax.ops.segment_sum(x, labels, k)
    centers = sums / jnp.maximum(counts, 1.0)[:, None]
    # empty clusters take the points farthest from their centers, one distinct point each
    empty = counts == 0
    rank = jnp.clip(jnp.cumsum(empty) - 1, 0, k - 1)
    farthest = jax.lax.top_k(nearest, k)[1]
    return jnp.where(empty[:, None], x[farthest[rank]], centers)


def lloyd(x: Array, centers: Array, max_iter: int = 300, tol: float = 1e-4) -> KMeansResult:
    """Lloyd iterations from ``centers`` (see the module docstring for the stopping rule)."""
    k = centers.shape[0]
    tol_abs = tol * jnp.mean(jnp.var(x, axis=0))
    labels0, _ = _assign(x, centers)

    def cond(carry):
        it, _, _, done = carry
        return (it < max_iter) & ~done

    def body(carry):
        it, centers, labels, _ = carry
        new_labels, nearest = _assign(x, centers)
        new_centers = _recenter(x, new_labels, nearest, k)
        shift = jnp.sum(jnp.square(new_centers - centers))
        done = ((it > 0) & jnp.all(new_labels == labels)) | (shift <= tol_abs)
        return it + 1, new_centers, new_labels, done

    it, centers, _, _ = jax.lax.while_loop(
        cond, body, (jnp.zeros((), jnp.int32), centers, labels0, jnp.zeros((), bool))
    )
    labels, nearest = _assign(x, centers)
    return KMeansResult(labels, centers, jnp.sum(nearest), it)


@functools.partial(
    jax.jit, static_argnames=("k", "n_init", "max_iter", "tol", "num_trials", "sample")
)
def kmeans(
    key: PRNGKey,
    x: Array,
    k: int,
    *,
    n_init: int = 10,
    max_iter: int = 300,
    tol: float = 1e-4,
    num_trials: int | None = None,
    sample: int = 0,
) -> KMeansResult:
    """k-means with ``n_init`` k-means++ seedings; the lowest inertia wins.

    Args:
      key: PRNG key.
      x: float[n, d] points.
      k: clusters (static, ``1 <= k <= n``).
      n_init: seedings (scikit-learn's ``SpectralClustering`` uses 10).
      max_iter: Lloyd iteration budget (300 in the paper and in scikit-learn).
      tol: relative center-shift tolerance.
      num_trials: k-means++ candidates per center (``2 + floor(log k)`` when ``None``).
      sample: fit on this many rows drawn without replacement, then assign every row (module
        docstring); 0, or at least ``n``, fits on every row. The result's ``inertia`` is over
        every row, its ``iterations`` those of the fit.
    """
    x = jnp.asarray(x, jnp.float32)
    chex.assert_rank(x, 2)
    n = x.shape[0]
    check_kmeans(k, n, n_init, max_iter)
    if sample < 0 or 0 < sample < k:
        raise ConfigError(f"k-means sample must be 0 (every row) or >= k={k}, got {sample}")
    fit_x = x
    if 0 < sample < n:
        key, k_sample = jax.random.split(key)
        fit_x = x[uniform_subset(k_sample, n, sample)]

    def one(key):
        return lloyd(fit_x, kmeans_plusplus(key, fit_x, k, num_trials), max_iter, tol)

    # one seeding after another: vmapping the data-dependent loops costs more than it saves
    runs = jax.lax.map(one, jax.random.split(key, n_init))
    best = jax.tree.map(lambda a: a[jnp.argmin(runs.inertia)], runs)
    if fit_x is x:
        return best
    # one Lloyd step on every row: the centers become the means of all their members (the
    # sample's means carry an O(1/s) error per cluster), then the final assignment
    labels, nearest = _assign(x, best.centers)
    centers = _recenter(x, labels, nearest, k)
    labels, nearest = _assign(x, centers)
    return KMeansResult(labels, centers, jnp.sum(nearest), best.iterations)


def contingency_ari(table: Array) -> Array:
    """Adjusted Rand index (Hubert and Arabie 1985) from a contingency table ``n_ij`` (the
    number of points with label ``i`` in one labeling and ``j`` in the other); 1 when both
    labelings are trivially identical (e.g. one cluster each)."""
    table = jnp.asarray(table, jnp.float32)

    def pairs(c):
        return jnp.sum(c * (c - 1.0) / 2.0)

    n = jnp.sum(table)
    index = pairs(table)
    sum_a, sum_b = pairs(table.sum(1)), pairs(table.sum(0))
    expected = sum_a * sum_b / jnp.maximum(n * (n - 1.0) / 2.0, 1.0)
    denom = 0.5 * (sum_a + sum_b) - expected
    return jnp.where(denom == 0, 1.0, (index - expected) / jnp.where(denom == 0, 1.0, denom))


def adjusted_rand_index(a: Array, b: Array, num_a: int, num_b: int) -> Array:
    """Adjusted Rand index of two labelings with labels in ``[0, num_a)`` and ``[0, num_b)``
    (:func:`contingency_ari`)."""
    return contingency_ari(contingency(a, b, num_a, num_b))


def contingency(a: Array, b: Array, num_a: int, num_b: int) -> Array:
    """float32[num_a, num_b]: the number of points with label ``i`` in ``a`` and ``j`` in
    ``b``, counted by a scatter-add (exact below 2^24 points; no ``n x num_a`` one-hot, which
    at 10^6 points and 100 labels would be 400 MB)."""
    cell = jnp.asarray(a, jnp.int32) * num_b + jnp.asarray(b, jnp.int32)
    counts = jax.ops.segment_sum(jnp.ones(cell.shape, jnp.float32), cell, num_a * num_b)
    return counts.reshape(num_a, num_b)
