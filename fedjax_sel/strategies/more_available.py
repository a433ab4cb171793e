"""More-available (CA-Fed paper, section V-A c, baseline 2): only the "more available" clients
train, the "less available" ones are always excluded. The paper does not give its weights nor
how the classes are told apart; here a client is "more available" when ``pi_hat_k >=
threshold`` (0.5 separates the paper's classes ``1/2 +- g``) and it gets CA-Fed's weight
``alpha_k / pi_hat_k`` (unnormalised), i.e. CA-Fed with every less-available client excluded.
The public CA-Fed code (github.com/arodio/CA-Fed) has no such baseline (docs/ca_fed.md)."""

from __future__ import annotations

from fedjax_sel.base import ConfigError, Strategy
from fedjax_sel.strategies._ca_fed_common import Estimator, Prior, availability_weighted
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.registry import register_strategy


@register_strategy(
    "more_available",
    traced=("threshold", "prior_rounds"),
    description="only available clients with pi >= threshold, weight alpha/pi (use per_round = K)",
    reference="Rodio et al. 2023 (CA-Fed), section V-A c, baseline More available",
)
def more_available(
    *,
    per_round: int,
    threshold: float = 0.5,
    estimator: Estimator = "auto",
    prior: Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
) -> Strategy:
    """More-available: ``S_t = {k in A_t : pi_hat_k >= threshold}``, ``q_k = alpha_k/pi_hat_k``.

    Args:
      per_round: slots; use ``per_round = K``.
      threshold: the availability that separates "more" from "less" available clients.
      estimator, prior, prior_rounds: where ``pi_hat`` comes from (see
        :mod:`fedjax_sel.strategies._ca_fed_common`).
      weighting: ``alpha``: ``size`` (``n_k / n``) or ``uniform``.

    Traced (a grid of them shares one program): ``threshold``, ``prior_rounds``.
    """
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
        threshold=threshold,
    )
