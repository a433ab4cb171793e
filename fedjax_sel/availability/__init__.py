"""Client availability models: who is online each round, on device, with fixed shapes.

Each model is an :class:`~fedjax_sel.base.AvailabilityModel`: ``init(key, num_clients)`` and
``step(state, key) -> (available bool[K], state)``, called once per round before selection.

>>> model = markov(pi=0.5, lam=0.9)
>>> state = model.init(jax.random.key(0), 4)
>>> available, state = model.step(state, jax.random.key(1))
>>> available.shape
(4,)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import Array, AvailabilityModel, ConfigError, PRNGKey
from fedjax_sel.registry import Registry


def always() -> AvailabilityModel:
    """Every client is available every round."""

    def init(key: PRNGKey, num_clients: int) -> Array:
        del key
        return jnp.ones((num_clients,), bool)

    def step(state: Array, key: PRNGKey) -> tuple[Array, Array]:
        del key
        return state, state

    return AvailabilityModel(init, step, "always", {})


def _per_client(value, num_clients: int, name: str) -> Array:
    arr = jnp.asarray(value, jnp.float32)
    if arr.ndim == 0:
        return jnp.full((num_clients,), arr)
    if arr.shape != (num_clients,):
        raise ConfigError(
            f"{name} must be a scalar or have shape ({num_clients},), got {arr.shape}"
        )
    return arr


def bernoulli(p: float | Array = 0.5) -> AvailabilityModel:
    """Each client is available independently each round with probability ``p_k``."""
    p_host = np.asarray(p, np.float64)
    if np.any(~np.isfinite(p_host)) or np.any(p_host <= 0) or np.any(p_host > 1):
        raise ConfigError(f"bernoulli availability p must lie in (0, 1], got {p!r}")

    def init(key: PRNGKey, num_clients: int) -> Array:
        del key
        return _per_client(p, num_clients, "bernoulli p")

    def step(probs: Array, key: PRNGKey) -> tuple[Array, Array]:
        return jax.random.bernoulli(key, probs), probs

    return AvailabilityModel(init, step, "bernoulli", {"p": p_host.tolist()})


class MarkovState(NamedTuple):
    """Two-state chain per client: the current on/off states and the chain parameters."""

    on: Array  # bool[K]
    pi: Array  # float32[K] stationary availability
    lam: Array  # float32[K] second eigenvalue


def markov_lambda_range(pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Valid ``lambda`` for stationary availability ``pi``: transition probabilities in [0, 1]
    need ``max(1 - 1/pi, 1 - 1/(1 - pi)) <= lambda <= 1``."""
    pi = np.asarray(pi, np.float64)
    with np.errstate(divide="ignore"):
        lo = np.maximum(1 - 1 / pi, 1 - 1 / (1 - pi))
    return lo, np.ones_like(lo)


def markov(pi: float | Array = 0.5, lam: float | Array = 0.0) -> AvailabilityModel:
    """Two-state Markov availability per client (CA-Fed; docs/ca_fed.md, "Equations").

    ``P(on -> on) = lam + (1 - lam) pi`` and ``P(off -> on) = (1 - lam) pi``: the stationary
    availability is ``pi`` and the second eigenvalue (the lag-1 autocorrelation of the on/off
    process) is ``lam``. Chains start in their stationary law.
    """
    pi_h, lam_h = np.asarray(pi, np.float64), np.asarray(lam, np.float64)
    if np.any(~np.isfinite(pi_h)) or np.any(pi_h <= 0) or np.any(pi_h >= 1):
        raise ConfigError(f"markov availability pi must lie in (0, 1), got {pi!r}")
    lo, hi = markov_lambda_range(pi_h)
    bad = (~np.isfinite(lam_h)) | (lam_h < lo - 1e-12) | (lam_h > hi)
    if np.any(bad):
        raise ConfigError(
            f"markov availability lam={lam!r} is outside its valid range "
            f"[max(1 - 1/pi, 1 - 1/(1 - pi)), 1] = [{np.max(lo):.4g}, 1] for pi={pi!r}"
        )

    def init(key: PRNGKey, num_clients: int) -> MarkovState:
        p = _per_client(pi, num_clients, "markov pi")
        lm = _per_client(lam, num_clients, "markov lam")
        return MarkovState(jax.random.bernoulli(key, p), p, lm)

    def step(state: MarkovState, key: PRNGKey) -> tuple[Array, MarkovState]:
        p_on = markov_transition(state.on, state.pi, state.lam)
        on = jax.random.bernoulli(key, p_on)
        return on, state._replace(on=on)

    return AvailabilityModel(init, step, "markov", {"pi": pi_h.tolist(), "lam": lam_h.tolist()})


def markov_transition(on: Array, pi: Array, lam: Array) -> Array:
    """Probability of being on next round given the current states."""
    return jnp.where(on, lam + (1 - lam) * pi, (1 - lam) * pi)


AVAILABILITY = Registry("availability", package="fedjax_sel.availability")


def register_availability(
    name: str,
    factory: Callable[..., AvailabilityModel],
    params: dict[str, str] | None = None,
    *,
    description: str | None = None,
    replace: bool = False,
) -> None:
    """Adds an availability model to the registry used by the CLI and :func:`from_spec`.

    ``factory``'s keyword parameters are the model's options (``name:key=value,...``);
    ``params`` describes them for ``fedjax-sel list``.
    """
    doc = (factory.__doc__ or name).strip().splitlines()[0]
    AVAILABILITY.add(
        name, factory, description=description or doc, params=dict(params or {}), replace=replace
    )


register_availability("always", always, {})
register_availability("bernoulli", bernoulli, {"p": "probability of being online each round"})
register_availability(
    "markov",
    markov,
    {"pi": "stationary availability", "lam": "second eigenvalue (autocorrelation)"},
)


def from_spec(spec: str) -> AvailabilityModel:
    """Builds an availability model from a CLI spec such as ``markov:pi=0.5,lam=0.9``."""
    return AVAILABILITY.from_spec(spec)


__all__ = [
    "AVAILABILITY",
    "MarkovState",
    "always",
    "bernoulli",
    "from_spec",
    "markov",
    "markov_lambda_range",
    "markov_transition",
    "register_availability",
]
