"""Linear models: multinomial logistic regression and linear regression."""

from __future__ import annotations

import math

import flax.linen as nn
import jax

from fedjax_sel.base import ConfigError
from fedjax_sel.models.base import Model, from_linen, register_model

# Dense-layer initialisations: flax's (LeCun normal weights, zero bias) and PyTorch's
# nn.Linear default (weights and bias uniform in +-1/sqrt(fan_in): kaiming_uniform with
# a = sqrt(5)), which reference code written in PyTorch starts from.
DENSE_INITS = ("flax", "torch")


def check_init(model: str, init: str) -> str:
    if init not in DENSE_INITS:
        raise ConfigError(f"model {model!r}: init must be one of {DENSE_INITS}, got {init!r}")
    return init


def dense(features: int, fan_in: int, init: str, use_bias: bool = True) -> nn.Dense:
    """A dense layer of ``features`` outputs on ``fan_in`` inputs, initialised as ``init``."""
    if init == "flax":
        return nn.Dense(features, use_bias=use_bias)
    bound = 1.0 / math.sqrt(fan_in)

    def uniform(key, shape, dtype=jax.numpy.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nn.Dense(features, use_bias=use_bias, kernel_init=uniform, bias_init=uniform)


class Linear(nn.Module):
    """``x W (+ b)`` on flattened inputs: logistic regression (with softmax cross-entropy) or
    linear regression (with squared error)."""

    features: int
    use_bias: bool = True
    weight_init: str = "flax"

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        out = dense(self.features, x.shape[-1], self.weight_init, self.use_bias)(x)
        return out[:, 0] if self.features == 1 and not self.use_bias else out


@register_model("logreg", description="multinomial logistic regression (optional ridge)")
def logreg(*, input_shape: tuple[int, ...], num_classes: int, init: str = "flax") -> Model:
    """Args: init: ``flax`` (LeCun normal weights, zero bias) or ``torch`` (PyTorch's
    ``nn.Linear`` default)."""
    return from_linen(
        Linear(features=num_classes, weight_init=check_init("logreg", init)),
        name="logreg",
        input_shape=input_shape,
        cpu_parallel="vmap",
    )


@register_model(
    "linreg",
    description="linear regression (squared error); D = input features (+ intercept feature)",
    task="regression",
)
def linreg(
    *, input_shape: tuple[int, ...], num_classes: int | None = None, init: str = "flax"
) -> Model:
    """Args: init: ``flax`` or ``torch`` (as :func:`logreg`)."""
    del num_classes
    return from_linen(
        Linear(features=1, use_bias=False, weight_init=check_init("linreg", init)),
        name="linreg",
        input_shape=input_shape,
        task="regression",
        cpu_parallel="vmap",
    )
