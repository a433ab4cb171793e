"""Power-of-Choice (Cho, Wang and Joshi, AISTATS 2022, arXiv:2010.01243): sample d candidates,
keep the m with the highest local loss."""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Selection, Strategy, client_work
from fedjax_sel.kernels import gumbel_top_k
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.registry import register_strategy

Variant = Literal["pow", "cpow", "rpow"]


class PowerOfChoiceState(NamedTuple):
    """``last_loss``: float32[K], each client's mean training loss in its last round
    (+inf before its first participation; used by ``rpow``)."""

    last_loss: Array


@register_strategy(
    "power_of_choice",
    description="d candidates by data size, keep the per_round with highest loss (pow/cpow/rpow)",
    reference="Cho, Wang, Joshi 2022, Towards Understanding Biased Client Selection in FL",
)
def power_of_choice(
    *,
    per_round: int,
    d: int = 0,
    variant: Variant = "pow",
    batch_size: int = 64,
    weighting: Weighting = "uniform",
) -> Strategy:
    """Power-of-Choice client selection.

    1. Draw ``d`` distinct candidates among the available clients with probability
       proportional to their data size ``p_k = n_k / N`` (sequentially without replacement).
    2. Keep the ``per_round`` candidates with the largest loss of the current global model:
       ``pow``: on each candidate's whole training set (``oracle.loss``); ``cpow``: on one
       minibatch of ``batch_size`` (``oracle.batch_loss``); ``rpow``: the stale mean training
       loss of the candidate's last participation, +inf if it never trained.

    Args:
      per_round: m, clients kept.
      d: candidates (``0`` means ``2 * per_round``, FedCVR-Bolt's setting); must be >= m.
      variant: ``pow``, ``cpow`` or ``rpow``.
      batch_size: minibatch of the ``cpow`` estimate.
      weighting: ``uniform`` (``1/m``, the reference code) or ``size``.
    """
    d = 2 * per_round if d == 0 else int(d)
    if d < per_round:
        raise ConfigError(f"power_of_choice needs d >= per_round ({per_round}), got d={d}")
    if batch_size < 1:
        raise ConfigError(f"power_of_choice batch_size must be >= 1, got {batch_size}")

    def init(key, spec):
        del key
        if d > spec.num_clients:
            raise ConfigError(
                f"power_of_choice d={d} exceeds the number of clients ({spec.num_clients})"
            )
        return PowerOfChoiceState(jnp.full((spec.num_clients,), jnp.inf, jnp.float32))

    def select(state, inputs, oracle, key):
        k_cand, k_loss = jax.random.split(key)
        log_p = jnp.log(inputs.num_examples.astype(jnp.float32))
        cand, cand_ok = gumbel_top_k(k_cand, log_p, d, inputs.available)
        k = inputs.num_examples.shape[0]
        work = None
        if variant == "pow":
            loss = oracle.loss(inputs.params, cand, k_loss)
            queried = inputs.num_examples[cand]  # each candidate's whole training set
            work = client_work(k, cand, cand_ok, forward_examples=queried)
        elif variant == "cpow":
            loss = oracle.batch_loss(inputs.params, cand, k_loss, batch_size)
            queried = jnp.minimum(inputs.num_examples[cand], batch_size)
            work = client_work(k, cand, cand_ok, forward_examples=queried)
        else:
            loss = state.last_loss[cand]
        loss = jnp.where(cand_ok, loss, -jnp.inf)
        top, order = jax.lax.top_k(loss, per_round)
        clients, mask = cand[order], cand_ok[order]
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        finite = cand_ok & jnp.isfinite(loss)
        kept = mask & jnp.isfinite(top)
        diagnostics = {  # how far the loss filter moves away from the size-biased candidates
            "candidate_loss_mean": jnp.sum(jnp.where(finite, loss, 0.0))
            / jnp.maximum(jnp.sum(finite), 1),
            "selected_loss_mean": jnp.sum(jnp.where(kept, top, 0.0))
            / jnp.maximum(jnp.sum(kept), 1),
            "candidates": jnp.sum(cand_ok),
        }
        return Selection(clients, mask, weights, diagnostics=diagnostics, work=work), state

    def update(state, selection, feedback):
        if variant != "rpow":
            return state
        idx = jnp.where(selection.mask, selection.clients, state.last_loss.shape[0])
        return PowerOfChoiceState(state.last_loss.at[idx].set(feedback.train_loss, mode="drop"))

    return Strategy(init, select, update, asynchronous=True, reads_deltas=False)
