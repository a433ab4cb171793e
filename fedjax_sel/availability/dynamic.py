"""Time-varying availability the field uses beside Markov chains (FLGo, MIFA, FedScale).

* ``diurnal``: a sinusoidal on-rate, ``p_k(t) = mean + amplitude * sin(2 pi (t / period +
  phase_k))``, independent draws each round. ``phases=random`` spreads the clients' phases
  uniformly over the day (time zones); ``phases=same`` gives the whole population one phase.
* ``onoff``: each client alternates online and offline spells whose lengths (in rounds) are
  lognormal with means ``on_mean`` and ``off_mean`` and log-scale ``sigma`` (FLGo's ``LN``
  availability, the shape FedScale's device traces show). Spells are drawn with a fresh key as
  each one ends; the population starts in the alternating renewal process's stationary law
  (online with probability ``on_mean / (on_mean + off_mean)``, the current spell's remaining
  length uniform over a fresh draw: an approximation to the exact length-biased residual).

Both run on device with fixed shapes; neither has a two-state chain's ``lambda``, so they expose
no ``true_params`` (oracle estimators need a Markov or trace model).

CLI: ``--availability diurnal:mean=0.5,amplitude=0.4,period=24`` or
``--availability onoff:on_mean=5,off_mean=15,sigma=1``.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel import availability as availability_lib
from fedjax_sel.base import Array, AvailabilityModel, ConfigError, PRNGKey


class DiurnalState(NamedTuple):
    """``phase`` float32[K] (fraction of a period) and ``round`` int32, the next round."""

    phase: Array
    round: Array


def diurnal_rate(mean: float, amplitude: float, period: float, phase: Array, t: Array) -> Array:
    """The on-probability of every client at round ``t``."""
    return mean + amplitude * jnp.sin(2 * math.pi * (t / period + phase))


def diurnal(
    mean: float = 0.5,
    amplitude: float = 0.4,
    period: float = 24.0,
    phases: Literal["random", "same"] = "random",
) -> AvailabilityModel:
    """Sinusoidal on-rate with a period of ``period`` rounds (see the module docstring).

    Args:
      mean: the average on-probability.
      amplitude: the swing around it; ``mean +- amplitude`` must stay inside [0, 1].
      period: rounds per cycle (a "day").
      phases: ``random`` (uniform per client) or ``same`` (all clients in step).
    """
    if not 0 < mean <= 1:
        raise ConfigError(f"diurnal mean must lie in (0, 1], got {mean!r}")
    if amplitude < 0 or mean - amplitude < 0 or mean + amplitude > 1:
        raise ConfigError(
            f"diurnal amplitude={amplitude!r} with mean={mean!r} leaves [0, 1]: need "
            f"0 <= amplitude <= min(mean, 1 - mean)"
        )
    if not period > 0:
        raise ConfigError(f"diurnal period must be positive (rounds), got {period!r}")
    if phases not in ("random", "same"):
        raise ConfigError(f"diurnal phases must be 'random' or 'same', got {phases!r}")

    def init(key: PRNGKey, num_clients: int) -> DiurnalState:
        if phases == "random":
            phase = jax.random.uniform(key, (num_clients,))
        else:
            phase = jnp.zeros((num_clients,))
        return DiurnalState(phase, jnp.zeros((), jnp.int32))

    def step(state: DiurnalState, key: PRNGKey) -> tuple[Array, DiurnalState]:
        rate = diurnal_rate(mean, amplitude, period, state.phase, state.round.astype(jnp.float32))
        on = jax.random.uniform(key, state.phase.shape) < rate
        return on, state._replace(round=state.round + 1)

    info = {"mean": mean, "amplitude": amplitude, "period": period, "phases": phases}
    return AvailabilityModel(init, step, "diurnal", info)


class OnOffState(NamedTuple):
    """``on`` bool[K], the current spell, and ``remaining`` float32[K], its rounds left."""

    on: Array
    remaining: Array


def lognormal_spell(key: PRNGKey, mean: Array, sigma: float, shape) -> Array:
    """Lognormal spell lengths with the given mean: ``mu = log(mean) - sigma^2 / 2``."""
    mu = jnp.log(mean) - 0.5 * sigma**2
    return jnp.exp(mu + sigma * jax.random.normal(key, shape))


def onoff(on_mean: float = 5.0, off_mean: float = 5.0, sigma: float = 1.0) -> AvailabilityModel:
    """Alternating online/offline spells with lognormal lengths (see the module docstring).

    Args:
      on_mean: mean online spell, in rounds.
      off_mean: mean offline spell, in rounds.
      sigma: log-scale standard deviation of both spell lengths.
    """
    for name, value in (("on_mean", on_mean), ("off_mean", off_mean)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"onoff {name} must be a positive number of rounds, got {value!r}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"onoff sigma must be >= 0, got {sigma!r}")
    stationary_on = on_mean / (on_mean + off_mean)

    def init(key: PRNGKey, num_clients: int) -> OnOffState:
        k_on, k_len, k_frac = jax.random.split(key, 3)
        on = jax.random.bernoulli(k_on, stationary_on, (num_clients,))
        spell = lognormal_spell(k_len, jnp.where(on, on_mean, off_mean), sigma, (num_clients,))
        return OnOffState(on, spell * jax.random.uniform(k_frac, (num_clients,)))

    def step(state: OnOffState, key: PRNGKey) -> tuple[Array, OnOffState]:
        # a spell that ran out flips the client and starts a fresh spell of the other kind
        ended = state.remaining <= 0
        on = jnp.where(ended, ~state.on, state.on)
        fresh = lognormal_spell(key, jnp.where(on, on_mean, off_mean), sigma, on.shape)
        remaining = jnp.where(ended, state.remaining + fresh, state.remaining) - 1.0
        return on, OnOffState(on, remaining)

    info = {"on_mean": on_mean, "off_mean": off_mean, "sigma": sigma}
    return AvailabilityModel(init, step, "onoff", info)


availability_lib.register_availability(
    "diurnal",
    diurnal,
    {
        "mean": "average on-probability (default 0.5)",
        "amplitude": "swing around the mean (default 0.4)",
        "period": "rounds per cycle (default 24)",
        "phases": "random (per client, default) or same",
    },
)
availability_lib.register_availability(
    "onoff",
    onoff,
    {
        "on_mean": "mean online spell in rounds (default 5)",
        "off_mean": "mean offline spell in rounds (default 5)",
        "sigma": "log-scale std of the spell lengths (default 1)",
    },
)
