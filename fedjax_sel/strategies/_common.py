"""Helpers shared by strategy modules."""

from __future__ import annotations

from typing import Literal, get_args

import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError

# a choice option typed Literal is checked by the registry (make_strategy, the CLI, sweeps)
Weighting = Literal["size", "uniform"]
WEIGHTINGS = get_args(Weighting)


def check_weighting(weighting: str) -> None:
    if weighting not in WEIGHTINGS:
        raise ConfigError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def fedavg_weights(num_examples: Array, clients: Array, mask: Array, weighting: str) -> Array:
    """FedAvg weights over the valid slots, summing to one (zeros if no slot is valid).

    ``size``: ``n_k / sum_selected n``; ``uniform``: ``1 / number selected``.
    """
    raw = (
        num_examples[clients].astype(jnp.float32)
        if weighting == "size"
        else jnp.ones(clients.shape)
    )
    raw = jnp.where(mask, raw, 0.0)
    return raw / jnp.maximum(jnp.sum(raw), 1e-12)
