"""Unbiased aggregation (CA-Fed paper, section V-A c, baseline 1; docs/ca_fed.md): every
available client trains, with weight ``q_k = alpha_k / pi_hat_k`` (not normalised), so that
``E[sum_{k in A_t} q_k Delta_k] = sum_k alpha_k Delta_k`` under stationarity (Theorem 1: the
bias error vanishes for ``q proportional to alpha / pi``)."""

from __future__ import annotations

from fedjax_sel.base import Strategy
from fedjax_sel.strategies._ca_fed_common import Estimator, Prior, availability_weighted
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.registry import register_strategy


@register_strategy(
    "unbiased",
    traced=("prior_rounds",),
    description="every available client, weight alpha/pi (unnormalised; use per_round = K)",
    reference="Rodio et al. 2023 (CA-Fed), section V-A c, baseline Unbiased",
)
def unbiased(
    *,
    per_round: int,
    estimator: Estimator = "auto",
    prior: Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
) -> Strategy:
    """Unbiased: ``S_t = A_t``, ``q_k = alpha_k / pi_hat_k``.

    Args:
      per_round: slots; use ``per_round = K`` (with fewer slots, the available clients of
        largest weight train).
      estimator, prior, prior_rounds: where ``pi_hat`` comes from (see
        :mod:`fedjax_sel.strategies._ca_fed_common`).
      weighting: ``alpha``: ``size`` (``n_k / n``) or ``uniform``.

    Traced (a grid of it shares one program): ``prior_rounds``.
    """

    def rule(alpha, pi_hat, available):
        return available, alpha / pi_hat

    return availability_weighted(
        per_round,
        rule,
        estimator=estimator,
        prior=prior,
        prior_rounds=prior_rounds,
        weighting=weighting,
    )
