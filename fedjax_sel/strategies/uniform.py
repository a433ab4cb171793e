"""Uniform sampling among available clients (FedAvg, McMahan et al. 2017)."""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_sel.base import Selection, Strategy, init_empty_state, update_identity
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.registry import register_strategy


@register_strategy(
    "uniform",
    description="uniform sampling of per_round available clients without replacement (FedAvg)",
    reference="McMahan et al. 2017, Communication-Efficient Learning of Deep Networks",
)
def uniform(*, per_round: int, weighting: Weighting = "size") -> Strategy:
    """Draws ``per_round`` distinct clients uniformly among the available ones.

    Args:
      per_round: slots per round; fewer available clients leave slots empty.
      weighting: ``size`` (``n_k / sum n`` over the selected, FedAvg) or ``uniform``.
    """

    def select(state, inputs, oracle, key):
        del oracle
        clients, mask = uniform_without_replacement(key, inputs.available, per_round)
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        law = inputs.available / jnp.maximum(jnp.sum(inputs.available), 1)
        return Selection(clients, mask, weights, diagnostics={"law": law}), state

    return Strategy(
        init_empty_state, select, update_identity, asynchronous=True, reads_deltas=False
    )
