"""Hyperparameters traced through the compiled round.

A learning rate closed over by the client optimizer is a constant of the compiled program: a
grid of learning rates would compile one program per value. :class:`HParams` carries the
numeric hyperparameters that change no shape in the simulation state instead (the way
``optax.inject_hyperparams`` carries an optimizer's), so members of a vmapped batch can differ
in them and one program serves a whole grid (:func:`fedjax_sel.experiment.loop.program_key`).

A traced value computes exactly what the constant did (``g * -lr`` is the same IEEE product
whether ``lr`` is folded in or read from the state), so a grid point equals its separate run.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError

# RunConfig fields traced in the state, in HParams order
TRACED_FIELDS = ("lr", "server_lr", "prox_mu")


class HParams(NamedTuple):
    """Float32 scalars read by the round (stacked ``[members]`` in a vmapped batch).

    Attributes:
      lr: client learning rate.
      server_lr: server learning rate (of a :class:`~fedjax_sel.training.server.
        ServerOptimizer`).
      prox_mu: FedProx proximal coefficient; whether the proximal term exists at all
        (``prox_mu > 0``) stays a static part of the program.
    """

    lr: Array
    server_lr: Array
    prox_mu: Array

    @classmethod
    def of(cls, lr: float, server_lr: float = 1.0, prox_mu: float = 0.0) -> HParams:
        """The checked values as float32 scalars."""
        for name, v in (("learning rate", lr), ("server learning rate", server_lr)):
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        if not prox_mu >= 0:
            raise ConfigError(f"FedProx mu must be >= 0, got {prox_mu!r}")
        return cls(*(jnp.asarray(v, jnp.float32) for v in (lr, server_lr, prox_mu)))

    @classmethod
    def from_config(cls, config: Any) -> HParams:
        """The traced values of a :class:`~fedjax_sel.config.RunConfig`."""
        return cls.of(*(getattr(config, name) for name in TRACED_FIELDS))
