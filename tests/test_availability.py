"""The engine's availability models: always-on, Bernoulli, and the two-state Markov chain."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import (
    always,
    bernoulli,
    markov,
    markov_lambda_range,
    markov_transition,
)
from fedjax_sel.base import ConfigError
from fedjax_sel.registry import parse_spec


def _trajectory(model, k, t, seed=0):
    state = model.init(jax.random.key(seed), k)

    def body(s, key):
        a, s = model.step(s, key)
        return s, a

    _, traj = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), t))
    return np.asarray(traj)


def test_always_on():
    assert _trajectory(always(), 5, 3).all()


def test_bernoulli_frequencies_per_client():
    p = jnp.array([0.1, 0.5, 0.9])
    traj = _trajectory(bernoulli(p), 3, 20000)
    np.testing.assert_allclose(traj.mean(0), p, atol=0.015)


def test_markov_transition_matrix_has_stationary_pi_and_eigenvalue_lambda():
    pi, lam = 0.3, 0.6
    p11 = float(markov_transition(jnp.array(True), pi, lam))
    p01 = float(markov_transition(jnp.array(False), pi, lam))
    m = np.array([[1 - p01, p01], [1 - p11, p11]])
    eig = sorted(np.linalg.eigvals(m).real)
    np.testing.assert_allclose(eig, [lam, 1.0], atol=1e-6)
    stationary = np.array([1 - pi, pi])
    np.testing.assert_allclose(stationary @ m, stationary, atol=1e-6)


def test_markov_chain_availability_and_autocorrelation():
    pi = jnp.array([0.2, 0.5, 0.8, 0.5])
    lam = jnp.array([0.9, 0.0, 0.5, -0.5])
    traj = _trajectory(markov(pi=pi, lam=lam), 4, 60000).astype(float)
    np.testing.assert_allclose(traj.mean(0), pi, atol=0.03)
    for k in range(4):
        a = traj[:, k] - traj[:, k].mean()
        rho = (a[1:] * a[:-1]).mean() / a.var()
        assert abs(rho - float(lam[k])) < 0.03


def test_markov_lambda_range_is_enforced():
    lo, _ = markov_lambda_range(np.array([0.9]))
    np.testing.assert_allclose(lo, 1 - 1 / 0.9)  # max(1 - 1/pi, 1 - 1/(1 - pi))
    with pytest.raises(ConfigError, match="lam"):
        markov(pi=0.9, lam=-10.0)
    with pytest.raises(ConfigError, match="pi"):
        markov(pi=1.2, lam=0.0)
    with pytest.raises(ConfigError, match="p must lie"):
        bernoulli(0.0)


def test_parse_spec():
    assert parse_spec("markov:pi=0.5,lam=0.9", what="availability") == (
        "markov",
        [],
        {"pi": "0.5", "lam": "0.9"},
    )
    assert parse_spec("always", what="availability") == ("always", [], {})
    assert parse_spec("dirichlet:0.1,min_size=3", what="partition") == (
        "dirichlet",
        ["0.1"],
        {"min_size": "3"},
    )
    with pytest.raises(ConfigError, match="bare values come before"):
        parse_spec("dirichlet:alpha=0.1,3", what="partition")
    # availability models take no bare values: the registry names the problem
    from fedjax_sel.availability import from_spec

    with pytest.raises(ConfigError, match="takes 0 bare value"):
        from_spec("bernoulli:0.5")
    with pytest.raises(ConfigError, match="pi='abc' is not a valid"):
        from_spec("markov:pi=abc")
