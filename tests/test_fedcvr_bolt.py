"""FedCVR-Bolt strategy (Algorithm 1): the table / mean / covariance step against a NumPy
transcription of eqs. 9 and 11 with explicit ``C^d`` matrices, one draw per coalition on planted
coalitions, the warm-up, degenerate inputs, the model sketch, and the round in the engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError, RoundInputs, SimSpec
from fedjax_sel.data import load_dataset
from fedjax_sel.kernels.covariance import init_covariance, value_vector
from fedjax_sel.kernels.spectral import CoalitionConfig
from fedjax_sel.models import make_model
from fedjax_sel.simulation import Simulation
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies._sketch import sketch_coordinates, sketch_one
from fedjax_sel.strategies.divfl import flatten_stacked
from fedjax_sel.strategies.fedcvr_bolt import observe, select_clients
from fedjax_sel.training import LocalConfig

FAST = CoalitionConfig(n_init=2)  # fewer k-means seedings keep the tests quick
select_jit = jax.jit(
    select_clients, static_argnames=("per_round", "beta", "coalitions", "fill_empty")
)


def numpy_observe(table, labels, clients, mask, new_rows, cov_mats, alpha, t):
    """Algorithm 1 lines 12-17 with dense ``C^d`` (K x K per coordinate)."""
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    new_table = table.copy()
    sel = [(int(c), r) for c, r, m in zip(clients, new_rows, mask, strict=True) if m]
    for c, r in sel:
        new_table[c] = r
    mean = np.zeros_like(table)
    for k in range(len(table)):
        same = [(c, r) for c, r in sel if labels[c] == labels[k]]
        # eq. 9 pairs k with its coalition's selected client; else the most similar selected
        c, r = same[0] if same else max(sel, key=lambda cr: unit[k] @ unit[cr[0]])
        mean[k] = (unit[k] @ unit[c]) * r
    u = new_table - mean
    gamma = 1.0 / t
    cov_mats = [
        (1 - gamma) * c + gamma * np.outer(u[:, d], u[:, d]) for d, c in enumerate(cov_mats)
    ]
    # a zero variance (the client just observed, gamma = 1) scores 0: value_vector's convention
    # (in float64 the residual is ~1e-17 instead of 0, and the ratio is noise)
    v = sum(
        np.where(np.diag(c) > 1e-12, (c @ alpha) ** 2 / np.maximum(np.diag(c), 1e-300), 0.0)
        for c in cov_mats
    )
    return new_table, cov_mats, v


def test_observe_matches_dense_eq9_eq11():
    rng = np.random.default_rng(0)
    k, d = 8, 3
    alpha = rng.uniform(1, 3, k)
    alpha /= alpha.sum()
    table = rng.normal(size=(k, d)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    cov_mats = [np.eye(k) for _ in range(d)]
    cov = init_covariance(jnp.asarray(alpha, jnp.float32), d)
    for t, (clients, mask) in enumerate(
        [
            ([0, 4, 5], [True, True, True]),  # one per coalition: eq. 9 exactly
            ([3, 1, 7], [True, False, True]),  # coalition 1's slot empty: nearest selected
            ([6, 2, 2], [True, True, False]),
        ],
        start=1,
    ):
        new_rows = rng.normal(size=(3, d)).astype(np.float32)
        ref_table, cov_mats, ref_v = numpy_observe(
            table.astype(np.float64), labels, clients, mask, new_rows, cov_mats, alpha, t
        )
        got_table, cov = observe(
            jnp.asarray(table),
            cov,
            jnp.asarray(alpha, jnp.float32),
            jnp.asarray(labels),
            jnp.asarray(clients, jnp.int32),
            jnp.asarray(mask),
            jnp.asarray(new_rows),
        )
        np.testing.assert_allclose(np.asarray(got_table), ref_table, rtol=1e-6)
        np.testing.assert_allclose(
            np.asarray(value_vector(cov.c_alpha, cov.c_diag)), ref_v, rtol=2e-4
        )
        table = np.asarray(got_table)
    # nobody trained: nothing changes (and the step count does not advance)
    same_table, same_cov = observe(
        jnp.asarray(table),
        cov,
        jnp.asarray(alpha, jnp.float32),
        jnp.asarray(labels),
        jnp.zeros(3, jnp.int32),
        jnp.zeros(3, bool),
        jnp.ones((3, d)),
    )
    np.testing.assert_array_equal(np.asarray(same_table), table)
    assert int(same_cov.count) == int(cov.count) == 3


def planted_table(rng, sizes, dim=5):
    centers = np.linalg.qr(rng.normal(size=(dim, len(sizes))))[0].T
    x = np.concatenate(
        [c + 0.05 * rng.normal(size=(n, dim)) for c, n in zip(centers, sizes, strict=True)]
    )
    return x.astype(np.float32), np.repeat(np.arange(len(sizes)), sizes)


def test_select_one_client_per_planted_coalition():
    rng = np.random.default_rng(1)
    table, truth = planted_table(rng, [5, 6, 4, 1])  # the last coalition has one client
    k, p = len(table), 4
    cov = init_covariance(jnp.full((k,), 1.0 / k), table.shape[1])
    cov = cov._replace(c_alpha=jnp.asarray(rng.normal(size=(k, table.shape[1])), jnp.float32))

    def run(key, avail, fill_empty=True):
        return select_jit(
            key,
            jnp.asarray(table),
            cov,
            avail,
            per_round=p,
            coalitions=FAST,
            fill_empty=fill_empty,
        )

    everyone = jnp.ones(k, bool)
    for s in range(3):
        out = run(jax.random.key(s), everyone)
        labels = np.asarray(out.labels)
        # coalitions = planted clusters (same partition up to renaming)
        assert len({(a, b) for a, b in zip(labels, truth, strict=True)}) == p
        picked = np.asarray(out.clients)
        assert np.asarray(out.mask).all()
        assert sorted(truth[picked].tolist()) == [0, 1, 2, 3]
        assert picked[labels[picked] == labels[-1]] == k - 1  # a coalition of one: always it
        # eq. 8 within each coalition
        v = np.asarray(value_vector(cov.c_alpha, cov.c_diag))
        probs = np.asarray(out.probs)
        for c in range(p):
            m = labels == c
            e = np.exp(v[m] - v[m].max())
            np.testing.assert_allclose(probs[m], e / e.sum(), rtol=1e-5)
    # the lone client offline: its coalition is empty, its slot is filled from the others
    avail = np.ones(k, bool)
    avail[-1] = False
    out = run(jax.random.key(9), jnp.asarray(avail))
    picked = np.asarray(out.clients)
    assert np.asarray(out.mask).all() and len(set(picked.tolist())) == p
    assert k - 1 not in picked
    nofill = select_clients(
        jax.random.key(9),
        jnp.asarray(table),
        cov,
        jnp.asarray(avail),
        per_round=p,
        fill_empty=False,
    )
    assert int(np.asarray(nofill.mask).sum()) == p - 1


def test_identical_clients_and_nobody_online():
    k, p, d = 10, 4, 3
    table = jnp.ones((k, d))  # every client holds the initial model
    cov = init_covariance(jnp.full((k,), 0.1), d)
    out = select_jit(jax.random.key(0), table, cov, jnp.ones(k, bool), per_round=p, coalitions=FAST)
    picked = np.asarray(out.clients)
    assert np.asarray(out.mask).all() and len(set(picked.tolist())) == p
    assert np.all(np.isfinite(np.asarray(out.probs))) and np.all(np.isfinite(out.values))
    none = select_jit(
        jax.random.key(0), table, cov, jnp.zeros(k, bool), per_round=p, coalitions=FAST
    )
    assert not np.asarray(none.mask).any()
    assert np.all(np.asarray(none.probs) == 0.0)


def _spec(k, p, params, n=None):
    n = jnp.full((k,), 10, jnp.int32) if n is None else n
    return SimSpec(k, p, 50, n, params)


def test_warmup_is_uniform_then_boltzmann():
    k, p = 6, 2
    params = {"w": jnp.zeros((2,))}
    strat = make_strategy("fedcvr_bolt", p, warmup=3, beta=50.0, sketch="all", kmeans_init=2)
    state = strat.init(jax.random.key(0), _spec(k, p, params))
    # two coalitions of 3; client 0 and client 3 have by far the largest value
    table = jnp.asarray([[1, 0.01], [1, 0.02], [1, 0.0], [0, 1], [0.01, 1], [0.02, 1]])
    c_alpha = jnp.asarray([[1.0, 1.0], [0, 0], [0, 0], [1.0, 1.0], [0, 0], [0, 0]])
    state = state._replace(table=table, cov=state.cov._replace(c_alpha=c_alpha))

    n = 300
    keys = jax.random.split(jax.random.key(1), n)

    @jax.jit
    def many(round_):
        def one(key):
            inputs = RoundInputs(round_, jnp.ones(k, bool), params, jnp.full((k,), 10))
            return strat.select(state, inputs, None, key)[0].clients

        return jax.vmap(one)(keys)

    warm = np.asarray(many(jnp.int32(2)))
    freq = np.bincount(warm.ravel(), minlength=k) / n  # uniform: p / k = 1/3 each
    assert np.all(np.abs(freq - p / k) < 5 * np.sqrt((1 / 3) * (2 / 3) / n))
    assert all(len(set(r)) == p for r in warm.tolist())
    after = np.asarray(many(jnp.int32(3)))
    assert all(sorted(r) == [0, 3] for r in after.tolist())


def test_size_weights_and_config_errors():
    k, p = 6, 3
    params = {"w": jnp.zeros((2,))}
    n = jnp.asarray([5, 10, 20, 40, 80, 160], jnp.int32)
    strat = make_strategy("fedcvr_bolt", p, warmup=0, sketch="all", kmeans_init=1)
    state = strat.init(jax.random.key(0), _spec(k, p, params, n))
    np.testing.assert_allclose(np.asarray(state.alpha), np.asarray(n) / 315.0, rtol=1e-6)
    inputs = RoundInputs(jnp.int32(0), jnp.ones(k, bool), params, n)
    sel, _ = jax.jit(strat.select, static_argnums=2)(state, inputs, None, jax.random.key(3))
    chosen = np.asarray(n)[np.asarray(sel.clients)]
    np.testing.assert_allclose(np.asarray(sel.weights), chosen / chosen.sum(), rtol=1e-6)
    for bad, match in (
        ({"beta": -1.0}, "beta"),
        ({"warmup": -2}, "warmup"),
        ({"affinity": "poly"}, "poly"),
        ({"sketch": "first"}, "first"),
        ({"sketch_dim": -3}, "sketch_dim"),
        ({"coalitions": "approx"}, "approx"),
        ({"init_cov": 0.0}, "init_cov"),
        ({"weighting": "loss"}, "loss"),
    ):
        with pytest.raises(ConfigError, match=match):
            make_strategy("fedcvr_bolt", p, **bad)


def test_sketch_last_layer_and_random_subset():
    model = make_model("mlp", input_shape=(6,), num_classes=3, hidden=(4, 5))
    params = model.init(jax.random.key(0))
    flat = np.asarray(flatten_stacked(jax.tree.map(lambda x: x[None], params)))[0]
    last = list(params.keys())[-1]
    last_vals = np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(params[last])])
    coords = np.asarray(sketch_coordinates(jax.random.key(1), params, "last_layer", 0))
    assert len(coords) == 5 * 3 + 3
    np.testing.assert_array_equal(np.sort(flat[coords]), np.sort(last_vals))
    np.testing.assert_array_equal(np.asarray(sketch_one(params, jnp.asarray(coords))), flat[coords])
    assert len(sketch_coordinates(jax.random.key(1), params, "all", 0)) == flat.size
    sub = np.asarray(sketch_coordinates(jax.random.key(1), params, "last_layer", 7))
    assert len(sub) == 7 and len(set(sub.tolist())) == 7 and set(sub) <= set(coords)
    again = np.asarray(sketch_coordinates(jax.random.key(1), params, "last_layer", 7))
    np.testing.assert_array_equal(sub, again)


def test_round_in_the_engine_tracks_trained_models():
    k, p = 10, 3
    ds = load_dataset("regression", num_clients=k, seed=0, num_clusters=2, intercept=True)
    model = make_model("linreg", input_shape=ds.input_shape, num_classes=None)
    strat = make_strategy("fedcvr_bolt", p, warmup=1, sketch="all", kmeans_init=2)
    sim = Simulation(
        ds,
        model,
        strat,
        local=LocalConfig(lr=0.05, local_steps=3),
        per_round=p,
        num_rounds=3,
        chunk_size=1,
    )
    state = sim.init(seed=0)

    @jax.jit
    def step(state, data):
        _, sel, available = sim._select_phase(state, data)
        _, _, k_train = sim._round_keys(state)
        everyone = jnp.arange(k, dtype=jnp.int32)
        trained = sim.trainer(state.params, data.train, everyone, available, k_train)
        new_state, _ = sim.round_fn(state, data)
        return sel, trained, new_state

    table0 = np.asarray(state.strategy_state.table)
    for _ in range(3):
        sel, trained, new_state = step(state, sim.data)
        chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
        rows = np.asarray(flatten_stacked(trained.params))
        table = np.asarray(new_state.strategy_state.table)
        np.testing.assert_allclose(table[chosen], rows[chosen], rtol=1e-5, atol=1e-6)
        others = np.setdiff1d(np.arange(k), chosen)
        np.testing.assert_array_equal(table[others], table0[others])
        counts = np.asarray(ds.num_examples)[chosen]
        np.testing.assert_allclose(
            np.asarray(sel.weights)[np.asarray(sel.mask)], counts / counts.sum(), rtol=1e-6
        )
        state, table0 = new_state, table
    assert int(state.strategy_state.cov.count) == 3
    metrics = strat.metrics(state.strategy_state, state.params, None)
    assert 1 <= int(metrics["coalitions_used"]) <= p
    assert np.isfinite(float(metrics["value_max"]))
