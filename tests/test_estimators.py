"""Estimators of pi and lambda (CA-Fed section IV-B): exact counting against a NumPy
posterior, convergence on long chains, the error falling with more rounds, and the reference
code's bias."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import estimators as est
from fedjax_sel.availability import markov
from fedjax_sel.base import ConfigError


def _chains(pi, lam, t, seed=0):
    """bool[t, K] trajectories of independent stationary chains."""
    model = markov(pi=jnp.asarray(pi), lam=jnp.asarray(lam))
    state = model.init(jax.random.key(seed), len(pi))

    def body(s, key):
        a, s = model.step(s, key)
        return s, a

    _, traj = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), t))
    return traj


@jax.jit
def _run(traj):
    def body(c, a):
        return est.update_counts(c, a), None

    return jax.lax.scan(body, est.init_counts(traj.shape[1]), traj)[0]


@jax.jit
def _run_reference(traj):
    def body(c, a):
        return est.update_counts(c, a, estimator="reference"), None

    return jax.lax.scan(body, est.init_counts(traj.shape[1]), traj)[0]


def _numpy_posterior(x: np.ndarray, h: float, pi0: float, lam0: float):
    """Beta posterior means from a 0/1 sequence, written from the definitions."""
    t = len(x)
    pi_hat = (x.sum() + h * pi0) / (t + h)
    p11_0, p00_0 = pi0 + lam0 * (1 - pi0), 1 - pi0 + lam0 * pi0
    pairs = list(zip(x[:-1], x[1:], strict=True))
    from_on = sum(1 for a, _ in pairs if a)
    from_off = len(pairs) - from_on
    on_on = sum(1 for a, b in pairs if a and b)
    off_off = sum(1 for a, b in pairs if not a and not b)
    p11 = (on_on + h * p11_0) / (from_on + h)
    p00 = (off_off + h * p00_0) / (from_off + h)
    return pi_hat, p11 + p00 - 1


def test_bayes_estimates_equal_the_beta_posterior_means():
    rng = np.random.default_rng(0)
    x = rng.random((37, 6)) < np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.5])
    x[:, 5] = True  # never leaves the on state: p00 stays at its prior
    for h, pi0, lam0 in [(2.0, 0.5, 0.0), (10.0, 0.2, 0.6)]:
        pi_hat, lam_hat = est.estimate(
            _run(jnp.asarray(x)), prior_rounds=h, prior_pi=pi0, prior_lam=lam0
        )
        for k in range(6):
            want = _numpy_posterior(x[:, k], h, pi0, lam0)
            np.testing.assert_allclose([pi_hat[k], lam_hat[k]], want, rtol=1e-5, atol=1e-6)


def test_estimates_before_any_observation_are_the_prior():
    pi_hat, lam_hat = est.estimate(est.init_counts(3), prior_pi=0.3, prior_lam=0.4)
    np.testing.assert_allclose(pi_hat, 0.3, rtol=1e-6)
    np.testing.assert_allclose(lam_hat, 0.4, rtol=1e-6)


def test_bayes_estimators_converge_to_the_truth_on_long_chains():
    pi = np.array([0.1, 0.1, 0.5, 0.5, 0.9, 0.9, 0.3, 0.7])
    lam = np.array([0.9, 0.0, 0.9, -0.5, 0.9, 0.0, 0.5, 0.2])
    pi_hat, lam_hat = est.estimate(_run(_chains(pi, lam, 50000)))
    np.testing.assert_allclose(pi_hat, pi, atol=0.03)
    np.testing.assert_allclose(lam_hat, lam, atol=0.04)


def test_estimation_error_falls_with_more_rounds():
    # 400 clients of the paper's population; mean absolute errors after t observed rounds
    k = 400
    pi = np.where(np.arange(k) < k // 2, 0.9, 0.1)
    lam = np.where(np.arange(k) % 2 == 0, 0.9, 0.0)
    traj = _chains(pi, lam, 10000, seed=4)
    errors = []
    for t in (30, 300, 3000, 10000):
        pi_hat, lam_hat = est.estimate(_run(traj[:t]))
        errors.append((np.abs(pi_hat - pi).mean(), np.abs(lam_hat - lam).mean()))
    errors = np.array(errors)
    assert np.all(np.diff(errors[:, 0]) < 0) and np.all(np.diff(errors[:, 1]) < 0), errors
    assert errors[-1, 0] < 0.02 and errors[-1, 1] < 0.06, errors
    assert errors[0, 1] > 3 * errors[-1, 1]


def test_reference_estimator_is_biased_toward_minus_2_pi_1_minus_pi_1_minus_lambda():
    # reference/algorithms.md 1.3: lambda_hat -> -2 pi (1 - pi)(1 - lambda) whatever lambda
    pi = np.array([0.5, 0.1, 0.5])
    lam = np.array([0.9, 0.9, 0.0])
    counts = _run_reference(_chains(pi, lam, 50000, seed=2))
    _, lam_ref = est.estimate(counts, estimator="reference")
    np.testing.assert_allclose(lam_ref, -2 * pi * (1 - pi) * (1 - lam), atol=0.02)
    assert np.all(np.asarray(lam_ref) < 0.05)


def test_reference_first_round_counts_off_off_for_offline_clients():
    first = jnp.array([True, False])
    ref = est.update_counts(est.init_counts(2), first, estimator="reference")
    fixed = est.update_counts(est.init_counts(2), first)
    np.testing.assert_array_equal(ref.off_off, [0, 1])
    np.testing.assert_array_equal(fixed.off_off + fixed.from_on + fixed.from_off, [0, 0])


def test_bad_estimator_arguments():
    with pytest.raises(ConfigError, match="must be one of"):
        est.estimate(est.init_counts(2), estimator="mle")
    with pytest.raises(ConfigError, match="prior_rounds"):
        est.check_prior(0.0)


def test_estimation_error_curve_matches_estimates_on_prefixes():
    pi = np.array([0.9, 0.9, 0.1, 0.1, 0.5])
    lam = np.array([0.9, 0.0, 0.9, 0.0, 0.5])
    traj = _chains(pi, lam, 300, seed=7)
    checkpoints = (10, 100, 300)
    for estimator, run in (("bayes", _run), ("reference", _run_reference)):
        pi_mae, lam_mae = est.estimation_error_curve(
            traj, pi, lam, checkpoints, estimator=estimator
        )
        for i, t in enumerate(checkpoints):
            pi_hat, lam_hat = est.estimate(run(traj[:t]), estimator=estimator)
            np.testing.assert_allclose(pi_mae[i], np.abs(pi_hat - pi).mean(), rtol=1e-5)
            np.testing.assert_allclose(lam_mae[i], np.abs(lam_hat - lam).mean(), rtol=1e-5)
    with pytest.raises(ConfigError, match="checkpoints"):
        est.estimation_error_curve(traj, pi, lam, (0, 10))
