"""CA-Fed's heterogeneous Markov population (Rodio et al. 2023, section V-A a) behind the CLI
name ``markov``.

Every client is a two-state chain with stationary availability ``pi_k`` and second eigenvalue
``lambda_k`` (:func:`fedjax_sel.availability.markov_transition`). The paper's population splits
the K clients into two equal classes, "more available" (``pi = 1/2 + g``) and "less available"
(``pi = 1/2 - g``), and each class into two equal sub-classes, "correlated" (``lambda = nu``)
and "weakly correlated" (``lambda ~ N(0, eps^2)``); ``g = 0.4``, ``nu = 0.9``, ``eps = 1e-2``.

CLI: ``--availability markov`` is that population, ``markov:g=0.3,nu=0.8,eps=0.01`` changes its
parameters, and ``markov:pi=0.5,lam=0.9`` is a homogeneous chain (every client alike).

>>> model = markov_population(g=0.4, nu=0.9, eps=0.01)
>>> state = model.init(jax.random.key(0), 8)
>>> [round(float(p), 2) for p in state.pi]
[0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel.availability import MarkovState, markov_lambda_range, markov_transition
from fedjax_sel.base import Array, AvailabilityModel, AvailabilityParams, ConfigError, PRNGKey

# Client classes of the population, in client-id order (section V-A a, Fig. 1d).
CLASS_NAMES = (
    "more available, correlated",
    "more available, weakly correlated",
    "less available, correlated",
    "less available, weakly correlated",
)
MORE_CORRELATED, MORE_WEAK, LESS_CORRELATED, LESS_WEAK = range(4)


def population_classes(num_clients: int) -> np.ndarray:
    """Class of every client (codes index :data:`CLASS_NAMES`), in contiguous blocks: the first
    half of the ids is "more available" (its first half correlated), the second half "less
    available" (its first half correlated). Odd sizes are split as ``np.array_split`` does."""
    if num_clients < 1:
        raise ConfigError(f"the population needs at least one client, got {num_clients}")
    classes = np.empty(num_clients, np.int32)
    for half, ids in enumerate(np.array_split(np.arange(num_clients), 2)):
        for sub, block in enumerate(np.array_split(ids, 2)):
            classes[block] = 2 * half + sub
    return classes


def check_population(g: float, nu: float, eps: float) -> None:
    """Raises :class:`ConfigError` unless ``0 <= g < 1/2``, ``eps >= 0`` and ``nu`` is a valid
    eigenvalue for both availabilities ``1/2 +- g``."""
    if not (np.isfinite(g) and 0 <= g < 0.5):
        raise ConfigError(f"markov population g must lie in [0, 0.5), got g={g!r}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ConfigError(f"markov population eps must be >= 0, got eps={eps!r}")
    lo, _ = markov_lambda_range(np.array([0.5 + g, 0.5 - g]))
    if not (np.isfinite(nu) and np.max(lo) <= nu <= 1):
        raise ConfigError(
            f"markov population nu={nu!r} is outside the valid range of lambda "
            f"[{np.max(lo):.4g}, 1] for pi = 1/2 +- g = {0.5 + g:.4g}, {0.5 - g:.4g}"
        )


def ca_fed_population(
    key: PRNGKey, num_clients: int, g: float = 0.4, nu: float = 0.9, eps: float = 0.01
) -> AvailabilityParams:
    """The paper's ``(pi_k, lambda_k)`` for ``num_clients`` clients (section V-A a).

    Weakly correlated clients draw ``lambda ~ N(0, eps^2)`` from ``key``, clipped into the valid
    range ``[max(1 - 1/pi, 1 - 1/(1 - pi)), 1]`` (a no-op for the paper's ``eps = 1e-2``).
    """
    check_population(g, nu, eps)
    classes = jnp.asarray(population_classes(num_clients))
    more = (classes == MORE_CORRELATED) | (classes == MORE_WEAK)
    correlated = (classes == MORE_CORRELATED) | (classes == LESS_CORRELATED)
    pi = jnp.where(more, 0.5 + g, 0.5 - g).astype(jnp.float32)
    lo = jnp.maximum(1 - 1 / pi, 1 - 1 / (1 - pi))
    weak = jnp.clip(eps * jax.random.normal(key, (num_clients,)), lo, 1.0)
    lam = jnp.where(correlated, jnp.float32(nu), weak).astype(jnp.float32)
    return AvailabilityParams(pi, lam)


def markov_true_params(state: MarkovState) -> AvailabilityParams:
    """The true parameters of a per-client Markov chain (its state carries them)."""
    return AvailabilityParams(state.pi, state.lam)


def _step(state: MarkovState, key: PRNGKey) -> tuple[Array, MarkovState]:
    on = jax.random.bernoulli(key, markov_transition(state.on, state.pi, state.lam))
    return on, state._replace(on=on)


def markov_population(g: float = 0.4, nu: float = 0.9, eps: float = 0.01) -> AvailabilityModel:
    """CA-Fed's population of independent two-state chains (see the module docstring).

    Chains start in their stationary law. The model exposes the true ``pi`` and ``lambda``
    (``AvailabilityModel.true_params``) for oracle estimators.
    """
    g, nu, eps = float(g), float(nu), float(eps)
    check_population(g, nu, eps)

    def init(key: PRNGKey, num_clients: int) -> MarkovState:
        k_lam, k_on = jax.random.split(key)
        pi, lam = ca_fed_population(k_lam, num_clients, g, nu, eps)
        return MarkovState(jax.random.bernoulli(k_on, pi), pi, lam)

    info = {"population": "ca_fed", "g": g, "nu": nu, "eps": eps}
    return AvailabilityModel(init, _step, "markov", info, markov_true_params)


def markov(
    g: float | None = None,
    nu: float | None = None,
    eps: float | None = None,
    pi: float | None = None,
    lam: float | None = None,
) -> AvailabilityModel:
    """The CLI's ``markov``: the paper's population (``g``, ``nu``, ``eps``; defaults 0.4, 0.9,
    0.01) or, when ``pi`` or ``lam`` is given, a homogeneous chain with those parameters
    (defaults ``pi = 0.5``, ``lam = 0``). Both expose their true parameters."""
    population = {k: v for k, v in (("g", g), ("nu", nu), ("eps", eps)) if v is not None}
    if pi is None and lam is None:
        return markov_population(**population)
    if population:
        raise ConfigError(
            f"markov availability takes either the population parameters g, nu, eps or a "
            f"homogeneous chain's pi, lam, not both (got {sorted(population)} and pi/lam)"
        )
    chain = availability_lib.markov(pi=0.5 if pi is None else pi, lam=0.0 if lam is None else lam)
    return chain._replace(true_params=markov_true_params)


availability_lib.register_availability(
    "markov",
    markov,
    {
        "g": "population: availability gap, pi = 1/2 +- g (default 0.4)",
        "nu": "population: lambda of the correlated clients (default 0.9)",
        "eps": "population: weakly correlated lambda ~ N(0, eps^2) (default 0.01)",
        "pi": "homogeneous chain: stationary availability of every client",
        "lam": "homogeneous chain: second eigenvalue of every client",
    },
    replace=True,  # CA-Fed's population extends the homogeneous chain of the package
)
