"""CA-Fed's heterogeneous Markov population (Rodio et al. 2023, section V-A a) behind the CLI
name ``markov``.

Every client is a two-state chain with stationary availability ``pi_k`` and second eigenvalue
``lambda_k`` (:func:`fedjax_sel.availability.markov_transition`). The paper's population splits
the K clients into two equal classes, "more available" (``pi = 1/2 + g``) and "less available"
(``pi = 1/2 - g``), and each class into two equal sub-classes, "correlated" (``lambda = nu``)
and "weakly correlated" (``lambda ~ N(0, eps^2)``); ``g = 0.4``, ``nu = 0.9``, ``eps = 1e-2``.

``mix="code"`` is the public code's population instead (github.com/arodio/CA-Fed, its
``JOINT_PROBABILITY_MATRIX``): 50% "more available, weakly correlated", 25% "less available,
correlated", 25% "less available, weakly correlated", and no "more available, correlated"
client; the counts are its ``--deterministic_split`` (``floor(K p)``, leftovers one each to the
non-empty types in order). ``id_seed``: client ids are a random permutation of the class blocks
drawn from that seed (the code permutes its clients at random when it generates the data, so
the permutation is fixed with the data, not with the run seed); ``None`` keeps contiguous
blocks. Ties in CA-Fed's greedy orders are broken by id, so contiguous blocks always visit the
same class first.

CLI: ``--availability markov`` is the paper's population, ``markov:g=0.3,nu=0.8,eps=0.01``
changes its parameters, ``markov:mix=code,id_seed=0`` is the code's population with shuffled
ids, and ``markov:pi=0.5,lam=0.9`` is a homogeneous chain (every client alike).

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

# Client classes of the population (section V-A a, Fig. 1d).
CLASS_NAMES = (
    "more available, correlated",
    "more available, weakly correlated",
    "less available, correlated",
    "less available, weakly correlated",
)
MORE_CORRELATED, MORE_WEAK, LESS_CORRELATED, LESS_WEAK = range(4)
MIXES = ("paper", "code")
# the reference code's JOINT_PROBABILITY_MATRIX, rows {available, unavailable} x columns
# {stable, shifting, unstable}, flattened, and the class of each cell (unused cells: -1)
CODE_JOINT = (0.0, 0.5, 0.0, 0.25, 0.25, 0.0)
CODE_CELL_CLASS = (MORE_CORRELATED, MORE_WEAK, -1, LESS_CORRELATED, LESS_WEAK, -1)


def code_class_counts(num_clients: int) -> np.ndarray:
    """Clients per class of the code's population (its ``compute_count_per_cluster`` with
    ``--deterministic_split``): ``floor(K p)`` per cell of the joint matrix, then one more to
    each non-empty cell in order while clients are left. int64[4] in class order."""
    p = np.asarray(CODE_JOINT)
    counts = np.floor(num_clients * p).astype(np.int64)
    left = num_clients - int(counts.sum())
    for cell in np.flatnonzero(p > 0):
        if left == 0:
            break
        counts[cell] += 1
        left -= 1
    out = np.zeros(4, np.int64)
    for cell, cls in enumerate(CODE_CELL_CLASS):
        if cls >= 0:
            out[cls] += counts[cell]
    return out


def population_classes(num_clients: int, mix: str = "paper", id_seed: int | None = None):
    """Class of every client (codes index :data:`CLASS_NAMES`).

    ``mix="paper"``: four equal classes in contiguous blocks: the first half of the ids is
    "more available" (its first half correlated), the second half "less available" (its first
    half correlated); odd sizes split as ``np.array_split`` does. ``mix="code"``: the code's
    50/25/25 population (:func:`code_class_counts`), in class order. ``id_seed``: the blocks
    permuted by ``np.random.default_rng(id_seed)``.
    """
    if num_clients < 1:
        raise ConfigError(f"the population needs at least one client, got {num_clients}")
    if mix not in MIXES:
        raise ConfigError(f"markov population mix must be one of {MIXES}, got {mix!r}")
    if mix == "paper":
        classes = np.empty(num_clients, np.int32)
        for half, ids in enumerate(np.array_split(np.arange(num_clients), 2)):
            for sub, block in enumerate(np.array_split(ids, 2)):
                classes[block] = 2 * half + sub
    else:
        classes = np.repeat(np.arange(4, dtype=np.int32), code_class_counts(num_clients))
    if id_seed is not None:
        classes = classes[np.random.default_rng(int(id_seed)).permutation(num_clients)]
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
    key: PRNGKey,
    num_clients: int,
    g: float = 0.4,
    nu: float = 0.9,
    eps: float = 0.01,
    mix: str = "paper",
    id_seed: int | None = None,
) -> AvailabilityParams:
    """The population's ``(pi_k, lambda_k)`` for ``num_clients`` clients (section V-A a; the
    classes of :func:`population_classes` with ``mix`` and ``id_seed``).

    Weakly correlated clients draw ``lambda ~ N(0, eps^2)`` from ``key``, clipped into the valid
    range ``[max(1 - 1/pi, 1 - 1/(1 - pi)), 1]`` (a no-op for the paper's ``eps = 1e-2``).
    """
    check_population(g, nu, eps)
    classes = jnp.asarray(population_classes(num_clients, mix, id_seed))
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


def markov_population(
    g: float = 0.4,
    nu: float = 0.9,
    eps: float = 0.01,
    mix: str = "paper",
    id_seed: int | None = None,
) -> AvailabilityModel:
    """CA-Fed's population of independent two-state chains (see the module docstring).

    Chains start in their stationary law. The model exposes the true ``pi`` and ``lambda``
    (``AvailabilityModel.true_params``) for oracle estimators.
    """
    g, nu, eps = float(g), float(nu), float(eps)
    check_population(g, nu, eps)
    if mix not in MIXES:
        raise ConfigError(f"markov population mix must be one of {MIXES}, got {mix!r}")
    id_seed = None if id_seed is None else int(id_seed)

    def init(key: PRNGKey, num_clients: int) -> MarkovState:
        k_lam, k_on = jax.random.split(key)
        pi, lam = ca_fed_population(k_lam, num_clients, g, nu, eps, mix, id_seed)
        return MarkovState(jax.random.bernoulli(k_on, pi), pi, lam)

    info = {"population": "ca_fed", "g": g, "nu": nu, "eps": eps, "mix": mix, "id_seed": id_seed}
    return AvailabilityModel(init, _step, "markov", info, markov_true_params)


def markov(
    g: float | None = None,
    nu: float | None = None,
    eps: float | None = None,
    mix: str | None = None,
    id_seed: int | None = None,
    pi: float | None = None,
    lam: float | None = None,
) -> AvailabilityModel:
    """The CLI's ``markov``: the population (``g``, ``nu``, ``eps``; defaults 0.4, 0.9,
    0.01; ``mix`` paper or code, ``id_seed``) or, when ``pi`` or ``lam`` is given, a
    homogeneous chain with those parameters (defaults ``pi = 0.5``, ``lam = 0``). Both expose
    their true parameters."""
    population = {
        k: v
        for k, v in (("g", g), ("nu", nu), ("eps", eps), ("mix", mix), ("id_seed", id_seed))
        if v is not None
    }
    if pi is None and lam is None:
        return markov_population(**population)
    if population:
        raise ConfigError(
            f"markov availability takes either the population parameters g, nu, eps, mix, "
            f"id_seed or a "
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
        "mix": "population: paper (four equal classes) or code (50/25/25, reference code)",
        "id_seed": "population: shuffle client ids with this seed (default: class blocks)",
        "pi": "homogeneous chain: stationary availability of every client",
        "lam": "homogeneous chain: second eigenvalue of every client",
    },
    replace=True,  # CA-Fed's population extends the homogeneous chain of the package
)
