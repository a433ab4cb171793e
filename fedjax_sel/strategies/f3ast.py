"""F3AST (Ribero, Vikalo and de Veciana, IEEE JSTSP 2023) as CA-Fed compares with it (section
V-A c, baseline 4; docs/ca_fed.md).

Each round F3AST selects, among the available clients, the ``m`` with the largest
``alpha_k^2 / r_k^2`` and weights them ``alpha_k / r_k`` (not normalised), where ``r_k``
estimates client ``k``'s participation rate:

* ``variant="paper"`` (default): the exponential moving average of past selections,
  ``r_k <- (1 - beta) r_k + beta 1{k in S_t}``, from ``r_k = m / K``; rarely selected clients
  see ``r_k`` fall and are favoured next.
* ``variant="reference"``: the CA-Fed code's non-recursive rate of availability,
  ``r_k = (1 - beta) pi_hat_k + beta`` for the available clients, recomputed every round.

``beta = 0`` means ``1 / T`` (the code's hard-wired choice). Diagnostics: those of
:mod:`fedjax_sel.strategies._ca_fed_common` (its "kept" clients are the selected ones; ``q_sum``
is the round's weight sum).

The weights add up to more than 1, and that is the rule's own property: ``alpha_k / r_k`` is
the unbiased weight (its sum has mean ``sum_k alpha_k = 1`` when ``r_k`` is the client's true
selection probability), applied unnormalised with a server learning rate, CA-Fed's eq. (3)
``w_{t+1} = w_t + eta_bar sum_{k in S_t} q_k Delta_t^k`` with ``eta_bar`` tuned by grid search
beside the client's (section V-A c; the CA-Fed code's server SGD divides by nothing,
reference/algorithms.md sections 1.5 and 3.3). From ``r = m / K`` the first round's sum is
``(K / m) sum_{k in S_0} alpha_k``, K/m times the data share of the m largest clients, and the
EMA forgets that start at rate ``beta = 1 / T``, i.e. not within the run: on Synthetic(1,1)
(1,000 clients, 20 a round, 100 rounds, seed 0) the sum is about 20 in round 1, 1.3 by round
100, 2.6 on average, a server step 2.6 times FedAvg's at ``server_lr = 1``. A client left out
long enough has ``r_k`` decayed towards 0 and a large weight when it comes back, so the sum
need not approach 1 later either. Compare F3AST at a tuned server learning rate (our CA-Fed
reproduction's: 0.1) or with normalised weights (``tests/test_findings.py`` pins the sums).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax.numpy as jnp

from fedjax_sel.availability import estimators as est
from fedjax_sel.base import Array, ConfigError, Selection, Strategy, update_identity
from fedjax_sel.strategies import _ca_fed_common as common
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

Variant = Literal["paper", "reference"]
RATE_FLOOR = 1e-6


class F3astState(NamedTuple):
    """``counts``: availability statistics; ``rate``: float32[K], ``r_k`` (``paper``: the
    selection EMA; ``reference``: this round's rate); ``beta``: float32 scalar (``1 / T`` for
    ``beta = 0``)."""

    counts: est.AvailabilityCounts
    rate: Array
    beta: Array


@register_strategy(
    "f3ast",
    description="top-m available clients by alpha^2/r^2, weights alpha/r (r: selection-rate EMA)",
    reference="Ribero, Vikalo, de Veciana 2023 (F3AST), as in Rodio et al. 2023 (CA-Fed)",
)
def f3ast(
    *,
    per_round: int,
    budget: int = 0,
    beta: float = 0.0,
    variant: Variant = "paper",
    estimator: common.Estimator = "auto",
    prior: common.Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
) -> Strategy:
    """F3AST (see the module docstring).

    Args:
      per_round: slots.
      budget: ``m``, clients selected per round (``0`` means ``per_round``); ``<= per_round``.
      beta: EMA / mixing weight in (0, 1]; ``0`` means ``1 / T``.
      variant: ``paper`` (selection-rate EMA) or ``reference`` (the CA-Fed code).
      estimator, prior, prior_rounds: where ``pi_hat`` comes from (``reference`` variant; see
        :mod:`fedjax_sel.strategies._ca_fed_common`).
      weighting: ``alpha``: ``size`` (``n_k / n``) or ``uniform``.

    Traced (a grid of them shares one program): ``beta`` (0 included; its weight, ``1 / T``
    for 0, lives in the state from ``init``) and ``prior_rounds``.
    """
    common.check_availability_args(estimator, prior, prior_rounds, weighting)
    m = per_round if budget == 0 else int(budget)
    if not 1 <= m <= per_round:
        raise ConfigError(f"f3ast budget must lie in [1, per_round={per_round}], got {budget}")
    if not 0 <= beta <= 1:
        raise ConfigError(f"f3ast beta must lie in [0, 1] (0 means 1/T), got {beta!r}")

    def init(beta, key, spec):  # on the host: beta is the member's own value
        del key
        k = spec.num_clients
        b = beta if beta > 0 else 1.0 / spec.num_rounds
        rate = jnp.full((k,), min(m / k, 1.0), jnp.float32)
        return F3astState(est.init_counts(k), rate, jnp.float32(b))

    def build(beta, prior_rounds):  # floats, or traced scalars inside the round
        return Strategy(
            functools.partial(init, beta),
            functools.partial(select, prior_rounds),
            update_identity,
            reads_deltas=False,
        )

    def select(prior_rounds, state, inputs, oracle, key):
        del oracle, key
        pi_hat, lam_hat, counts = common.availability_estimates(
            state.counts, inputs, estimator=estimator, prior=prior, prior_rounds=prior_rounds
        )
        b = state.beta  # set by init from the member's beta (1/T for beta = 0)
        rate = state.rate if variant == "paper" else (1 - b) * pi_hat + b
        rate = jnp.maximum(rate, RATE_FLOOR)
        alpha = common.target_importance(inputs.num_examples, weighting)
        chosen, chosen_ok = common.pack_slots(inputs.available, jnp.square(alpha / rate), m)
        pad = per_round - m
        clients = jnp.concatenate([chosen, jnp.zeros((pad,), jnp.int32)])
        mask = jnp.concatenate([chosen_ok, jnp.zeros((pad,), bool)])
        weights = jnp.where(mask, (alpha / rate)[clients], 0.0)
        k = inputs.available.shape[0]
        picked = common.slot_mask(clients, mask, k)
        # F3AST excludes nobody for good: its "kept" clients are this round's selected ones
        diagnostics = common.round_diagnostics(
            common.client_groups(inputs, pi_hat, lam_hat),
            picked,
            picked,
            common.slot_weights(clients, mask, weights, k),
        )
        if variant == "paper":
            rate = (1 - b) * state.rate + b * picked.astype(jnp.float32)
        return Selection(clients, mask, weights, diagnostics=diagnostics), F3astState(
            counts, rate, b
        )

    return inject_hyperparams(build, beta=beta, prior_rounds=prior_rounds)
