"""Power-of-Choice (Cho, Wang and Joshi 2022) against an exact NumPy enumeration of its rule:
d candidates drawn by data size without replacement among the available clients, then the
per_round candidates with the largest loss, each variant with its own loss (pow: the whole
local data; cpow: one minibatch; rpow: the stale loss of the last participation, +inf before
the first)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, RoundInputs, SimSpec
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.power_of_choice import PowerOfChoiceState

SIZES = np.array([1, 2, 3, 4, 5, 6])
AVAILABLE = np.array([True, True, False, True, True, True])
FULL_LOSS = np.array([0.5, 0.9, 9.0, 0.2, 0.7, 0.1])  # oracle.loss (whole data)
BATCH_LOSS = np.array([0.1, 0.2, 9.0, 0.9, 0.3, 0.8])  # oracle.batch_loss (one minibatch)
STALE_LOSS = np.array([0.3, np.inf, 9.0, 0.6, np.inf, 0.2])  # rpow: inf = never trained
M, D = 2, 3


def exact_selection_law(sizes, available, loss, m, d):
    """P(selected set) by enumerating every ordered sequence of d distinct candidates drawn
    with probability proportional to size among the available clients."""
    ids = np.flatnonzero(available)
    law: dict[frozenset, float] = {}
    for seq in itertools.permutations(ids, d):
        p, mass = 1.0, float(sizes[ids].sum())
        for c in seq:
            p *= sizes[c] / mass
            mass -= sizes[c]
        top = sorted(seq, key=lambda c: -loss[c])[:m]
        law[frozenset(top)] = law.get(frozenset(top), 0.0) + p
    return law


def _oracle():
    return ClientOracle(
        loss=lambda params, clients, key=None: jnp.asarray(FULL_LOSS, jnp.float32)[clients],
        batch_loss=lambda params, clients, key, b: jnp.asarray(BATCH_LOSS, jnp.float32)[clients],
        all_losses=None,
        train=None,
        train_key=None,
    )


@pytest.mark.parametrize(
    "variant, loss", [("pow", FULL_LOSS), ("cpow", BATCH_LOSS), ("rpow", STALE_LOSS)]
)
def test_selection_frequencies_follow_the_exact_rule(variant, loss):
    k = len(SIZES)
    strategy = make_strategy("power_of_choice", M, d=D, variant=variant)
    spec = SimSpec(k, M, 10, jnp.asarray(SIZES, jnp.int32), {})
    state = strategy.init(jax.random.key(0), spec)
    if variant == "rpow":
        state = PowerOfChoiceState(jnp.asarray(STALE_LOSS, jnp.float32))
    inputs = RoundInputs(jnp.int32(0), jnp.asarray(AVAILABLE), {}, jnp.asarray(SIZES, jnp.int32))

    @jax.jit
    def picks(key):
        sel, _ = strategy.select(state, inputs, _oracle(), key)
        return sel.clients, sel.mask

    n = 20000
    clients, mask = jax.vmap(picks)(jax.random.split(jax.random.key(1), n))
    assert np.all(np.asarray(mask))
    sets = [frozenset(row.tolist()) for row in np.asarray(clients)]
    law = exact_selection_law(SIZES, AVAILABLE, loss, M, D)
    assert sum(law.values()) == pytest.approx(1.0)
    for s, p in law.items():
        freq = sets.count(s) / n
        assert abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (s, freq, p)
    assert not any(2 in s for s in sets)  # never the unavailable client


def test_rpow_records_the_training_loss_of_its_picks():
    strategy = make_strategy("power_of_choice", 2, d=4, variant="rpow")
    state = strategy.init(jax.random.key(0), SimSpec(6, 2, 10, jnp.ones(6, jnp.int32), {}))
    assert np.all(np.isinf(np.asarray(state.last_loss)))
    from fedjax_sel.base import RoundFeedback, Selection

    sel = Selection(jnp.array([4, 1]), jnp.array([True, False]), jnp.array([1.0, 0.0]))
    zeros = jnp.zeros(2)
    fb = RoundFeedback(
        0,
        None,
        {},
        {},
        {},
        jnp.array([0.3, 0.7]),
        zeros,
        zeros,
        zeros,
        jnp.array([1, 0]),
        jnp.array([1, 0]),
    )
    new = np.asarray(strategy.update(state, sel, fb).last_loss)
    assert new[4] == pytest.approx(0.3) and np.isinf(new[1])  # the empty slot records nothing
