"""Multilayer perceptron (MNIST 784-200-200-10, McMahan et al. 2017)."""

from __future__ import annotations

import flax.linen as nn

from fedjax_sel.models.base import check_positive, from_linen, register_model
from fedjax_sel.models.linear import check_init, dense


class MLP(nn.Module):
    """ReLU multilayer perceptron on flattened inputs (MNIST: 784-200-200-10)."""

    hidden: tuple[int, ...]
    features: int
    weight_init: str = "flax"

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for h in self.hidden:
            x = nn.relu(dense(h, x.shape[-1], self.weight_init)(x))
        return dense(self.features, x.shape[-1], self.weight_init)(x)


@register_model(
    "mlp", description="multilayer perceptron, hidden sizes 200-200 (MNIST 784-200-200-10)"
)
def mlp(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 200),
    init: str = "flax",
):
    """Args: hidden: the hidden layers' widths (CLI ``hidden=200-200``; empty for none);
    init: ``flax`` or ``torch`` (PyTorch's ``nn.Linear`` default, as :func:`logreg`)."""
    check_positive("mlp", **{f"hidden[{i}]": h for i, h in enumerate(hidden)})
    return from_linen(
        MLP(
            hidden=tuple(int(h) for h in hidden),
            features=num_classes,
            weight_init=check_init("mlp", init),
        ),
        name="mlp",
        input_shape=input_shape,
    )
