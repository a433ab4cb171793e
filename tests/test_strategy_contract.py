"""One contract for every registered strategy (design section 4).

Shapes, no duplicate picks, never an unavailable client, finite non-negative weights,
deterministic for a key (a fresh trace of a new strategy object picks the same clients),
strategy-state structure unchanged by update, and one trace of the round across rounds; for
every registered strategy with its defaults and for the variants that change its code path.
The clients train one after another (``map``), so a strategy that declares it does not read
the slots' models (``reads_deltas=False``) gets none: its round aggregates as it trains.
"""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from fedjax_sel import engine
from fedjax_sel.availability import markov
from fedjax_sel.data import load_dataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.phases import select_phase, streams_aggregate
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.models import make_model
from fedjax_sel.strategies import STRATEGIES, make_strategy
from fedjax_sel.training import HParams, LocalConfig, Parallel

K = 12


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(
        "digits",
        num_clients=K,
        partition="dirichlet:0.5",
        seed=0,
        test_fraction=0.2,
        server_fraction=0.1,
    )


# hyperparameter variants that take another code path than the defaults
VARIANTS = [
    ("filfl", {"inner": "power_of_choice"}),
    ("filfl", {"inner": "divfl"}),
    ("filfl", {"variant": "dgf"}),
    ("oort", {"preset": "fedscale"}),
    ("hetero_select", {"scoring": "multiplicative"}),
    ("power_of_choice", {"variant": "cpow"}),
    ("power_of_choice", {"variant": "rpow"}),
    ("f3ast", {"variant": "reference"}),
    ("fedcvr_bolt", {"beta": 0.0}),
    ("fedcvr_bolt", {"value_scale": "standardized"}),
    ("active_fl", {"refresh": "available"}),
    # greedy from round 1, GP rounds (extra random round, retraining) from round 2
    ("fedcor", {"warmup": 0, "gpr_interval": 1, "final_iterations": 5, "gp_iterations": 5}),
    ("fedcor", {"warmup": 0, "gpr_interval": 1, "solver": "dense", "update_mean": False}),
    ("pyramidfl", {"ranking": "gradient", "gradient_utility": "delta", "keep": 3}),
    ("clustered_similarity", {"pool": 6, "sketch_dim": 20}),
    ("clustered_similarity", {"measure": "l1", "ward_input": "condensed"}),
    ("delta", {"replace": False}),
    ("delta", {"sigma": "none", "weighting": "size"}),
    ("fedcbs", {"first": "sample", "repeats": 1}),
    # the budget variants of the all-available methods (per_round of a uniform draw)
    *(
        (name, {"candidates": "uniform"})
        for name in ("ca_fed", "unbiased", "adafed", "more_available")
    ),
]
CASES = [(name, {}) for name in sorted(STRATEGIES)] + VARIANTS


def _simulation(name, dataset, args=None):
    per_round = K if name == "full" else 4
    model = make_model("logreg", input_shape=dataset.input_shape, num_classes=10)
    spec = RoundSpec.create(
        dataset,
        model,
        make_strategy(name, per_round, **(args or {})),
        local=LocalConfig(batch_size=16, local_steps=2),
        per_round=per_round,
        availability=markov(pi=0.6, lam=0.3),
        parallel=Parallel("map"),
    )
    return Simulation(spec, dataset, num_rounds=5, chunk_size=1), per_round


@pytest.mark.parametrize(
    "name, args", CASES, ids=[n + "".join(f"-{k}={v}" for k, v in a.items()) for n, a in CASES]
)
def test_strategy_contract(name, args, dataset):
    sim, per_round = _simulation(name, dataset, args)
    assert streams_aggregate(sim.spec) == (not sim.spec.strategy.reads_deltas)
    state = sim.init(seed=0, hparams=HParams.of(0.1))
    structure = jax.tree.structure(state.strategy_state)

    def step(sim):
        # the round and, beside it, its selection phase on the same state: one compiled
        # program per case instead of two
        def fn(state, data):
            _, selection, available = select_phase(sim.spec, state, data)
            new_state, log = engine.round_fn(sim.spec, state, data)
            return new_state, log, selection, available

        return fn

    round_fn = jax.jit(chex.assert_max_traces(step(sim), n=1))
    # a second, independently built strategy and simulation: a fresh trace (of the same
    # program, so it comes from the compilation cache)
    fresh_round_fn = jax.jit(step(_simulation(name, dataset, args)[0]))

    try:
        for _ in range(3):
            new_state, log, sel, available = round_fn(state, sim.data)
            _, _, sel2, _ = fresh_round_fn(state, sim.data)
            clients, mask = np.asarray(sel.clients), np.asarray(sel.mask)
            weights, available = np.asarray(sel.weights), np.asarray(available)
            assert clients.shape == mask.shape == weights.shape == (per_round,)
            assert clients.dtype == np.int32 and mask.dtype == bool
            assert np.all((clients >= 0) & (clients < K))
            chosen = clients[mask]
            assert len(set(chosen.tolist())) == len(chosen), "duplicate picks"
            assert available[chosen].all(), "picked an unavailable client"
            assert np.all(np.isfinite(weights)) and np.all(weights >= 0)
            np.testing.assert_array_equal(clients, np.asarray(sel2.clients))
            np.testing.assert_array_equal(weights, np.asarray(sel2.weights))
            # the round trained the selection it was given
            np.testing.assert_array_equal(np.asarray(log.clients), clients)
            np.testing.assert_array_equal(np.asarray(log.weights), weights)
            state = new_state
            assert jax.tree.structure(state.strategy_state) == structure
    finally:
        chex.clear_trace_counter()
    assert int(state.round) == 3
