"""Server side: weighted aggregation of client deltas and pseudo-gradient server optimizers.

The server treats ``-sum_i w_i (theta_i - theta)`` as a gradient and applies an optax
optimizer to it (Reddi et al. 2021, "Adaptive Federated Optimization"): plain SGD with learning
rate 1 is FedAvg, SGD with momentum is FedAvgM, Adam is FedAdam.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_sel.base import Array, ConfigError, Params
from fedjax_sel.tree import weighted_sum

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")


class ServerOptimizer(NamedTuple):
    """A server optimizer's static settings; :meth:`build` makes the optax transformation for
    a learning rate that may be traced (the round's comes from
    :class:`fedjax_sel.training.hparams.HParams`, so a grid of server learning rates shares one
    compiled program)."""

    name: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-3

    def build(self, lr: float | Array) -> optax.GradientTransformation:
        """The transformation with learning rate ``lr``."""
        parts = [optax.add_decayed_weights(self.weight_decay)] if self.weight_decay > 0 else []
        if self.name == "sgd":
            parts.append(optax.sgd(lr))
        elif self.name == "momentum":
            parts.append(optax.sgd(lr, momentum=self.momentum))
        else:
            parts.append(optax.adam(lr, b1=self.b1, b2=self.b2, eps=self.eps))
        return optax.chain(*parts)


def server_spec(
    name: str = "sgd",
    *,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.99,
    eps: float = 1e-3,
) -> ServerOptimizer:
    """The checked settings of a server optimizer (its learning rate is the round's traced
    ``HParams.server_lr``).

    Args:
      name: ``sgd`` (FedAvg at learning rate 1), ``momentum`` (FedAvgM) or ``adam`` (FedAdam;
        ``eps = 1e-3`` as Reddi et al. recommend).
      momentum: momentum of ``momentum``.
      weight_decay: coupled L2 decay added to the pseudo-gradient (CA-Fed's reference code uses
        ``1e-2`` with momentum ``0.9``).
    """
    if name not in SERVER_OPTIMIZERS:
        raise ConfigError(
            f"unknown server optimizer {name!r}; choose {', '.join(SERVER_OPTIMIZERS)}"
        )
    if weight_decay < 0:
        raise ConfigError(f"server weight decay must be >= 0, got {weight_decay!r}")
    if name == "momentum" and not 0 <= momentum < 1:
        raise ConfigError(f"server momentum must lie in [0, 1), got {momentum!r}")
    return ServerOptimizer(name, float(momentum), float(weight_decay), b1, b2, eps)


def server_optimizer(name: str = "sgd", lr: float = 1.0, **kwargs) -> optax.GradientTransformation:
    """A fixed optax transformation: :func:`server_spec`'s optimizer at the constant learning
    rate ``lr`` (a ``RoundSpec`` given one uses it as it is, whatever ``HParams.server_lr``)."""
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"server learning rate must be a positive number, got {lr!r}")
    return server_spec(name, **kwargs).build(float(lr))


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
