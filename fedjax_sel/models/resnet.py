"""ResNet-18 for 32x32 images (He et al. 2016; the CIFAR variant: 3x3 stem, no max-pool), the
model of HeteRo-Select's CIFAR-10 experiments (arXiv:2508.06692, section IV).

Batch normalisation keeps running statistics, which the simulator's pure ``Model`` (params
only, no mutable state) does not carry and which federated averaging handles poorly on
non-IID clients; like most FL code we use GroupNorm instead (2 groups, Hsieh et al. 2020).
``width`` scales every stage (64 is the standard network; tests use a narrow one).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fedjax_sel.base import ConfigError
from fedjax_sel.models.base import Model, check_image_input, from_linen, register_model


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a (projected) identity shortcut."""

    features: int
    strides: int = 1
    groups: int = 2

    @nn.compact
    def __call__(self, x):
        y = nn.Conv(self.features, (3, 3), self.strides, padding=1, use_bias=False)(x)
        y = nn.relu(nn.GroupNorm(num_groups=self.groups)(y))
        y = nn.Conv(self.features, (3, 3), padding=1, use_bias=False)(y)
        y = nn.GroupNorm(num_groups=self.groups)(y)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = nn.Conv(self.features, (1, 1), self.strides, use_bias=False)(x)
            x = nn.GroupNorm(num_groups=self.groups)(x)
        return nn.relu(x + y)


class ResNet18(nn.Module):
    """Stem, four stages of two basic blocks (width, 2w, 4w, 8w; strides 1, 2, 2, 2), global
    average pooling and a dense classifier."""

    num_classes: int
    width: int = 64
    groups: int = 2

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.width, (3, 3), padding=1, use_bias=False)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        for stage, strides in enumerate((1, 2, 2, 2)):
            for block in range(2):
                x = BasicBlock(self.width * 2**stage, strides if block == 0 else 1, self.groups)(x)
        return nn.Dense(self.num_classes)(jnp.mean(x, axis=(1, 2)))


@register_model(
    "resnet18",
    description="ResNet-18 with GroupNorm (CIFAR stem; options width=64, groups=2)",
    reference="He et al. 2016; GroupNorm in FL: Hsieh et al. 2020",
)
def make_resnet18(
    *, input_shape: tuple[int, ...], num_classes: int, width: int = 64, groups: int = 2
) -> Model:
    """A :class:`~fedjax_sel.models.Model` around :class:`ResNet18` (cross-entropy loss)."""
    check_image_input("resnet18", input_shape)
    if width < 1 or groups < 1 or width % groups:
        raise ConfigError(f"resnet18 width={width} must be a positive multiple of groups={groups}")
    # jit the initialisation: eagerly, the ~60 layers take tens of seconds on CPU
    return from_linen(
        ResNet18(num_classes=num_classes, width=width, groups=groups),
        name="resnet18",
        input_shape=input_shape,
        jit_init=True,
    )
