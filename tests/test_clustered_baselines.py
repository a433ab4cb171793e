"""FedCVR-Bolt's baselines: Active FL (steps against a NumPy transcription, valuations, the
softmax law, fresh valuations of every available client, the alpha3 = 0 lock-in and the
diagnostics against NumPy), IFCA and FeSEM (argmin rules and per-cluster averages against
NumPy; planted label-flip clusters recovered in the engine, scored per client under the
assigned model)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, ConfigError, RoundInputs, SimSpec
from fedjax_sel.data.datasets import assemble, partition_by_client
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.active_fl import active_logits
from fedjax_sel.strategies.cluster_models import (
    cluster_average,
    cluster_weights,
    init_cluster_models,
)
from fedjax_sel.strategies.fesem import nearest_center
from fedjax_sel.strategies.ifca import assign_by_loss
from fedjax_sel.training import HParams, LocalConfig

# ---------------------------------------------------------------- Active FL


def numpy_active_logits(v, available, alpha1, alpha2):
    out = np.full(len(v), -np.inf)
    avail = np.flatnonzero(available)
    drop = int(np.floor(alpha1 * len(avail)))
    keep = avail[np.argsort(v[avail], kind="stable")][drop:]
    keep = keep[np.isfinite(v[keep])]
    out[keep] = alpha2 * v[keep]
    return out


def test_active_logits_match_numpy():
    rng = np.random.default_rng(0)
    for _ in range(5):
        v = rng.normal(size=11)
        v[rng.integers(0, 11, 2)] = -np.inf  # never seen
        available = rng.random(11) < 0.8
        for a1 in (0.0, 0.5, 0.75):
            got = np.asarray(
                active_logits(jnp.asarray(v, jnp.float32), jnp.asarray(available), a1, 0.3)
            )
            np.testing.assert_allclose(got, numpy_active_logits(v, available, a1, 0.3), rtol=1e-6)


def _fake_oracle(loss_of_client):
    def loss(params, clients, key):
        del params, key
        return loss_of_client[clients]

    def all_losses(params):
        del params
        return loss_of_client

    return ClientOracle(
        loss=loss, batch_loss=None, all_losses=all_losses, train=None, train_key=None
    )


def test_active_fl_valuations_first_round_and_softmax_law():
    k, m = 8, 1
    n = jnp.asarray([4, 9, 16, 25, 36, 49, 64, 81], jnp.int32)
    loss_of_client = jnp.linspace(0.5, 2.0, k)
    params = {"w": jnp.zeros(2)}
    spec = SimSpec(k, m, 10, n, params)
    inputs = RoundInputs(jnp.int32(0), jnp.ones(k, bool), params, n)
    oracle = _fake_oracle(loss_of_client)
    for kind, expect in (
        ("loss", np.sqrt(np.asarray(n)) * np.asarray(loss_of_client)),
        ("loss_per_sqrt_n", np.asarray(loss_of_client) / np.sqrt(np.asarray(n))),
    ):
        strat = make_strategy("active_fl", 4, valuation_kind=kind)
        state = strat.init(jax.random.key(0), spec._replace(per_round=4))
        sel, state = strat.select(state, inputs, oracle, jax.random.key(1))
        picked = np.asarray(sel.clients)
        # first round: every valuation -inf, all slots filled uniformly
        assert np.asarray(sel.mask).all() and len(set(picked.tolist())) == 4
        vals = np.asarray(state.inner.values)
        np.testing.assert_allclose(vals[picked], expect[picked], rtol=1e-5)
        assert np.all(np.isneginf(np.delete(vals, picked)))
    # the softmax law: one slot, alpha3 = 0, the alpha1 lowest never drawn
    strat = make_strategy("active_fl", m, alpha1=0.25, alpha2=1.0, alpha3=0.0)
    values = jnp.asarray([0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -2.0, 1.5])
    state = strat.init(jax.random.key(0), spec).inner._replace(values=values)  # as built
    draws = 4000
    keys = jax.random.split(jax.random.key(2), draws)
    picks = jax.jit(jax.vmap(lambda kk: strat.select(state, inputs, oracle, kk)[0].clients[0]))
    freq = np.bincount(np.asarray(picks(keys)), minlength=k) / draws
    kept = np.ones(k, bool)
    kept[[3, 6]] = False  # the floor(0.25 * 8) = 2 lowest
    p = np.where(kept, np.exp(np.asarray(values)), 0.0)
    p /= p.sum()
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / draws) + 1e-9)


def test_active_fl_uniform_share_and_errors():
    k, m = 12, 10
    n = jnp.full((k,), 10, jnp.int32)
    params = {"w": jnp.zeros(2)}
    strat = make_strategy("active_fl", m, alpha1=0.0, alpha2=1.0, alpha3=0.3)
    state = strat.init(jax.random.key(0), SimSpec(k, m, 10, n, params)).inner
    # only clients 0..6 have a valuation: 7 soft draws take exactly them, 3 uniform the rest
    state = state._replace(values=jnp.where(jnp.arange(k) < 7, 1.0, -jnp.inf))
    inputs = RoundInputs(jnp.int32(3), jnp.ones(k, bool), params, n)
    sel, _ = strat.select(state, inputs, _fake_oracle(jnp.ones(k)), jax.random.key(0))
    picked = np.asarray(sel.clients)
    assert sorted(picked[:7].tolist()) == list(range(7))
    assert len(set(picked.tolist())) == m and np.asarray(sel.mask).all()
    for bad, match in (
        ({"alpha1": 1.0}, "alpha1"),
        ({"alpha3": 1.5}, "alpha3"),
        ({"alpha2": -1.0}, "alpha2"),
        ({"valuation_kind": "grad"}, "grad"),
        ({"refresh": "some"}, "refresh"),
        ({"refresh": "available", "valuation_kind": "train_loss"}, "train_loss"),
    ):
        with pytest.raises(ConfigError, match=match):
            make_strategy("active_fl", 2, **bad)


def test_active_fl_refresh_lock_in_and_diagnostics():
    """FedCVR-Bolt's setting (alpha1 = 0.8, alpha2 = 1, alpha3 = 0): with the paper's refresh
    (participants only) the first round's m clients are drawn forever; with every available
    client's valuation fresh, the kept set is the top ``(1 - alpha1) n`` by valuation, and the
    diagnostics match a NumPy softmax over it."""
    k, m = 20, 2
    n = jnp.asarray(np.arange(1, k + 1) ** 2, jnp.int32)
    loss_of_client = jnp.asarray(np.random.default_rng(3).uniform(0.1, 0.3, k), jnp.float32)
    params = {"w": jnp.zeros(2)}
    spec = SimSpec(k, m, 10, n, params)
    oracle = _fake_oracle(loss_of_client)
    afl = dict(alpha1=0.8, alpha2=1.0, alpha3=0.0)

    def rounds(strat, count=4):
        state = strat.init(jax.random.key(0), spec)
        picked, diags = [], []
        for t in range(count):
            inputs = RoundInputs(jnp.int32(t), jnp.ones(k, bool), params, n)
            sel, state = strat.select(state, inputs, oracle, jax.random.key(t))
            picked.append(sorted(np.asarray(sel.clients).tolist()))
            diags.append({key: np.asarray(v) for key, v in sel.diagnostics.items()})
        return picked, diags

    picked, diags = rounds(make_strategy("active_fl", m, **afl))
    assert all(p == picked[0] for p in picked)  # locked onto the first round's clients
    assert [float(d["kept"]) for d in diags] == [0.0, m, m, m]

    picked, diags = rounds(make_strategy("active_fl", m, refresh="available", **afl))
    v = np.sqrt(np.asarray(n, np.float64)) * np.asarray(loss_of_client)  # sqrt(n) * mean loss
    kept = np.argsort(v)[int(0.8 * k) :]
    q = np.zeros(k)
    q[kept] = np.exp(v[kept] - v[kept].max())
    q /= q.sum()
    d = diags[0]
    assert float(d["kept"]) == len(kept) == 4
    np.testing.assert_allclose(d["law"], q, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(d["top_mass"], np.sort(q)[-m:].sum(), rtol=1e-4)
    ent = -np.sum(q[kept] * np.log(q[kept])) / np.log(len(kept))
    np.testing.assert_allclose(d["soft_entropy_ratio"], ent, rtol=1e-4)
    np.testing.assert_allclose(d["logit_spread"], np.ptp(v[kept]), rtol=1e-4)
    assert all(set(p) <= set(kept.tolist()) for p in picked)  # only the top 4 are drawn


# ---------------------------------------------------------------- IFCA / FeSEM pieces


def test_assignments_and_cluster_average_match_numpy():
    rng = np.random.default_rng(1)
    losses = rng.normal(size=(3, 7)).astype(np.float32)
    losses[:, 0] = 1.0  # a tie: lowest index
    np.testing.assert_array_equal(
        np.asarray(assign_by_loss(jnp.asarray(losses))), np.argmin(losses, 0)
    )
    feats = rng.normal(size=(6, 4)).astype(np.float32)
    centers = rng.normal(size=(3, 4)).astype(np.float32)
    ref = np.argmin(((feats[:, None] - centers[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(
        np.asarray(nearest_center(jnp.asarray(feats), jnp.asarray(centers))), ref
    )
    models = {"w": jnp.asarray(rng.normal(size=(3, 2, 2)), jnp.float32)}
    slots = {"w": jnp.asarray(rng.normal(size=(5, 2, 2)), jnp.float32)}
    assign = np.array([0, 2, 0, 2, 1])
    mask = np.array([True, True, True, False, False])
    sizes = np.array([1.0, 3.0, 3.0, 5.0, 2.0])
    w = cluster_weights(jnp.asarray(assign), jnp.asarray(mask), jnp.asarray(sizes), 3)
    out = np.asarray(cluster_average(models, slots, w)["w"])
    s = np.asarray(slots["w"])
    np.testing.assert_allclose(out[0], (1 * s[0] + 3 * s[2]) / 4, rtol=1e-6)
    np.testing.assert_allclose(out[2], s[1], rtol=1e-6)  # slot 3 is masked out
    np.testing.assert_allclose(out[1], np.asarray(models["w"])[1])  # no valid slot: unchanged


def test_shuffled_cluster_models_are_permutations():
    params = {"a": jnp.arange(12.0).reshape(3, 4), "b": jnp.zeros(4)}
    models = init_cluster_models(jax.random.key(0), params, 3, "shuffle")
    a = np.asarray(models["a"])
    np.testing.assert_array_equal(a[0], np.asarray(params["a"]))
    for j in (1, 2):
        np.testing.assert_array_equal(np.sort(a[j].ravel()), np.arange(12.0))
    assert not np.array_equal(a[1], a[2])
    assert np.all(np.asarray(models["b"]) == 0.0)
    with pytest.raises(ConfigError, match="num_clusters"):
        make_strategy("ifca", 2, num_clusters=0)
    with pytest.raises(ConfigError, match="init"):
        make_strategy("fesem", 2, init="zeros")


# ---------------------------------------------------------------- planted clusters in the engine


def label_flip_dataset(num_clients=12, per_client=60, seed=0):
    """Two planted client groups: ``y = 1[x_0 > 0]`` for even clients, flipped for odd."""
    rng = np.random.default_rng(seed)
    client = np.repeat(np.arange(num_clients), per_client)
    x = rng.normal(size=(len(client), 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    y = np.where(client % 2 == 1, 1 - y, y).astype(np.int32)
    return assemble(
        "flip",
        x,
        y,
        partition_by_client(client, num_clients),
        rng=rng,
        test_fraction=0.25,
        layout="padded",
        task="classification",
        num_classes=2,
        default_model="logreg",
        info={},
    )


@pytest.mark.parametrize("name", ["ifca", "fesem"])
def test_clustered_methods_recover_planted_groups(name):
    ds = label_flip_dataset()
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=2)
    kw = {"num_clusters": 2} if name == "ifca" else {"num_clusters": 2, "sketch": "all"}
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy(name, 6, **kw),
        local=LocalConfig(local_steps=10, batch_size=16),
        per_round=6,
    )
    sim = Simulation(spec, ds, num_rounds=15, chunk_size=15)
    state, _ = sim.run_rounds(sim.init(seed=0, hparams=HParams.of(0.5)), 15)
    out = sim.evaluate(state)
    # one global logistic model cannot fit both groups (about 50%); one model per group can
    assert out["client_test_accuracy_mean"] > 0.85
    assert out["test_accuracy"] < 0.75
    assert int(out["clusters_used"]) == 2
