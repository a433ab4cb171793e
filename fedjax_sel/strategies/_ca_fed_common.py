"""Pieces shared by CA-Fed and its baselines (Unbiased, More-available, AdaFed, F3AST):
target importance ``alpha``, availability estimates (oracle or Bayesian), slot packing.

Availability estimates ``(pi_hat, lambda_hat)`` come from one of

* ``oracle``: the availability model's true parameters (``RoundInputs.availability_params``;
  the paper's main experiments, section V-A c);
* ``bayes``: the Beta-prior estimators of section IV-B, computed from the availability masks the
  strategy observes (:mod:`fedjax_sel.availability.estimators`);
* ``reference``: the public code's biased ``lambda`` estimator (``reference/algorithms.md`` 1.3);
* ``auto`` (default): ``oracle`` when the availability model exposes its parameters, else
  ``bayes``.

The Beta prior is centred on ``pi_0 = 1/2, lambda_0 = 0`` (``prior="flat"``) or, as in the
reference code, on the true parameters (``prior="truth"``, needs an availability model that
exposes them); its weight is ``prior_rounds`` pseudo-rounds (2 = a uniform Beta(1, 1) on pi;
the reference code uses 100).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.availability import estimators as est
from fedjax_sel.base import Array, ConfigError, RoundInputs, Selection, Strategy, update_identity
from fedjax_sel.strategies._common import check_weighting

ESTIMATOR_MODES = ("auto", "oracle", "bayes", "reference")
PRIORS = ("flat", "truth")
PI_FLOOR = 1e-6  # guards alpha / pi_hat against a client that is never online


def check_availability_args(estimator: str, prior: str, prior_rounds: float, weighting: str):
    """Validates the hyperparameters every strategy of this family takes."""
    if estimator not in ESTIMATOR_MODES:
        raise ConfigError(f"estimator must be one of {ESTIMATOR_MODES}, got {estimator!r}")
    if prior not in PRIORS:
        raise ConfigError(f"prior must be one of {PRIORS}, got {prior!r}")
    est.check_prior(prior_rounds)
    check_weighting(weighting)


def target_importance(num_examples: Array, weighting: str) -> Array:
    """``alpha``: ``n_k / sum n`` (``size``) or ``1 / K`` (``uniform``), float32[K]."""
    n = num_examples.astype(jnp.float32)
    raw = n if weighting == "size" else jnp.ones_like(n)
    return raw / jnp.sum(raw)


def availability_estimates(
    counts: est.AvailabilityCounts,
    inputs: RoundInputs,
    *,
    estimator: str,
    prior: str,
    prior_rounds: float,
) -> tuple[Array, Array, est.AvailabilityCounts]:
    """Observes this round's availability and returns ``(pi_hat, lambda_hat, counts)``.

    The counts are updated in every mode (so the state keeps one structure); ``pi_hat`` is
    floored at ``1e-6``. The choice between oracle and estimate is static (made at trace time).
    """
    truth = inputs.availability_params
    needs_truth = estimator == "oracle" or prior == "truth"
    if needs_truth and truth is None:
        raise ConfigError(
            f"estimator={estimator!r}, prior={prior!r} needs the true availability parameters, "
            "but this availability model does not expose them (use --availability markov, "
            "markov_clustered or trace, or estimator=bayes with prior=flat)"
        )
    kind = "bayes" if estimator in ("auto", "oracle") else estimator
    counts = est.update_counts(counts, inputs.available, estimator=kind)
    if estimator == "oracle" or (estimator == "auto" and truth is not None):
        pi_hat, lam_hat = truth.pi, truth.lam
    else:
        pi0, lam0 = (truth.pi, truth.lam) if prior == "truth" else (0.5, 0.0)
        pi_hat, lam_hat = est.estimate(
            counts, prior_rounds=prior_rounds, prior_pi=pi0, prior_lam=lam0, estimator=kind
        )
    pi_hat = jnp.clip(pi_hat.astype(jnp.float32), PI_FLOOR, 1.0)
    return pi_hat, lam_hat.astype(jnp.float32), counts


def pack_slots(selected: Array, priority: Array, per_round: int) -> tuple[Array, Array]:
    """The ``per_round`` selected clients of highest ``priority`` (ties by id) as slots:
    ``(clients int32[P], mask bool[P])``. With ``per_round = K`` nothing is dropped."""
    score = jnp.where(selected, priority.astype(jnp.float32), -jnp.inf)
    if per_round == selected.shape[0]:
        clients = jnp.argsort(score, descending=True, stable=True)
    else:
        _, clients = jax.lax.top_k(score, per_round)
    clients = clients.astype(jnp.int32)
    return clients, selected[clients]


class CountsState(NamedTuple):
    """State of the stateless-but-estimating baselines: the availability counts, and this
    round's ``pi_hat`` (float32[K], for diagnostics)."""

    counts: est.AvailabilityCounts
    pi_hat: Array


def availability_weighted(
    per_round: int,
    rule: Callable[[Array, Array, Array], tuple[Array, Array]],
    *,
    estimator: str,
    prior: str,
    prior_rounds: float,
    weighting: str,
) -> Strategy:
    """A strategy that trains ``selected`` clients with weights ``q`` where
    ``rule(alpha, pi_hat, available) -> (selected bool[K], q float32[K])`` (Unbiased, AdaFed,
    More-available). Slots go to the selected clients of largest ``q``."""
    check_availability_args(estimator, prior, prior_rounds, weighting)

    def init(key, spec):
        del key
        k = spec.num_clients
        return CountsState(est.init_counts(k), jnp.zeros((k,), jnp.float32))

    def select(state, inputs, oracle, key):
        del oracle, key
        pi_hat, _, counts = availability_estimates(
            state.counts, inputs, estimator=estimator, prior=prior, prior_rounds=prior_rounds
        )
        alpha = target_importance(inputs.num_examples, weighting)
        selected, q = rule(alpha, pi_hat, inputs.available)
        clients, mask = pack_slots(selected, q, per_round)
        weights = jnp.where(mask, q[clients], 0.0)
        return Selection(clients, mask, weights), CountsState(counts, pi_hat)

    return Strategy(init, select, update_identity)
