"""Device profiles and the virtual clock against an independent reference: FedScale's
completion time, the round's duration, deadlines with partial work, over-commitment, dropouts,
and every strategy under the same rules."""

from __future__ import annotations

import functools
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import load_dataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.phases import select_phase, train_phase
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.system import (
    SYSTEMS,
    client_work,
    durations,
    from_spec,
    lognormal,
    model_kbit,
    normal,
    overcommitted,
    round_timing,
)
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, Parallel


def np_round(mask, compute, comm, steps, alive, keep_count, deadline):
    """The round's rules written out: live slots sorted by full duration, the first
    ``keep_count`` kept; with a deadline, a late kept slot does the steps that fit before it
    (none: it sends nothing) and the round lasts until the deadline."""
    full = compute + comm
    live = [i for i in range(len(mask)) if mask[i] and alive[i]]
    kept = sorted(live, key=lambda i: (full[i], i))[:keep_count]
    limit = {i: int(steps[i]) for i in kept}
    length = max((full[i] for i in kept), default=0.0)
    if deadline is not None:
        late = [i for i in kept if full[i] > deadline]
        for i in late:
            per_step = compute[i] / steps[i]
            limit[i] = max(0, min(int(steps[i]), int(np.floor((deadline - comm[i]) / per_step))))
        kept = [i for i in kept if limit[i] > 0]
        length = deadline if late else max((full[i] for i in kept), default=0.0)
    return sorted(kept), {i: limit[i] for i in kept}, length


def test_completion_time_is_fedscales():
    ms, kbps = jnp.array([100.0, 40.0]), jnp.array([1000.0, 500.0])
    samples, steps = client_work(jnp.array([50, 7]), 10, 6, None)
    np.testing.assert_array_equal(samples, [60, 42])  # a small client's batch is its data
    compute, comm = durations(ms, kbps, samples, 3200.0)
    np.testing.assert_allclose(compute, [3 * 60 * 100 / 1000, 3 * 42 * 40 / 1000])
    np.testing.assert_allclose(comm, [2 * 3200 / 1000, 2 * 3200 / 500])
    samples, steps = client_work(jnp.array([50, 7]), 10, None, 2)
    np.testing.assert_array_equal(samples, [100, 14])
    np.testing.assert_array_equal(steps, [10, 2])
    assert model_kbit({"w": jnp.zeros((10, 10)), "b": jnp.zeros(10)}) == pytest.approx(3.52)


def test_lognormal_profiles_have_their_medians():
    state = lognormal(compute_ms=100.0, bandwidth_kbps=1000.0).init(jax.random.key(0), 40000)
    assert abs(np.median(np.asarray(state.ms_per_example)) / 100.0 - 1) < 0.03
    assert abs(np.median(np.asarray(state.bandwidth_kbps)) / 1000.0 - 1) < 0.03
    model = lognormal(noise=0.3)
    ms, _ = model.step(state, jax.random.key(1))
    ratio = np.log(np.asarray(ms) / np.asarray(state.ms_per_example))
    assert abs(ratio.std() - 0.3) < 0.01  # per-round jitter of the given spread


def test_normal_profiles_have_their_mean_spread_and_floor():
    """Away from the floor the draws are N(mean, std); a spread wide enough to cross zero is
    clipped at 5% of the mean: exactly the share of a normal below it sits on the floor."""
    from scipy import stats

    n = 40000
    state = normal(compute_ms=150.0, std=30.0, bandwidth_kbps=2200.0, bandwidth_std=400.0).init(
        jax.random.key(0), n
    )
    ms, bw = np.asarray(state.ms_per_example), np.asarray(state.bandwidth_kbps)
    assert abs(ms.mean() - 150.0) < 0.6 and abs(ms.std() - 30.0) < 0.5
    assert abs(bw.mean() - 2200.0) < 8.0 and abs(bw.std() - 400.0) < 6.0
    wide = normal(compute_ms=100.0, std=80.0, bandwidth_kbps=1000.0, bandwidth_std=900.0)
    state = wide.init(jax.random.key(1), n)
    for values, mean, std in ((state.ms_per_example, 100.0, 80.0),
                              (state.bandwidth_kbps, 1000.0, 900.0)):  # fmt: skip
        v = np.asarray(values)
        floor = 0.05 * mean
        assert v.min() == pytest.approx(floor)  # clipped, never below
        share = float(np.mean(v == np.float32(floor)))
        assert share == pytest.approx(stats.norm.cdf((floor - mean) / std), abs=0.006)
        above = v[v > floor]  # the unclipped part is the normal's upper part
        assert np.median(above) == pytest.approx(
            mean + std * stats.norm.ppf(0.5 + 0.5 * stats.norm.cdf((floor - mean) / std)),
            rel=0.02,
        )


@pytest.mark.parametrize("deadline", [None, 25.0, 8.0])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_round_timing_against_the_written_rules(deadline, dropout):
    rng = np.random.default_rng(0)
    for trial in range(20):
        n = 9
        mask = rng.random(n) < 0.85
        compute = rng.uniform(1, 30, n)
        comm = rng.uniform(0.5, 4, n)
        steps = rng.integers(1, 12, n)
        key = jax.random.key(trial)
        alive = np.asarray(jax.random.uniform(key, (n,)) >= dropout)
        t = round_timing(
            jnp.asarray(mask), jnp.asarray(compute, jnp.float32), jnp.asarray(comm, jnp.float32),
            jnp.asarray(steps), key, keep_count=5, deadline=deadline, dropout=dropout,
        )  # fmt: skip
        kept, limits, length = np_round(mask, compute, comm, steps, alive, 5, deadline)
        assert np.flatnonzero(np.asarray(t.keep)).tolist() == kept
        assert {i: int(t.step_limit[i]) for i in kept} == limits
        assert float(t.duration) == pytest.approx(length, rel=1e-5)
        assert int(t.dropped) == int(np.sum(mask & ~alive))


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=16, partition="dirichlet:0.5", seed=0)


def _sim(ds, strategy="uniform", **kw):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    per_round = kw.pop("per_round", 4)
    slots = overcommitted(per_round, kw.get("overcommit", 1.0), ds.num_clients)
    spec = RoundSpec.create(ds, model, make_strategy(strategy, slots), per_round=per_round,
                            local=LocalConfig(batch_size=8, local_steps=6), **kw)  # fmt: skip
    return Simulation(spec, ds, num_rounds=10, chunk_size=5)


def _lr():
    return HParams.of(0.1)


def test_simulation_clock_follows_the_profiles(digits):
    """The engine's round: durations from the profile and each client's work, the slowest
    kept client sets the round, over-commitment keeps the first finishers, the clock sums."""
    sim = _sim(digits, system=lognormal(sigma=1.0), overcommit=1.5)
    state = sim.init(0, hparams=_lr())
    ms, kbps = (
        np.asarray(state.system_state.ms_per_example),
        np.asarray(state.system_state.bandwidth_kbps),
    )
    counts = np.asarray(digits.train.counts)
    full = 3 * 6 * np.minimum(counts, 8) * ms / 1000 + 2 * sim.spec.kbit / kbps
    state, logs = sim.run_rounds(state, 10)
    assert sim.spec.slots == 6 and np.all(logs.num_selected == 4)
    for c, m, d in zip(logs.clients, logs.mask, logs.duration, strict=True):
        kept = c[m]
        assert float(d) == pytest.approx(full[kept].max(), rel=1e-5)
    assert float(state.sim_time) == pytest.approx(float(np.sum(logs.duration)), rel=1e-5)


def test_stragglers_contribute_their_completed_steps(digits):
    """Under a deadline a straggler's update is exactly the update of its first k steps (the
    prefix of its full work): training it with the step limit equals training it alone with
    k local steps."""
    sim = _sim(digits, system=lognormal(sigma=1.0), deadline=20.0)
    state = sim.init(0, hparams=_lr())
    state, selection, _ = jax.jit(functools.partial(select_phase, sim.spec))(state, sim.data)
    t = selection.timing
    limits = np.asarray(t.step_limit)[np.asarray(selection.mask)]
    assert np.any(limits < 6), "pick a deadline that cuts somebody"
    result = train_phase(sim.spec, state, sim.data, selection)
    np.testing.assert_array_equal(np.asarray(result.num_steps)[np.asarray(selection.mask)], limits)
    k = int(limits.min())
    slot = int(np.flatnonzero(np.asarray(selection.mask))[np.argmin(limits)])
    short = make_trainer_for(sim, k).train(
        state.params, sim.data.train, selection.clients[slot : slot + 1], jnp.ones(1, bool),
        jax.random.fold_in(jax.random.fold_in(state.key, state.round), 2), hparams=_lr(),
    )  # fmt: skip
    for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(short.params), strict=True):
        np.testing.assert_allclose(a[slot], b[0], rtol=1e-5, atol=1e-6)


def make_trainer_for(sim, steps):
    from fedjax_sel.training import make_trainer

    local = sim.spec.local._replace(local_steps=steps)
    return make_trainer(sim.spec.model, local, sim.dataset.train.n_max, parallel=Parallel("vmap"))


def test_dropouts_send_nothing_and_weights_are_renormalised(digits):
    sim = _sim(digits, dropout=0.4, strategy="uniform")
    state, logs = sim.run_rounds(sim.init(0, hparams=_lr()), 10)
    assert 0 < int(np.sum(logs.dropped)) < 40
    np.testing.assert_array_equal(logs.num_selected + logs.dropped, 4)
    for w, m in zip(logs.weights, logs.mask, strict=True):
        if m.any():
            assert float(np.sum(w[m])) == pytest.approx(1.0, rel=1e-5)
        assert not np.any(w[~m])


def test_fedscale_device_capacity_file(tmp_path):
    profiles = {f"c{i}": {"computation": 50.0 + i, "communication": 1000.0 * (i + 1)}
                for i in range(3)}  # fmt: skip
    path = tmp_path / "capacity.pkl"
    path.write_bytes(pickle.dumps(profiles))
    model = from_spec(f"fedscale:path={path}")
    state = model.init(jax.random.key(0), 5)  # 5 clients over 3 profiles: k mod 3
    np.testing.assert_allclose(state.ms_per_example, [50, 51, 52, 50, 51])
    np.testing.assert_allclose(state.bandwidth_kbps, [1000, 2000, 3000, 1000, 2000])
    (tmp_path / "bad.pkl").write_bytes(pickle.dumps({"a": {"computation": 1.0}}))
    with pytest.raises(ConfigError, match="'computation' and 'communication'"):
        from_spec(f"fedscale:path={tmp_path / 'bad.pkl'}")
    with pytest.raises(ConfigError, match="does not exist"):
        from_spec("fedscale:path=/nonexistent.pkl")


def test_bad_settings_are_named(digits):
    with pytest.raises(ConfigError, match="needs device profiles"):
        _sim(digits, deadline=10.0)
    with pytest.raises(ConfigError, match="dropout must lie in"):
        _sim(digits, dropout=1.0)
    with pytest.raises(ConfigError, match="sigma"):
        SYSTEMS.from_spec("lognormal:sigma=-1")
