"""FilFL (Algorithm 1) as a strategy: schedule, planted filtering, composition with the inner
selectors, identity of the pre-trained slots with the round's own training (FedAvg and
FedProx), filtering-set options, the ``subset`` availability model and the CLI."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel import engine
from fedjax_sel.availability import from_spec
from fedjax_sel.base import ClientOracle, ConfigError, RoundInputs, SimSpec, TrainResult
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.phases import round_keys, select_phase
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, parse_parallel
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


def test_diagnostics_match_numpy_on_planted_clients():
    """The filter's diagnostics against a NumPy count on planted clients: the local models of
    the ``bad`` clients are far worse than the global model on V (the rest better); ``worse``
    and ``worse_removed`` must equal the count of bad considered clients and of those outside
    S^f (read from the state). With the infeasible empty set (the default) the first considered
    client is always kept, so some rounds keep a bad client: both outcomes are exercised."""
    bad = [1, 4, 9]
    oracle = planted_oracle(bad)
    ends = np.asarray(oracle.train({"w": jnp.zeros(D)}, jnp.arange(K), None).params["w"])
    local_loss = np.sum(np.square(ends - TARGET), axis=1)
    strat = make_strategy("filfl", 3, variant="dgf", period=2)
    state = strat.init(jax.random.key(0), spec())
    select = jax.jit(lambda s, i, k: strat.select(s, i, oracle, k))
    rng = np.random.default_rng(5)
    kept_worse = filtering = 0
    for t in range(16):
        avail = rng.uniform(size=K) < 0.75
        avail[bad[0]] = True  # a bad client is considered in every filtering round
        params = {"w": jnp.asarray(0.1 * rng.normal(size=D), jnp.float32)}
        sel, state = select(state, inputs(t, avail, params), jax.random.key(t))
        d = {k: float(v) for k, v in sel.diagnostics.items() if k != "law"}
        assert d["filter_round"] == 1.0  # the available set changes every round
        filtering += 1
        global_loss = float(np.sum(np.square(np.asarray(params["w"]) - TARGET)))
        worse = avail & (local_loss > global_loss)
        np.testing.assert_array_equal(
            np.flatnonzero(worse), np.intersect1d(bad, np.flatnonzero(avail))
        )
        keep = np.asarray(state.filtered)
        assert keep.sum() >= 1  # the infeasible empty set: S^f is never empty
        assert d["considered"] == avail.sum() and d["kept"] == keep.sum()
        assert d["removed"] == avail.sum() - keep.sum()
        assert d["worse"] == worse.sum() and d["worse_removed"] == (worse & ~keep).sum()
        np.testing.assert_allclose(d["worse_share"], worse.sum() / avail.sum(), rtol=1e-6)
        np.testing.assert_allclose(d["filter_rate"], keep.sum() / avail.sum(), rtol=1e-6)
        np.testing.assert_allclose(d["value_global"], -global_loss, rtol=1e-5)
        # the inner uniform selector's law: uniform over S^f (all available here)
        np.testing.assert_allclose(sel.diagnostics["law"], keep / keep.sum(), rtol=1e-6)
        kept_worse += int(d["worse"] - d["worse_removed"])
    assert filtering == 16 and 0 < kept_worse < 16  # some rounds keep a bad client, most not
    # a regular round (same availability, not a period round) reports zeros
    sel, _ = select(state, inputs(17, avail, params), jax.random.key(99))
    assert all(float(sel.diagnostics[k]) == 0.0 for k in ("filter_round", "worse", "kept"))


def test_state_holds_no_diagnostics():
    """FilFL's state is S^f, S_{t-1}, a flag and the inner selector's state: nothing grows
    with the number of rounds (the per-round record lives in ``Selection.diagnostics``)."""
    from fedjax_sel.strategies.filfl import FilFLState

    assert FilFLState._fields == ("filtered", "last_available", "has_filter", "inner")
    strat = make_strategy("filfl", 3, inner="power_of_choice", track_opt=True, considered=8)
    short = strat.init(jax.random.key(0), spec(num_rounds=5))
    long = strat.init(jax.random.key(0), spec(num_rounds=500))
    shapes = lambda s: [x.shape for x in jax.tree.leaves(s)]  # noqa: E731
    assert shapes(short) == shapes(long)
    sel, after = strat.select(
        short, inputs(0, np.ones(K, bool)), planted_oracle([2]), jax.random.key(1)
    )
    assert jax.tree.structure(after) == jax.tree.structure(short)
    assert shapes(after) == shapes(short)
    assert set(sel.diagnostics) >= {"filter_rate", "worse_share", "worse_removed", "ratio_dgf"}


def test_schedule_filters_every_period_and_on_availability_change():
    oracle = planted_oracle([])
    strat = make_strategy("filfl", 2, period=4, variant="dgf")
    state = strat.init(jax.random.key(0), spec(num_rounds=12))
    select = jax.jit(lambda s, i, k: strat.select(s, i, oracle, k))
    rng = np.random.default_rng(0)
    avail = np.ones(K, bool)
    expected, filtered_rounds, considered = [], [], []
    for t in range(12):
        changed = t in (6, 7)  # the available set changes at rounds 6 and 7
        if changed:
            avail = rng.uniform(size=K) < 0.7
        expected.append(t == 0 or t % 4 == 0 or changed)
        sel, state = select(state, inputs(t, avail), jax.random.key(t))
        chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
        assert avail[chosen].all() and np.asarray(state.filtered)[chosen].all()
        filtered_rounds.append(float(sel.diagnostics["filter_round"]) == 1.0)
        considered.append(int(sel.diagnostics["considered"]))
    np.testing.assert_array_equal(filtered_rounds, expected)
    assert considered[0] == K and considered[7] == avail.sum() and considered[1] == 0


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
    sel, state = strat.select(
        state, inputs(0, np.ones(K, bool)), planted_oracle([]), jax.random.key(2)
    )
    assert int(sel.diagnostics["considered"]) == 5
    assert 1 <= int(np.asarray(state.filtered).sum()) <= 5


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
    sel, _ = strat.select(state, inputs(0, np.ones(K, bool)), oracle, jax.random.key(3))
    d = {k: float(v) for k, v in sel.diagnostics.items() if k != "law"}
    assert d["value_opt"] >= max(d["value_dgf"], d["value_rgf"], d["value_all"]) - 1e-5
    assert d["value"] == d["value_rgf"]
    assert "value_empty" not in d  # infeasible: R(empty) is VALUE_FLOOR, not logged
    assert np.isfinite([d["value_dgf"], d["value_rgf"], d["value_opt"]]).all()
    for v in ("dgf", "rgf"):  # Fig. 11's ratio on f = 10 - F_V, and the offset-free one
        np.testing.assert_allclose(
            d[f"ratio_{v}"], (10 + d[f"value_{v}"]) / (10 + d["value_opt"]), rtol=1e-6
        )
        np.testing.assert_allclose(
            d[f"loss_ratio_{v}"], d["value_opt"] / d[f"value_{v}"], rtol=1e-6
        )
        assert 0 < d[f"ratio_{v}"] <= 1 + 1e-6 and 0 < d[f"loss_ratio_{v}"] <= 1 + 1e-6


def test_config_errors():
    with pytest.raises(ConfigError, match="inner=.filfl. is not a valid choice"):
        make_strategy("filfl", 3, inner="filfl")
    with pytest.raises(ConfigError, match="key=value"):
        make_strategy("filfl", 3, inner_args="d")
    with pytest.raises(ConfigError, match="has no option"):
        make_strategy("filfl", 3, inner="uniform", inner_args="d=3")
    with pytest.raises(ConfigError, match="variant"):
        make_strategy("filfl", 3, variant="best")
    with pytest.raises(ConfigError, match="period"):
        make_strategy("filfl", 3, period=0)
    with pytest.raises(ConfigError, match="filter_size"):
        make_strategy("filfl", 3, filter_data="client", filter_size=5)
    # n is a cap: more than the K clients considers every client, as n = 0 does
    capped = make_strategy("filfl", 3, considered=10**6).init(jax.random.key(0), spec())
    whole = make_strategy("filfl", 3, considered=0).init(jax.random.key(0), spec())
    assert jax.tree.map(jnp.shape, capped) == jax.tree.map(jnp.shape, whole)
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


def _sim(ds, strategy, prox=False, parallel="vmap", availability="subset:n=8,every=3"):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    spec = engine.RoundSpec.create(
        ds,
        model,
        strategy,
        local=LocalConfig(batch_size=16, local_steps=3, prox=prox),
        per_round=3,
        availability=from_spec(availability),
        parallel=parse_parallel(parallel),
    )
    return Simulation(spec, ds, num_rounds=6, chunk_size=2)


def _hparams(prox_mu=0.0):
    return HParams.of(0.2, prox_mu=prox_mu)


@pytest.mark.parametrize("prox_mu, parallel", [(0.0, "vmap"), (0.5, "map")])
def test_pretrained_slots_equal_the_rounds_own_training(digits, prox_mu, parallel):
    """FilFL trains every considered client before filtering; aggregating the selected slots'
    results must give exactly what the round would compute by training them itself."""
    sim = _sim(
        digits, make_strategy("filfl", 3, inner="power_of_choice", period=2), prox_mu > 0, parallel
    )
    state = sim.init(seed=1, hparams=_hparams(prox_mu))

    @jax.jit
    def check(state, data):
        _, sel, _ = select_phase(sim.spec, state, data)
        _, _, k_train = round_keys(state)
        own = sim.spec.trainer.train(
            state.params, data.train, sel.clients, sel.mask, k_train, hparams=state.hparams
        )
        new_state, _ = engine.round_fn(sim.spec, state, data)
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
    _, logs = sim.run_rounds(sim.init(seed=0, hparams=_hparams()), 1)
    # R(empty) = -F_V(w_0) on 7 server examples spread evenly over the set
    m = digits.server_x.shape[0]
    idx = (np.arange(7) * m) // 7
    params0 = sim.init(seed=0, hparams=_hparams()).params
    logits = np.asarray(model.apply(params0, digits.server_x[idx]))
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    f_v = -np.mean(logp[np.arange(7), np.asarray(digits.server_y)[idx]])
    np.testing.assert_allclose(float(logs.diagnostics["value_empty"][0]), -f_v, rtol=1e-5)
    np.testing.assert_allclose(float(logs.diagnostics["value_global"][0]), -f_v, rtol=1e-5)
    # variable filtering set: one considered client's own test split
    sim = _sim(digits, make_strategy("filfl", 3, filter_data="client", empty_value="global"))
    state = sim.init(seed=0, hparams=_hparams())
    _, logs = sim.run_rounds(state, 1)
    value = float(logs.diagnostics["value_empty"][0])
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
    from fedjax_sel.cli.main import main

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
    # the filter's diagnostics reach metrics.jsonl (chunk means: rounds 0 and 3 filter)
    diag = [r["diagnostics"] for r in rows]
    assert [d["filter_round"] for d in diag] == [0.5, 0.5]
    for d in diag:
        assert 0 < d["filter_rate"] <= d["filter_round"] and d["considered"] == 0.5 * 8
        assert 0 <= d["worse_removed"] <= d["worse"] <= d["considered"]
    assert all(len(sel) <= 3 for r in rows for sel in r["selected"])
