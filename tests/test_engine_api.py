"""The engine as a value, outside :class:`Simulation`: ``init_state`` and ``round_fn`` (fedjax's
``init`` and ``apply``) under a plain ``jax.jit`` give the state and the logs of the driver's
own compiled chunks, bit for bit."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from fedjax_sel import engine
from fedjax_sel.availability import bernoulli
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.fedbuff import FedBuff
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.system import lognormal
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, Parallel

ROUNDS = 4


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=12, partition="dirichlet:0.5", seed=0)


def _spec(ds, case: str) -> engine.RoundSpec:
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    if case == "sync":  # momentum kept per client, FedProx, Bernoulli availability
        return engine.RoundSpec.create(
            ds,
            model,
            make_strategy("power_of_choice", 4),
            local=LocalConfig(batch_size=16, local_steps=3, momentum=0.9, prox=True),
            per_round=4,
            availability=bernoulli(0.7),
            persistent_client_state=True,
            parallel=Parallel("vmap"),
        )
    return engine.RoundSpec.create(  # FedBuff on the virtual clock
        ds,
        model,
        make_strategy("uniform", 4),
        local=LocalConfig(batch_size=16, local_steps=2),
        per_round=4,
        system=lognormal(),
        asynchronous=FedBuff(4, 2),
        parallel=Parallel("map"),
    )


def _leaves(tree) -> list[np.ndarray]:
    """The array leaves on the host (a typed PRNG key as its raw key data)."""
    return [
        np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                   else x)
        for x in jax.tree.leaves(tree)
    ]  # fmt: skip


@pytest.mark.parametrize("case", ["sync", "async"])
def test_init_state_and_round_fn_equal_the_simulation(digits, case):
    spec = _spec(digits, case)
    hparams = HParams.of(0.2, prox_mu=0.01 if case == "sync" else 0.0)
    seed = 3
    # the driver: rounds in compiled chunks of 3 (a full and a partial chunk)
    sim = Simulation(spec, digits, num_rounds=ROUNDS, chunk_size=3)
    sim_state, sim_logs = sim.run_rounds(sim.init(seed, hparams=hparams), ROUNDS)
    # the engine alone: the seed's model and key as Simulation.init derives them
    base = jax.random.key(seed)
    params = spec.model.init(jax.random.fold_in(base, 1))
    sim_spec = engine.sim_spec(digits, params, per_round=spec.slots, num_rounds=ROUNDS)
    start = engine.init_state(spec, sim_spec, jax.random.fold_in(base, 2), hparams)
    for a, b in zip(_leaves(start), _leaves(sim.init(seed, hparams=hparams)), strict=True):
        np.testing.assert_array_equal(a, b)
    step = jax.jit(functools.partial(engine.round_fn, spec))
    data = engine.SimData.of(digits)
    state, logs = start, []
    for _ in range(ROUNDS):
        state, log = step(state, data)
        logs.append(jax.tree.map(np.asarray, log))
    assert int(state.round) == ROUNDS
    for a, b in zip(_leaves(state), _leaves(sim_state), strict=True):
        np.testing.assert_array_equal(a, b)
    stacked = jax.tree.map(lambda *x: np.stack(x), *logs)
    for a, b in zip(_leaves(stacked), _leaves(sim_logs), strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.all(stacked.num_selected > 0) and np.all(np.isfinite(stacked.train_loss))
    # the learning rate is traced: another value is another run of the same program
    faster = hparams._replace(lr=hparams.lr * 2)
    other, _ = step(engine.init_state(spec, sim_spec, jax.random.fold_in(base, 2), faster), data)
    first, _ = step(start, data)
    assert not np.array_equal(_leaves(other.params)[0], _leaves(first.params)[0])
    assert step._cache_size() == 1


def test_chunk_fn_scans_round_fn(digits):
    """``chunk_fn`` of ``length`` rounds with ``num_active`` of them run: the active rounds'
    state and logs, the others' logs zero."""
    spec = _spec(digits, "sync")
    hparams = HParams.of(0.2, prox_mu=0.01)
    sim = Simulation(spec, digits, num_rounds=ROUNDS, chunk_size=1)
    start = sim.init(1, hparams=hparams)
    chunk = jax.jit(functools.partial(engine.chunk_fn, spec), static_argnums=2)
    state, logs = chunk(start, sim.data, 3, 2)
    ref, ref_logs = sim.run_rounds(start, 2)
    assert int(state.round) == 2
    for a, b in zip(_leaves(state), _leaves(ref), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(logs.clients)[:2], ref_logs.clients)
    assert not np.any(np.asarray(logs.clients)[2]) and int(logs.num_selected[2]) == 0
