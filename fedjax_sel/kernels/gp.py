"""FedCor's Gaussian process over clients (Tang et al., CVPR 2022; the reference code
``Yoruko-Tang/FedCor`` ``src/GPR.py``), as pure fixed-shape functions.

The prior of the clients' loss changes is ``N(mu, Sigma)`` with ``Sigma = X^T X + s^2 I``:
``X`` (float32[D, K]) holds learned client embeddings (the code's ``Poly_Kernel`` of order 1,
unnormalised) and ``s`` is the fixed noise. Two exact solvers:

* ``dense``: ``Sigma`` as a K x K matrix (the code): a Cholesky per likelihood, O(K^3), and a
  rank-1 downdate of Sigma per greedy pick, O(K^2).
* ``lowrank``: Sigma is rank D plus noise, so by Woodbury
  ``Sigma^-1 = s^-2 (I - X^T C^-1 X)`` with ``C = s^2 I_D + X X^T`` and
  ``log|Sigma| = (K - D) log s^2 + log|C|``: a likelihood costs O(K D^2 + S K D) for S
  samples. The greedy conditions the D-dimensional latent ``z`` of ``Delta L = X^T z + e``
  instead of Sigma (:func:`greedy_lowrank`): a pick costs O(K D) and nothing K x K exists.
  Same quantities in exact arithmetic (no approximation); float32 rounding differs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_sel.base import Array

_TINY = 1e-12


# ----------------------------------------------------------------------------- likelihood
def dense_covariance(x: Array, noise: Array) -> Array:
    """``Sigma = X^T X + noise^2 I`` (K x K)."""
    k = x.shape[1]
    return x.T @ x + jnp.square(noise) * jnp.eye(k, dtype=x.dtype)


def weighted_nll(
    x: Array, noise: Array, mu: Array, samples: Array, weights: Array, solver: str = "lowrank"
) -> Array:
    """``-sum_e weights_e log N(samples_e | mu, X^T X + noise^2 I)`` (the code's MML loss;
    ``samples``: float32[S, K], ``weights``: float32[S], 0 for empty buffer slots)."""
    d, k = x.shape
    r = samples - mu[None, :]
    s2 = jnp.square(noise)
    if solver == "dense":
        chol = jnp.linalg.cholesky(dense_covariance(x, noise))
        z = jax.scipy.linalg.solve_triangular(chol, r.T, lower=True)  # K x S
        quad = jnp.sum(jnp.square(z), axis=0)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    else:
        cap = s2 * jnp.eye(d, dtype=x.dtype) + x @ x.T
        chol = jnp.linalg.cholesky(cap)
        z = jax.scipy.linalg.solve_triangular(chol, x @ r.T, lower=True)  # D x S
        quad = (jnp.sum(jnp.square(r), axis=1) - jnp.sum(jnp.square(z), axis=0)) / s2
        logdet = (k - d) * jnp.log(s2) + 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
    per_sample = 0.5 * (quad + logdet + k * math.log(2.0 * math.pi))
    return jnp.sum(jnp.where(weights > 0, weights * per_sample, 0.0))


def weighted_mean(samples: Array, weights: Array) -> Array:
    """The code's ``MLE_Mean``: ``sum_e w_e y_e / sum_e w_e`` per client (every stored sample
    covers every client)."""
    total = jnp.sum(weights)
    return jnp.sum(weights[:, None] * samples, axis=0) / jnp.where(total > 0, total, 1.0)


def train_embeddings(
    x: Array,
    noise: Array,
    mu: Array,
    samples: Array,
    weights: Array,
    lr: Array,
    iterations: Array,
    solver: str = "lowrank",
) -> tuple[Array, Array]:
    """``iterations`` (may be traced) Adam steps on ``X`` from a fresh optimizer state (the
    code builds one per ``Train`` call); returns ``(X, the last loss)``."""
    opt = optax.adam(lr)
    grad = jax.value_and_grad(weighted_nll)

    def body(_, carry):
        x, state, _ = carry
        value, g = grad(x, noise, mu, samples, weights, solver)
        updates, state = opt.update(g, state, x)
        return optax.apply_updates(x, updates), state, value

    init = (x, opt.init(x), jnp.zeros((), x.dtype))
    x, _, value = jax.lax.fori_loop(0, iterations, body, init)
    return x, value


# ----------------------------------------------------------------------------- greedy selection
class Greedy(NamedTuple):
    """The greedy's picks (in order) and the conditioning it applied.

    Attributes:
      clients: int32[m], the picks.
      valid: bool[m], False once no eligible client is left.
      scores: float32[m], each pick's score.
      downdate: float32[D, D] (``lowrank``): ``P = Cov(z | picks)`` of the latent form
        (:func:`lowrank_posterior`); float32[K, K] (``dense``): ``Sigma_post`` itself.
    """

    clients: Array
    valid: Array
    scores: Array
    downdate: Array


def _pick(s, diag, beta, free):
    score = beta * s / jnp.sqrt(jnp.maximum(diag, _TINY))
    score = jnp.where(free, score, -jnp.inf)
    k = jnp.argmax(score)
    return k, score[k], jnp.any(free)


def greedy_lowrank(
    x: Array, noise: Array, weights: Array, beta: Array, eligible: Array, m: int
) -> Greedy:
    """FedCor's greedy (``Select_Clients``): ``m`` times, pick the eligible client ``k`` with
    the largest ``beta_k (sum_i w_i Sigma[i, k]) / sqrt(Sigma[k, k])`` and condition Sigma on
    it, ``Sigma <- Sigma - Sigma[:, k] Sigma[k, :] / Sigma[k, k]``; O(m K D), memory O(K D).

    Latent form of the same posterior: ``Delta L = X^T z + e`` with ``z ~ N(0, I_D)`` and
    independent noise ``e``, so after observing the picks ``S`` the covariance of two unpicked
    clients is ``x_i^T P x_k + s^2 [i = k]`` with ``P = Cov(z | S) = (I + X_S X_S^T / s^2)^-1``
    (a D x D matrix, one Sherman-Morrison downdate per pick), and a picked client's row is 0.
    Hence ``sum_i w_i Sigma[i, k] = a^T P x_k + s^2 w_k`` with ``a = sum_{i not in S} w_i x_i``
    and ``Sigma[k, k] = x_k^T P x_k + s^2``, both updated in O(K D) per pick. ``downdate``
    returns ``P``; :func:`lowrank_posterior` rebuilds the K x K matrix (tests)."""
    d, k_all = x.shape
    s2 = jnp.square(noise)
    idx = jnp.arange(k_all)

    def step(j, carry):
        p, a, diag, free, clients, valid, scores = carry
        s = (p @ a) @ x + s2 * weights
        k, score, ok = _pick(s, diag, beta, free)
        v = p @ x[:, k]
        c = s2 + x[:, k] @ v
        v = jnp.where(ok, v, 0.0)
        proj = v @ x  # x_i^T P x_k for every i
        return (
            p - jnp.outer(v, v) / c,
            a - jnp.where(ok, weights[k], 0.0) * x[:, k],
            diag - jnp.square(proj) / c,
            free & ((idx != k) | ~ok),
            clients.at[j].set(k.astype(jnp.int32)),
            valid.at[j].set(ok),
            scores.at[j].set(jnp.where(ok, score, 0.0)),
        )

    carry = (
        jnp.eye(d, dtype=x.dtype),
        x @ weights,
        jnp.sum(jnp.square(x), axis=0) + s2,
        eligible,
        jnp.zeros((m,), jnp.int32),
        jnp.zeros((m,), bool),
        jnp.zeros((m,), x.dtype),
    )
    p, _, _, _, clients, valid, scores = jax.lax.fori_loop(0, m, step, carry)
    return Greedy(clients, valid, scores, p)


def lowrank_posterior(x: Array, noise: Array, p: Array, picked: Array) -> Array:
    """The K x K posterior covariance of :func:`greedy_lowrank`'s ``P`` (``picked``: bool[K],
    whose rows and columns are 0)."""
    sigma = x.T @ p @ x + jnp.square(noise) * jnp.eye(x.shape[1], dtype=x.dtype)
    keep = ~picked
    return jnp.where(keep[:, None] & keep[None, :], sigma, 0.0)


def greedy_dense(sigma: Array, weights: Array, beta: Array, eligible: Array, m: int) -> Greedy:
    """The same greedy on an explicit K x K ``sigma`` (the code's rank-1 downdates); O(m K^2)."""
    idx = jnp.arange(sigma.shape[0])

    def step(j, carry):
        sig, free, clients, valid, scores = carry
        k, score, ok = _pick(weights @ sig, jnp.diagonal(sig), beta, free)
        col = sig[:, k]
        down = jnp.outer(col, col) / jnp.maximum(col[k], _TINY)
        return (
            jnp.where(ok, sig - down, sig),
            free & ((idx != k) | ~ok),
            clients.at[j].set(k.astype(jnp.int32)),
            valid.at[j].set(ok),
            scores.at[j].set(jnp.where(ok, score, 0.0)),
        )

    m_ = int(m)
    carry = (
        sigma,
        eligible,
        jnp.zeros((m_,), jnp.int32),
        jnp.zeros((m_,), bool),
        jnp.zeros((m_,), sigma.dtype),
    )
    sig, _, clients, valid, scores = jax.lax.fori_loop(0, m_, step, carry)
    return Greedy(clients, valid, scores, sig)
