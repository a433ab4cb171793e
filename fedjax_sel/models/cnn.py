"""The FedAvg CNN (McMahan et al. 2017). Its ``nn.Conv`` layers compute as patches @ kernel
by default (:mod:`fedjax_sel.models.conv`), which stays fast when vmapped over clients and
inside compiled loops on XLA:CPU."""

from __future__ import annotations

from typing import Literal

import flax.linen as nn

from fedjax_sel.models.base import Model, check_image_input, from_linen, register_model


class CNN(nn.Module):
    """Two 5x5 convolutions (32, 64 filters) each with ReLU and 2x2 max-pooling, a dense ReLU
    layer of 512 and a dense output layer (the FedAvg CNN, McMahan et al. 2017)."""

    features: int

    @nn.compact
    def __call__(self, x):
        for i, f in enumerate((32, 64)):
            x = nn.Conv(f, (5, 5), padding="SAME", name=f"conv{i}")(x)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(self.features)(x)


@register_model("cnn", description="CNN: two 5x5 conv (32, 64) + 2x2 max-pool, dense 512")
def cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    conv_impl: Literal["patches", "xla", "xla_nhwc"] = "patches",
) -> Model:
    """Args: conv_impl: ``patches`` (im2col + matmul; vmaps into batched GEMMs and stays fast
    inside compiled loops on XLA:CPU), ``xla`` (``lax.conv``) or ``xla_nhwc`` (``lax.conv``
    with channels-last gradients, fast inside compiled loops on XLA:CPU); all compute
    the same function (:mod:`fedjax_sel.models.conv`)."""
    check_image_input("cnn", input_shape)
    return from_linen(
        CNN(features=num_classes), name="cnn", input_shape=input_shape, conv_impl=conv_impl
    )
