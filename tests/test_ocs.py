"""Optimal Client Sampling (Chen, Horvath, Richtarik 2022): the exact probabilities against a
NumPy transcription of the closed form (largest feasible l) and against water-filling by
bisection; AOCS against a transcription of the reference loop (``simple_fedavg_tff.py``, its
``break`` included); the strategy's cohort, weights ``w_i / p_i`` and pre-trained slots; the
unbiasedness of the importance-weighted aggregate and its variance, checked empirically; the
traced ``expected``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, ConfigError, RoundInputs, SimSpec, TrainResult
from fedjax_sel.kernels.ocs import (
    STOP_TOLERANCE,
    aocs_probabilities,
    estimator_variance,
    ocs_probabilities,
)
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.hyperparams import init_with_hyperparams


# ------------------------------------------------------------------------ NumPy transcriptions
def numpy_ocs(u: np.ndarray, m: float) -> np.ndarray:
    """The closed form: sort ascending, the largest l in 1..n with
    0 < m + l - n <= sum_{j<=l} u_(j) / u_(l); p_(i) = (m + l - n) u_(i) / sum_{j<=l} u_(j) for
    i <= l, 1 above (float64; all u > 0)."""
    n = len(u)
    order = np.argsort(u)
    us = u[order]
    best = None
    for ell in range(1, n + 1):
        room = m + ell - n
        if 0 < room <= us[:ell].sum() / us[ell - 1]:
            best = ell
    p_sorted = np.ones(n)
    p_sorted[:best] = (m + best - n) * us[:best] / us[:best].sum()
    p = np.empty(n)
    p[order] = p_sorted
    return p


def numpy_water_filling(u: np.ndarray, m: float) -> np.ndarray:
    """p = min(1, c u) with sum p = m, c by bisection."""
    lo, hi = 0.0, 1e12
    for _ in range(200):
        c = 0.5 * (lo + hi)
        lo, hi = (c, hi) if np.minimum(1, c * u).sum() < m else (lo, c)
    return np.minimum(1.0, hi * u)


def numpy_aocs(u: np.ndarray, m: float, j_max: int) -> tuple[np.ndarray, int]:
    """``simple_fedavg_tff.py``: scale, then up to j_max rescales, break after C <= 1 (+ the
    kernel's float32 tolerance: at the fixed point C = 1 exactly)."""
    n = len(u)
    p = np.minimum(1.0, u * m / u.sum())
    it = 0
    for _ in range(j_max):
        below = p < 1
        c = (m - n + below.sum()) / p[below].sum()
        p = np.minimum(1.0, p * c)
        it += 1
        if c <= 1 + STOP_TOLERANCE:
            break
    return p, it


def lognormal(seed, n, sigma=1.5):
    return np.random.default_rng(seed).lognormal(0.0, sigma, n)


# ----------------------------------------------------------------------------- probabilities
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("m", [1.0, 3.0, 7.5, 15.0])
def test_exact_probabilities_follow_the_closed_form(seed, m):
    n_c = 32
    u = lognormal(seed, n_c, sigma=1.0 + 0.5 * (seed % 3))
    valid = np.ones(n_c, bool)
    valid[-4:] = False  # an invalid tail (fewer available clients than slots)
    got = np.asarray(ocs_probabilities(jnp.asarray(u, jnp.float32), jnp.asarray(valid), m))
    want = numpy_ocs(u[valid], m)
    np.testing.assert_allclose(got[valid], want, rtol=2e-5, atol=2e-6)
    assert np.all(got[~valid] == 0)
    # the properties: sum m, capped at 1, the capped are the largest, proportional below the cap
    np.testing.assert_allclose(got.sum(), m, rtol=1e-5)
    assert got.max() <= 1.0
    np.testing.assert_allclose(got[valid], numpy_water_filling(u[valid], m), rtol=1e-4, atol=1e-6)
    capped = valid & (got >= 1.0)
    free = valid & ~capped
    if capped.any():
        assert u[capped].min() >= u[free].max()
    ratio = got[free] / u[free]
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-5)


def test_exact_probabilities_edge_cases():
    u = jnp.asarray([0.0, 2.0, 0.0, 1.0, 5.0], jnp.float32)
    valid = jnp.ones(5, bool)
    # fewer positive norms than m: every positive one sends, the zero updates never
    np.testing.assert_array_equal(np.asarray(ocs_probabilities(u, valid, 4.0)), [0, 1, 0, 1, 1])
    # m above the cohort is capped at its size
    p = np.asarray(ocs_probabilities(jnp.ones(5), jnp.array([1, 1, 0, 1, 0], bool), 4.0))
    np.testing.assert_allclose(p, [1, 1, 0, 1, 0])
    # equal norms: uniform m / n
    np.testing.assert_allclose(
        np.asarray(ocs_probabilities(jnp.ones(8), jnp.ones(8, bool), 3)), 3 / 8
    )


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("m, j_max", [(3.0, 4), (10.0, 4), (10.0, 1), (6.0, 0)])
def test_aocs_follows_the_reference_loop(seed, m, j_max):
    u = lognormal(seed, 32, sigma=2.0)
    p, it = aocs_probabilities(jnp.asarray(u, jnp.float32), jnp.ones(32, bool), m, j_max)
    want, want_it = numpy_aocs(u, m, j_max)
    np.testing.assert_allclose(np.asarray(p), want, rtol=2e-5, atol=1e-6)
    assert int(it) == want_it
    if want_it < j_max:  # it stopped on C <= 1: the exact optimum (to rounding)
        np.testing.assert_allclose(np.asarray(p), numpy_ocs(u, m), rtol=1e-4, atol=1e-6)


def test_aocs_guards():
    valid = jnp.array([1, 1, 1, 1, 0, 0], bool)
    p, _ = aocs_probabilities(jnp.zeros(6), valid, 2.0, 4)  # sum u = 0: uniform m / n
    np.testing.assert_allclose(np.asarray(p), [0.5] * 4 + [0, 0])
    p, _ = aocs_probabilities(jnp.ones(6), valid, 9.0, 4)  # everybody capped: P = 0, no NaN
    np.testing.assert_allclose(np.asarray(p), [1, 1, 1, 1, 0, 0])


def test_optimal_variance_is_below_uniform_sampling():
    u = jnp.asarray(lognormal(3, 32, 1.5), jnp.float32)
    valid = jnp.ones(32, bool)
    v_ocs = float(estimator_variance(ocs_probabilities(u, valid, 3.0), u, valid))
    v_aocs = float(estimator_variance(aocs_probabilities(u, valid, 3.0, 4)[0], u, valid))
    v_uniform = float(estimator_variance(jnp.full(32, 3 / 32), u, valid))
    assert v_ocs <= v_aocs * (1 + 1e-5) and v_ocs < 0.8 * v_uniform


# ------------------------------------------------------------------------------- the strategy
K, D = 12, 3


def planted(seed=0):
    rng = np.random.default_rng(seed)
    updates = rng.normal(size=(K, D)) * rng.lognormal(0, 1.2, (K, 1))
    sizes = rng.integers(5, 80, K)
    return updates.astype(np.float32), sizes


def oracle(updates):
    ups = jnp.asarray(updates)

    def train(params, clients, key, active=None):
        del key
        active = jnp.ones(clients.shape, bool) if active is None else active
        w = params["w"][None] + jnp.where(active[:, None], ups[clients], 0.0)
        z = jnp.zeros(clients.shape, jnp.float32)
        return TrainResult({"w": w}, z, z, z, active.astype(jnp.int32))

    return ClientOracle(None, None, None, train, jax.random.key(3))


def select_many(strategy, updates, sizes, available, keys, state=None):
    params = {"w": jnp.ones(D)}
    if state is None:
        spec = SimSpec(K, K, 5, jnp.asarray(sizes), params)  # ocs reads nothing of it
        state = strategy.init(jax.random.key(0), spec)
    inputs = RoundInputs(jnp.int32(0), jnp.asarray(available), params, jnp.asarray(sizes))
    fn = jax.jit(jax.vmap(lambda k: strategy.select(state, inputs, oracle(updates), k)[0]))
    return fn(keys)


@pytest.mark.parametrize("name", ["ocs", "aocs"])
def test_slots_are_the_trained_cohort_and_senders_weigh_w_over_p(name):
    updates, sizes = planted()
    available = np.ones(K, bool)
    available[[2, 7]] = False
    n_c, m = 8, 3.0
    strategy = make_strategy(name, n_c, expected=m)
    sel = select_many(strategy, updates, sizes, available, jax.random.split(jax.random.key(0), 4))
    for r in range(4):
        cohort = np.asarray(sel.clients[r])
        assert len(set(cohort)) == n_c and available[cohort].all()
        trained = np.asarray(sel.train_result.params["w"][r])
        np.testing.assert_allclose(trained, 1.0 + updates[cohort], rtol=1e-6)
        w = sizes[cohort] / sizes[cohort].sum()
        u = w * np.linalg.norm(updates[cohort], axis=1)
        p = numpy_ocs(u, m) if name == "ocs" else numpy_aocs(u, m, 4)[0]
        mask = np.asarray(sel.mask[r])
        np.testing.assert_allclose(np.asarray(sel.weights[r])[mask], (w / p)[mask], rtol=1e-4)
        assert np.all(np.asarray(sel.weights[r])[~mask] == 0)
        assert float(sel.diagnostics["expected_senders"][r]) == pytest.approx(m, rel=1e-4)


@pytest.mark.parametrize("name", ["ocs", "aocs"])
def test_importance_weighted_aggregate_is_unbiased(name):
    """Over many Bernoulli draws, ``sum_slots weight * U`` averages the full-cohort update
    ``sum_i w_i U_i``, with the variance ``sum_i (1 - p_i) / p_i ||w_i U_i||^2``."""
    updates, sizes = planted(1)
    rounds = 20000
    strategy = make_strategy(name, K, expected=3.0)  # the cohort is every client
    sel = select_many(
        strategy, updates, sizes, np.ones(K, bool), jax.random.split(jax.random.key(1), rounds)
    )
    clients = np.asarray(sel.clients)
    weights = np.where(np.asarray(sel.mask), np.asarray(sel.weights), 0.0)
    agg = np.einsum("rs,rsd->rd", weights, updates[clients])
    full = (sizes / sizes.sum()) @ updates
    se = agg.std(axis=0) / np.sqrt(rounds)
    assert np.all(np.abs(agg.mean(axis=0) - full) < 5 * se)
    senders = np.asarray(sel.mask).sum(axis=1)
    assert senders.mean() == pytest.approx(3.0, abs=0.05)
    want_var = float(np.mean(np.asarray(sel.diagnostics["estimator_variance"])))
    got_var = float(np.sum((agg - full) ** 2, axis=1).mean())
    assert got_var == pytest.approx(want_var, rel=0.08)


def test_expected_is_traced_and_checked():
    updates, sizes = planted(2)
    keys = jax.random.split(jax.random.key(4), 3)
    built_2 = make_strategy("ocs", 8, expected=2.0)
    built_5 = make_strategy("ocs", 8, expected=5.0)
    assert built_2.hyperparams == (("expected", 2.0),)
    spec = SimSpec(K, 8, 5, jnp.asarray(sizes), {"w": jnp.ones(D)})
    switched = init_with_hyperparams(built_2, jax.random.key(0), spec, {"expected": 5.0})
    a = select_many(built_2, updates, sizes, np.ones(K, bool), keys, state=switched)
    b = select_many(built_5, updates, sizes, np.ones(K, bool), keys)
    np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(b.mask))
    np.testing.assert_allclose(np.asarray(a.weights), np.asarray(b.weights))
    with pytest.raises(ConfigError):
        make_strategy("ocs", 4, expected=5.0)
    with pytest.raises(ConfigError):
        make_strategy("aocs", 4, j_max=-1)
