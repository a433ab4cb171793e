"""Kernel benchmarks of HeteRo-Select's scoring and draw and of Oort's selector, against K."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import ClientOracle, RoundInputs, SimSpec
from fedjax_sel.bench.kernels import register_kernel
from fedjax_sel.strategies import make_strategy


def _unused(*args, **kwargs):
    raise AssertionError("not used by this kernel")


def _spec(k: int, per_round: int) -> SimSpec:
    key = jax.random.key(0)
    counts = jax.random.randint(key, (k, 10), 0, 50).astype(jnp.float32)
    return SimSpec(
        num_clients=k,
        per_round=per_round,
        num_rounds=100,
        num_examples=jnp.sum(counts, axis=1).astype(jnp.int32) + 1,
        params={"w": jnp.zeros((100_000,))},
        num_classes=10,
        label_counts=counts,
    )


def _random_round(state, k: int):
    """A mid-run state: random participation history, losses and update norms."""
    keys = jax.random.split(jax.random.key(1), 4)
    return state._replace(
        loss_last=jax.random.uniform(keys[0], (k,), minval=0.5, maxval=2.0),
        loss_seen=jnp.full((k,), 2, jnp.int32),
        participations=jax.random.randint(keys[1], (k,), 0, 20),
        last_round=jax.random.randint(keys[2], (k,), 0, 40),
        norm_sq=jax.random.uniform(keys[3], (k,)),
        norm_known=jnp.ones((k,), bool),
    )


@register_kernel(
    "hetero_select_round",
    description="HeteRo-Select: six components (eqs. 3-11), additive score, softmax draw of "
    "min(100, K/2) clients",
)
def _hetero_select(k: int):
    per_round = min(100, k // 2)
    strategy = make_strategy("hetero_select", per_round)
    state = strategy.init(jax.random.key(0), _spec(k, per_round))
    state = state._replace(inner=_random_round(state.inner, k))
    losses = jax.random.uniform(jax.random.key(2), (k,), minval=0.4, maxval=2.0)
    available = jax.random.bernoulli(jax.random.key(3), 0.8, (k,))

    def fn(state, losses, available, key):
        oracle = ClientOracle(
            loss=_unused,
            batch_loss=_unused,
            all_losses=lambda params: losses,
            train=_unused,
            train_key=key,
        )
        inputs = RoundInputs(jnp.int32(40), available, {}, jnp.ones((k,), jnp.int32))
        return strategy.select(state, inputs, oracle, key)

    return fn, (state, losses, available, jax.random.key(4))


@register_kernel(
    "oort_select",
    description="Oort (original preset): pacer, scores, exploitation/exploration draws, "
    "over-commitment, for min(100, K/10) clients",
)
def _oort(k: int):
    per_round = max(1, min(100, k // 10))
    strategy = make_strategy("oort", per_round)
    state = strategy.init(jax.random.key(0), _spec(k, per_round))
    keys = jax.random.split(jax.random.key(1), 3)
    explored = jax.random.bernoulli(keys[0], 0.5, (k,))
    inner = state.inner._replace(
        reward=jnp.where(explored, jax.random.exponential(keys[1], (k,)) * 100, state.inner.reward),
        count=explored.astype(jnp.int32),
        time_stamp=jnp.where(explored, jax.random.randint(keys[2], (k,), 1, 40), 0),
    )
    state = state._replace(inner=inner)
    available = jax.random.bernoulli(jax.random.key(3), 0.8, (k,))
    # the system model's simulated seconds per client (log-normal, median 60 s)
    durations = 60.0 * jnp.exp(jax.random.normal(jax.random.key(5), (k,)))

    def fn(state, available, durations, key):
        inputs = RoundInputs(
            jnp.int32(40), available, {}, jnp.ones((k,), jnp.int32), durations=durations
        )
        return strategy.select(state, inputs, None, key)

    return fn, (state, available, durations, jax.random.key(4))
