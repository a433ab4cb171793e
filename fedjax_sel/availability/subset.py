"""Time-varying availability of FilFL's experiments (Fourati et al. 2024, section 5.1): ``n`` of
the ``N`` clients are available, a uniformly random subset redrawn every ``every`` rounds.

FilFL's reference code (salmakh1/FilFL; docs/filfl.md) redraws every 5 rounds and also at
each of the first 5 rounds (``warmup=5`` reproduces that). Spec: ``subset:n=100,every=5``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_sel.availability import register_availability
from fedjax_sel.base import Array, AvailabilityModel, ConfigError, PRNGKey
from fedjax_sel.kernels.sampling import uniform_without_replacement


class SubsetState(NamedTuple):
    """``available``: bool[K], the current subset; ``round``: int32, steps taken so far."""

    available: Array
    round: Array


def _positive_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or float(value) != int(value) or int(value) < minimum:
        raise ConfigError(
            f"subset availability {name} must be an integer >= {minimum}, got {value!r}"
        )
    return int(value)


def subset(n: int = 10, every: int = 1, warmup: int = 0) -> AvailabilityModel:
    """``n`` clients drawn uniformly without replacement, kept for ``every`` rounds.

    The subset is redrawn at round ``t`` (0-based) when ``t % every == 0`` or ``t < warmup``.

    Args:
      n: available clients per round (at most K).
      every: rounds between redraws.
      warmup: the first ``warmup`` rounds each draw a new subset (5 in the reference code).
    """
    n = _positive_int(n, "n", 1)
    every = _positive_int(every, "every", 1)
    warmup = _positive_int(warmup, "warmup", 0)

    def init(key: PRNGKey, num_clients: int) -> SubsetState:
        del key
        if n > num_clients:
            raise ConfigError(
                f"subset availability n={n} exceeds the number of clients ({num_clients})"
            )
        return SubsetState(jnp.zeros((num_clients,), bool), jnp.zeros((), jnp.int32))

    def step(state: SubsetState, key: PRNGKey) -> tuple[Array, SubsetState]:
        k = state.available.shape[0]
        redraw = (state.round % every == 0) | (state.round < warmup)
        clients, _ = uniform_without_replacement(key, jnp.ones((k,), bool), n)
        fresh = jnp.zeros((k,), bool).at[clients].set(True)
        available = jnp.where(redraw, fresh, state.available)
        return available, SubsetState(available, state.round + 1)

    return AvailabilityModel(init, step, "subset", {"n": n, "every": every, "warmup": warmup})


register_availability(
    "subset",
    subset,
    {
        "n": "clients available (a uniform subset)",
        "every": "rounds between redraws",
        "warmup": "first rounds that each redraw (reference code: 5)",
    },
)
