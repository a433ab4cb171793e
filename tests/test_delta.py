"""DELTA (fedjax_sel.strategies.delta) against a NumPy transcription of the ICLR-2023 text's
practical algorithm (section 4) and its eq. (6) aggregation: the law update, a planted
diversity case, the with-replacement draw, the sigma^ estimate and the unbiasedness of the
importance-weighted aggregate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, RoundFeedback, RoundInputs, Selection, TrainResult
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.delta import DeltaState, distinct_draws

K, M = 12, 5


def np_update(p, clients, mask, deltas, sigma_sq, a1, a2, floor):
    """Section 4: s_i = sqrt(a1 |D_i - mean_S D|^2 + a2 sigma_i^2) over the participants S;
    p_i <- s_i / sum_S s * (1 - sum_{j not in S} p_j) on S, unchanged elsewhere; then our floor
    at floor / K and a renormalisation."""
    p = np.asarray(p, np.float64).copy()
    s_idx = np.asarray(clients)[np.asarray(mask)]
    d = np.asarray(deltas, np.float64)[np.asarray(mask)]
    zeta_sq = np.sum((d - d.mean(axis=0)) ** 2, axis=1)
    s = np.sqrt(a1 * zeta_sq + a2 * np.asarray(sigma_sq, np.float64)[np.asarray(mask)])
    outside = np.ones(len(p), bool)
    outside[s_idx] = False
    p[s_idx] = s / s.sum() * (1.0 - p[outside].sum())
    p = np.maximum(p, floor / len(p))
    return p / p.sum()


def feedback_for(selection, deltas, n):
    m = selection.clients.shape[0]
    z = jnp.zeros((m,), jnp.float32)
    return RoundFeedback(
        round=jnp.int32(0),
        available=jnp.ones((K,), bool),
        params=None,
        new_params=None,
        deltas=deltas,
        train_loss=z,
        initial_loss=z,
        loss_sq=z,
        update_norm=z,
        num_examples=jnp.where(selection.mask, n[selection.clients], 0),
        num_steps=jnp.ones((m,), jnp.int32),
    )


def test_law_update_matches_numpy_transcription():
    """Three rounds of the update on a random law: the participants' mass is redistributed by
    their scores, a client outside the rounds keeps its probability exactly, sum p = 1."""
    rng = np.random.default_rng(0)
    a1, a2, floor = 0.7, 0.3, 1e-3
    strategy = make_strategy("delta", M, alpha1=a1, alpha2=a2, floor=floor)
    p = rng.dirichlet(np.ones(K))
    state = DeltaState(jnp.asarray(p, jnp.float32), jnp.zeros((M,), jnp.float32))
    n = jnp.asarray(rng.integers(5, 50, K), jnp.int32)
    update = jax.jit(strategy.update)
    for _ in range(3):
        clients = rng.choice(K - 1, M, replace=False)  # client K - 1 never takes part
        mask = np.array([True, True, True, False, True])
        w = rng.normal(size=(M, 3, 2)) * rng.uniform(0.1, 3.0, (M, 1, 1))
        b = rng.normal(size=(M, 2))
        sigma_sq = rng.uniform(0.0, 2.0, M)
        sel = Selection(jnp.asarray(clients, jnp.int32), jnp.asarray(mask), jnp.zeros(M))
        deltas = {"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)}
        state = state._replace(sigma_sq=jnp.asarray(sigma_sq, jnp.float32))
        flat = np.concatenate([w.reshape(M, -1), b], axis=1)
        want = np_update(p, clients, mask, flat, sigma_sq, a1, a2, floor)
        state = update(state, sel, feedback_for(sel, deltas, n)).inner
        got = np.asarray(state.p)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(got.sum(), 1.0, rtol=1e-6)
        np.testing.assert_allclose(got[K - 1], want[K - 1], rtol=1e-6)
        p = want


def test_planted_diversity_gets_proportional_probability():
    """Four participants of a uniform law with updates +-e1, +-10 e2 (mean 0, so zeta = 1, 1,
    10, 10) and no variance term: the diverse pair gets 10 times the probability of the other,
    the participants keep their total mass, the rest stay at 1/K. Then equal diversity and
    planted sigma: p proportional to sqrt(a1 zeta^2 + a2 sigma^2)."""
    strategy = make_strategy("delta", 4, sigma="none", floor=0.0)
    state = strategy.init(jax.random.key(0), _spec(4))
    clients = jnp.array([0, 1, 2, 3], jnp.int32)
    sel = Selection(clients, jnp.ones(4, bool), jnp.zeros(4))
    d = jnp.array([[1.0, 0], [-1.0, 0], [0, 10.0], [0, -10.0]])
    n = jnp.full((K,), 10, jnp.int32)
    p = np.asarray(strategy.update(state, sel, feedback_for(sel, {"w": d}, n)).inner.p)
    np.testing.assert_allclose(p[2] / p[0], 10.0, rtol=1e-5)
    np.testing.assert_allclose(p[:4].sum(), 4.0 / K, rtol=1e-5)
    np.testing.assert_allclose(p[4:], 1.0 / K, rtol=1e-6)

    # equal diversity (zeta = 1 each), sigma^2 = 0, 3, 15: s = sqrt(a1 + a2 sigma^2)
    a1, a2 = 0.8, 0.2
    strategy = make_strategy("delta", 4, alpha1=a1, alpha2=a2, floor=0.0)
    state = strategy.init(jax.random.key(0), _spec(4)).inner  # runs at the values built with
    sigma_sq = jnp.array([0.0, 0.0, 3.0, 15.0])
    d = jnp.array([[1.0, 0], [-1.0, 0], [0, 1.0], [0, -1.0]])
    state = state._replace(sigma_sq=sigma_sq)
    p = np.asarray(strategy.update(state, sel, feedback_for(sel, {"w": d}, n)).inner.p)
    s = np.sqrt(a1 + a2 * np.asarray(sigma_sq))
    np.testing.assert_allclose(p[:4], s / s.sum() * 4.0 / K, rtol=1e-5)


def _spec(m, n=None):
    from fedjax_sel.base import SimSpec

    n = jnp.full((K,), 10, jnp.int32) if n is None else n
    return SimSpec(K, m, 10, n, {"w": jnp.zeros((2,))})


def test_distinct_draws_follow_the_law():
    """m draws with replacement from q as slots of distinct clients: the counts sum to m, the
    valid slots are distinct, and the mean count of each client is m q_i."""
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.ones(K) * 0.7)
    q[3] = 0.0
    q /= q.sum()
    keys = jax.random.split(jax.random.key(2), 20000)
    clients, first, counts = jax.jit(jax.vmap(lambda k: distinct_draws(k, jnp.asarray(q), M)))(keys)
    clients, first, counts = map(np.asarray, (clients, first, counts))
    np.testing.assert_array_equal(np.sum(np.where(first, counts, 0), axis=1), M)
    for c, f in zip(clients[:200], first[:200], strict=True):
        assert len(set(c[f].tolist())) == f.sum()
    mean_count = np.zeros(K)
    np.add.at(mean_count, clients[first], counts[first])
    mean_count /= len(keys)
    se = np.sqrt(M * q * (1 - q) / len(keys))
    assert np.all(np.abs(mean_count - M * q) <= 5 * se + 1e-9)
    assert mean_count[3] == 0


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_importance_weighted_aggregate_is_unbiased(weighting):
    """Eq. (6) weights c_i lambda_i / (m q_i) on a skewed law with 9 of 12 clients available:
    the mean of sum_slots w D_client over many draws is the objective's sum_{i in A} lambda_i
    D_i (within 4 standard errors), and the weights sum to one on average."""
    rng = np.random.default_rng(3)
    n = jnp.asarray(rng.integers(5, 80, K), jnp.int32)
    p = rng.dirichlet(np.ones(K) * 0.5) + 0.01
    p /= p.sum()
    avail = np.ones(K, bool)
    avail[[1, 5, 8]] = False
    d = rng.normal(size=(K, 4)) * 3 + rng.normal(size=4)
    strategy = make_strategy("delta", M, sigma="none", weighting=weighting)
    state = DeltaState(jnp.asarray(p, jnp.float32), jnp.zeros((M,), jnp.float32))
    inputs = RoundInputs(jnp.int32(0), jnp.asarray(avail), None, n)

    def estimate(key):
        sel, _ = strategy.select(state, inputs, None, key)
        return (
            jnp.sum(sel.weights[:, None] * jnp.asarray(d, jnp.float32)[sel.clients], axis=0),
            jnp.sum(sel.weights),
            sel.mask,
            sel.clients,
        )

    keys = jax.random.split(jax.random.key(4), 40000)
    est, wsum, mask, clients = map(np.asarray, jax.jit(jax.vmap(estimate))(keys))
    assert avail[clients[mask]].all()
    lam = np.where(avail, np.asarray(n, np.float64) if weighting == "size" else 1.0, 0.0)
    lam /= lam.sum()
    target = lam @ d
    se = est.std(axis=0) / np.sqrt(len(keys))
    assert np.all(np.abs(est.mean(axis=0) - target) <= 4 * se), (est.mean(axis=0), target, se)
    assert abs(wsum.mean() - 1.0) <= 4 * wsum.std() / np.sqrt(len(keys))


def test_sigma_is_half_the_squared_gap_of_two_independent_runs():
    """``sigma="retrain"``: select trains the slots twice (the round's key and an independent
    one), returns the first run as the round's training and keeps |D1 - D2|^2 / 2 per slot,
    which the update then scores with."""
    params = {"w": jnp.zeros((3,))}

    def train(p, clients, key, active=None):
        noise = jax.vmap(lambda c: jax.random.normal(jax.random.fold_in(key, c), (3,)))(clients)
        new = {"w": p["w"][None] + jnp.where(active[:, None], noise, 0.0)}
        z = jnp.zeros(clients.shape)
        return TrainResult(new, z, z, z, jnp.ones(clients.shape, jnp.int32))

    train_key = jax.random.key(9)
    oracle = ClientOracle(None, None, None, train, train_key)
    strategy = make_strategy("delta", M)
    state = strategy.init(jax.random.key(0), _spec(M))
    inputs = RoundInputs(jnp.int32(0), jnp.ones((K,), bool), params, jnp.full((K,), 10))
    sel, state = jax.jit(lambda s, x, k: strategy.select(s, x, oracle, k))(
        state, inputs, jax.random.key(5)
    )
    run1 = train(params, sel.clients, train_key, sel.mask)
    run2 = train(params, sel.clients, jax.random.fold_in(train_key, 1), sel.mask)
    np.testing.assert_allclose(sel.train_result.params["w"], run1.params["w"], rtol=1e-5)
    gap = np.asarray(run1.params["w"] - run2.params["w"], np.float64)
    want = np.where(np.asarray(sel.mask), 0.5 * np.sum(gap**2, axis=1), 0.0)
    np.testing.assert_allclose(np.asarray(state.inner.sigma_sq), want, rtol=1e-5)
    assert np.all(want[np.asarray(sel.mask)] > 0)


def test_traced_values_run_as_built():
    """A strategy built with the defaults and initialised at other alpha1 / alpha2 / floor
    (``init_with_hyperparams``, a grid member) selects and updates exactly as one built with
    them, and the values act."""
    from fedjax_sel.strategies.hyperparams import init_with_hyperparams

    rng = np.random.default_rng(5)
    n = jnp.asarray(rng.integers(5, 50, K), jnp.int32)
    d = jnp.asarray(rng.normal(size=(K, 3)), jnp.float32)
    other = {"alpha1": 0.1, "alpha2": 0.9, "floor": 0.05}
    built = make_strategy("delta", M, sigma="none")
    target = make_strategy("delta", M, sigma="none", **other)

    def run(strategy, state):
        def step(state, key):
            inputs = RoundInputs(jnp.int32(0), jnp.ones((K,), bool), None, n)
            sel, state = strategy.select(state, inputs, None, key)
            state = strategy.update(state, sel, feedback_for(sel, {"w": d[sel.clients]}, n))
            return state, (sel.clients, sel.weights)

        return jax.jit(lambda s: jax.lax.scan(step, s, jax.random.split(jax.random.key(1), 4)))(
            state
        )

    switched = init_with_hyperparams(built, jax.random.key(0), _spec(M), other)
    a = run(built, switched)
    b = run(target, target.init(jax.random.key(0), _spec(M)))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    default = run(built, built.init(jax.random.key(0), _spec(M)))
    assert not np.array_equal(np.asarray(default[0].inner.p), np.asarray(a[0].inner.p))
