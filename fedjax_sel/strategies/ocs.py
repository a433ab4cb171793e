"""Optimal Client Sampling (Chen, Horvath and Richtarik, TMLR 08/2022, arXiv:2010.13723,
"Optimal Client Sampling for Federated Learning"): OCS and its approximation AOCS.

A cohort of ``n_c`` clients (``per_round`` slots, drawn uniformly among the available ones) all
train; client ``i`` then sends its update ``U_i`` only with probability ``p_i``, independently
(``b_i ~ Bernoulli(p_i)``), and the server applies the unbiased estimate of the cohort's update

    Delta = sum_i w_i (b_i / p_i) U_i,   w_i = n_i / sum_{j in cohort} n_j

(the reference's ``federated_mean`` with weight ``n_i``: the denominator counts the clients that
do not send). The ``p_i`` minimise the estimator's variance ``sum_i (1 - p_i)/p_i ||w_i U_i||^2``
subject to ``sum_i p_i = m`` and ``p_i <= 1``: with ``u_i = ||w_i U_i||``

* ``ocs`` (exact; the server sees every ``u_i``): ``p_i = min(1, c u_i)`` with ``c`` such that
  ``sum p = m``, by the paper's closed form (sort, cumsum, the largest feasible ``l``:
  :func:`fedjax_sel.kernels.ocs.ocs_probabilities`);
* ``aocs`` (the reference code; clients stay stateless and only secure sums of scalars are
  exchanged): ``p_i = min(1, m u_i / sum u)`` then ``j_max`` rescales by
  ``C = (m - n_c + I) / P`` (``I``, ``P``: count and mass of the uncapped), stopping after the
  first ``C <= 1`` (:func:`fedjax_sel.kernels.ocs.aocs_probabilities`).

The paper's equation numbers and its own statement of the closed form were not read (only its
abstract and the reference code: docs/comparators/ocs.md); the closed form is tagged secondary
there and checked here against water-filling.

**Fixed shapes.** The ``Selection`` has ``per_round = n_c`` slots, one per cohort member, all
trained inside ``select`` (``oracle.train``, the same per-client randomness as the round's own
training); ``mask`` is ``valid & b`` (the senders), a random number of them with mean ``m`` =
``expected``; the weights ``w_i / p_i`` of the senders are not normalised (their sum is ``1`` only
in expectation). Fewer than ``n_c`` available clients leave slots invalid and ``m`` is capped at
their number.

**Asks of clients:** all ``n_c`` cohort clients train every round (``n_c`` local trainings, of
which only about ``m`` updates are uploaded); each uploads its scalar ``u_i`` (``ocs``), or
``1 + 2 j_max`` scalars through secure sums (``aocs``). No state across rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    ConfigError,
    RoundInputs,
    Selection,
    Strategy,
    client_work,
    init_empty_state,
    update_identity,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.kernels.ocs import aocs_probabilities, estimator_variance, ocs_probabilities
from fedjax_sel.strategies._common import Weighting, check_weighting
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy
from fedjax_sel.tree import stacked_norms

REFERENCE = (
    "Chen, Horvath, Richtarik 2022, Optimal Client Sampling for Federated Learning (TMLR), "
    "arXiv:2010.13723"
)


def _check(name: str, per_round: int, expected: float, weighting: str) -> None:
    check_weighting(weighting)
    if not 0 < expected <= per_round:
        raise ConfigError(
            f"{name} expected (m, the mean number of senders) must lie in (0, per_round = "
            f"{per_round}], got {expected}"
        )


def _optimal_sampling(per_round: int, expected, weighting: str, probabilities) -> Strategy:
    """The strategy around ``probabilities(u, valid, m) -> (p, diagnostics)``."""

    def select(state, inputs: RoundInputs, oracle, key):
        k_cohort, k_send = jax.random.split(key)
        cohort, valid = uniform_without_replacement(k_cohort, inputs.available, per_round)
        trained = oracle.train(inputs.params, cohort, oracle.train_key, valid)
        deltas = jax.tree.map(lambda p, g: p - g[None], trained.params, inputs.params)
        norms = jnp.where(valid, stacked_norms(deltas), 0.0)
        if weighting == "size":
            raw = jnp.where(valid, inputs.num_examples[cohort], 0).astype(jnp.float32)
        else:
            raw = valid.astype(jnp.float32)
        w = raw / jnp.maximum(jnp.sum(raw), 1e-12)
        u = w * norms
        p, extra = probabilities(u, valid, expected)
        send = valid & (jax.random.uniform(k_send, (per_round,)) < p)
        weights = jnp.where(send, w / jnp.where(send, p, 1.0), 0.0)
        k = inputs.available.shape[0]
        total_p = jnp.maximum(jnp.sum(p), 1e-12)
        diagnostics = {
            "law": jnp.zeros((k,), jnp.float32).at[cohort].add(jnp.where(valid, p, 0.0)) / total_p,
            "expected_senders": jnp.sum(p),
            "senders": jnp.sum(send).astype(jnp.float32),
            "capped": jnp.sum(valid & (p >= 1.0)).astype(jnp.float32),
            "estimator_variance": estimator_variance(p, u, valid),
            **extra,
        }
        # the cohort trained; those that do not send did so for their norm only
        work = client_work(k, cohort, valid & ~send, train_steps=trained.num_steps)
        selection = Selection(
            cohort, send, weights, train_result=trained, diagnostics=diagnostics, work=work
        )
        return selection, state

    return Strategy(init_empty_state, select, update_identity, reads_deltas=False)


@register_strategy(
    "ocs",
    description="Optimal Client Sampling (exact): the cohort trains, each sends with p_i = "
    "min(1, c ||w_i U_i||), sum p = expected; weights w_i/p_i",
    reference=REFERENCE,
)
def ocs(*, per_round: int, expected: float = 3.0, weighting: Weighting = "size") -> Strategy:
    """Exact OCS: the server sees every cohort member's weighted update norm.

    Args:
      per_round: n_c, the cohort (every member trains; at most n_c slots send).
      expected: m, the expected number of senders, ``sum p`` (the paper's runs: 3 of 32).
      weighting: ``w_i``: ``size`` (``n_i / sum_cohort n``, the reference) or ``uniform``.

    Traced: ``expected``.
    """
    _check("ocs", per_round, expected, weighting)

    def build(expected):
        def probabilities(u, valid, m):
            return ocs_probabilities(u, valid, m), {}

        return _optimal_sampling(per_round, expected, weighting, probabilities)

    return inject_hyperparams(build, expected=expected)


@register_strategy(
    "aocs",
    description="Approximate Optimal Client Sampling (reference code): p_i from secure sums of "
    "scalars, j_max rescales; the cohort trains, weights w_i/p_i",
    reference=REFERENCE,
)
def aocs(
    *, per_round: int, expected: float = 3.0, j_max: int = 4, weighting: Weighting = "size"
) -> Strategy:
    """AOCS: ``p_i = min(1, m u_i / sum u)``, then up to ``j_max`` rescales (each one secure sum
    of two scalars per client), stopping after the first factor ``C <= 1``.

    Args:
      per_round: n_c, the cohort (every member trains; at most n_c slots send).
      expected: m, the target ``sum p`` (the paper's runs: 3 of 32).
      j_max: rescaling iterations at most (the reference: 4).
      weighting: ``w_i``: ``size`` (the reference) or ``uniform``.

    Traced: ``expected``. Diagnostic ``aocs_iterations``: the rescales done.
    """
    _check("aocs", per_round, expected, weighting)
    if int(j_max) != j_max or j_max < 0:
        raise ConfigError(f"aocs j_max must be an integer >= 0, got {j_max}")
    j_max = int(j_max)

    def build(expected):
        def probabilities(u, valid, m):
            p, it = aocs_probabilities(u, valid, m, j_max)
            return p, {"aocs_iterations": it.astype(jnp.float32)}

        return _optimal_sampling(per_round, expected, weighting, probabilities)

    return inject_hyperparams(build, expected=expected)
