"""FedCor (Tang et al., CVPR 2022): the GP's likelihood, posterior and greedy selection against
a NumPy transcription of the reference code (``Yoruko-Tang/FedCor`` ``src/GPR.py``:
``Log_Marginal_Likelihood``, ``Posteriori``, ``Select_Clients``, ``MLE_Mean``), a planted
two-block case with a known answer, both solvers (low-rank Woodbury and dense K x K), and the
warm-up / GP-round schedule with its ring buffer and annealing through the strategy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, RoundFeedback, RoundInputs, SimSpec, TrainResult
from fedjax_sel.kernels import gp, uniform_without_replacement
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.fedcor import buffer_slots


# ----------------------------------------------------------------------------- NumPy references
def np_cov(x, noise):
    return x.T @ x + noise**2 * np.eye(x.shape[1])


def np_select_clients(sigma, number, weights, discount, available=None):
    """``GPR.Select_Clients`` (epsilon 0, not dynamic): the score sums over the remaining
    clients; only available ones may be picked (ours; the code has no availability)."""
    k = sigma.shape[0]
    remain = list(range(k))
    chosen = []
    for _ in range(number):
        cand = [c for c in remain if available is None or available[c]]
        if not cand:
            break
        sub = sigma[np.ix_(remain, remain)]
        total = (
            (weights[remain][:, None] * sub).sum(axis=0) * discount[remain] / np.sqrt(np.diag(sub))
        )
        total = np.where([c in cand for c in remain], total, -np.inf)
        idx = remain[int(np.argmax(total))]
        sigma = sigma - np.outer(sigma[:, idx], sigma[idx, :]) / sigma[idx, idx]
        chosen.append(idx)
        remain.remove(idx)
    return chosen, sigma


def np_posterior(cov, idx):
    """``GPR.Posteriori``'s covariance: ``Cov - Cov[:, S] Cov[S, S]^-1 Cov[S, :]``."""
    inv = np.linalg.inv(cov[np.ix_(idx, idx)])
    return cov - cov[:, idx] @ inv @ cov[idx, :]


def np_nll(x, noise, mu, samples, weights):
    """``-sum_e w_e MultivariateNormal(mu, Cov).log_prob(y_e)``."""
    cov = np_cov(x, noise)
    k = cov.shape[0]
    _, logdet = np.linalg.slogdet(cov)
    out = 0.0
    for y, w in zip(samples, weights, strict=True):
        r = y - mu
        out += w * 0.5 * (r @ np.linalg.solve(cov, r) + logdet + k * np.log(2 * np.pi))
    return out


# ----------------------------------------------------------------------------- kernels
def random_gp(seed, d=4, k=20):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(d, k)) / np.sqrt(d)
    w = rng.integers(5, 60, k).astype(float)
    return x, w / w.sum(), rng.uniform(0.5, 1.0, k), rng


@pytest.mark.parametrize("noise", [0.3, 0.01])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_and_posterior_match_the_reference(seed, noise):
    x, w, beta, rng = random_gp(seed)
    available = rng.random(20) < 0.8
    m = 6
    want, _ = np_select_clients(np_cov(x, noise), m, w, beta, available)
    args = (jnp.asarray(w, jnp.float32), jnp.asarray(beta, jnp.float32), jnp.asarray(available))
    xj = jnp.asarray(x, jnp.float32)
    low = gp.greedy_lowrank(xj, jnp.float32(noise), *args, m)
    dense = gp.greedy_dense(gp.dense_covariance(xj, jnp.float32(noise)), *args, m)
    for g in (low, dense):
        assert np.asarray(g.clients)[np.asarray(g.valid)].tolist() == want
    if noise == 0.3:  # the conditioned covariance (float32 is loose for sigma_n = 0.01)
        post = np_posterior(np_cov(x, noise), want)
        picked = np.zeros(20, bool)
        picked[want] = True
        low_post = gp.lowrank_posterior(xj, jnp.float32(noise), low.downdate, picked)
        np.testing.assert_allclose(low_post, post, atol=2e-5)
        np.testing.assert_allclose(np.asarray(dense.downdate), post, atol=2e-5)


def test_greedy_leaves_slots_empty_when_few_are_available():
    x, w, beta, _ = random_gp(1)
    available = np.zeros(20, bool)
    available[[3, 11]] = True
    g = gp.greedy_lowrank(jnp.asarray(x), 0.1, jnp.asarray(w), jnp.asarray(beta), available, 5)
    assert np.asarray(g.valid).tolist() == [True, True, False, False, False]
    assert set(np.asarray(g.clients)[:2].tolist()) == {3, 11}


def test_planted_blocks_second_pick_from_the_other_block():
    """Two perfectly correlated blocks: clients 0-5 load on one embedding axis, 6-11 on the
    other; block A carries more weight. The first pick is the argmax of
    ``beta (w^T Sigma) / sqrt(diag Sigma)`` (A's largest loading); conditioning on it explains
    all of A, so the second pick must come from B (without conditioning it would be A's
    second)."""
    a = np.array([1.0, 1.2, 0.9, 1.1, 0.95, 1.05])
    b = np.array([0.5, 0.6, 0.55, 0.45, 0.52, 0.58])
    x = np.zeros((2, 12))
    x[0, :6], x[1, 6:] = a, b
    w = np.full(12, 1 / 12)
    beta = np.ones(12)
    noise = 0.01
    cov = np_cov(x, noise)
    first = int(np.argmax(beta * (w @ cov) / np.sqrt(np.diag(cov))))
    assert first == 1
    for g in (
        gp.greedy_lowrank(
            jnp.asarray(x), noise, jnp.asarray(w), jnp.asarray(beta), np.ones(12, bool), 3
        ),
        gp.greedy_dense(
            jnp.asarray(cov, jnp.float32), jnp.asarray(w), jnp.asarray(beta), np.ones(12, bool), 3
        ),
    ):
        picks = np.asarray(g.clients).tolist()
        assert picks[0] == first and picks[1] in range(6, 12)
        assert picks[1] == 7  # B's largest loading
    # annealing: a discounted first choice hands the first pick to block B
    beta2 = beta.copy()
    beta2[:6] = 0.3
    g = gp.greedy_lowrank(
        jnp.asarray(x), noise, jnp.asarray(w), jnp.asarray(beta2), np.ones(12, bool), 2
    )
    assert np.asarray(g.clients)[0] == 7


@pytest.mark.parametrize("solver", ["lowrank", "dense"])
def test_likelihood_matches_the_reference(solver):
    x, _, _, rng = random_gp(3, d=3, k=15)
    samples = rng.normal(scale=0.1, size=(5, 15))
    mu = rng.normal(scale=0.02, size=15)
    weights = np.array([0.8**4, 0.8**3, 0.0, 0.8, 1.0])  # one empty slot
    for noise in (0.3, 0.05):
        got = gp.weighted_nll(
            jnp.asarray(x),
            noise,
            jnp.asarray(mu),
            jnp.asarray(samples),
            jnp.asarray(weights),
            solver,
        )
        want = np_nll(x, noise, mu, samples, weights)
        assert float(got) == pytest.approx(want, rel=2e-4)


def test_solvers_agree_on_gradients_and_training_fits_the_data():
    """The Woodbury and dense likelihoods give the same gradient; Adam on X raises the
    likelihood of loss changes drawn from a planted low-rank GP (checked in NumPy)."""
    rng = np.random.default_rng(5)
    k, d = 16, 3
    true_x = rng.normal(size=(d, k))
    samples = rng.multivariate_normal(np.zeros(k), np_cov(true_x, 0.1), size=8) * 0.1
    weights = 0.9 ** np.arange(8)[::-1]
    x0 = rng.normal(size=(d, k)) / np.sqrt(d)
    args = (
        jnp.asarray(x0),
        jnp.float32(0.05),
        jnp.zeros(k),
        jnp.asarray(samples),
        jnp.asarray(weights),
    )
    g_low = jax.grad(gp.weighted_nll)(*args, "lowrank")
    g_dense = jax.grad(gp.weighted_nll)(*args, "dense")
    np.testing.assert_allclose(g_low, g_dense, rtol=2e-3, atol=1e-2)
    x1, nll = gp.train_embeddings(*args, jnp.float32(0.01), jnp.int32(200), "lowrank")
    before = np_nll(x0, 0.05, np.zeros(k), samples, weights)
    after = np_nll(np.asarray(x1, np.float64), 0.05, np.zeros(k), samples, weights)
    assert after < before - 0.1 * abs(before)
    assert float(nll) == pytest.approx(
        np_nll(np.asarray(x1), 0.05, np.zeros(k), samples, weights), rel=0.05
    )


def test_weighted_mean_is_mle_mean():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(4, 6))
    w = np.array([0.0, 0.25, 0.5, 1.0])
    np.testing.assert_allclose(
        gp.weighted_mean(jnp.asarray(y), jnp.asarray(w)), (w @ y) / w.sum(), rtol=1e-5
    )


# ----------------------------------------------------------------------------- the schedule
K, M_PICK = 10, 3


def theta(t):
    return {"w": jnp.asarray([1.0 + 0.1 * t, 0.05 * t * t], jnp.float32)}


def np_losses(params):
    w = np.asarray(params["w"], np.float64)
    i = np.arange(K)
    return w[0] * (i + 1) * 0.1 + np.sin(i) * w[1]


def fake_oracle():
    def all_losses(params):
        i = jnp.arange(K, dtype=jnp.float32)
        return params["w"][0] * (i + 1) * 0.1 + jnp.sin(i) * params["w"][1]

    def train(params, clients, key, active=None):
        step = (clients.astype(jnp.float32) + 1.0)[:, None] * jnp.asarray([0.01, 0.02])
        p = params["w"][None] + step
        zero = jnp.zeros(clients.shape)
        return TrainResult({"w": p}, zero, zero, zero, jnp.ones(clients.shape, jnp.int32))

    return ClientOracle(None, None, all_losses, train, jax.random.key(0))


def test_schedule_buffer_annealing_and_selection():
    """warmup = 2, Delta t = 2, M = 4: rounds 0-2 random with every client's loss change stored
    after each; training once at the last warm-up round (update_mean); greedy from round 3; GP
    rounds 4, 6, 8 (extra random round from theta_{t+1}, stored L(temp) - L(theta_{t+1}),
    retraining, beta reset), beta discounted after rounds 3, 5, 7, 9; the ring buffer of
    buffer_slots(2, 2, 4) = 5 slots overwrites its oldest; the window keeps rounds >= newest - 4."""
    gamma, discount = 0.8, 0.5
    strategy = make_strategy(
        "fedcor",
        M_PICK,
        warmup=2,
        gpr_interval=2,
        group_size=4,
        gamma=gamma,
        discount=discount,
        dimension=3,
        final_iterations=4,
        gp_iterations=3,
    )
    n = jnp.asarray(np.arange(5, 5 + K), jnp.int32)
    w = np.arange(5, 5 + K) / np.arange(5, 5 + K).sum()
    spec = SimSpec(K, M_PICK, 20, n, theta(0), 10, None)
    state = strategy.init(jax.random.key(0), spec)
    oracle = fake_oracle()
    available = np.ones(K, bool)
    available[[2, 7]] = False
    select = jax.jit(lambda s, i, k: strategy.select(s, i, oracle, k))
    update = jax.jit(strategy.update)
    stored = {}  # stamp -> loss-change vector
    for t in range(11):
        key = jax.random.key(100 + t)
        before = state
        inputs = RoundInputs(jnp.int32(t), jnp.asarray(available), theta(t), n)
        sel, state = select(state, inputs, key)
        d = {k: int(v) for k, v in sel.diagnostics.items() if k != "fedcor_nll"}
        prev = t - 1
        warm, gp_round = 1 <= t <= 3, prev > 2 and prev % 2 == 0
        assert d["fedcor_eval_passes"] == (t == 0 or warm) + 2 * gp_round
        assert d["fedcor_extra_trainings"] == (M_PICK if gp_round else 0)
        assert d["fedcor_gp_iterations"] == (4 if prev == 2 else 3 if gp_round else 0)
        if warm:
            stored[prev] = np_losses(theta(t)) - np_losses(theta(t - 1))
        if gp_round:
            k_extra, _ = jax.random.split(key)
            extra, ok = uniform_without_replacement(k_extra, jnp.asarray(available), M_PICK)
            extra = np.asarray(extra)[np.asarray(ok)]
            temp = np.asarray(theta(t)["w"], np.float64) + np.mean(
                (extra[:, None] + 1.0) * np.array([0.01, 0.02]), axis=0
            )
            stored[prev] = np_losses({"w": temp}) - np_losses(theta(t))
        # the buffer holds exactly the stored vectors of the last 5 writes
        stamps = np.asarray(state.inner.stamps)
        live = sorted(stored)[-5:]
        assert sorted(s for s in stamps.tolist() if s >= 0) == live
        for s in live:
            row = np.asarray(state.inner.samples)[stamps.tolist().index(s)]
            np.testing.assert_allclose(row, stored[s], rtol=1e-4, atol=1e-6)
        if d["fedcor_gp_iterations"]:
            newest = max(live)
            ww = np.array([gamma ** (newest - s) if s >= newest - 4 else 0.0 for s in live])
            y = np.array([stored[s] for s in live])
            np.testing.assert_allclose(state.inner.mu, ww @ y / ww.sum(), rtol=1e-4, atol=1e-6)
            # the training raised the discounted likelihood of the window
            mu = np.asarray(state.inner.mu)
            nll0 = np_nll(np.asarray(before.inner.embedding), 0.01, mu, y, ww)
            nll1 = np_nll(np.asarray(state.inner.embedding), 0.01, mu, y, ww)
            assert nll1 < nll0
        clients, mask = np.asarray(sel.clients), np.asarray(sel.mask)
        assert mask.sum() == M_PICK and available[clients].all()
        assert len(set(clients.tolist())) == M_PICK
        if t > 2:  # the greedy on the state's GP and discounts
            x = np.asarray(state.inner.embedding, np.float64)
            want, _ = np_select_clients(
                np_cov(x, 0.01), M_PICK, w, np.asarray(state.inner.beta), available
            )
            assert clients.tolist() == want
        assert d["fedcor_greedy"] == (t > 2)
        feedback = RoundFeedback(
            jnp.int32(t), jnp.asarray(available), theta(t), theta(t + 1), None,
            *(jnp.zeros(M_PICK),) * 4, n[sel.clients], jnp.ones(M_PICK, jnp.int32), sel.mask,
        )  # fmt: skip
        beta_before = np.asarray(state.inner.beta)
        state = update(state, sel, feedback)
        beta = np.asarray(state.inner.beta)
        if t > 2 and t % 2 == 0:
            np.testing.assert_array_equal(beta, 1.0)
        elif t > 2:
            expect = beta_before.copy()
            expect[clients] *= discount
            np.testing.assert_allclose(beta, expect)
        else:
            np.testing.assert_array_equal(beta, 1.0)
    assert buffer_slots(2, 2, 4) == 5


def test_simulation_runs_both_phases():
    """A short digits run through warm-up, greedy and GP rounds (real oracle: all-client
    losses, the extra round's training)."""
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.models import make_model
    from fedjax_sel.training import HParams, LocalConfig

    ds = load_dataset("digits", num_clients=16, partition="dirichlet:0.3", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy("fedcor", 4, warmup=2, gpr_interval=2, dimension=4, final_iterations=50),
        local=LocalConfig(batch_size=16, local_steps=2),
        per_round=4,
    )
    sim = Simulation(spec, ds, num_rounds=8, chunk_size=8)
    hparams = HParams.of(0.1)
    state, logs = sim.run_rounds(sim.init(seed=0, hparams=hparams), 8)
    diag = logs.diagnostics
    assert diag["fedcor_greedy"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert diag["fedcor_eval_passes"].tolist() == [1, 1, 1, 1, 0, 2, 0, 2]
    assert np.all(np.isfinite(diag["fedcor_nll"]))
    assert np.all(logs.num_selected == 4)
    # two seeds vmapped together (members_cond's branches): seed 0 as alone
    _, batch = sim.run_rounds_batch(sim.init_batch([0, 1], hparams=hparams), None, 8)
    np.testing.assert_array_equal(batch.clients[0], logs.clients)
    np.testing.assert_allclose(batch.diagnostics["fedcor_nll"][0], diag["fedcor_nll"], rtol=1e-4)


def test_traced_discount_acts():
    """``discount`` is traced: a strategy built with 0.5 and initialised at 0.9 anneals by 0.9."""
    from fedjax_sel.base import Selection
    from fedjax_sel.strategies.hyperparams import init_with_hyperparams

    strategy = make_strategy("fedcor", 2, warmup=0, gpr_interval=5, dimension=2, discount=0.5)
    assert set(dict(strategy.hyperparams)) == {"gamma", "discount", "noise", "lr"}
    n = jnp.full((K,), 10, jnp.int32)
    state = init_with_hyperparams(
        strategy, jax.random.key(0), SimSpec(K, 2, 10, n, theta(0), 10, None), {"discount": 0.9}
    )
    sel = Selection(jnp.asarray([1, 4], jnp.int32), jnp.ones(2, bool), jnp.full(2, 0.5))
    feedback = RoundFeedback(
        jnp.int32(1), jnp.ones(K, bool), theta(1), theta(2), None,
        *(jnp.zeros(2),) * 4, n[:2], jnp.ones(2, jnp.int32), sel.mask,
    )  # fmt: skip
    beta = np.asarray(strategy.update(state, sel, feedback).inner.beta)
    np.testing.assert_allclose(beta[[1, 4]], 0.9)
    assert np.all(np.delete(beta, [1, 4]) == 1.0)


# ----------------------------------------------------------------------------- candidate pool
@pytest.mark.parametrize("solver", ["lowrank", "dense"])
@pytest.mark.parametrize("noise", [0.3, 0.01])
@pytest.mark.parametrize("seed", range(3))
def test_pooled_greedy_matches_numpy(seed, noise, solver):
    """:func:`pooled_greedy` against the NumPy ``Select_Clients`` with only the pool's clients
    eligible and the score's weighted sum over every remaining client (the pooled rule): same
    picks, all of them pooled and available; a pool that covers every available client gives
    the exact greedy's picks."""
    from fedjax_sel.strategies.fedcor import pooled_greedy

    x, w, beta, rng = random_gp(seed, k=30)
    available = rng.random(30) < 0.7
    m, pool = 5, 9
    args = (jnp.asarray(x, jnp.float32), jnp.float32(noise))
    rest = (jnp.asarray(w, jnp.float32), jnp.asarray(beta, jnp.float32), jnp.asarray(available))
    cov = np_cov(x, noise)
    for i in range(4):
        clients, valid, members, ok = map(
            np.asarray,
            pooled_greedy(jax.random.key(i), *args, *rest, m, pool, solver),
        )
        pooled = members[ok]
        assert len(set(pooled.tolist())) == len(pooled) == pool and available[pooled].all()
        in_pool = np.isin(np.arange(30), pooled)
        want, _ = np_select_clients(cov, m, w, beta, in_pool)
        assert valid.all() and clients.tolist() == want
    # the pool holds every available client (pool < K): the exact greedy's picks
    everyone = int(available.sum())
    clients, valid, _, ok = pooled_greedy(jax.random.key(9), *args, *rest, m, everyone + 2, solver)
    want, _ = np_select_clients(cov, m, w, beta, available)
    assert np.asarray(ok).sum() == everyone
    assert np.asarray(clients).tolist() == want and np.asarray(valid).all()


def run_schedule(strategy, rounds, available):
    """``rounds`` rounds of ``strategy`` on the scripted oracle (K = 10): per round the key,
    the state before the selection, and the selection."""
    n = jnp.asarray(np.arange(5, 5 + K), jnp.int32)
    state = strategy.init(jax.random.key(0), SimSpec(K, M_PICK, 20, n, theta(0), 10, None))
    oracle = fake_oracle()
    select = jax.jit(lambda s, i, k: strategy.select(s, i, oracle, k))
    out = []
    for t in range(rounds):
        key = jax.random.key(100 + t)
        inputs = RoundInputs(jnp.int32(t), jnp.asarray(available), theta(t), n)
        sel, after = select(state, inputs, key)
        out.append((key, after, sel))
        feedback = RoundFeedback(
            jnp.int32(t), jnp.asarray(available), theta(t), theta(t + 1), None,
            *(jnp.zeros(M_PICK),) * 4, n[sel.clients], jnp.ones(M_PICK, jnp.int32), sel.mask,
        )  # fmt: skip
        state = strategy.update(after, sel, feedback)
    return out


def test_pool_through_the_strategy():
    """``pool >= K`` is the exact rule bit for bit (selections and states over 8 rounds of
    warm-up, greedy and GP rounds); with ``pool = 5`` a greedy round picks the NumPy greedy's
    choice among the pool drawn with the round's warm-up key (available clients only), and
    warm-up rounds are unchanged."""
    available = np.ones(K, bool)
    available[[2, 7]] = False
    common = dict(warmup=2, gpr_interval=2, group_size=4, dimension=3, final_iterations=4)
    common.update(gp_iterations=3)
    exact = run_schedule(make_strategy("fedcor", M_PICK, **common), 8, available)
    for pool in (K, 3 * K):
        got = run_schedule(make_strategy("fedcor", M_PICK, pool=pool, **common), 8, available)
        for (_, s0, a), (_, s1, b) in zip(exact, got, strict=True):
            for x, y in zip(jax.tree.leaves((s0, a)), jax.tree.leaves((s1, b)), strict=True):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    pooled = run_schedule(make_strategy("fedcor", M_PICK, pool=5, **common), 8, available)
    w = np.arange(5, 5 + K) / np.arange(5, 5 + K).sum()
    differs = 0
    for t, ((key, state, sel), (_, _, ref)) in enumerate(zip(pooled, exact, strict=True)):
        clients = np.asarray(sel.clients)
        assert np.asarray(sel.mask).all() and available[clients].all()
        if t <= 2:  # warm-up: the same uniform draw
            np.testing.assert_array_equal(clients, np.asarray(ref.clients))
            continue
        _, k_warm = jax.random.split(key)
        members, ok = uniform_without_replacement(k_warm, jnp.asarray(available), 5)
        in_pool = np.zeros(K, bool)
        in_pool[np.asarray(members)[np.asarray(ok)]] = True
        assert in_pool.sum() == 5 and available[in_pool].all() and in_pool[clients].all()
        x = np.asarray(state.inner.embedding, np.float64)
        beta = np.asarray(state.inner.beta)
        want, _ = np_select_clients(np_cov(x, 0.01), M_PICK, w, beta, in_pool)
        assert clients.tolist() == want
        differs += clients.tolist() != np.asarray(ref.clients).tolist()
    assert differs  # the pool acted


def test_pool_must_hold_a_round():
    from fedjax_sel.base import ConfigError

    with pytest.raises(ConfigError, match="pool must be 0 or >= per_round"):
        make_strategy("fedcor", 5, pool=4)
