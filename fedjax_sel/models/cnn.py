"""The FedAvg CNN (McMahan et al. 2017), with an im2col convolution that stays fast when
vmapped over clients and inside compiled loops on XLA:CPU (design section 6)."""

from __future__ import annotations

from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.models.base import Model, check_image_input, from_linen, register_model


def extract_patches(x: jax.Array, kh: int, kw: int) -> jax.Array:
    """SAME-padded stride-1 patches: ``[B, H, W, C] -> [B, H, W, kh * kw * C]``.

    Feature order ``(i, j, c)`` matches a ``[kh, kw, C, F]`` kernel reshaped to
    ``[kh * kw * C, F]``. Built from shifted slices (not ``conv_general_dilated_patches``, which
    is itself a convolution and as slow inside loops on XLA:CPU).
    """
    _, h, w, _ = x.shape
    ph, pw = (kh - 1) // 2, (kw - 1) // 2
    xp = jnp.pad(x, ((0, 0), (ph, kh - 1 - ph), (pw, kw - 1 - pw), (0, 0)))
    return jnp.concatenate(
        [xp[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)], -1
    )


class PatchConv(nn.Module):
    """A SAME, stride-1 2-D convolution computed as patches @ kernel (im2col).

    Same parameters (``kernel [kh, kw, C, F]``, ``bias [F]``) and outputs as ``nn.Conv``; under
    ``vmap`` over clients it becomes a batched matmul rather than a grouped convolution.
    """

    features: int
    kernel_size: tuple[int, int] = (5, 5)

    @nn.compact
    def __call__(self, x):
        kh, kw = self.kernel_size
        c = x.shape[-1]
        kernel = self.param(
            "kernel", nn.initializers.lecun_normal(), (kh, kw, c, self.features), jnp.float32
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        return extract_patches(x, kh, kw) @ kernel.reshape(kh * kw * c, self.features) + bias


class CNN(nn.Module):
    """Two 5x5 convolutions (32, 64 filters) each with ReLU and 2x2 max-pooling, a dense ReLU
    layer of 512 and a dense output layer (the FedAvg CNN, McMahan et al. 2017)."""

    features: int
    conv_impl: str = "patches"

    @nn.compact
    def __call__(self, x):
        for i, f in enumerate((32, 64)):  # same parameter names for both implementations
            if self.conv_impl == "patches":
                x = PatchConv(f, (5, 5), name=f"conv{i}")(x)
            else:
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
    conv_impl: Literal["patches", "xla"] = "patches",
) -> Model:
    """Args: conv_impl: ``patches`` (im2col + matmul; vmaps into batched GEMMs and stays fast
    inside compiled loops on XLA:CPU) or ``xla`` (``lax.conv``); both compute the same
    function."""
    check_image_input("cnn", input_shape)
    return from_linen(
        CNN(features=num_classes, conv_impl=conv_impl), name="cnn", input_shape=input_shape
    )
