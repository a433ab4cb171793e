"""Simplex projection and projected gradient descent against NumPy references and closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.kernels.simplex import (
    minimize_quadratic_cubic,
    project_simplex,
    projected_gradient_descent,
    quadratic_lipschitz,
)


def numpy_projection(v: np.ndarray, radius: float = 1.0) -> np.ndarray:
    """Independent reference: bisection on the threshold theta of sum(max(v - theta, 0)) = z."""
    lo, hi = v.min() - radius, v.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(v - mid, 0).sum() > radius:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - 0.5 * (lo + hi), 0)


@pytest.mark.parametrize("m", [1, 2, 7, 50])
def test_projection_matches_numpy_reference_and_lies_on_simplex(m):
    rng = np.random.default_rng(m)
    v = rng.normal(scale=2.0, size=(20, m)).astype(np.float32)
    got = np.asarray(jax.jit(project_simplex)(jnp.asarray(v)))
    want = np.stack([numpy_projection(row.astype(np.float64)) for row in v])
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert (got >= 0).all()
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)


def test_projection_is_the_nearest_simplex_point():
    """Variational inequality of a Euclidean projection: (v - p) . (q - p) <= 0 for every q in
    the simplex; checked on the vertices (enough, by linearity)."""
    rng = np.random.default_rng(1)
    v = rng.normal(size=12).astype(np.float32)
    p = np.asarray(project_simplex(jnp.asarray(v)))
    for i in range(12):
        q = np.eye(12)[i]
        assert np.dot(v - p, q - p) <= 1e-5


def test_projection_keeps_points_already_on_the_simplex_and_respects_radius():
    a = np.array([0.2, 0.0, 0.5, 0.3], np.float32)
    np.testing.assert_allclose(np.asarray(project_simplex(jnp.asarray(a))), a, atol=1e-6)
    v = np.array([3.0, -1.0, 0.5], np.float32)
    got = np.asarray(project_simplex(jnp.asarray(v), radius=2.0))
    np.testing.assert_allclose(got, numpy_projection(v.astype(np.float64), 2.0), atol=1e-5)


def test_masked_projection_is_the_projection_onto_the_face():
    rng = np.random.default_rng(2)
    v = rng.normal(size=9).astype(np.float32)
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 1, 0], bool)
    got = np.asarray(project_simplex(jnp.asarray(v), jnp.asarray(mask)))
    assert (got[~mask] == 0).all()
    np.testing.assert_allclose(got[mask], numpy_projection(v[mask].astype(np.float64)), atol=2e-6)
    empty = np.asarray(project_simplex(jnp.asarray(v), jnp.zeros(9, bool)))
    assert (empty == 0).all()


def test_pgd_reaches_the_closed_form_minimiser_of_a_diagonal_quadratic():
    """min sum_i h_i a_i^2 on the simplex: a_i = (1/h_i) / sum_j (1/h_j) (inverse-variance
    weighting), the variance-only case of the SP-CACW bound."""
    h = np.array([0.5, 1.0, 2.0, 4.0, 8.0], np.float32)
    want = (1 / h) / np.sum(1 / h)
    for momentum in (True, False):
        got = minimize_quadratic_cubic(
            jnp.diag(jnp.asarray(h)), 0.0, jnp.full(5, 0.2), 500, momentum=momentum
        )
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


def test_pgd_on_a_general_quadratic_with_cubic_term_satisfies_kkt():
    """At the minimiser of a^T H a + lam sum a^3 on the simplex the gradient is constant on
    the support and no smaller off it (KKT); also checked against the minimum over a fine
    grid of the 3-simplex."""
    rng = np.random.default_rng(3)
    b = rng.normal(size=(3, 4)).astype(np.float32)
    h = b @ b.T + np.diag([0.3, 0.1, 0.2]).astype(np.float32)
    lam = 0.5
    a = np.asarray(minimize_quadratic_cubic(jnp.asarray(h), lam, jnp.full(3, 1 / 3), 2000))
    grad = 2 * h @ a + 3 * lam * a**2
    on = a > 1e-4
    assert np.ptp(grad[on]) < 1e-3
    assert (grad[~on] >= grad[on].min() - 1e-3).all()
    grid = np.linspace(0, 1, 201)
    best = np.inf
    for x in grid:
        y = grid[grid <= 1 - x + 1e-12]
        pts = np.stack([np.full_like(y, x), y, 1 - x - y], 1)
        vals = np.einsum("ni,ij,nj->n", pts, h, pts) + lam * np.sum(pts**3, 1)
        best = min(best, vals.min())
    value = a @ h @ a + lam * np.sum(a**3)
    assert value <= best + 1e-5


def test_pgd_puts_exactly_zero_weight_on_a_harmful_coordinate():
    """Bias rows b = (0, 0), (1, 0), (3, 0) and unit variances (H = B B^T + I): on the support
    {0, 1} the minimiser is (2/3, 1/3) with gradient 4/3, and coordinate 2's gradient there,
    2 b_2 . (B a) = 2, is larger, so the harmful coordinate gets exactly zero weight (the
    paper's "zero weight on harmful peers"; it needs a bias aligned with the mixture's)."""
    bias = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], np.float32)
    h = bias @ bias.T + np.eye(3, dtype=np.float32)
    a = np.asarray(minimize_quadratic_cubic(jnp.asarray(h), 0.0, jnp.full(3, 1 / 3), 500))
    assert a[2] == 0.0
    np.testing.assert_allclose(a, [2 / 3, 1 / 3, 0.0], atol=1e-4)


def test_generic_pgd_minimises_a_linear_function_at_a_vertex():
    c = jnp.array([0.3, -0.2, 0.1, 0.5])
    got = projected_gradient_descent(lambda a: c, jnp.full(4, 0.25), 0.1, 100)
    np.testing.assert_allclose(np.asarray(got), [0, 1, 0, 0], atol=1e-6)


def test_lipschitz_bound_dominates_the_largest_eigenvalue():
    rng = np.random.default_rng(4)
    b = rng.normal(size=(6, 6)).astype(np.float32)
    h = b @ b.T
    bound = float(quadratic_lipschitz(jnp.asarray(h), 0.0))
    assert bound >= 2 * np.linalg.eigvalsh(h).max() - 1e-4
