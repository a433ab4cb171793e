"""Linear models: multinomial logistic regression and linear regression."""

from __future__ import annotations

import flax.linen as nn

from fedjax_sel.models.base import Model, from_linen, register_model


class Linear(nn.Module):
    """``x W (+ b)`` on flattened inputs: logistic regression (with softmax cross-entropy) or
    linear regression (with squared error)."""

    features: int
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        out = nn.Dense(self.features, use_bias=self.use_bias)(x)
        return out[:, 0] if self.features == 1 and not self.use_bias else out


@register_model("logreg", description="multinomial logistic regression (optional ridge)")
def logreg(*, input_shape: tuple[int, ...], num_classes: int) -> Model:
    return from_linen(
        Linear(features=num_classes), name="logreg", input_shape=input_shape, cpu_parallel="vmap"
    )


@register_model(
    "linreg",
    description="linear regression (squared error); D = input features (+ intercept feature)",
    task="regression",
)
def linreg(*, input_shape: tuple[int, ...], num_classes: int | None = None) -> Model:
    del num_classes
    return from_linen(
        Linear(features=1, use_bias=False),
        name="linreg",
        input_shape=input_shape,
        task="regression",
        cpu_parallel="vmap",
    )
