"""Power iteration with Hessian-vector products against dense NumPy Hessians."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.kernels.smoothness import hessian_spectral_norm, hvp, power_iteration
from fedjax_sel.models import make_model


def test_power_iteration_finds_the_largest_eigenvalue_of_a_quadratic():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    eig = np.array([5.0, 3.0] + list(np.linspace(0.1, 2.0, 10)))
    a = (q * eig) @ q.T
    a_j = jnp.asarray(a, jnp.float32)

    def loss(p):
        return 0.5 * p["x"] @ a_j @ p["x"]

    est = float(hessian_spectral_norm(loss, {"x": jnp.zeros(12)}, jax.random.key(0), 60))
    np.testing.assert_allclose(est, 5.0, rtol=1e-3)


def test_power_iteration_returns_the_largest_magnitude_for_indefinite_maps():
    a = jnp.diag(jnp.array([1.0, -4.0, 2.0]))
    lam, v = power_iteration(lambda x: a @ x, jnp.array([1.0, 1.0, 1.0]), 80)
    np.testing.assert_allclose(float(lam), 4.0, rtol=1e-4)
    np.testing.assert_allclose(np.abs(np.asarray(v)), [0, 1, 0], atol=1e-3)


def test_hvp_matches_a_dense_hessian():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(5, 5))
    a = a + a.T
    a_j = jnp.asarray(a, jnp.float32)

    def loss(x):
        return 0.5 * x @ a_j @ x + jnp.sum(x**4) / 4

    x = jnp.asarray(rng.normal(size=5), jnp.float32)
    v = jnp.asarray(rng.normal(size=5), jnp.float32)
    dense = a + np.diag(3 * np.asarray(x) ** 2)
    np.testing.assert_allclose(np.asarray(hvp(loss, x, v)), dense @ np.asarray(v), rtol=1e-4)


def numpy_softmax_ce_hessian(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dense Hessian of the mean softmax cross-entropy of ``x @ w + b`` w.r.t. the parameters
    ``[vec(w) (row-major, d x C), b]``: (1/n) sum_i (diag(p_i) - p_i p_i^T) kron (u_i u_i^T)
    arranged for u_i = [x_i, 1]."""
    n, d = x.shape
    c = w.shape[1]
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    u = np.concatenate([x, np.ones((n, 1))], 1)  # feature d = the bias
    h = np.zeros(((d + 1) * c, (d + 1) * c))
    for i in range(n):
        s = np.diag(p[i]) - np.outer(p[i], p[i])
        h += np.kron(np.outer(u[i], u[i]), s)  # index (feature j, class k) -> j * c + k
    return h / n


def test_smoothness_of_logistic_regression_matches_the_dense_hessian():
    rng = np.random.default_rng(2)
    n, d, c = 40, 4, 3
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.integers(0, c, n)
    model = make_model("logreg", input_shape=(d,), num_classes=c)
    params = model.init(jax.random.key(3))
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)

    def loss(p):
        return jnp.mean(model.loss(model.apply(p, jnp.asarray(x)), jnp.asarray(y)))

    want = np.linalg.eigvalsh(numpy_softmax_ce_hessian(x.astype(np.float64), w, b)).max()
    est = float(hessian_spectral_norm(loss, params, jax.random.key(4), 200))
    np.testing.assert_allclose(est, want, rtol=2e-3)
