"""CA-Fed, Correlation-Aware FL (Rodio, Faticanti, Marfoq, Neglia, Leonardi; IEEE/ACM ToN 2024,
Algorithm 1): aggregation weights ``q = alpha / pi_hat`` (Guideline C) on the clients left after a
greedy exclusion of highly correlated (high ``lambda_hat``) and rarely available (low
``pi_hat``) clients, as long as the error proxy ``eps_hat`` (eq. 20) falls.

One round (Algorithm 1, lines 3-12):

1. The available clients ``A_t`` report their loss ``F_k^(t)`` of the current model (line 3).
2. The server updates ``F_hat`` with the auto-regressive filter of eq. 17
   (``F_hat <- (1 - beta 1_A) F_hat + beta 1_A F``), ``F_hat^* = min_{s <= t} F_hat^(s)``,
   ``Gamma' = max_k (F_hat_k - F_hat_k^*)`` (eq. 19) and ``pi_hat``, ``lambda_hat`` (line 4).
3. ``q = alpha / pi_hat``; ``get()`` by descending ``lambda_hat``, then by ascending ``pi_hat``
   (lines 5-7; :func:`fedjax_sel.kernels.ca_fed.ca_fed_exclusions`, ``O(K log K)``).
4. The available clients with ``q_k > 0`` train; the server applies ``sum_k q_k Delta_k`` with
   the server learning rate (eq. 3, line 12): the weights are not normalised.

Where the paper and the public code (github.com/arodio/CA-Fed) differ (docs/ca_fed.md lists the
differences), the code's choice is an option: ``lambda_order="abs"`` (the code sorts by
``|lambda_hat|``), ``loss_source="validation"`` (the code's loss of the current model on the
clients' held-out split, every round) with a fixed ``F_k^*``: ``optimum="zero"`` (the code's
``F_k^* = 0`` on MNIST/CIFAR, where its scikit-learn fit fails) or ``optimum="given"`` with
``optimum_values`` (the code's per-client fit on Synthetic,
:func:`fedjax_sel.strategies._ca_fed_common.fit_local_optima`), ``estimator="reference"`` (its
biased ``lambda_hat``). ``kappa2`` is always in eq. 20's units: the code's ``bias_const`` c
multiplies ``max g * TV^2`` without the factor 4 of eq. 20, so ``c = 4 kappa2`` and the code's
``bias_const = 1`` (every script) is ``kappa2 = 0.25``. The code's ``smoothness_param`` s
weights the old estimate: ``beta = 1 - s``.

Diagnostics (every round, :mod:`fedjax_sel.strategies._ca_fed_common` for the shared ones):
``excluded`` (clients with ``q_k = 0``), ``excluded_available`` (available ones among them),
``gamma`` (``Gamma'``, eq. 19), ``eps_hat`` (eq. 20 on the kept set), the weight sums, the
weight ``law`` and the per-group counts. ``trace=True`` adds the K-sized ``kept`` and
``available`` masks (as 0/1 floats) for maps of single runs (Fig. 5); leave it off at large K.

Budget variant, ``candidates="uniform"`` (issue 54's equal-budget track; the module docstring of
:mod:`fedjax_sel.strategies._ca_fed_common`): ``m = min(per_round, |A_t|)`` available clients
are drawn uniformly without replacement (the select key: the ``uniform`` strategy's draw), the
exclusions are computed as above, over every client, and applied to the drawn set: the drawn
clients with ``q_k > 0`` train, weighted ``(alpha_k / pi_hat_k) |A_t| / m``; the drawn excluded
ones leave their slot empty. Why over every client and not over the drawn set: ``get()`` sorts
and visits all of ``K`` (lines 14-16), not ``A_t``, and eq. 20 scores the allocation ``q``
through eq. 4's biased importance ``p_k = pi_k q_k / sum_h pi_h q_h``, a long-run property of ``q``
and ``pi`` that no round's available set enters; the ``|A_t| / m`` factor makes each client's
expected contribution given ``A_t`` the all-available one, so ``p``, and with it eq. 20's proxy,
are those of Algorithm 1. A greedy restricted to the drawn set would score a ``p`` the algorithm
never realises and re-decide the exclusions from each round's random draw. All available clients
still report their loss (line 3, a minibatch each), which feeds eq. 17; the draw takes the
select key and the loss minibatches ``fold_in(key, 1)``.

A flat proxy: when every ``g_k = 0`` (so ``Gamma' = 0``; with ``F_hat^*`` the running minimum this
is always the case in the first round, and whenever no client's loss rose), ``eps_hat`` is the
same for every allocation and line 19 (``0 >= tau = 0``) would accept every exclusion down to a
single client. CA-Fed then keeps every client (the unbiased allocation of Guideline C) instead;
``keep_all_when_flat=False`` applies Algorithm 1 literally.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.availability import estimators as est
from fedjax_sel.base import (
    Array,
    ConfigError,
    Selection,
    Strategy,
    loss_pass_work,
    update_identity,
)
from fedjax_sel.kernels.ca_fed import ca_fed_exclusions, ca_fed_objective
from fedjax_sel.strategies import _ca_fed_common as common
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

Optimum = Literal["running_min", "zero", "given"]
LossSource = Literal["batch", "train", "validation"]


class CAFedState(NamedTuple):
    """CA-Fed's server state.

    Attributes:
      counts: availability statistics for the Bayesian estimators.
      loss_est: float32[K], ``F_hat`` (eq. 17).
      loss_min: float32[K], ``F_hat^*``, the running minimum of ``F_hat`` (+inf before any).
      started: bool scalar, some client has reported a loss.
    """

    counts: est.AvailabilityCounts
    loss_est: Array
    loss_min: Array
    started: Array


def update_loss_estimates(
    loss_est: Array, loss_min: Array, started: Array, loss: Array, available: Array, beta: float
) -> tuple[Array, Array, Array]:
    """Eq. 17 and the running minimum ``F_hat^*``. The first round with reports sets
    ``F_hat_k = F_k`` for the reporting clients and their mean for the others (the reference
    code's initialisation of ``F_hat^(0)``); later rounds filter the reports of ``A_t`` only.

    Returns ``(loss_est, loss_min, started)``.
    """
    n = jnp.sum(available)
    mean = jnp.sum(jnp.where(available, loss, 0.0)) / jnp.maximum(n, 1)
    first = jnp.where(available, loss, mean)
    filtered = jnp.where(available, (1.0 - beta) * loss_est + beta * loss, loss_est)
    loss_est = jnp.where(started, filtered, jnp.where(n > 0, first, loss_est))
    started = started | (n > 0)
    loss_min = jnp.where(started, jnp.minimum(loss_min, loss_est), loss_min)
    return loss_est, loss_min, started


@register_strategy(
    "ca_fed",
    description="CA-Fed: weights alpha/pi on clients kept by a greedy exclusion of correlated, "
    "rarely available ones (use per_round = K, or candidates=uniform: the kept among a uniform "
    "draw of per_round, weights x |A|/m)",
    reference="Rodio et al., Federated Learning under Heterogeneous and Correlated Client "
    "Availability, IEEE/ACM ToN 2024 (INFOCOM 2023)",
)
def ca_fed(
    *,
    per_round: int,
    kappa2: float = 1.0,
    tau: float = 0.0,
    beta: float = 1.0,
    optimum: Optimum = "running_min",
    optimum_values: tuple[float, ...] = (),
    loss_source: LossSource = "batch",
    loss_batch_size: int = 32,
    lambda_order: Literal["signed", "abs"] = "signed",
    estimator: common.Estimator = "auto",
    prior: common.Prior = "flat",
    prior_rounds: float = 2.0,
    weighting: Weighting = "size",
    keep_all_when_flat: bool = True,
    trace: bool = False,
    candidates: common.Candidates = "all",
) -> Strategy:
    """CA-Fed (Algorithm 1; see the module docstring).

    Args:
      per_round: slots; CA-Fed trains every available kept client, so use ``per_round = K``
        (with fewer slots and ``candidates="all"`` the kept clients with the largest ``q_k`` are
        trained, the rest dropped).
      kappa2: ``kappa_bar^2 >= 0``, the weight of the bias term (section IV-C); large values
        reduce CA-Fed to Unbiased.
      tau: threshold ``tau >= 0`` of the greedy (line 19).
      beta: eq. 17's weight of the new loss, in (0, 1]; 1 keeps only the latest report (the
        paper's experiments: the code's smoothness 0).
      optimum: ``running_min`` (``F_hat^* = min_s F_hat^(s)``, section IV-B), ``zero`` or
        ``given`` (``optimum_values``).
      optimum_values: ``F_k^*`` of every client (``optimum="given"``; K values).
      loss_source: the reported ``F_k^(t)``: ``batch`` (one minibatch of ``loss_batch_size``
        training examples, line 3), ``train`` (all training examples) or ``validation`` (the
        client's held-out split, the reference code; needs ``test_fraction > 0``).
      loss_batch_size: minibatch of the ``batch`` loss.
      lambda_order: ``signed`` (Algorithm 1) or ``abs`` (the code's ``|lambda_hat|``).
      estimator: ``auto``, ``oracle``, ``bayes`` or ``reference`` (see
        :mod:`fedjax_sel.strategies._ca_fed_common`).
      prior: ``flat`` or ``truth`` (the Beta prior's centre).
      prior_rounds: the Beta prior's weight H in pseudo-rounds.
      weighting: ``alpha``: ``size`` (``n_k / n``, the paper) or ``uniform``.
      keep_all_when_flat: keep every client when ``Gamma' = 0`` (see the module docstring).
      trace: add the K-sized ``kept`` and ``available`` masks to the diagnostics.
      candidates: ``all`` (every available client is a candidate) or ``uniform`` (the budget
        variant: the kept among a uniform draw of ``per_round`` available clients, weights
        scaled by ``|A_t| / m``; see the module docstring).

    Traced (a grid of them shares one program): ``kappa2``, ``tau``, ``beta``,
    ``prior_rounds``. Eq. 17's ``1 - beta`` is then a float32 difference, where it was a
    float64 one rounded to float32: the same bits for ``beta`` = 1 (the default) or 0.5, and
    possibly one ulp apart for others (e.g. 0.058).
    """
    common.check_availability_args(estimator, prior, prior_rounds, weighting)
    common.check_candidates("ca_fed", candidates)
    if not kappa2 >= 0:
        raise ConfigError(f"ca_fed kappa2 must be >= 0, got {kappa2!r}")
    if not tau >= 0:
        raise ConfigError(f"ca_fed tau must be >= 0, got {tau!r}")
    if not 0 < beta <= 1:
        raise ConfigError(f"ca_fed beta (eq. 17) must lie in (0, 1], got {beta!r}")
    if loss_batch_size < 1:
        raise ConfigError(f"ca_fed loss_batch_size must be >= 1, got {loss_batch_size}")
    if (optimum == "given") != bool(optimum_values):
        raise ConfigError(
            "ca_fed optimum_values (one F_k^* per client) go with optimum='given' and only with "
            f"it; got optimum={optimum!r} and {len(optimum_values)} value(s)"
        )
    given = jnp.asarray(optimum_values, jnp.float32)

    def init(key, spec):
        del key
        k = spec.num_clients
        if optimum == "given" and len(optimum_values) != k:
            raise ConfigError(
                f"ca_fed optimum_values has {len(optimum_values)} value(s) for {k} clients"
            )
        return CAFedState(
            counts=est.init_counts(k),
            loss_est=jnp.zeros((k,), jnp.float32),
            loss_min=jnp.full((k,), jnp.inf, jnp.float32),
            started=jnp.zeros((), bool),
        )

    def reported_losses(inputs, oracle, key):
        every = jnp.arange(inputs.available.shape[0], dtype=jnp.int32)
        if loss_source == "batch":
            return oracle.batch_loss(inputs.params, every, key, loss_batch_size)
        if loss_source == "train":
            return oracle.all_losses(inputs.params)
        if oracle.client_test_loss is None:
            raise ConfigError("ca_fed loss_source=validation needs per-client test splits")
        return oracle.client_test_loss(inputs.params, every)

    def loss_query_work(num_examples, available):
        """The available clients' loss reports (a minibatch, the training set, or the
        validation split, whose size the training set's stands in for)."""
        if loss_source == "batch":
            num_examples = jnp.minimum(num_examples, loss_batch_size)
        return loss_pass_work(num_examples, available)

    def optimum_estimate(loss_min):
        if optimum == "running_min":
            return loss_min
        if optimum == "zero":
            return jnp.zeros_like(loss_min)
        return given

    def build(kappa2, tau, beta, prior_rounds):  # floats, or traced scalars inside the round
        def select(state, inputs, oracle, key):
            pi_hat, lam_hat, counts = common.availability_estimates(
                state.counts, inputs, estimator=estimator, prior=prior, prior_rounds=prior_rounds
            )
            draw_key, loss_key = key, key
            if candidates == "uniform":  # the draw takes the key ("all" keeps its losses)
                loss_key = jax.random.fold_in(key, 1)
            loss = reported_losses(inputs, oracle, loss_key).astype(jnp.float32)
            loss_est, loss_min, started = update_loss_estimates(
                state.loss_est, state.loss_min, state.started, loss, inputs.available, beta
            )
            gap = jnp.where(started, loss_est - optimum_estimate(loss_min), 0.0)
            alpha = common.target_importance(inputs.num_examples, weighting)
            kept, gamma = ca_fed_exclusions(
                alpha, gap, pi_hat, lam_hat, kappa2=kappa2, tau=tau, lambda_order=lambda_order
            )
            if keep_all_when_flat:
                kept = kept | (gamma <= 0)
            q = alpha / pi_hat
            drawn, scale = common.draw_candidates(draw_key, inputs.available, per_round, candidates)
            if candidates == "uniform":
                q = q * scale  # unbiased under the draw (module docstring)
            clients, mask = common.pack_slots(kept & drawn, q, per_round)
            weights = jnp.where(mask, q[clients], 0.0)
            k = inputs.available.shape[0]
            diagnostics = common.round_diagnostics(
                common.client_groups(inputs, pi_hat, lam_hat),
                kept,
                common.slot_mask(clients, mask, k),
                common.slot_weights(clients, mask, weights, k),
            )
            diagnostics.update(
                excluded=jnp.sum(~kept),
                excluded_available=jnp.sum(~kept & inputs.available),
                gamma=gamma.astype(jnp.float32),
                eps_hat=ca_fed_objective(alpha, gap, gamma, kept, kappa2).astype(jnp.float32),
            )
            if trace:
                diagnostics.update(
                    kept=kept.astype(jnp.float32), available=inputs.available.astype(jnp.float32)
                )
            new_state = CAFedState(counts, loss_est, loss_min, started)
            work = loss_query_work(inputs.num_examples, inputs.available)
            selection = Selection(clients, mask, weights, diagnostics=diagnostics, work=work)
            return selection, new_state

        return Strategy(init, select, update_identity, reads_deltas=False)

    return inject_hyperparams(build, kappa2=kappa2, tau=tau, beta=beta, prior_rounds=prior_rounds)
