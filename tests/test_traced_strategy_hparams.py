"""Strategy hyperparameters traced through the state (``inject_hyperparams``), strategy by
strategy: a strategy built with one value and initialised at another
(``init_with_hyperparams``) runs exactly as the strategy built with the other, the values act,
and configurations that differ only in them share one compiled program (``program_key``).
Small planted problem, a few jitted rounds of ``select`` + ``update`` in one ``lax.scan``; no
simulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import AvailabilityParams, ClientOracle, RoundFeedback, RoundInputs, SimSpec
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.loop import program_key
from fedjax_sel.kernels import oort as ok
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.hyperparams import init_with_hyperparams
from fedjax_sel.strategies.oort import TRACED as OORT_TRACED
from fedjax_sel.strategies.registry import traced_values

K, T = 12, 5

# name, per_round, fixed arguments, values a, values b (every traced name), a static change
CASES = [
    (
        "oort",
        4,
        {"warmup_rounds": 0, "pacer_step": 1},  # Oort from the first round; the pacer every round
        {},  # the preset's values (None defaults)
        dict(
            exploration_factor=0.5,
            exploration_decay=0.7,
            exploration_min=0.05,
            cut_off_util=0.2,
            clip_bound=0.6,
            round_threshold=60.0,
            round_penalty=1.5,
            pacer_delta=15.0,
        ),
        {"sample_window": 2.0},
    ),
    (
        "ca_fed",
        K,
        {"estimator": "bayes"},
        {},
        {"kappa2": 0.01, "tau": 1e-4, "beta": 0.5, "prior_rounds": 6.0},
        {"lambda_order": "abs"},
    ),
    (
        "f3ast",
        5,
        {},
        {"beta": 0.0},  # 1 / T, known to init only
        {"beta": 0.3, "prior_rounds": 5.0},
        {"budget": 3},
    ),
    (
        "f3ast",
        5,
        {"variant": "reference", "estimator": "bayes"},
        {"beta": 0.3},
        {"beta": 0.0, "prior_rounds": 5.0},
        {"budget": 3},
    ),
    ("unbiased", K, {"estimator": "bayes"}, {}, {"prior_rounds": 8.0}, {"prior": "truth"}),
    ("adafed", 6, {"estimator": "reference"}, {}, {"prior_rounds": 8.0}, {"prior": "truth"}),
    (
        "more_available",
        K,
        {"estimator": "bayes"},
        {},
        {"threshold": 0.3, "prior_rounds": 8.0},
        {"prior": "truth"},
    ),
]
EXPECTED = {
    "oort": OORT_TRACED,
    "ca_fed": ("kappa2", "tau", "beta", "prior_rounds"),
    "f3ast": ("beta", "prior_rounds"),
    "unbiased": ("prior_rounds",),
    "adafed": ("prior_rounds",),
    "more_available": ("threshold", "prior_rounds"),
}


def planted(seed=0):
    rng = np.random.default_rng(seed)
    n = jnp.asarray(rng.integers(5, 60, K), jnp.int32)
    truth = AvailabilityParams(
        jnp.asarray(rng.uniform(0.2, 0.9, K), jnp.float32),
        jnp.asarray(rng.uniform(-0.5, 0.8, K), jnp.float32),
    )
    rounds = dict(
        round=jnp.arange(T, dtype=jnp.int32),
        available=jnp.asarray(rng.random((T, K)) < 0.75),
        loss=jnp.asarray(rng.uniform(0.1, 3.0, (T, K)), jnp.float32),
        durations=jnp.asarray(rng.lognormal(3.0, 0.8, (T, K)), jnp.float32),
        slot_loss=jnp.asarray(rng.uniform(0.1, 4.0, (T, K)), jnp.float32),
        slot_durations=jnp.asarray(rng.lognormal(3.0, 0.8, (T, K)), jnp.float32),
        finished=jnp.asarray(rng.random((T, K)) < 0.8),  # the engine keeps these picks
        key=jax.random.split(jax.random.key(seed), T),
    )
    return n, truth, rounds


def rounds_fn(strategy, n, truth):
    """One jitted program: ``T`` rounds of select + update from a given state."""
    params = {"w": jnp.zeros((3,))}

    def oracle(loss):
        def losses(p, clients, key=None, *args):
            return loss[clients]

        return ClientOracle(
            losses, losses, lambda p: loss, None, jax.random.key(0), None, lambda p, c: loss[c]
        )

    def step(state, x):
        inputs = RoundInputs(x["round"], x["available"], params, n, truth, x["durations"])
        sel, state = strategy.select(state, inputs, oracle(x["loss"]), x["key"])
        p = sel.clients.shape[0]
        kept = sel.mask & x["finished"][:p]
        feedback = RoundFeedback(
            round=x["round"],
            available=x["available"],
            params=params,
            new_params=params,
            deltas=jax.tree.map(lambda w: jnp.zeros((p,) + w.shape), params),
            train_loss=x["slot_loss"][:p],
            initial_loss=x["slot_loss"][:p],
            loss_sq=jnp.square(x["slot_loss"][:p]),
            update_norm=x["slot_loss"][:p],
            num_examples=jnp.where(kept, n[sel.clients], 0),
            num_steps=jnp.ones((p,), jnp.int32),
            requested=sel.mask,
            durations=x["slot_durations"][:p],
        )
        state = strategy.update(state, sel._replace(mask=kept), feedback)
        return state, (sel.clients, sel.mask, sel.weights, sel.diagnostics, state)

    return jax.jit(lambda state, xs: jax.lax.scan(step, state, xs)[1])


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_same(x, y):
    assert jax.tree.structure(x) == jax.tree.structure(y)
    for a, b in zip(leaves(x), leaves(y), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def differs(x, y) -> bool:
    return any(not np.array_equal(a, b) for a, b in zip(leaves(x), leaves(y), strict=True))


@pytest.mark.parametrize(
    "name, per_round, fixed, a, b, static",
    CASES,
    ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[2].items()) or 'defaults'}" for c in CASES],
)
def test_switched_values_run_as_built(name, per_round, fixed, a, b, static):
    built_a = make_strategy(name, per_round, **fixed, **a)
    built_b = make_strategy(name, per_round, **fixed, **b)
    # (1) what is traced, in the order of inject_hyperparams' keywords, with the values built
    assert tuple(dict(built_a.hyperparams)) == EXPECTED[name]
    values_b = traced_values(name, per_round, {**fixed, **b})
    assert values_b == dict(built_b.hyperparams)
    assert tuple(values_b) == EXPECTED[name]
    assert all(values_b[k] == float(v) for k, v in b.items())

    n, truth, xs = planted()
    spec = SimSpec(K, per_round, 20, n, {"w": jnp.zeros((3,))}, 10, None)
    init_a = built_a.init(jax.random.key(1), spec)
    init_b = built_b.init(jax.random.key(1), spec)
    switched = init_with_hyperparams(built_a, jax.random.key(1), spec, values_b)
    # (2) a's strategy initialised at b's values holds no value of a, and a's program runs
    # it exactly as b's
    assert_same(switched, init_b)
    run_a = rounds_fn(built_a, n, truth)  # one program for both of a's states
    out_switched = run_a(switched, xs)
    assert_same(out_switched, rounds_fn(built_b, n, truth)(init_b, xs))
    # (3) the values act: a's run differs from b's in the selection or the state
    out_a = run_a(init_a, xs)
    assert differs(out_a[:4], out_switched[:4])  # the selections themselves
    # (4) one compiled program for the grid; a static option is another one
    config = RunConfig(
        dataset="digits", num_clients=K, per_round=per_round, strategy=name, rounds=T
    )
    key_a = program_key(config.replace(strategy_args={**fixed, **a}))
    assert key_a == program_key(config.replace(strategy_args={**fixed, **b}))
    assert key_a != program_key(config.replace(strategy_args={**fixed, **a, **static}))


def test_oort_values_left_to_the_preset_are_the_presets():
    """Oort's traced options default to None (the preset's value): a grid member that leaves
    one out runs at its preset's value, not at another member's."""
    for preset in ("original", "fedscale"):
        want = {k: float(getattr(ok.PRESETS[preset], k)) for k in OORT_TRACED}
        assert traced_values("oort", 4, {"preset": preset}) == want
    assert traced_values("oort", 4, {"clip_bound": "0.5"})["clip_bound"] == 0.5  # CLI text
    assert traced_values("oort", 4, {"round_threshold": None})["round_threshold"] == 10.0
    strategy = make_strategy("oort", 4, preset="fedscale", cut_off_util=0.3)
    state = strategy.init(jax.random.key(0), SimSpec(K, 4, 10, jnp.ones(K, jnp.int32), {}))
    assert float(state.hyperparams["cut_off_util"]) == np.float32(0.3)
    assert float(state.hyperparams["clip_bound"]) == np.float32(0.9)  # fedscale's
    # the traced values beside Oort's own state, nothing read through
    assert type(state)._fields == ("hyperparams", "inner")
    assert state.inner.count.shape == state.inner.reward.shape == (K,)
