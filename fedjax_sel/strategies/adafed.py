"""AdaFed as CA-Fed compares with it (section V-A c, baseline 3; docs/ca_fed.md): every
available client trains, with ``q_k = (alpha_k / pi_hat_k) / sum_{j in A_t} (alpha_j /
pi_hat_j)``, normalised over the round's available clients. The reference code
(github.com/arodio/CA-Fed) runs it with server learning rate 1. (AdaFed's own adaptive-weight
optimisation, Tan et al. 2022, is not what the CA-Fed paper and code compare with.)"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_sel.base import Strategy
from fedjax_sel.strategies._ca_fed_common import Estimator, Prior, availability_weighted
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.registry import register_strategy


@register_strategy(
    "adafed",
    traced=("prior_rounds",),
    description="every available client, weights alpha/pi normalised over the available ones",
    reference="Tan et al. 2022 (AdaFed) as run by Rodio et al. 2023 (CA-Fed), section V-A c",
)
def adafed(
    *,
    per_round: int,
    estimator: Estimator = "auto",
    prior: Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
) -> Strategy:
    """AdaFed: ``S_t = A_t``, weights ``alpha/pi_hat`` normalised to sum to one over ``A_t``.

    Args:
      per_round: slots; use ``per_round = K`` (with fewer slots, the available clients of
        largest weight train, and the weights are normalised over all available clients).
      estimator, prior, prior_rounds: where ``pi_hat`` comes from (see
        :mod:`fedjax_sel.strategies._ca_fed_common`).
      weighting: ``alpha``: ``size`` (``n_k / n``) or ``uniform``.

    Traced (a grid of it shares one program): ``prior_rounds``.
    """

    def rule(alpha, pi_hat, available):
        raw = jnp.where(available, alpha / pi_hat, 0.0)
        return available, raw / jnp.maximum(jnp.sum(raw), 1e-30)

    return availability_weighted(
        per_round,
        rule,
        estimator=estimator,
        prior=prior,
        prior_rounds=prior_rounds,
        weighting=weighting,
    )
