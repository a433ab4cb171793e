"""FilFL (Algorithm 1) as a strategy: schedule, planted filtering, composition with the inner
selectors, identity of the pre-trained slots with the round's own training (FedAvg and
FedProx), filtering-set options, the ``subset`` availability model and the CLI."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import from_spec
from fedjax_sel.base import ClientOracle, ConfigError, RoundInputs, SimSpec, TrainResult
from fedjax_sel.data import load_dataset
from fedjax_sel.models import make_model
from fedjax_sel.simulation import Simulation
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import LocalConfig
from fedjax_sel.training import evaluate as ev

K, D = 12, 3
TARGET = np.array([1.0, -2.0, 0.5], np.float32)


# ----------------------------------------------------------------------------- a planted oracle
def planted_oracle(bad: list[int], noise: float = 0.05, seed: int = 0) -> ClientOracle:
    """Local training moves client k to ``TARGET + e_k`` (small ``e_k``), or far away for the
    ``bad`` clients; the server loss is the squared distance to ``TARGET``."""
    rng = np.random.default_rng(seed)
    ends = TARGET + noise * rng.normal(size=(K, D)).astype(np.float32)
    drift = np.array([1.0, 1.0, -1.0], np.float32)  # bad clients all drift the same way, so
    for b in bad:  # removing any of them from Y helps (b_i > 0) and RGF rejects it surely
        ends[b] = TARGET + 50.0 * (drift + 0.1 * rng.normal(size=D).astype(np.float32))
    ends = jnp.asarray(ends)

    def train(params, clients, key, active=None):
        del key
        active = jnp.ones(clients.shape, bool) if active is None else active
        p = jnp.where(active[:, None], ends[clients], params["w"][None])
        z = jnp.zeros(clients.shape, jnp.float32)
        return TrainResult({"w": p}, z, z, z, active.astype(jnp.int32))

    def server_loss(params, size=None):
        del size
        return jnp.sum(jnp.square(params["w"] - TARGET))

    def unused(*a, **k):
        raise AssertionError("not used by this test")

    def loss(params, clients, key=None):  # PoC: the distance of the global model (uniform)
        return jnp.zeros(clients.shape, jnp.float32) + jnp.arange(clients.shape[0]) * 0.0

    return ClientOracle(
        loss=loss,
        batch_loss=unused,
        all_losses=unused,
        train=train,
        train_key=jax.random.key(7),
        server_loss=server_loss,
        client_test_loss=lambda p, c: jnp.full(c.shape, server_loss(p)),
    )


def spec(num_rounds=20, per_round=3) -> SimSpec:
    return SimSpec(K, per_round, num_rounds, jnp.full((K,), 10, jnp.int32), {"w": jnp.zeros(D)})


def inputs(round_, available, params=None) -> RoundInputs:
    params = {"w": jnp.zeros(D)} if params is None else params
    return RoundInputs(jnp.int32(round_), jnp.asarray(available), params, jnp.full((K,), 10))


def test_planted_bad_clients_are_filtered_out_and_never_selected():
    """With R(empty) = -F_V(w_t), a client whose model is far off (huge weights) is rejected
    wherever it comes in the order (with the default infeasible empty set the first considered
    client is always kept: see the next test)."""
    bad = [1, 4, 9]
    oracle = planted_oracle(bad)
    for variant, inner in (("dgf", "uniform"), ("rgf", "power_of_choice"), ("rgf", "divfl")):
        strat = make_strategy("filfl", 3, variant=variant, inner=inner, empty_value="global")
        state = strat.init(jax.random.key(0), spec())
        select = jax.jit(lambda s, i, k, strat=strat: strat.select(s, i, oracle, k))
        for t in range(3):
            avail = np.ones(K, bool)
            sel, state = select(state, inputs(t, avail), jax.random.key(t))
            filtered = np.asarray(state.filtered)
            assert not filtered[bad].any(), (variant, inner)
            assert filtered.sum() >= K - len(bad) - 2  # good clients are (mostly) kept
            chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
            assert len(chosen) == 3 and filtered[chosen].all()
            # the pre-trained results of the chosen slots are the clients' local models
            np.testing.assert_allclose(
                np.asarray(sel.train_result.params["w"])[np.asarray(sel.mask)],
                np.asarray(
                    oracle.train({"w": jnp.zeros(D)}, jnp.asarray(chosen), None).params["w"]
                ),
            )


def test_infeasible_empty_set_keeps_only_the_first_considered_bad_client():
    bad = [1, 4, 9]
    oracle = planted_oracle(bad)
    strat = make_strategy("filfl", 3, variant="dgf")  # empty_value="infeasible"
    state = strat.init(jax.random.key(0), spec())
    kept_bad = 0
    for t in range(12):
        _, state = strat.select(state, inputs(5 * t, np.ones(K, bool)), oracle, jax.random.key(t))
        filtered = np.asarray(state.filtered)
        kept_bad += int(filtered[bad].sum())
        assert filtered[bad].sum() <= 1 and filtered.sum() >= 1
    assert kept_bad <= 6  # each bad client is kept only when drawn first: 1/4 of the rounds


def test_schedule_filters_every_period_and_on_availability_change():
    oracle = planted_oracle([])
    strat = make_strategy("filfl", 2, period=4, variant="dgf")
    state = strat.init(jax.random.key(0), spec(num_rounds=12))
    select = jax.jit(lambda s, i, k: strat.select(s, i, oracle, k))
    rng = np.random.default_rng(0)
    avail = np.ones(K, bool)
    expected = []
    for t in range(12):
        changed = t in (6, 7)  # the available set changes at rounds 6 and 7
        if changed:
            avail = rng.uniform(size=K) < 0.7
        expected.append(t == 0 or t % 4 == 0 or changed)
        sel, state = select(state, inputs(t, avail), jax.random.key(t))
        chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
        assert avail[chosen].all() and np.asarray(state.filtered)[chosen].all()
    size = np.asarray(state.log.size)
    np.testing.assert_array_equal(size >= 0, expected)
    considered = np.asarray(state.log.considered)
    assert considered[0] == K and considered[7] == avail.sum()


def test_small_filtered_set_is_taken_whole_and_considered_subsample():
    # 2 good clients: |S^f| = 2 <= per_round = 4 -> both selected, no inner selection
    bad = [k for k in range(K) if k not in (3, 8)]
    oracle = planted_oracle(bad)
    strat = make_strategy("filfl", 4, variant="dgf", inner="power_of_choice", empty_value="global")
    state = strat.init(jax.random.key(0), spec(per_round=4))
    sel, state = strat.select(state, inputs(0, np.ones(K, bool)), oracle, jax.random.key(1))
    chosen = sorted(np.asarray(sel.clients)[np.asarray(sel.mask)].tolist())
    assert chosen == [3, 8]
    np.testing.assert_allclose(np.asarray(sel.weights)[np.asarray(sel.mask)], 0.5)
    # considered = n < available: exactly n clients train, the filtered set lies among them
    strat = make_strategy("filfl", 2, considered=5, variant="rgf")
    state = strat.init(jax.random.key(0), spec(per_round=2))
    _, state = strat.select(
        state, inputs(0, np.ones(K, bool)), planted_oracle([]), jax.random.key(2)
    )
    assert int(state.log.considered[0]) == 5 and 1 <= int(np.asarray(state.filtered).sum()) <= 5


def test_empty_filtered_set_rules():
    # every average of local models is worse than the global one (at TARGET, loss 0): the
    # greedy keeps nobody
    oracle = planted_oracle([], noise=1.0)
    at_target = {"w": jnp.asarray(TARGET)}
    for if_empty, expect in (("none", 0), ("all", K)):
        strat = make_strategy("filfl", 3, variant="dgf", empty_value="global", if_empty=if_empty)
        state = strat.init(jax.random.key(0), spec())
        sel, state = strat.select(
            state, inputs(0, np.ones(K, bool), at_target), oracle, jax.random.key(0)
        )
        assert int(np.asarray(state.filtered).sum()) == expect
        assert int(np.asarray(sel.mask).sum()) == min(expect, 3)
    # with the reference code's R(empty) = -10 (losses here are ~3) or an infeasible empty set
    # (the default) somebody is kept
    for empty_value in ("code", "infeasible"):
        strat = make_strategy("filfl", 3, variant="dgf", empty_value=empty_value)
        state = strat.init(jax.random.key(0), spec())
        _, state = strat.select(
            state, inputs(0, np.ones(K, bool), at_target), oracle, jax.random.key(0)
        )
        assert int(np.asarray(state.filtered).sum()) >= 1


def test_track_opt_logs_greedy_and_optimum():
    oracle = planted_oracle([2], noise=0.5)
    strat = make_strategy("filfl", 3, variant="rgf", track_opt=True, considered=8)
    state = strat.init(jax.random.key(0), spec())
    _, state = strat.select(state, inputs(0, np.ones(K, bool)), oracle, jax.random.key(3))
    log = jax.tree.map(lambda x: np.asarray(x)[0], state.log)
    assert log.value_opt >= max(log.value_dgf, log.value_rgf, log.value_all) - 1e-5
    assert log.value == log.value_rgf
    assert np.isfinite([log.value_dgf, log.value_rgf, log.value_opt, log.value_empty]).all()


def test_config_errors():
    with pytest.raises(ConfigError, match="inner selector"):
        make_strategy("filfl", 3, inner="filfl")
    with pytest.raises(ConfigError, match="key=value"):
        make_strategy("filfl", 3, inner_args="d")
    with pytest.raises(ConfigError, match="no hyperparameter"):
        make_strategy("filfl", 3, inner="uniform", inner_args="d=3")
    with pytest.raises(ConfigError, match="variant"):
        make_strategy("filfl", 3, variant="best")
    with pytest.raises(ConfigError, match="period"):
        make_strategy("filfl", 3, period=0)
    with pytest.raises(ConfigError, match="filter_size"):
        make_strategy("filfl", 3, filter_data="client", filter_size=5)
    with pytest.raises(ConfigError, match="considered=13"):
        make_strategy("filfl", 3, considered=13).init(jax.random.key(0), spec())
    with pytest.raises(ConfigError, match="track_opt"):
        make_strategy("filfl", 3, track_opt=True).init(
            jax.random.key(0), spec()._replace(num_clients=17)
        )
    with pytest.raises(ConfigError, match="subset availability n=20"):
        from_spec("subset:n=20").init(jax.random.key(0), 10)
    with pytest.raises(ConfigError, match="every"):
        from_spec("subset:n=2,every=0")


# ----------------------------------------------------------------------------- real simulation
@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=K, seed=0, test_fraction=0.2, server_fraction=0.1)


def _sim(ds, strategy, prox_mu=0.0, parallel="vmap", availability="subset:n=8,every=3"):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    return Simulation(
        ds,
        model,
        strategy,
        local=LocalConfig(batch_size=16, lr=0.2, local_steps=3, prox_mu=prox_mu),
        per_round=3,
        num_rounds=6,
        availability=from_spec(availability),
        parallel=parallel,
        chunk_size=2,
    )


@pytest.mark.parametrize("prox_mu, parallel", [(0.0, "vmap"), (0.5, "map")])
def test_pretrained_slots_equal_the_rounds_own_training(digits, prox_mu, parallel):
    """FilFL trains every considered client before filtering; aggregating the selected slots'
    results must give exactly what the round would compute by training them itself."""
    sim = _sim(
        digits, make_strategy("filfl", 3, inner="power_of_choice", period=2), prox_mu, parallel
    )
    state = sim.init(seed=1)

    @jax.jit
    def check(state, data):
        _, sel, _ = sim._select_phase(state, data)
        _, _, k_train = sim._round_keys(state)
        own = sim.trainer(state.params, data.train, sel.clients, sel.mask, k_train)
        new_state, _ = sim.round_fn(state, data)
        expect = jax.tree.map(
            lambda g, p: g + jnp.tensordot(sel.weights * sel.mask, p - g[None], axes=1),
            state.params,
            own.params,
        )
        return sel.train_result, own, new_state, expect

    for _ in range(3):  # a filtering round, a regular round, a filtering round
        pretrained, own, new_state, expect = check(state, sim.data)
        for a, b in zip(jax.tree.leaves(pretrained), jax.tree.leaves(own), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expect), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        state = new_state


def test_filter_size_and_client_filtering_set(digits):
    model = make_model("logreg", input_shape=digits.input_shape, num_classes=10)
    sim = _sim(digits, make_strategy("filfl", 3, filter_size=7, empty_value="global"))
    state, _ = sim.run_rounds(sim.init(seed=0), 1)
    # R(empty) = -F_V(w_0) on 7 server examples spread evenly over the set
    m = digits.server_x.shape[0]
    idx = (np.arange(7) * m) // 7
    params0 = sim.init(seed=0).params
    logits = np.asarray(model.apply(params0, digits.server_x[idx]))
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    f_v = -np.mean(logp[np.arange(7), np.asarray(digits.server_y)[idx]])
    np.testing.assert_allclose(float(state.strategy_state.log.value_empty[0]), -f_v, rtol=1e-5)
    # variable filtering set: one considered client's own test split
    sim = _sim(digits, make_strategy("filfl", 3, filter_data="client", empty_value="global"))
    state = sim.init(seed=0)
    state2, _ = sim.run_rounds(state, 1)
    value = float(state2.strategy_state.log.value_empty[0])
    per_client = -np.asarray(
        ev.client_losses(model, state.params, digits.test, jnp.arange(K, dtype=jnp.int32))
    )
    assert np.isclose(per_client, value, rtol=1e-5).any()


def test_subset_availability_statistics():
    model = from_spec("subset:n=4,every=3,warmup=2")
    state = model.init(jax.random.key(0), 10)
    step = jax.jit(model.step)
    masks = []
    for t in range(300):
        avail, state = step(state, jax.random.fold_in(jax.random.key(1), t))
        masks.append(np.asarray(avail))
    masks = np.array(masks)
    assert (masks.sum(1) == 4).all()
    changes = [t for t in range(1, 300) if (masks[t] != masks[t - 1]).any()]
    redraws = [t for t in range(1, 300) if t % 3 == 0 or t < 2]
    assert set(changes) <= set(redraws) and len(changes) >= 0.95 * len(redraws)
    # each client is available 4/10 of the time; 100 redraws -> sd 0.049 per client
    freq = masks[::3].mean(0)
    assert np.all(np.abs(freq - 0.4) < 0.2)
    assert abs(freq.mean() - 0.4) < 1e-6


def test_cli_run_with_filfl(tmp_path):
    from fedjax_sel.cli import main

    out = tmp_path / "run"
    main(
        [
            "run",
            "--strategy",
            "filfl",
            "--strategy-arg",
            "inner=power_of_choice,variant=dgf,period=3,inner_args=d=6,filter_size=20",
            "--dataset",
            "digits",
            "--clients",
            "12",
            "--server-fraction",
            "0.1",
            "--availability",
            "subset:n=8,every=5",
            "--per-round",
            "3",
            "--rounds",
            "4",
            "--eval-every",
            "2",
            "--model",
            "logreg",
            "--local-steps",
            "2",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(1 <= r["filtered_size"] <= 8 for r in rows)
    assert all(len(sel) <= 3 for r in rows for sel in r["selected"])
