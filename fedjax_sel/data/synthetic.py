"""Synthetic federated data sets, generated in JAX from a key (no files, no network).

* :func:`leaf_synthetic`: Synthetic(alpha, beta) of FedProx / LEAF (Li et al. 2020), the recipe
  of ``litian96/FedProx data/synthetic_1_1/generate_synthetic.py``.
* :func:`clustered_regression`: the clustered linear regression of FedCVR-Bolt (appendix C.3).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import ConfigError, PRNGKey


def leaf_synthetic_sizes(
    key: PRNGKey,
    num_clients: int,
    max_examples: int | None = None,
    examples_per_client: int | None = None,
):
    """Client sizes ``floor(LogNormal(4, 2)) + 50`` (FedProx), optionally capped; or
    ``examples_per_client`` for every client (equal sizes, no LogNormal skew)."""
    if examples_per_client is not None:
        if examples_per_client < 2:
            raise ConfigError(f"examples_per_client must be >= 2, got {examples_per_client}")
        return np.full(num_clients, int(examples_per_client), np.int64)
    sizes = jnp.floor(jnp.exp(4.0 + 2.0 * jax.random.normal(key, (num_clients,)))) + 50
    if max_examples is not None:
        sizes = jnp.minimum(sizes, max_examples)
    return np.asarray(sizes, np.int64)


def leaf_synthetic(
    key: PRNGKey,
    num_clients: int,
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    dim: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    max_examples: int | None = None,
    examples_per_client: int | None = None,
    personal_scale: float | None = None,
    chunk_rows: int = 16384,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LEAF Synthetic(alpha, beta).

    Per client k: ``u_k ~ N(0, alpha^2)``, ``B_k ~ N(0, beta^2)``, ``v_k ~ N(B_k, 1)^dim``,
    ``W_k ~ N(u_k, 1)^{dim x C}``, ``b_k ~ N(u_k, 1)^C``; examples ``x ~ N(v_k, Sigma)`` with
    ``Sigma = diag((j + 1)^-1.2)``, labels ``argmax(x W_k + b_k)``. In the IID variant all
    clients share one ``W, b`` and ``v_k = 0``. Note that ``alpha = 0`` does not make clients
    identical: each still draws its own ``W_k``. Sizes: ``floor(LogNormal(4, 2)) + 50``
    (capped at ``max_examples``), or ``examples_per_client`` each (CA-Fed's reference code
    gives every client the same size).

    Every client's ``W_k`` is its own draw, so at 10^5-10^6 clients the federation has no common
    model to learn (the test accuracy of one global model stays near chance). ``personal_scale
    = s`` (ours) makes it learnable at any K: ``W_k = W + s N(u_k, 1)`` and ``b_k = b + s
    N(u_k, 1)`` around one shared ``W, b ~ N(0, 1)`` (``s = 0``: one model, covariate shift
    through ``v_k`` only; ``u_k`` moves every logit alike, so only ``s`` sets the concept shift).

    Returns:
      ``(x float32[N, dim], y int32[N], client int32[N])``, rows grouped by client.
    """
    if num_clients < 1:
        raise ConfigError(f"leaf_synthetic needs num_clients >= 1, got {num_clients}")
    if alpha < 0 or beta < 0:
        raise ConfigError(f"leaf_synthetic alpha and beta must be >= 0, got {alpha}, {beta}")
    ks = jax.random.split(key, 9)
    sizes = leaf_synthetic_sizes(ks[0], num_clients, max_examples, examples_per_client)
    u = alpha * jax.random.normal(ks[1], (num_clients,))
    big_b = beta * jax.random.normal(ks[2], (num_clients,))
    if iid:
        v = jnp.zeros((num_clients, dim))
        w = jnp.broadcast_to(
            jax.random.normal(ks[3], (dim, num_classes)), (num_clients, dim, num_classes)
        )
        b = jnp.broadcast_to(jax.random.normal(ks[4], (num_classes,)), (num_clients, num_classes))
    else:
        v = _shifted_normal(ks[5], big_b, (num_clients, dim))
        w = _shifted_normal(ks[6], u, (num_clients, dim, num_classes))
        b = _shifted_normal(ks[7], u, (num_clients, num_classes))
        if personal_scale is not None:
            if not personal_scale >= 0:
                raise ConfigError(
                    f"leaf_synthetic personal_scale must be >= 0, got {personal_scale}"
                )
            w = _around_shared(w, jax.random.normal(ks[3], (dim, num_classes)), personal_scale)
            b = _around_shared(b, jax.random.normal(ks[4], (num_classes,)), personal_scale)
    client = np.repeat(np.arange(num_clients, dtype=np.int32), sizes)
    sd = jnp.power(jnp.arange(1, dim + 1, dtype=jnp.float32), -0.6)  # sqrt of (j+1)^-1.2
    # rows are made in fixed-size chunks by one compiled function that takes the client
    # parameters as arguments (closing over them would bake K x dim x C constants into the
    # program), written into preallocated host arrays
    n = len(client)
    x_out = np.empty((n, dim), np.float32)
    y_out = np.empty((n,), np.int32)
    rows = min(chunk_rows, max(n, 1))
    for i, start in enumerate(range(0, n, rows)):
        c = client[start : start + rows]
        x, y = _leaf_rows(
            jax.random.fold_in(ks[8], i), jnp.asarray(np.pad(c, (0, rows - len(c)))), v, w, b, sd
        )
        x_out[start : start + len(c)] = np.asarray(x)[: len(c)]
        y_out[start : start + len(c)] = np.asarray(y)[: len(c)]
    return x_out, y_out, client


def _shifted_normal(key, shift, shape):
    """``shift_k + N(0, 1)`` of the given shape, ``shift`` broadcast along the first axis; the
    sum is written into the draw's buffer (donated), so a K x dim x C array exists once."""
    return _add_shift(jax.random.normal(key, shape), shift)


@functools.partial(jax.jit, donate_argnums=0)
def _add_shift(draw, shift):
    return draw + shift.reshape((-1,) + (1,) * (draw.ndim - 1))


@functools.partial(jax.jit, donate_argnums=0)
def _around_shared(personal, shared, scale):
    return shared[None] + scale * personal


@jax.jit
def _leaf_rows(key, c, v, w, b, sd):
    """LEAF Synthetic rows of clients ``c``: ``x ~ N(v_c, diag(sd^2))``, ``argmax(x W_c + b_c)``."""
    x = v[c] + sd * jax.random.normal(key, (c.shape[0], v.shape[1]))
    logits = jnp.einsum("rd,rdc->rc", x, w[c]) + b[c]
    return x, jnp.argmax(logits, axis=-1).astype(jnp.int32)


class RegressionClusters(NamedTuple):
    """The cluster parameters of :func:`clustered_regression` (``J`` clusters): input means
    ``x_mean`` float32[J, dim] and standard deviations ``x_std`` float32[J]; regression-vector
    means ``theta_mean`` float32[J, D] and standard deviations ``theta_std`` float32[J]."""

    x_mean: jax.Array
    x_std: jax.Array
    theta_mean: jax.Array
    theta_std: jax.Array


def regression_clusters(
    key: PRNGKey,
    num_clusters: int,
    *,
    dim: int = 1,
    intercept: bool = False,
    x_mean_range: float = 3.0,
    x_std_range: tuple[float, float] = (0.5, 1.5),
    theta_mean_range: float = 3.0,
    theta_std_range: tuple[float, float] = (0.1, 0.5),
    theta_scale: float = 1.0,
) -> RegressionClusters:
    """The cluster parameters :func:`clustered_regression` draws from ``key`` (the same key
    gives the same parameters): ``theta_x_j ~ U(-x_mean_range, x_mean_range)^dim``,
    ``sigma_x_j ~ U(*x_std_range)``, and ``theta_scale`` times
    ``theta_bar_j ~ U(-theta_mean_range, theta_mean_range)^D`` and
    ``sigma_theta_j ~ U(*theta_std_range)``."""
    if not (isinstance(theta_scale, (int, float)) and theta_scale > 0):
        raise ConfigError(f"theta_scale must be a number > 0, got {theta_scale!r}")
    big_d = dim + int(intercept)
    ks = jax.random.split(key, 8)
    x_mean = jax.random.uniform(
        ks[1], (num_clusters, dim), minval=-x_mean_range, maxval=x_mean_range
    )
    x_std = jax.random.uniform(ks[2], (num_clusters,), minval=x_std_range[0], maxval=x_std_range[1])
    th_mean = jax.random.uniform(
        ks[3], (num_clusters, big_d), minval=-theta_mean_range, maxval=theta_mean_range
    )
    th_std = jax.random.uniform(
        ks[4], (num_clusters,), minval=theta_std_range[0], maxval=theta_std_range[1]
    )
    return RegressionClusters(x_mean, x_std, theta_scale * th_mean, theta_scale * th_std)


def clustered_regression(
    key: PRNGKey,
    num_clients: int = 100,
    num_clusters: int = 2,
    *,
    dim: int = 1,
    intercept: bool = False,
    examples_per_client: int = 100,
    x_mean_range: float = 3.0,
    x_std_range: tuple[float, float] = (0.5, 1.5),
    theta_mean_range: float = 3.0,
    theta_std_range: tuple[float, float] = (0.1, 0.5),
    theta_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """FedCVR-Bolt's clustered linear regression (arXiv:2506.02897, appendix C.3).

    Each client k gets a cluster ``j_k ~ U{0..J-1}``. Its inputs are
    ``x ~ N(theta_x_j, sigma_x_j^2 I)`` and each example draws its own regression vector
    ``theta_i ~ N(theta_bar_j, sigma_theta_j^2 I)``; the target is ``y = theta_i^T x`` (with a
    constant feature 1 appended to x when ``intercept``, so the model has D = dim + 1
    coefficients). ``J = 1`` is the IID case.

    The paper says only that cluster parameters are drawn by "uniform sampling routines"; ours
    are :func:`regression_clusters`'s. ``theta_scale`` (ours) multiplies the whole law of the
    regression vectors (``theta_bar_j`` and ``sigma_theta_j``): the inputs stay the same and
    the targets, for the same key, are exactly ``theta_scale`` times those of scale 1, so every
    MSE scales by ``theta_scale^2`` (the best one-cluster no-intercept fit leaves
    ``theta_scale^2 sigma_theta^2 (theta_x^2 + sigma_x^2)``). The paper does not give its data
    scale; this option lets its Table 1 magnitudes be matched.

    Returns:
      ``(x float32[N, D], y float32[N], client int32[N], cluster int32[K])``.
    """
    if num_clusters < 1 or num_clusters > num_clients:
        raise ConfigError(
            f"clustered_regression needs 1 <= num_clusters <= num_clients, got {num_clusters}"
        )
    if examples_per_client < 2:
        raise ConfigError(f"examples_per_client must be >= 2, got {examples_per_client}")
    big_d = dim + int(intercept)
    params = regression_clusters(
        key,
        num_clusters,
        dim=dim,
        intercept=intercept,
        x_mean_range=x_mean_range,
        x_std_range=x_std_range,
        theta_mean_range=theta_mean_range,
        theta_std_range=theta_std_range,
        theta_scale=theta_scale,
    )
    ks = jax.random.split(key, 8)  # ks[1..4] drew the cluster parameters
    cluster = jax.random.randint(ks[0], (num_clients,), 0, num_clusters)
    n = num_clients * examples_per_client
    client = jnp.repeat(jnp.arange(num_clients, dtype=jnp.int32), examples_per_client)
    j = cluster[client]
    x = params.x_mean[j] + params.x_std[j, None] * jax.random.normal(ks[5], (n, dim))
    if intercept:
        x = jnp.concatenate([x, jnp.ones((n, 1))], axis=1)
    theta = params.theta_mean[j] + params.theta_std[j, None] * jax.random.normal(ks[6], (n, big_d))
    y = jnp.sum(theta * x, axis=1)
    return (
        np.asarray(x, np.float32),
        np.asarray(y, np.float32),
        np.asarray(client, np.int32),
        np.asarray(cluster, np.int32),
    )
