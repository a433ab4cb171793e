"""Synthetic federated data sets, generated in JAX from a key (no files, no network).

* :func:`leaf_synthetic`: Synthetic(alpha, beta) of FedProx / LEAF (Li et al. 2020), the recipe
  of ``litian96/FedProx data/synthetic_1_1/generate_synthetic.py``.
* :func:`clustered_regression`: the clustered linear regression of FedCVR-Bolt (appendix C.3).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl, threefry2x32_p

from fedjax_sel.base import ConfigError, PRNGKey
from fedjax_sel.data.client_data import RowChunks
from fedjax_sel.input_checks import check_claimed_bytes


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

    The rows are made a chunk at a time (:func:`leaf_synthetic_rows`, which data sets assemble
    straight into their final layout); here they are written into host arrays.

    Returns:
      ``(x float32[N, dim], y int32[N], client int32[N])``, rows grouped by client.
    """
    pool, sizes = leaf_synthetic_rows(
        key,
        num_clients,
        alpha,
        beta,
        dim=dim,
        num_classes=num_classes,
        iid=iid,
        max_examples=max_examples,
        examples_per_client=examples_per_client,
        personal_scale=personal_scale,
        chunk_rows=chunk_rows,
    )
    n, rows = pool.num_rows, pool.chunk_rows
    x_out = np.empty((n, dim), np.float32)
    y_out = np.empty((n,), np.int32)
    for i in range(pool.num_chunks):
        x, y = pool.make(i)
        m = min(rows, n - i * rows)
        x_out[i * rows : i * rows + m] = np.asarray(x)[:m]
        y_out[i * rows : i * rows + m] = np.asarray(y)[:m]
    client = np.repeat(np.arange(num_clients, dtype=np.int32), sizes)
    return x_out, y_out, client


def leaf_synthetic_rows(
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
) -> tuple[RowChunks, np.ndarray]:
    """The rows of :func:`leaf_synthetic` (same arguments, the same values), made a chunk of
    ``chunk_rows`` rows at a time on the device, and the clients' sizes (rows are grouped by
    client, in client order).

    Nothing of size K x dim x C is held: the client parameters ``v_k, W_k, b_k`` are drawn for a
    block of clients at a time (the same values as whole-array draws: :func:`offset_normal`),
    the blocks the current chunk's clients fall in. A chunk of rows is one compiled program
    whatever K is; chunk ``i`` draws its examples from ``fold_in(key_8, i)``, so the values
    depend on ``chunk_rows`` (the default is the one every committed result used)."""
    if num_clients < 1:
        raise ConfigError(f"leaf_synthetic needs num_clients >= 1, got {num_clients}")
    if alpha < 0 or beta < 0:
        raise ConfigError(f"leaf_synthetic alpha and beta must be >= 0, got {alpha}, {beta}")
    if dim < 1 or num_classes < 2:
        raise ConfigError(
            f"leaf_synthetic needs dim >= 1 and num_classes >= 2, got {dim}, {num_classes}"
        )
    check_claimed_bytes(  # one client's draws at least: W (dim x classes), b, v and Sigma
        4 * dim * (num_classes + 3),
        f"leaf_synthetic with dim={dim} and num_classes={num_classes}",
    )
    if not iid and personal_scale is not None and not personal_scale >= 0:
        raise ConfigError(f"leaf_synthetic personal_scale must be >= 0, got {personal_scale}")
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):  # a raw uint32[2] key
        key = jax.random.wrap_key_data(key)
    ks = jax.random.split(key, 9)
    sizes = leaf_synthetic_sizes(ks[0], num_clients, max_examples, examples_per_client)
    u = alpha * jax.random.normal(ks[1], (num_clients,))
    big_b = beta * jax.random.normal(ks[2], (num_clients,))
    n = int(sizes.sum())
    rows = min(chunk_rows, max(n, 1))
    ends = np.cumsum(sizes)
    num_chunks = -(-n // rows)
    # the first and last client of every chunk; a block holds as many clients as the widest
    # chunk, so every chunk's clients lie in two consecutive blocks
    first = np.searchsorted(ends, np.arange(num_chunks) * rows, side="right")
    last = np.searchsorted(ends, np.minimum(np.arange(1, num_chunks + 1) * rows, n) - 1, "right")
    block = int(np.max(last - first, initial=0)) + 1 if n else num_clients
    num_blocks = -(-num_clients // block)
    span = min(2, num_blocks)
    shared = None
    if iid or personal_scale is not None:
        shared = (
            jax.random.normal(ks[3], (dim, num_classes)),
            jax.random.normal(ks[4], (num_classes,)),
        )
    zero_shift = jnp.zeros((block,), jnp.float32)
    whole = None  # every client's parameters at once, where blocks cannot be drawn alone
    if not iid and not _offset_draws(ks[5]):
        whole = [
            _add_shift(jax.random.normal(k, (num_clients, *shape)), shift)
            for k, shape, shift in [
                (ks[5], (dim,), big_b),
                (ks[6], (dim, num_classes), u),
                (ks[7], (num_classes,), u),
            ]
        ]

    def shifts(a, q):  # u or B of block q's clients (zeros past the last client)
        s = a[q * block : (q + 1) * block]
        return s if s.shape[0] == block else jnp.concatenate([s, zero_shift[s.shape[0] :]])

    if iid:  # every block's parameters: v = 0 and the shared W, b
        same = (
            jnp.zeros((block, dim)),
            jnp.broadcast_to(shared[0], (block, dim, num_classes)),
            jnp.broadcast_to(shared[1], (block, num_classes)),
        )

    def params(q):
        """``(v, W, b)`` of block ``q``: clients ``q * block ... (q + 1) * block - 1``."""
        if iid:
            return same
        start = q * block
        if whole is not None:
            v, w, b = (_rows_of(a, start, block) for a in whole)
        else:
            uq = shifts(u, q)
            v = _add_shift(offset_normal(ks[5], (block, dim), start), shifts(big_b, q))
            w = _add_shift(offset_normal(ks[6], (block, dim, num_classes), start), uq)
            b = _add_shift(offset_normal(ks[7], (block, num_classes), start), uq)
        if personal_scale is not None:
            w = _around_shared(w, shared[0], float(personal_scale))
            b = _around_shared(b, shared[1], float(personal_scale))
        return v, w, b

    sd = jnp.power(jnp.arange(1, dim + 1, dtype=jnp.float32), -0.6)  # sqrt of (j+1)^-1.2
    cache: dict[int, tuple] = {}

    def make(i: int):
        """Rows ``i * rows ... (i + 1) * rows - 1`` (past the last row: client 0's, padding)."""
        q0 = min(int(first[i]) // block, num_blocks - span)
        for q in [q for q in cache if q < q0]:
            del cache[q]
        for q in range(q0, q0 + span):
            if q not in cache:
                cache[q] = params(q)
        window = [cache[q] for q in range(q0, q0 + span)]
        v, w, b = (
            window[0] if span == 1 else [jnp.concatenate(p) for p in zip(*window, strict=True)]
        )
        c = np.searchsorted(ends, np.arange(i * rows, min((i + 1) * rows, n)), side="right")
        c = np.pad(c - q0 * block, (0, rows - len(c))).astype(np.int32)
        # rows are made by one compiled function that takes the client parameters as
        # arguments (closing over them would bake their values into the program)
        return _leaf_rows(jax.random.fold_in(ks[8], i), jnp.asarray(c), v, w, b, sd)

    pool = RowChunks(
        num_rows=n,
        chunk_rows=rows,
        make=make,
        x=jax.ShapeDtypeStruct((dim,), jnp.float32),
        y=jax.ShapeDtypeStruct((), jnp.int32),
    )
    return pool, sizes


def _offset_bits(key_data, bit_width, shape):
    """Threefry bits of elements ``start ... start + size - 1`` of a larger draw (``key_data``:
    the key's two words, then ``start``'s high and low words): element ``i`` of a draw of any
    shape hashes its row-major index ``i`` (``jax_threefry_partitionable``)."""
    if bit_width != 32:
        raise NotImplementedError("offset draws make 32-bit words only")
    hi, lo = _counters(key_data[2], key_data[3], math.prod(shape))
    b1, b2 = threefry2x32_p.bind(key_data[0], key_data[1], hi, lo)
    return (b1 ^ b2).reshape(shape)


def _counters(start_hi, start_lo, size: int):
    """The 64-bit counters ``start + [0, size)`` as (high, low) uint32 words (``size`` below
    2^32: at most one carry)."""
    lo = start_lo + lax.iota(np.uint32, size)
    return start_hi + (lo < start_lo).astype(np.uint32), lo


def _unused(*args, **kwargs):
    raise NotImplementedError("offset keys only draw")


_OFFSET_THREEFRY = define_prng_impl(
    key_shape=(4,),
    seed=_unused,
    split=_unused,
    random_bits=_offset_bits,
    fold_in=_unused,
    name="threefry2x32_offset",
)


def _offset_draws(key: PRNGKey) -> bool:
    """Whether :func:`offset_normal` can draw from ``key``: a threefry key, and the draws
    partitionable (the default; otherwise a draw's bits depend on its whole size)."""
    return bool(jax.config.jax_threefry_partitionable) and (
        str(jax.random.key_impl(key)) == "threefry2x32"
    )


def _rows_of(a: jax.Array, start: int, size: int) -> jax.Array:
    """Rows ``start ... start + size - 1`` of ``a``, zero-padded past its end."""
    part = a[start : start + size]
    pad = size - part.shape[0]
    return part if pad == 0 else jnp.concatenate([part, jnp.zeros((pad,) + a.shape[1:], a.dtype)])


def offset_normal(key: PRNGKey, shape: tuple[int, ...], start: int) -> jax.Array:
    """``jax.random.normal(key, (N, *shape[1:]))[start : start + shape[0]]`` for any N (rows
    past N too), without drawing the whole array: ``jax.random.normal`` itself, on threefry
    bits of the elements' own row-major indices (what the whole draw hashes)."""
    if not _offset_draws(key):
        raise ConfigError(
            "offset draws need a threefry2x32 key and jax_threefry_partitionable (the default)"
        )
    k = np.asarray(jax.random.key_data(key), np.uint32)
    first = int(start) * math.prod(shape[1:])
    data = np.array([k[0], k[1], first >> 32, first & 0xFFFFFFFF], np.uint32)
    return jax.random.normal(jax.random.wrap_key_data(data, impl=_OFFSET_THREEFRY), shape)


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
    if dim < 1:
        raise ConfigError(f"clustered_regression needs dim >= 1, got {dim}")
    check_claimed_bytes(  # x, y and their shuffled copies, before the generator allocates them
        8 * num_clients * examples_per_client * (dim + 2),
        f"regression data of {num_clients} clients x examples_per_client="
        f"{examples_per_client} x dim={dim}",
    )
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
