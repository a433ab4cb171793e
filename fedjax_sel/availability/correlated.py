"""Availability correlated with the clients' data (FLGo's ``MDF``/``LDF``/``YMF``/``YFF``
modes, MIFA's label-dependent participation).

Each client's stationary availability ``pi_k`` is set from its data, then a two-state Markov
chain with that ``pi_k`` and a common ``lam`` runs as in :func:`~fedjax_sel.availability.markov`
(``lam = 0``: independent draws each round):

* ``by=size``: ``pi_k = low + (high - low) * r_k / (K - 1)``, ``r_k`` the rank of client ``k``'s
  data size (``high > low``: more data, more online, FLGo's ``MDF``; swap them for ``LDF``);
* ``by=label``: ``pi_k = low + (high - low) * ybar_k / (C - 1)``, ``ybar_k`` the mean label of
  client ``k``'s examples (FLGo's ``YMF``: clients holding larger labels are online more often).

The true ``pi`` and ``lambda`` are exposed to oracle estimators. Needs the simulation's data
(the model's ``init`` takes the :class:`~fedjax_sel.base.SimSpec`), so it works inside a
:class:`~fedjax_sel.Simulation` only.

CLI: ``--availability correlated:by=size,low=0.2,high=0.9`` (``lam=0.5`` for persistence).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel.availability import MarkovState, markov_lambda_range, markov_transition
from fedjax_sel.base import Array, AvailabilityModel, AvailabilityParams, ConfigError, PRNGKey


def data_availability(
    by: str, low: float, high: float, num_examples: np.ndarray, label_counts: np.ndarray | None
) -> np.ndarray:
    """``pi_k`` of every client from its data (the module docstring's two rules)."""
    num_examples = np.asarray(num_examples, np.float64)
    k = len(num_examples)
    if by == "size":
        # ties share the average of their ranks, so equal clients get equal availability
        order = np.argsort(num_examples, kind="stable")
        rank = np.empty(k)
        rank[order] = np.arange(k)
        for value in np.unique(num_examples):
            tie = num_examples == value
            rank[tie] = rank[tie].mean()
        score = rank / max(k - 1, 1)
    else:
        if label_counts is None:
            raise ConfigError(
                "correlated availability by=label needs label counts: a classification data "
                "set with one label per example (not sequence targets)"
            )
        counts = np.asarray(label_counts, np.float64)
        classes = counts.shape[1]
        total = np.maximum(counts.sum(1), 1.0)
        mean_label = (counts * np.arange(classes)).sum(1) / total
        score = mean_label / max(classes - 1, 1)
    return low + (high - low) * score


def correlated(
    by: Literal["size", "label"] = "size",
    low: float = 0.2,
    high: float = 0.8,
    lam: float = 0.0,
) -> AvailabilityModel:
    """Markov availability whose stationary ``pi_k`` follows the client's data (see the module
    docstring).

    Args:
      by: ``size`` (rank of the client's number of examples) or ``label`` (its mean label).
      low: ``pi`` of the client with the smallest size or mean label.
      high: ``pi`` of the client with the largest.
      lam: the chains' second eigenvalue (0: independent rounds).
    """
    if by not in ("size", "label"):
        raise ConfigError(f"correlated availability by must be 'size' or 'label', got {by!r}")
    for name, value in (("low", low), ("high", high)):
        if not 0 < value < 1:
            raise ConfigError(f"correlated availability {name} must lie in (0, 1), got {value!r}")
    lo, _ = markov_lambda_range(np.array([low, high]))
    if not np.max(lo) - 1e-12 <= lam <= 1:
        raise ConfigError(
            f"correlated availability lam={lam!r} is outside the valid range "
            f"[{np.max(lo):.4g}, 1] for pi in [{min(low, high)}, {max(low, high)}]"
        )

    def init(key: PRNGKey, num_clients: int, spec=None) -> MarkovState:
        if spec is None:
            raise ConfigError("correlated availability needs the simulation's data (SimSpec)")
        labels = None if spec.label_counts is None else np.asarray(spec.label_counts)
        pi_h = data_availability(by, low, high, np.asarray(spec.num_examples), labels)
        pi = jnp.asarray(pi_h, jnp.float32)
        lam_k = jnp.full((num_clients,), lam, jnp.float32)
        return MarkovState(jax.random.bernoulli(key, pi), pi, lam_k)

    def step(state: MarkovState, key: PRNGKey) -> tuple[Array, MarkovState]:
        on = jax.random.bernoulli(key, markov_transition(state.on, state.pi, state.lam))
        return on, state._replace(on=on)

    def true_params(state: MarkovState) -> AvailabilityParams:
        return AvailabilityParams(state.pi, state.lam)

    info = {"by": by, "low": low, "high": high, "lam": lam}
    return AvailabilityModel(init, step, "correlated", info, true_params, needs_spec=True)


availability_lib.register_availability(
    "correlated",
    correlated,
    {
        "by": "size (rank of the data size) or label (mean label)",
        "low": "pi of the smallest client / lowest mean label (default 0.2)",
        "high": "pi of the largest client / highest mean label (default 0.8)",
        "lam": "Markov second eigenvalue, 0 = independent rounds (default 0)",
    },
)
