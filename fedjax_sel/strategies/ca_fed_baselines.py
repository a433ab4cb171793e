"""The availability-weighted baselines CA-Fed compares with (section V-A c; docs/ca_fed.md):
every available client trains (More-available: the more available ones only), weighted by
``alpha_k / pi_hat_k`` (:func:`~fedjax_sel.strategies._ca_fed_common.availability_weighted`).

* ``unbiased`` (baseline 1): ``q_k = alpha_k / pi_hat_k``, not normalised, so that
  ``E[sum_{k in A_t} q_k Delta_k] = sum_k alpha_k Delta_k`` under stationarity (Theorem 1: the
  bias error vanishes for ``q proportional to alpha / pi``).
* ``adafed`` (baseline 3): ``q_k = (alpha_k / pi_hat_k) / sum_{j in A_t} (alpha_j /
  pi_hat_j)``, normalised over the round's available clients. The reference code
  (github.com/arodio/CA-Fed) runs it with server learning rate 1. (AdaFed's own adaptive-weight
  optimisation, Tan et al. 2022, is not what the CA-Fed paper and code compare with.)
* ``more_available`` (baseline 2): only the "more available" clients train, the "less
  available" ones are always excluded. The paper does not give its weights nor how the classes
  are told apart; here a client is "more available" when ``pi_hat_k >= threshold`` (0.5
  separates the paper's classes ``1/2 +- g``) and it gets CA-Fed's weight ``alpha_k /
  pi_hat_k`` (unnormalised), i.e. CA-Fed with every less-available client excluded. The public
  CA-Fed code has no such baseline.

Each takes ``per_round = K`` (with fewer slots, the selected clients of largest weight train);
``estimator``, ``prior`` and ``prior_rounds`` say where ``pi_hat`` comes from (see
:mod:`fedjax_sel.strategies._ca_fed_common`), ``weighting`` what ``alpha`` is (``size``: ``n_k /
n``, or ``uniform``). Traced (a grid of them shares one program): ``prior_rounds`` and
More-available's ``threshold``.

Budget variants, ``candidates="uniform"`` (the module docstring of
:mod:`~fedjax_sel.strategies._ca_fed_common`): each keeps its paper's rule within ``per_round``
slots by drawing ``m = min(per_round, |A_t|)`` available clients uniformly without replacement
and applying the rule to the drawn set ``D_t`` only:

* ``unbiased``: every drawn client, ``q_k = (alpha_k / pi_hat_k) |A_t| / m``; a client of
  ``A_t`` is drawn with probability ``m / |A_t|``, so the expected aggregate given ``A_t`` is the
  all-available one, ``sum_{k in A_t} (alpha_k / pi_hat_k) Delta_k``;
* ``adafed``: every drawn client, ``alpha_k / pi_hat_k`` normalised over ``D_t`` (weights sum
  to 1, as over ``A_t`` in the paper's run);
* ``more_available``: the drawn clients with ``pi_hat_k >= threshold``, ``q_k = (alpha_k /
  pi_hat_k) |A_t| / m`` (unbiased for the all-available rule the same way); the drawn
  less-available ones leave their slot empty.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Strategy
from fedjax_sel.strategies._ca_fed_common import (
    Candidates,
    Estimator,
    Prior,
    availability_weighted,
)
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.registry import register_strategy

Rule = Callable[[Array, Array, Array], tuple[Array, Array]]


def _unbiased_rule(alpha: Array, pi_hat: Array, available: Array) -> tuple[Array, Array]:
    return available, alpha / pi_hat


def _adafed_rule(alpha: Array, pi_hat: Array, available: Array) -> tuple[Array, Array]:
    raw = jnp.where(available, alpha / pi_hat, 0.0)
    return available, raw / jnp.maximum(jnp.sum(raw), 1e-30)


def _register(
    name: str, rule: Rule, *, normalised: bool, description: str, reference: str
) -> Callable:
    """Registers the baseline ``name``: every available (or drawn) client, weights ``rule``
    (``normalised``: they sum to one over the clients it is given)."""

    def factory(
        *,
        per_round: int,
        candidates: Candidates = "all",
        estimator: Estimator = "auto",
        prior: Prior = "flat",
        prior_rounds: float = 2.0,
        weighting: Weighting = "size",
    ) -> Strategy:
        return availability_weighted(
            per_round,
            rule,
            estimator=estimator,
            prior=prior,
            prior_rounds=prior_rounds,
            weighting=weighting,
            candidates=candidates,
            normalised=normalised,
            name=name,
        )

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"{description} (module docstring)."
    return register_strategy(name, description=description, reference=reference)(factory)


unbiased = _register(
    "unbiased",
    _unbiased_rule,
    normalised=False,
    description="every available client, weight alpha/pi (unnormalised; use per_round = K, "
    "or candidates=uniform: a uniform draw of per_round, weights x |A|/m)",
    reference="Rodio et al. 2023 (CA-Fed), section V-A c, baseline Unbiased",
)
adafed = _register(
    "adafed",
    _adafed_rule,
    normalised=True,
    description="every available client, weights alpha/pi normalised over the available ones "
    "(candidates=uniform: over a uniform draw of per_round of them)",
    reference="Tan et al. 2022 (AdaFed) as run by Rodio et al. 2023 (CA-Fed), section V-A c",
)


@register_strategy(
    "more_available",
    description="only available clients with pi >= threshold, weight alpha/pi (use per_round = K, "
    "or candidates=uniform: among a uniform draw of per_round, weights x |A|/m)",
    reference="Rodio et al. 2023 (CA-Fed), section V-A c, baseline More available",
)
def more_available(
    *,
    per_round: int,
    threshold: float = 0.5,
    candidates: Candidates = "all",
    estimator: Estimator = "auto",
    prior: Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
) -> Strategy:
    """More-available: ``S_t = {k in A_t : pi_hat_k >= threshold}``, ``q_k = alpha_k/pi_hat_k``
    (module docstring); ``threshold``: the availability that separates "more" from "less"
    available clients. ``candidates="uniform"``: ``A_t`` is replaced by a uniform draw of
    ``m = min(per_round, |A_t|)`` of its clients and ``q_k`` scaled by ``|A_t| / m`` (module
    docstring)."""
    if not 0 <= threshold <= 1:
        raise ConfigError(f"more_available threshold must lie in [0, 1], got {threshold!r}")

    def rule(alpha, pi_hat, available, threshold):  # threshold: a float, or traced
        return available & (pi_hat >= threshold), alpha / pi_hat

    return availability_weighted(
        per_round,
        rule,
        estimator=estimator,
        prior=prior,
        prior_rounds=prior_rounds,
        weighting=weighting,
        candidates=candidates,
        name="more_available",
        threshold=threshold,
    )
