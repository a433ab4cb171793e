"""Convolutions as patches @ kernel (im2col) for any flax model (README, "Bring your own model").

Inside the compiled round a convolution is slow twice on XLA:CPU: vmapped over clients it
becomes a grouped convolution with per-client kernels, and inside a compiled loop (``scan``,
``while``) it runs several times slower than outside (jax-ml/jax issue 12868). Written as
shifted slices (the patches) and one matmul, per-client kernels become batched GEMMs instead,
which stay fast in both places.

:func:`patches_conv_general_dilated` has ``lax.conv_general_dilated``'s signature for the
channels-last layouts flax uses; :func:`patches_convolutions` is a flax method interceptor that
makes every ``nn.Conv`` of a module compute through it, without touching the module's code or
parameters. What it cannot express (input dilation, other layouts) is refused with a
:class:`~fedjax_sel.base.ConfigError` naming it.

>>> with patches_convolutions():
...     y = module.apply(variables, x)        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError


def _out_size(length: int, extent: int, stride: int) -> int:
    return (length - extent) // stride + 1


def _explicit_padding(
    padding, spatial: Sequence[int], kernel: Sequence[int], strides, dilation
) -> list[tuple[int, int]]:
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [(0, 0)] * len(spatial)
        if mode == "SAME":
            pads = []
            for length, e, s in zip(spatial, extents, strides, strict=True):
                out = -(-length // s)
                total = max((out - 1) * s + e - length, 0)
                pads.append((total // 2, total - total // 2))
            return pads
        raise ConfigError(f"patches convolution: padding {padding!r} is not supported")
    return [tuple(int(v) for v in p) for p in padding]


def patches_conv_general_dilated(
    lhs: Array,
    rhs: Array,
    window_strides: Sequence[int],
    padding,
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers=None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision=None,
    preferred_element_type=None,
) -> Array:
    """``lax.conv_general_dilated`` for channels-last inputs ``[B, *spatial, C]`` and kernels
    ``[*k, C / groups, F]`` (flax's layout), computed as shifted slices and a matmul.

    Supports any number of spatial dimensions, strides, kernel dilation, ``SAME``/``VALID``/
    explicit padding and feature groups; input dilation and batch groups are refused.
    """
    n = lhs.ndim - 2
    if dimension_numbers is not None:
        spec = tuple(getattr(dimension_numbers, "lhs_spec", ()) or ())
        channels_last = tuple(range(n + 2))[:1] + (n + 1,) + tuple(range(1, n + 1))
        if spec and tuple(spec) != channels_last:
            raise ConfigError(
                "patches convolution supports flax's channels-last layout only, got dimension "
                f"numbers {dimension_numbers}"
            )
    if lhs_dilation is not None and any(d != 1 for d in lhs_dilation):
        raise ConfigError(
            f"patches convolution does not support input dilation (got {tuple(lhs_dilation)}); "
            "use conv_impl=xla for this model"
        )
    if batch_group_count != 1:
        raise ConfigError(f"patches convolution: batch_group_count={batch_group_count} unsupported")
    kernel = tuple(rhs.shape[:n])
    strides = tuple(window_strides) if window_strides else (1,) * n
    dilation = tuple(rhs_dilation) if rhs_dilation else (1,) * n
    spatial = lhs.shape[1:-1]
    pads = _explicit_padding(padding, spatial, kernel, strides, dilation)
    x = jnp.pad(lhs, [(0, 0), *pads, (0, 0)])
    padded = x.shape[1:-1]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    out = [_out_size(p, e, s) for p, e, s in zip(padded, extents, strides, strict=True)]
    if any(o < 1 for o in out):
        raise ConfigError(f"patches convolution: kernel {kernel} larger than input {spatial}")
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = [slice(None)]
        for o, d, s, size in zip(offset, dilation, strides, out, strict=True):
            start = o * d
            index.append(slice(start, start + (size - 1) * s + 1, s))
        slices.append(x[tuple(index)])
    patches = jnp.stack(slices, axis=-2)  # [B, *out, prod(k), C]
    c_in, features = lhs.shape[-1], rhs.shape[-1]
    groups = int(feature_group_count)
    if c_in % groups or features % groups:
        raise ConfigError(
            f"patches convolution: {c_in} input and {features} output features are not "
            f"divisible by feature_group_count={groups}"
        )
    taps = math.prod(kernel)
    patches = patches.reshape(patches.shape[:-2] + (taps, groups, c_in // groups))
    w = rhs.reshape((taps, c_in // groups, groups, features // groups))
    y = jnp.einsum(
        "...kgc,kcgf->...gf",
        patches,
        w,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    return y.reshape(y.shape[:-2] + (features,))


def _conv_interceptor(next_fun, args, kwargs, context):
    """Runs ``nn.Conv.__call__`` with :func:`patches_conv_general_dilated` as its convolution
    (the module's ``conv_general_dilated`` field, read only inside ``__call__``)."""
    module = context.module
    if not isinstance(module, nn.Conv) or context.method_name != "__call__":
        return next_fun(*args, **kwargs)
    previous = module.conv_general_dilated
    object.__setattr__(module, "conv_general_dilated", patches_conv_general_dilated)
    try:
        return next_fun(*args, **kwargs)
    finally:
        object.__setattr__(module, "conv_general_dilated", previous)


@contextlib.contextmanager
def patches_convolutions() -> Iterator[None]:
    """Within the context, every ``nn.Conv`` computes as patches @ kernel."""
    with nn.intercept_methods(_conv_interceptor):
        yield


def count_convolutions(module: nn.Module, x: Array) -> int:
    """How many ``nn.Conv`` calls one forward pass of ``module`` makes (an abstract trace)."""
    calls = []

    def count(next_fun, args, kwargs, context):
        if isinstance(context.module, nn.Conv) and context.method_name == "__call__":
            calls.append(1)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(count):
        jax.eval_shape(lambda: module.init(jax.random.key(0), x))
    return len(calls)
