"""Server side: weighted aggregation of client deltas and pseudo-gradient server optimizers.

The server treats ``-sum_i w_i (theta_i - theta)`` as a gradient and applies an optax
optimizer to it (Reddi et al. 2021, "Adaptive Federated Optimization"): plain SGD with learning
rate 1 is FedAvg, SGD with momentum is FedAvgM, Adam is FedAdam.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fedjax_sel.base import Array, ConfigError, Params
from fedjax_sel.tree import weighted_sum

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")


def server_optimizer(
    name: str = "sgd",
    lr: float = 1.0,
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.99,
    eps: float = 1e-3,
) -> optax.GradientTransformation:
    """Builds the server optimizer.

    Args:
      name: ``sgd`` (FedAvg when ``lr == 1``), ``momentum`` (FedAvgM) or ``adam`` (FedAdam;
        ``eps = 1e-3`` as Reddi et al. recommend).
      lr: server learning rate.
      momentum: momentum of ``momentum``.
      weight_decay: coupled L2 decay added to the pseudo-gradient (CA-Fed's reference code uses
        ``1e-2`` with momentum ``0.9``).
    """
    if name not in SERVER_OPTIMIZERS:
        raise ConfigError(
            f"unknown server optimizer {name!r}; choose {', '.join(SERVER_OPTIMIZERS)}"
        )
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"server learning rate must be a positive number, got {lr!r}")
    if weight_decay < 0:
        raise ConfigError(f"server weight decay must be >= 0, got {weight_decay!r}")
    parts = [optax.add_decayed_weights(weight_decay)] if weight_decay > 0 else []
    if name == "sgd":
        parts.append(optax.sgd(lr))
    elif name == "momentum":
        if not 0 <= momentum < 1:
            raise ConfigError(f"server momentum must lie in [0, 1), got {momentum!r}")
        parts.append(optax.sgd(lr, momentum=momentum))
    else:
        parts.append(optax.adam(lr, b1=b1, b2=b2, eps=eps))
    return optax.chain(*parts)


def weighted_delta(deltas: Params, weights: Array, mask: Array) -> Params:
    """``sum_i mask_i * w_i * delta_i`` over the slot axis of stacked ``deltas``."""
    return weighted_sum(jnp.where(mask, weights, 0.0), deltas)


def server_step(
    tx: optax.GradientTransformation, params: Params, opt_state, delta: Params
) -> tuple[Params, optax.OptState]:
    """Applies the aggregated ``delta`` through the server optimizer."""
    pseudo_grad = jax.tree.map(jnp.negative, delta)
    updates, opt_state = tx.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
