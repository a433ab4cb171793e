"""SP-CACW: the bound and weight rules against NumPy, the personalized simulator against closed
forms and exact references, and the planted two-cluster behaviour."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import from_client_arrays
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.experiment.personalized import run_method
from fedjax_sel.models import make_model
from fedjax_sel.personalized import (
    PersonalizedConfig,
    PersonalizedSimulation,
    summary_row,
)
from fedjax_sel.personalized import weighting as wt


def planted_regression(
    num_clients=8, n_train=10, n_test=200, dim=5, noise=1.0, seed=0, n_override=None
) -> FederatedDataset:
    """Two planted clusters of linear regression clients, y = x . w_c + noise, w_1 = -w_0;
    clients alternate clusters (even ids: cluster 0)."""
    rng = np.random.default_rng(seed)
    w0 = 3.0 * rng.normal(size=dim)
    ws = np.stack([w0, -w0])
    cluster = np.arange(num_clients) % 2
    xs, ys, txs, tys = [], [], [], []
    for k in range(num_clients):
        n = n_train if n_override is None else n_override[k]
        x = rng.normal(size=(n + n_test, dim)).astype(np.float32)
        y = (x @ ws[cluster[k]] + noise * rng.normal(size=n + n_test)).astype(np.float32)
        xs.append(x[:n])
        ys.append(y[:n])
        txs.append(x[n:])
        tys.append(y[n:])
    train = from_client_arrays(xs, ys)
    test = from_client_arrays(txs, tys)
    return FederatedDataset(
        name="planted",
        train=train,
        test=test,
        test_x=jnp.asarray(np.concatenate(txs)),
        test_y=jnp.asarray(np.concatenate(tys)),
        task="regression",
        num_classes=None,
        input_shape=(dim,),
        default_model="linreg",
        info={"cluster": cluster.tolist(), "num_clusters": 2},
    )


def linreg(dim=5):
    return make_model("linreg", input_shape=(dim,), num_classes=None)


# ------------------------------------------------------------------------------ weighting
def test_bound_matrix_and_value_match_numpy():
    rng = np.random.default_rng(0)
    bias = rng.normal(size=(6, 11)).astype(np.float32)
    bias[2] = 0
    v = rng.uniform(0.1, 2, 6).astype(np.float32)
    alpha = rng.dirichlet(np.ones(6)).astype(np.float32)
    c_b, lr_l = 1.7, 0.3
    h = np.asarray(wt.bound_matrix(jnp.asarray(bias), jnp.asarray(v), c_b, lr_l))
    want = c_b * bias @ bias.T + lr_l * np.diag(v)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)
    val = float(wt.bound_value(jnp.asarray(alpha), jnp.asarray(bias), jnp.asarray(v), c_b, lr_l))
    np.testing.assert_allclose(val, alpha @ want @ alpha, rtol=1e-5)


def test_bound_coefficients_of_both_variants():
    a, c = wt.bound_coefficients("descent", jnp.float32(0.2))
    assert float(a) == 1.0 and float(c) == 1.0
    a, c = wt.bound_coefficients("appendix_d", jnp.float32(0.2))
    np.testing.assert_allclose([float(a), float(c)], [0.6, 1.4], rtol=1e-6)
    with pytest.raises(ConfigError, match="bound"):
        wt.bound_coefficients("tight", jnp.float32(0.2))


def test_peer_variances_match_the_bernoulli_aggregate_variance_by_simulation():
    """Var(sum_i a_i z_i / p_i g_i) = sum_i a_i^2 v_i with v_i = sigma_i^2 + (1/p_i - 1)
    E||g_i||^2 (appendix E): Monte Carlo with Gaussian g_i."""
    rng = np.random.default_rng(1)
    m, d, n = 4, 3, 400_000
    mean = rng.normal(size=(m, d))
    sigma = np.array([0.5, 1.0, 0.2, 0.8])
    p = np.array([1.0, 0.5, 0.3, 0.7])
    a = np.array([0.4, 0.3, 0.2, 0.1])
    g = mean[None] + sigma[None, :, None] * rng.normal(size=(n, m, d)) / np.sqrt(d)
    z = rng.uniform(size=(n, m)) < p
    agg = np.einsum("m,nm,nmd->nd", a / p, z, g)
    emp = np.mean(np.sum((agg - agg.mean(0)) ** 2, 1))
    v = wt.peer_variances(
        jnp.asarray(sigma**2), jnp.asarray(np.sum(mean**2, 1) + sigma**2), jnp.asarray(p)
    )
    np.testing.assert_allclose(emp, float(np.sum(a**2 * np.asarray(v))), rtol=0.01)


def test_ema_noise_gram_matches_simulated_emas():
    """E[b_hat_i . b_hat_j] - b_i . b_j of EMAs of g_i - g_0 with Gaussian noise."""
    rng = np.random.default_rng(2)
    m, d, steps, reps, beta = 3, 2, 6, 100_000, 0.3
    sig = np.array([0.7, 1.0, 0.5])  # per-step gradient noise std (total over d)
    noise = sig[None, None, :, None] * rng.normal(size=(reps, steps, m, d)) / np.sqrt(d)
    diff = noise - noise[:, :, :1]  # target = row 0; true bias 0
    ema = diff[:, 0]
    for t in range(1, steps):
        ema = (1 - beta) * ema + beta * diff[:, t]
    emp = np.einsum("rid,rjd->ij", ema, ema) / reps
    got = wt.ema_noise_gram(jnp.asarray(sig**2), jnp.full(m, steps, jnp.int32), beta, jnp.int32(0))
    np.testing.assert_allclose(np.asarray(got), emp, atol=0.01)


def test_debiased_bound_matrix_is_psd_and_removes_pure_noise():
    bias = jnp.asarray(np.random.default_rng(3).normal(size=(4, 6)), jnp.float32)
    noise = bias @ bias.T  # everything is noise
    h = np.asarray(wt.bound_matrix(bias, jnp.ones(4), 1.0, 0.5, noise))
    np.testing.assert_allclose(h, 0.5 * np.eye(4), atol=1e-4)


def test_ftal_step_accumulates_hazan_surrogate():
    rng = np.random.default_rng(4)
    b = rng.normal(size=(3, 5))
    h = b @ b.T + np.eye(3)
    alpha = np.array([0.5, 0.3, 0.2])
    lam = 0.1
    quad, lin, beta = wt.ftal_step(
        jnp.zeros((3, 3)), jnp.zeros(3), jnp.asarray(h), jnp.float32(lam), jnp.asarray(alpha)
    )
    g = 2 * h @ alpha + 3 * lam * alpha**2
    g_bound = 2 * np.linalg.norm(h, axis=0).max() + 3 * lam
    want_beta = 0.5 * min(1 / (4 * g_bound * np.sqrt(2)), 1 / (2 * np.diag(h).max()))
    np.testing.assert_allclose(float(beta), want_beta, rtol=1e-5)
    # the surrogate a^T quad a + lin . a equals grad . a + beta/2 (grad . (a - alpha))^2 + const
    a = np.array([0.1, 0.6, 0.3])
    sur = a @ np.asarray(quad) @ a + np.asarray(lin) @ a
    ref = g @ a + 0.5 * want_beta * (g @ (a - alpha)) ** 2
    const = 0.5 * want_beta * (g @ alpha) ** 2
    np.testing.assert_allclose(sur + const, ref, rtol=1e-4)


def test_ftal_step_imputes_unobserved_coordinates_pessimistically():
    """With a mask, an unobserved peer's gradient coordinate (0 from its zero row of H) is
    replaced by the largest observed coordinate before it enters the FTAL sums."""
    rng = np.random.default_rng(5)
    b = rng.normal(size=(4, 6))
    b[2] = 0.0  # peer 2 never observed: zero bias row, zero variance
    h = b @ b.T + np.diag([0.5, 0.7, 0.0, 0.4])
    alpha, lam = np.full(4, 0.25), 0.05
    mask = np.array([True, True, False, True])
    quad, lin, beta = wt.ftal_step(
        jnp.zeros((4, 4)), jnp.zeros(4), jnp.asarray(h), jnp.float32(lam), jnp.asarray(alpha),
        jnp.asarray(mask),
    )  # fmt: skip
    g = 2 * h @ alpha + 3 * lam * alpha**2
    g[2] = g[mask].max()
    np.testing.assert_allclose(np.asarray(quad), 0.5 * float(beta) * np.outer(g, g), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(lin), g - float(beta) * g * (g @ alpha), rtol=1e-5)


def test_similarity_and_cluster_weights():
    g = jnp.asarray([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [0.0, 2.0]])
    w = np.asarray(wt.similarity_weights(g, jnp.int32(0)))
    cos = np.array([1.0, 1 / np.sqrt(2), 0.0, 0.0])
    np.testing.assert_allclose(w, cos / cos.sum(), rtol=1e-6)
    c = np.asarray(wt.cluster_weights(jnp.asarray([0, 1, 0, 0]), jnp.int32(0)))
    np.testing.assert_allclose(c, [1 / 3, 0, 1 / 3, 1 / 3], rtol=1e-6)


# ----------------------------------------------------------------------- the simulation
def one_example_clients():
    """Four linreg clients holding ONE example each: every minibatch draw is that example,
    so the stochastic gradients are exact and one step has a closed form."""
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=(1, 3)).astype(np.float32) for _ in range(4)]
    ys = [rng.normal(size=1).astype(np.float32) for _ in range(4)]
    ds = FederatedDataset(
        "one", from_client_arrays(xs, ys), from_client_arrays(xs, ys), jnp.zeros((1, 3)),
        jnp.zeros(1), "regression", None, (3,), "linreg", {"cluster": [0, 0, 1, 1]},
    )  # fmt: skip
    return ds, np.concatenate(xs), np.concatenate(ys)


def test_one_step_is_the_weighted_gradient_step_and_the_bias_ema_starts_exact():
    ds, x, y = one_example_clients()
    model = linreg(3)
    cfg = PersonalizedConfig(method="oracle", lr=0.1, batch_size=4, update_every=1)
    sim = PersonalizedSimulation(ds, model, cfg)
    state = sim.init(0)
    w0 = np.asarray(state.targets.params[0])
    state, _ = sim.run_epochs(state, 1)
    grads = 2 * (x @ w0 - y)[:, None] * x  # per client, the model's squared error
    for t, cl in enumerate([0, 0, 1, 1]):
        alpha = np.array([1, 1, 0, 0] if cl == 0 else [0, 0, 1, 1]) / 2
        np.testing.assert_allclose(
            np.asarray(state.targets.params[t]), w0 - 0.1 * alpha @ grads, rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            np.asarray(state.targets.bias[t]), grads - grads[t], rtol=1e-5, atol=1e-6
        )
    # one example per client: the two half-batch gradients agree, so zero variance
    np.testing.assert_allclose(np.asarray(state.targets.var), 0.0, atol=1e-10)


def test_partial_participation_update_is_unbiased():
    """E[w_1] over participation draws equals the full-participation step (1/p scaling)."""
    ds, x, y = one_example_clients()
    cfg = PersonalizedConfig(
        method="uniform", lr=0.1, batch_size=4, update_every=1, participation=0.4
    )
    sim = PersonalizedSimulation(ds, linreg(3), cfg, targets=[1])
    base = sim.init(0)
    w0 = np.asarray(base.targets.params[0])

    # 600 independent one-step runs in one compiled call (a key per run)
    def one_run(key):
        return sim._run_fn(base.replace(key=key), ds.train, 1)[0].targets.params[0]

    ends = np.asarray(jax.jit(jax.vmap(one_run))(jax.random.split(jax.random.key(0), 600)))
    grads = 2 * (x @ w0 - y)[:, None] * x
    full_step = w0 - 0.1 * grads.mean(0)
    # standard error of the mean from the per-peer Bernoulli noise
    per_peer = 0.1 * 0.25 * np.abs(grads) * np.sqrt((1 - 0.4) / 0.4)
    se = np.sqrt(np.sum(per_peer[[0, 2, 3]] ** 2, 0) / len(ends))
    assert np.all(np.abs(ends.mean(0) - full_step) < 5 * se + 1e-6)


def test_half_batch_variance_estimate_is_unbiased():
    """E ||g_a - g_b||^2 / 4 = trace Cov of the batch-mean gradient (with replacement), exact
    per-example gradients in NumPy."""
    ds = planted_regression(num_clients=2, n_train=6, seed=6)
    model = linreg()
    cfg = PersonalizedConfig(method="local", lr=0.1, batch_size=4)
    sim = PersonalizedSimulation(ds, model, cfg, targets=[0])
    theta = sim.initial_params(0)
    keys = jax.random.split(jax.random.key(7), 20000)
    _, grads = jax.jit(jax.vmap(lambda k: sim._peer_grads(theta, ds.train, jnp.int32(0), k)))(keys)
    est = np.mean(0.25 * np.sum((np.asarray(grads[:, 0]) - np.asarray(grads[:, 1])) ** 2, 1))
    x, y = ds.train.client_arrays(0)
    per = 2 * (x @ np.asarray(theta) - y)[:, None] * x
    want = np.mean(np.sum((per - per.mean(0)) ** 2, 1)) / 4
    np.testing.assert_allclose(est, want, rtol=0.05)


def test_exact_bound_terms_match_numpy():
    """With track_bound, the exact full-data bias, variance and gradient error at the initial
    model (uniform weights) against a NumPy computation."""
    ds = planted_regression(num_clients=4, n_train=7, seed=8)
    cfg = PersonalizedConfig(method="uniform", lr=0.05, batch_size=4, participation=0.5)
    sim = PersonalizedSimulation(ds, linreg(), cfg, targets=[0, 3])
    state = sim.init(0)
    ev = sim.evaluate(state, track_bound=True)
    w = np.asarray(sim.initial_params(0), np.float64)
    means, sig2 = [], []
    for k in range(4):
        x, y = ds.train.client_arrays(k)
        per = 2 * (x @ w - y)[:, None] * x
        means.append(per.mean(0))
        sig2.append(np.mean(np.sum((per - per.mean(0)) ** 2, 1)) / 4)
    means, sig2 = np.stack(means), np.array(sig2)
    a = np.full(4, 0.25)
    for j, t in enumerate([0, 3]):
        p = np.where(np.arange(4) == t, 1.0, 0.5)
        v = sig2 + (1 / p - 1) * (sig2 + np.sum(means**2, 1))
        bias = means - means[t]
        err = np.sum((a @ bias) ** 2) + np.sum(a**2 * v)
        np.testing.assert_allclose(ev["grad_error"][j], err, rtol=1e-4)
        np.testing.assert_allclose(ev["grad_norm_sq"][j], np.sum(means[t] ** 2), rtol=1e-4)
        lr_l = float(state.targets.smoothness[j]) * 0.05
        c_b = 1 + 2 * lr_l  # the default appendix-D bound
        np.testing.assert_allclose(
            ev["bound_true"][j], c_b * np.sum((a @ bias) ** 2) + lr_l * np.sum(a**2 * v), rtol=1e-4
        )


# ----------------------------------------------------------------- planted two clusters
PLANTED_CONFIG = PersonalizedConfig(lr=0.05, batch_size=8, update_every=5)


@pytest.fixture(scope="module")
def planted_runs():
    ds = planted_regression(num_clients=8, n_train=10, seed=0)
    model = linreg()
    runs = {
        m: run_method(m, ds, model, epochs=40, eval_every=20, config=PLANTED_CONFIG, seed=0)
        for m in ("sp_cacw", "local", "fedavg")
    }
    return ds, runs


def test_planted_weights_concentrate_on_the_own_cluster(planted_runs):
    """Weights over the second half of the run (FTAL, the default, sits on a face of the simplex
    that can jump between updates, so one update is a noisy snapshot)."""
    ds, runs = planted_runs
    w = runs["sp_cacw"].logs.alpha[20:].mean(0)  # [targets, clients], 40 updates
    cl = np.asarray(ds.info["cluster"])
    own = np.sum(np.where(cl[:, None] == cl[None, :], w, 0.0), axis=1)
    assert own.mean() > 0.9  # uniform weights would give 0.5
    same = (cl[:, None] == cl[None, :]) & ~np.eye(len(cl), dtype=bool)
    other = cl[:, None] != cl[None, :]
    # same-cluster peers are used (variance reduction), other-cluster peers hardly
    assert w[same].mean() > 5 * w[other].mean()
    assert np.mean(np.diag(w)) < 0.8


def test_planted_target_beats_fedavg_and_local(planted_runs):
    _, runs = planted_runs
    loss = {m: r.final("test_loss") for m, r in runs.items()}
    assert np.mean(loss["sp_cacw"]) < 0.9 * np.mean(loss["local"])
    assert np.mean(loss["sp_cacw"]) < 0.5 * np.mean(loss["fedavg"])
    assert np.mean(loss["sp_cacw"] < loss["local"]) >= 0.6


def test_planted_variants_stay_on_the_simplex_and_find_the_own_cluster(planted_runs):
    """FTAL, the exact-expansion bound, partial participation, eta = min(lr, 1/L) and the
    debiased Gram together (one compile): weights on the simplex, mass on the own cluster, and
    the step never above 1/L (that bound's descent condition)."""
    ds, _ = planted_runs
    cfg = dataclasses.replace(
        PLANTED_CONFIG, solver="ftal", bound="descent", participation=0.7,
        lr_rule="smoothness", debias=True,
    )  # fmt: skip
    res = run_method("sp_cacw", ds, linreg(), epochs=40, eval_every=40, config=cfg)
    w = res.weights[-1]
    assert np.all(w >= 0) and np.allclose(w.sum(1), 1.0, atol=1e-5)
    row = summary_row(res)  # the numbers summary.json holds, from the result's own arrays
    assert row["own_cluster_mass"] > 0.8
    assert row["target_test_loss"] == pytest.approx(np.mean(res.final("test_loss")))
    assert row["bound_premise_fraction"] == pytest.approx(np.mean(res.metrics["bound_premise"][-1]))
    assert np.all(res.logs.lr <= 1.0 / res.logs.smoothness + 1e-7)
    assert np.all(res.logs.lr <= PLANTED_CONFIG.lr + 1e-9)
    # eta <= 1/L is the exact-expansion bound's premise: it held, so the risk bound is reported
    assert np.all(res.metrics["bound_premise"][-1] == 1.0)
    assert np.all(np.isfinite(res.metrics["risk_bound"][-1]))


def test_same_seed_same_results_and_targets_are_independent(planted_runs):
    """A subset of targets, simulated in chunks (lax.map), reproduces those targets' rows of the
    all-targets vmapped run, and reruns are bit-for-bit identical. (PGD: FTAL's nearly linear
    surrogate puts the weight on a vertex, where float rounding between the vmapped and the
    chunked program can pick another of two near-tied peers.)"""
    ds, _ = planted_runs
    cfg = dataclasses.replace(PLANTED_CONFIG, solver="pgd")
    sub = PersonalizedSimulation(
        ds, linreg(), dataclasses.replace(cfg, target_chunk=1), targets=[5, 2]
    )
    a, log_a = sub.run_epochs(sub.init(0), 20)
    b, log_b = sub.run_epochs(sub.init(0), 20)
    np.testing.assert_array_equal(np.asarray(a.targets.params), np.asarray(b.targets.params))
    np.testing.assert_array_equal(log_a.alpha, log_b.alpha)
    every = PersonalizedSimulation(ds, linreg(), cfg)
    full, _ = every.run_epochs(every.init(0), 20)
    # 20 epochs of float drift between the two programs (3e-5 seen on an AMD EPYC); a wrong
    # target's row differs by far more (up to 0.43 here)
    np.testing.assert_allclose(sub.weights(a), every.weights(full)[[5, 2]], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(
        sub.evaluate(a)["test_loss"], every.evaluate(full)["test_loss"][[5, 2]], rtol=1e-3
    )


def test_personalized_ifca_is_the_engines_ifca_and_recovers_planted_clusters():
    """The personalized comparison's IFCA is the engine's ``ifca`` strategy with every client
    every round: each target ends under the cluster model of its planted cluster."""
    ds = planted_regression(num_clients=8, n_train=10, seed=1)
    res = run_method(
        "ifca",
        ds,
        linreg(),
        epochs=15,
        eval_every=15,
        config=PersonalizedConfig(lr=0.05, batch_size=8, update_every=5),
        num_clusters=2,
    )
    assign = res.metrics["cluster"][-1].astype(int)
    cl = np.asarray(ds.info["cluster"])
    assert len(set(zip(assign.tolist(), cl.tolist(), strict=True))) == 2  # a bijection
    # under its assigned model every target fits its own cluster's line (noise variance 1)
    assert np.all(res.metrics["test_loss"][-1] < 3.0)
    fedavg = run_method(
        "fedavg",
        ds,
        linreg(),
        epochs=15,
        eval_every=15,
        config=PersonalizedConfig(lr=0.05, batch_size=8, update_every=5),
    )
    assert np.mean(fedavg.metrics["test_loss"][-1]) > 3 * np.mean(res.metrics["test_loss"][-1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"method": "best"}, "method"),
        ({"batch_size": 5}, "batch_size"),
        ({"ema": 0.0}, "ema"),
        ({"participation": 1.5}, "participation"),
        ({"solver": "newton"}, "solver"),
        ({"lr": -1.0}, "lr"),
        ({"update_every": 0}, "update_every"),
    ],
)
def test_bad_configuration_names_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PersonalizedConfig(**kwargs).validate()


def test_bad_inputs_raise_config_errors():
    ds = planted_regression(num_clients=4, seed=2)
    no_clusters = dataclasses.replace(ds, info={})
    with pytest.raises(ConfigError, match="clusters"):
        PersonalizedSimulation(no_clusters, linreg(), PersonalizedConfig(method="oracle"))
    with pytest.raises(ConfigError, match="targets"):
        PersonalizedSimulation(ds, linreg(), PersonalizedConfig(), targets=[0, 9])
    with pytest.raises(ConfigError, match="per-client test"):
        PersonalizedSimulation(dataclasses.replace(ds, test=None), linreg(), PersonalizedConfig())
    with pytest.raises(ConfigError, match="personalized method"):
        run_method("fedprox", ds, linreg(), epochs=1)


# ------------------------------------------------- partial participation: unobserved peers
def numpy_quadratic_cubic_min(
    h: np.ndarray, lam: float, feasible: np.ndarray, linear: np.ndarray | None = None
) -> np.ndarray:
    """Independent reference: ``argmin a^T H a + lam sum a^3 (+ linear . a)`` over the simplex
    face of the ``feasible`` coordinates, by SLSQP (scipy) from the face's centre."""
    from scipy.optimize import minimize

    idx = np.flatnonzero(feasible)
    sub = h[np.ix_(idx, idx)].astype(np.float64)
    c = np.zeros(idx.size) if linear is None else np.asarray(linear, np.float64)[idx]
    res = minimize(
        lambda a: a @ sub @ a + lam * np.sum(a**3) + c @ a,
        np.full(idx.size, 1.0 / idx.size),
        jac=lambda a: 2 * sub @ a + 3 * lam * a**2 + c,
        bounds=[(0, 1)] * idx.size,
        constraints=({"type": "eq", "fun": lambda a: np.sum(a) - 1.0},),
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 500},
    )
    out = np.zeros(h.shape[0])
    out[idx] = res.x
    return out


@pytest.fixture(scope="module")
def sparse_observation_runs():
    """One lazy update after ONE step at participation 0.25: most peers of every target are
    still unobserved (zero bias, variance and norm estimates, so ``H_ii = 0``)."""
    ds = planted_regression(num_clients=8, n_train=10, seed=3)
    base = PersonalizedConfig(lr=0.05, batch_size=8, update_every=1, participation=0.25)
    out = {}
    for name, cfg in (
        ("pgd", dataclasses.replace(base, solver="pgd", pgd_steps=400)),
        ("ftal", base),  # the default solver
        ("similarity", dataclasses.replace(base, method="similarity")),
    ):
        sim = PersonalizedSimulation(ds, linreg(), cfg)
        state, _ = sim.run_epochs(sim.init(0), 1)
        out[name] = (sim, state)
    return out


def test_unobserved_peers_get_no_weight_under_partial_participation(sparse_observation_runs):
    """The bug (fidelity notes): a never-observed peer looked ideal (``H_ii = 0``) and drew most
    of the weight. Now only observed peers (and the target) may get weight, with either solver;
    PGD's weights are the bound's minimiser over the observed face (scipy reference)."""
    sim, state = sparse_observation_runs["pgd"]
    ts = state.targets
    seen = np.asarray(ts.num_obs) > 0
    assert 0 < seen.sum() < seen.size - 8  # some peers of most targets are unobserved
    assert np.all(seen[np.arange(8), np.arange(8)])  # a target always observes itself
    for name in ("pgd", "ftal"):
        w = sim.weights(sparse_observation_runs[name][1])
        np.testing.assert_allclose(w[~seen], 0.0, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-5)
    w = sim.weights(state)
    for t in range(8):
        p = np.where(np.arange(8) == t, 1.0, 0.25)
        v = np.asarray(ts.var[t]) + (1 / p - 1) * np.asarray(ts.sq_norm[t])
        lr_l = float(ts.smoothness[t]) * float(ts.lr[t])
        bias = np.asarray(ts.bias[t], np.float64)
        h = (1 + 2 * lr_l) * bias @ bias.T + lr_l * np.diag(v)  # appendix-D bound
        want = numpy_quadratic_cubic_min(h, float(ts.lam[t]), seen[t])
        np.testing.assert_allclose(w[t], want, atol=2e-3)


def test_ftal_over_the_history_of_bounds_is_the_default(sparse_observation_runs):
    """The paper's rule is the default of the configuration and of the registry, and a default
    run's first weights are FTAL's: the accumulated surrogate of the first bound (NumPy) and its
    minimiser over the observed face (scipy), not the bound's own minimiser."""
    from fedjax_sel.personalized.methods import PERSONALIZED_METHODS

    assert PersonalizedConfig().solver == "ftal"
    assert PERSONALIZED_METHODS["sp_cacw"].options["solver"].default == "ftal"
    sim, state = sparse_observation_runs["ftal"]
    assert sim.config.solver == "ftal"
    ts = state.targets
    seen = np.asarray(ts.num_obs) > 0
    w = sim.weights(state)
    for t in range(8):
        p = np.where(np.arange(8) == t, 1.0, 0.25)
        v = np.asarray(ts.var[t]) + (1 / p - 1) * np.asarray(ts.sq_norm[t])
        lr_l = float(ts.smoothness[t]) * float(ts.lr[t])
        bias = np.asarray(ts.bias[t], np.float64)
        h = (1 + 2 * lr_l) * bias @ bias.T + lr_l * np.diag(v)
        lam, a0 = float(ts.lam[t]), np.full(8, 1 / 8)  # the uniform initial weights
        g = 2 * h @ a0 + 3 * lam * a0**2
        g[~seen[t]] = g[seen[t]].max()
        g_bound = 2 * np.linalg.norm(h, axis=0).max() + 3 * lam
        beta = 0.5 * min(1 / (4 * g_bound * np.sqrt(2)), 1 / (2 * np.diag(h).max()))
        quad, lin = 0.5 * beta * np.outer(g, g), g - beta * g * (g @ a0)
        np.testing.assert_allclose(np.asarray(ts.ftal_quad[t]), quad, rtol=1e-3, atol=1e-7)
        np.testing.assert_allclose(np.asarray(ts.ftal_lin[t]), lin, rtol=1e-3, atol=1e-6)
        want = numpy_quadratic_cubic_min(quad, lam, seen[t], linear=lin)
        np.testing.assert_allclose(w[t], want, atol=2e-3)


def test_similarity_baseline_ignores_unobserved_peers(sparse_observation_runs):
    """An unobserved peer's row of the EMA gradients equals the target's own gradient (cosine
    1); it must get no weight. The weights are ``max(cos, 0)`` over the observed peers."""
    sim, state = sparse_observation_runs["similarity"]
    ts = state.targets
    seen = np.asarray(ts.num_obs) > 0
    w = sim.weights(state)
    for t in range(8):
        g = np.asarray(ts.bias[t]) + np.asarray(ts.own_grad[t])[None]
        cos = g @ g[t] / (np.linalg.norm(g, axis=1) * np.linalg.norm(g[t]))
        want = np.where(seen[t], np.maximum(cos, 0.0), 0.0)
        want[t] = 1.0
        np.testing.assert_allclose(w[t], want / want.sum(), atol=1e-5)


# ------------------------------------------------------------ the risk bound's premise
def test_risk_bound_is_reported_only_where_its_premise_held():
    """``L eta <= 1/2`` at every step (``a = 1 - 2 L eta >= 0``) or the running risk bound is no
    descent guarantee: per target, ``bound_premise`` equals that condition on the logged
    ``L`` and ``eta`` (the initial estimate and every update but the last, which no step has
    used yet), ``risk_bound`` is NaN exactly where it failed, and ``eta = min(lr, 1/(2L))``
    (``lr_rule="smoothness"``) keeps it everywhere."""
    ds = planted_regression(num_clients=6, n_train=10, seed=4)
    model = linreg()
    base = PersonalizedConfig(batch_size=8, update_every=2, solver="pgd", pgd_steps=50)

    def check(cfg):
        sim = PersonalizedSimulation(ds, model, cfg)
        init = sim.init(0)
        state, log = sim.run_epochs(init, 4)
        ev = sim.evaluate(state)
        used_l = np.concatenate([np.asarray(init.targets.smoothness)[None], log.smoothness[:-1]])
        used_lr = np.concatenate([np.asarray(init.targets.lr)[None], log.lr[:-1]])
        held = np.all(used_l * used_lr <= 0.5 * (1 + 1e-5), axis=0)
        np.testing.assert_array_equal(ev["bound_premise"], held.astype(np.float32))
        assert np.all(np.isfinite(ev["risk_bound"]) == held)
        lr_l = log.smoothness[-1] * log.lr[-1]
        np.testing.assert_allclose(ev["lr_times_smoothness"], lr_l, rtol=1e-6)
        return held, used_l

    held, used_l = check(dataclasses.replace(base, lr=10.0, lr_rule="smoothness"))
    assert held.all()
    # linear regression: L does not depend on the model, so a fixed step between the targets'
    # 1/(2 max L) values keeps the premise for some targets and breaks it for the others
    limits = np.sort(0.5 / used_l.max(axis=0))
    held, _ = check(dataclasses.replace(base, lr=float(limits[2:4].mean())))
    assert held.sum() == 3
