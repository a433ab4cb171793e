"""Full participation: every available client, every round."""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_sel.base import ConfigError, EmptyState, Selection, Strategy, update_identity
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.registry import register_strategy


@register_strategy(
    "full",
    description="every available client every round (needs per_round = number of clients)",
    reference="full-participation FedAvg",
)
def full(*, per_round: int, weighting: Weighting = "size") -> Strategy:
    """Selects all available clients; ``per_round`` must equal the number of clients.

    Args:
      per_round: slots per round, equal to K.
      weighting: ``size`` (FedAvg) or ``uniform``.
    """

    def init(key, spec):
        del key
        if spec.per_round != spec.num_clients:
            raise ConfigError(
                f"strategy 'full' needs per_round equal to the number of clients "
                f"({spec.num_clients}), got {spec.per_round}"
            )
        return EmptyState()

    def select(state, inputs, oracle, key):
        del oracle, key
        clients = jnp.arange(per_round, dtype=jnp.int32)
        mask = inputs.available
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        return Selection(clients, mask, weights), state

    return Strategy(init, select, update_identity, reads_deltas=False)
