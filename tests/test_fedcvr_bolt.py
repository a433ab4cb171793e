"""FedCVR-Bolt strategy (Algorithm 1): the table / mean / covariance step against a NumPy
transcription of eqs. 9 and 11 with explicit ``C^d`` matrices, one draw per coalition on planted
coalitions, the scale-free option against a NumPy standardisation, beta = 0 uniform within
coalitions, the diagnostics (coalition sizes, adjusted Rand index, per-coalition entropy) on a
planted case, the warm-up, degenerate inputs, the model sketch, and the round in the engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel import engine
from fedjax_sel.base import ConfigError, RoundInputs, SimSpec
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.phases import round_keys, select_phase
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.kernels.boltzmann import sample_per_coalition, standardize_within
from fedjax_sel.kernels.covariance import init_covariance, value_vector
from fedjax_sel.kernels.spectral import CoalitionConfig
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies._sketch import sketch_coordinates, sketch_one
from fedjax_sel.strategies.divfl import flatten_stacked
from fedjax_sel.strategies.fedcvr_bolt import observe, select_clients
from fedjax_sel.training import HParams, LocalConfig

FAST = CoalitionConfig(n_init=2)  # fewer k-means seedings keep the tests quick
select_jit = jax.jit(
    select_clients,
    static_argnames=("per_round", "beta", "value_scale", "coalitions", "fill_empty"),
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
    state = strat.init(jax.random.key(0), _spec(k, p, params)).inner  # runs at beta = 50
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

    inputs = RoundInputs(jnp.int32(2), jnp.ones(k, bool), params, jnp.full((k,), 10))
    diag = strat.select(state, inputs, None, jax.random.key(0))[0].diagnostics
    np.testing.assert_allclose(np.asarray(diag["law"]), 1.0 / k)  # the warm-up law: uniform
    assert float(diag["in_warmup"]) == 1.0
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
    np.testing.assert_allclose(np.asarray(state.inner.alpha), np.asarray(n) / 315.0, rtol=1e-6)
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
    spec = engine.RoundSpec.create(ds, model, strat, local=LocalConfig(local_steps=3), per_round=p)
    sim = Simulation(spec, ds, num_rounds=3, chunk_size=1)
    state = sim.init(seed=0, hparams=HParams.of(0.05))

    @jax.jit
    def step(state, data):
        _, sel, available = select_phase(spec, state, data)
        _, _, k_train = round_keys(state)
        everyone = jnp.arange(k, dtype=jnp.int32)
        trained = spec.trainer.train(
            state.params, data.train, everyone, available, k_train, hparams=state.hparams
        )
        new_state, _ = engine.round_fn(spec, state, data)
        return sel, trained, new_state

    table0 = np.asarray(state.strategy_state.inner.table)
    for _ in range(3):
        sel, trained, new_state = step(state, sim.data)
        chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
        rows = np.asarray(flatten_stacked(trained.params))
        table = np.asarray(new_state.strategy_state.inner.table)
        np.testing.assert_allclose(table[chosen], rows[chosen], rtol=1e-5, atol=1e-6)
        others = np.setdiff1d(np.arange(k), chosen)
        np.testing.assert_array_equal(table[others], table0[others])
        counts = np.asarray(ds.num_examples)[chosen]
        np.testing.assert_allclose(
            np.asarray(sel.weights)[np.asarray(sel.mask)], counts / counts.sum(), rtol=1e-6
        )
        state, table0 = new_state, table
    assert int(state.strategy_state.inner.cov.count) == 3
    assert strat.metrics is None  # what used to be reported from state is now a diagnostic
    _, logs = sim.run_rounds(state, 1)
    diag = {k: np.asarray(v) for k, v in logs.diagnostics.items()}
    assert 1 <= int(diag["coalitions_used"][0]) <= p
    assert np.isfinite(diag["value_max"][0]) and diag["coalition_sizes"].shape == (1, p)
    assert diag["coalition_sizes"][0].sum() == k
    assert "ari_dominant_label" not in diag  # regression: no labels to compare with


# ---------------------------------------------------------------- the mechanisms taken apart


def numpy_standardize(v, labels, available):
    """Mean 0, standard deviation 1 (population) over each coalition's available members."""
    z = np.zeros_like(v)
    for c in np.unique(labels):
        m = (labels == c) & available
        if m.any():
            sd = v[m].std()
            z[m] = (v[m] - v[m].mean()) / sd if sd > 0 else 0.0
    return z


def test_scale_free_values_match_numpy_standardisation():
    rng = np.random.default_rng(4)
    k, p = 21, 5
    v = rng.lognormal(size=k) * 1e-4  # squared-parameter units: tiny
    labels = rng.integers(0, 3, k)
    labels[0] = 3  # a coalition of one
    labels[[1, 2]] = 4  # a coalition of two equal values
    v[[1, 2]] = 0.5
    available = rng.random(k) < 0.8
    available[:3] = True
    got = np.asarray(standardize_within(jnp.asarray(v), jnp.asarray(labels), p, available))
    ref = numpy_standardize(v, labels, available)
    np.testing.assert_allclose(got[available], ref[available], rtol=1e-4, atol=1e-5)
    assert got[0] == 0.0 and got[1] == got[2] == 0.0
    # scale-free: an affine change of units leaves the standardised values unchanged
    again = standardize_within(jnp.asarray(3e6 * v - 7.0), jnp.asarray(labels), p, available)
    np.testing.assert_allclose(np.asarray(again)[available], got[available], atol=2e-3)

    # in the strategy's selection: eq. 8 on the standardised values of each coalition
    table, _ = planted_table(rng, [5, 6, 4])
    kk = len(table)
    cov = init_covariance(jnp.full((kk,), 1.0 / kk), table.shape[1])
    cov = cov._replace(c_alpha=jnp.asarray(1e-3 * rng.normal(size=(kk, 5)), jnp.float32))
    out = select_jit(
        jax.random.key(0),
        jnp.asarray(table),
        cov,
        jnp.ones(kk, bool),
        per_round=3,
        beta=2.0,
        value_scale="standardized",
        coalitions=FAST,
    )
    labels = np.asarray(out.labels)
    z = numpy_standardize(np.asarray(out.values, np.float64), labels, np.ones(kk, bool))
    np.testing.assert_allclose(np.asarray(out.scores), z, rtol=1e-4, atol=1e-5)
    for c in range(3):
        m = labels == c
        e = np.exp(2.0 * (z[m] - z[m].max()))
        np.testing.assert_allclose(np.asarray(out.probs)[m], e / e.sum(), rtol=1e-4)
    with pytest.raises(ConfigError, match="value_scale"):
        make_strategy("fedcvr_bolt", 3, value_scale="zscore")


def test_beta_zero_draws_uniformly_within_coalitions():
    labels = jnp.asarray([0, 0, 1, 1, 1, 2, 2, 2, 2, 2])
    values = jnp.asarray([0.0, 3.0, 0.0, 1.0, 4.0, 0.0, 0.5, 1.0, 2.0, 5.0])
    draws = 6000
    keys = jax.random.split(jax.random.key(7), draws)

    def freq(beta):
        run = jax.jit(jax.vmap(lambda key: sample_per_coalition(key, values, labels, 3, beta)[0]))
        picks = np.asarray(run(keys))
        return np.bincount(picks.ravel(), minlength=10) / draws

    sizes = np.bincount(np.asarray(labels))
    uniform = 1.0 / sizes[np.asarray(labels)]
    tol = 5 * np.sqrt(uniform * (1 - uniform) / draws)
    assert np.all(np.abs(freq(0.0) - uniform) <= tol)
    assert np.any(np.abs(freq(1.0) - uniform) > tol)  # the same values at beta = 1 are not


def ari_pairs(a, b):
    """Adjusted Rand index by explicit pair counting (Hubert and Arabie 1985)."""
    n = len(a)
    i, j = np.triu_indices(n, 1)
    same_a, same_b = a[i] == a[j], b[i] == b[j]
    index = np.sum(same_a & same_b)
    expected = same_a.sum() * same_b.sum() / len(i)
    top = 0.5 * (same_a.sum() + same_b.sum())
    return 1.0 if top == expected else (index - expected) / (top - expected)


@pytest.mark.parametrize("beta", [0.0, 3.0])
def test_diagnostics_on_planted_coalitions(beta):
    rng = np.random.default_rng(5)
    sizes = [6, 4, 3, 2]
    table, truth = planted_table(rng, sizes)
    k, p, d = len(table), len(sizes), table.shape[1]
    dominant = truth.copy()
    dominant[[0, 7]] = [2, 0]  # two clients whose dominant label is not their group's
    counts = np.eye(p)[dominant] * 30 + 1
    params = {"w": jnp.zeros((d,))}
    spec = SimSpec(k, p, 10, jnp.full((k,), 10), params, p, jnp.asarray(counts, jnp.float32))
    strat = make_strategy("fedcvr_bolt", p, warmup=0, beta=beta, sketch="all", kmeans_init=2)
    state = strat.init(jax.random.key(0), spec).inner  # runs at the beta it was built with
    c_alpha = jnp.asarray(rng.normal(size=(k, d)), jnp.float32)
    state = state._replace(table=jnp.asarray(table), cov=state.cov._replace(c_alpha=c_alpha))
    inputs = RoundInputs(jnp.int32(4), jnp.ones(k, bool), params, jnp.full((k,), 10))
    sel, new_state = jax.jit(strat.select, static_argnums=2)(state, inputs, None, jax.random.key(1))
    diag = {key: np.asarray(v) for key, v in sel.diagnostics.items()}
    labels = np.asarray(new_state.inner.labels)
    assert ari_pairs(labels, truth) == 1.0  # the planted coalitions are found
    np.testing.assert_array_equal(diag["coalition_sizes"], sizes)  # largest first
    assert diag["coalitions_used"] == p
    np.testing.assert_allclose(diag["ari_dominant_label"], ari_pairs(labels, dominant), atol=1e-6)
    np.testing.assert_allclose(
        diag["ari_previous_round"], ari_pairs(labels, np.zeros(k, int)), atol=1e-6
    )
    # eq. 8 per coalition, against NumPy: entropy over log(size), max over uniform
    v = np.asarray(value_vector(c_alpha, state.cov.c_diag), np.float64)
    ratio, top, law, spread = [], [], np.zeros(k), 0.0
    for c in sorted(range(p), key=lambda c: -np.sum(labels == c)):
        m = labels == c
        e = np.exp(beta * (v[m] - v[m].max()))
        q = e / e.sum()
        law[m] = q
        ratio.append(-np.sum(q * np.log(q)) / np.log(m.sum()))
        top.append(q.max() * m.sum())
        spread = max(spread, beta * (v[m].max() - v[m].min()))
    np.testing.assert_allclose(diag["coalition_entropy_ratio"], ratio, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(diag["coalition_max_over_uniform"], top, rtol=1e-4)
    np.testing.assert_allclose(diag["law"], law, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(diag["logit_spread"], spread, rtol=2e-3, atol=1e-6)
    if beta == 0.0:  # coalition-stratified sampling: every coalition's law is uniform
        np.testing.assert_allclose(diag["coalition_entropy_ratio"], 1.0, rtol=1e-5)
    assert diag["in_warmup"] == 0.0
