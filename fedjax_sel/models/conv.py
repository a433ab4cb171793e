"""Convolutions for any flax model inside the compiled round (README, "Bring your own model").

Inside the compiled round a convolution is slow twice on XLA:CPU: vmapped over clients it
becomes a grouped convolution with per-client kernels, and inside a compiled loop (``scan``,
``while``) its training step runs many times slower than outside (jax-ml/jax issue 12868). Two
ways around it, each an ``nn.Conv`` interceptor:

* ``patches``: shifted slices (the patches) and one matmul; per-client kernels become batched
  GEMMs, which stay fast in both places (:func:`patches_conv_general_dilated`).
* ``xla_nhwc``: XLA's own convolution, with both gradients written out as channels-last
  convolutions (:func:`nhwc_grad_conv_general_dilated`). The loop's slowness is in the
  gradients: jax expresses the kernel gradient as a convolution whose batch and feature
  dimensions are swapped, and the input gradient with the kernel's in/out features swapped,
  both in the dimension numbers; XLA:CPU runs them through its library kernel at the top level
  of a program but as a naive loop nest inside a ``while`` body
  (``benchmarks/conv_in_loops.py``). With the transposes and the kernel flip done on the arrays,
  the same sums run through the library kernel everywhere, and clients run one after another
  (``map``) at the loop's speed.

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
import functools
import itertools
import math
from collections.abc import Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

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


def _channels_last(n: int) -> lax.ConvDimensionNumbers:
    """NHWC / HWIO / NHWC for ``n`` spatial dimensions."""
    spatial = tuple(range(1, n + 1))
    return lax.ConvDimensionNumbers(
        lhs_spec=(0, n + 1, *spatial),
        rhs_spec=(n + 1, n, *range(n)),
        out_spec=(0, n + 1, *spatial),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _conv_nhwc_grad(lhs, rhs, strides, pads, dilation, precision):
    return lax.conv_general_dilated(
        lhs,
        rhs,
        strides,
        pads,
        rhs_dilation=dilation,
        dimension_numbers=_channels_last(lhs.ndim - 2),
        precision=precision,
    )


def _conv_nhwc_grad_fwd(lhs, rhs, strides, pads, dilation, precision):
    return _conv_nhwc_grad(lhs, rhs, strides, pads, dilation, precision), (lhs, rhs)


def _conv_nhwc_grad_bwd(strides, pads, dilation, precision, residuals, g):
    lhs, rhs = residuals
    n = lhs.ndim - 2
    dn = _channels_last(n)
    sp = tuple(range(1, n + 1))
    kernel, spatial, out = rhs.shape[:n], lhs.shape[1:-1], g.shape[1:-1]
    kernel_extent = [1 + d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    out_extent = [1 + s * (o - 1) for o, s in zip(out, strides, strict=True)]
    # input gradient: the output gradient, dilated by the strides, convolved with the kernel
    # flipped in space and with its in/out features swapped (jax's lhs transpose rule, with
    # the swap done on the array, not in the dimension numbers)
    before = [e - lo - 1 for e, (lo, _hi) in zip(kernel_extent, pads, strict=True)]
    after = [
        length + e - 1 - oe - b
        for length, e, oe, b in zip(spatial, kernel_extent, out_extent, before, strict=True)
    ]
    flipped = jnp.flip(rhs, axis=tuple(range(n))).swapaxes(n, n + 1)
    d_lhs = lax.conv_general_dilated(
        g,
        flipped,
        (1,) * n,
        list(zip(before, after, strict=True)),
        lhs_dilation=strides,
        rhs_dilation=dilation,
        dimension_numbers=dn,
        precision=precision,
    )
    # kernel gradient: dW[k, c, f] = sum_{b, o} x_pad[b, o * s + k * d, c] g[b, o, f], a
    # convolution of the input (channels as batch, examples as features) with the output
    # gradient as its kernel; the forward strides become the kernel dilation and the forward
    # kernel dilation the window strides (jax's rhs transpose rule, written channels-last)
    pads_for_grad = [
        (lo, oe - length + e - lo - 1)
        for (lo, _hi), length, e, oe in zip(pads, spatial, kernel_extent, out_extent, strict=True)
    ]
    d_rhs = lax.conv_general_dilated(
        lhs.transpose(n + 1, *sp, 0),  # [B, *sp, C] -> [C, *sp, B]
        g.transpose(*sp, 0, n + 1),  # [B, *o, F] -> [*o, B, F]
        dilation,
        pads_for_grad,
        rhs_dilation=strides,
        dimension_numbers=dn,
        precision=precision,
    )  # [C, *k, F]
    return d_lhs, d_rhs.transpose(*sp, 0, n + 1)


_conv_nhwc_grad.defvjp(_conv_nhwc_grad_fwd, _conv_nhwc_grad_bwd)


def nhwc_grad_conv_general_dilated(
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
    """``lax.conv_general_dilated`` with both gradients computed as channels-last
    convolutions (the module docstring says why). Same values as XLA's own gradients; what it
    does not cover (input dilation, feature or batch groups, other layouts, a preferred
    output type) is left to ``lax.conv_general_dilated`` unchanged."""
    n = lhs.ndim - 2
    plain = (
        (lhs_dilation is None or all(d == 1 for d in lhs_dilation))
        and feature_group_count == 1
        and batch_group_count == 1
        and preferred_element_type is None
        # None, layout strings or ConvDimensionNumbers, compared in one form
        and lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers) == _channels_last(n)
    )
    if not plain:
        return lax.conv_general_dilated(
            lhs,
            rhs,
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            dimension_numbers,
            feature_group_count,
            batch_group_count,
            precision,
            preferred_element_type,
        )
    kernel = tuple(rhs.shape[:n])
    strides = tuple(int(s) for s in window_strides) if window_strides else (1,) * n
    dilation = tuple(int(d) for d in rhs_dilation) if rhs_dilation else (1,) * n
    pads = tuple(_explicit_padding(padding, lhs.shape[1:-1], kernel, strides, dilation))
    return _conv_nhwc_grad(lhs, rhs, strides, pads, dilation, precision)


def _interceptor(conv_general_dilated):
    """A flax method interceptor that runs ``nn.Conv.__call__`` with ``conv_general_dilated``
    as its convolution (the module's field of that name, read only inside ``__call__``)."""

    def intercept(next_fun, args, kwargs, context):
        module = context.module
        if not isinstance(module, nn.Conv) or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        previous = module.conv_general_dilated
        object.__setattr__(module, "conv_general_dilated", conv_general_dilated)
        try:
            return next_fun(*args, **kwargs)
        finally:
            object.__setattr__(module, "conv_general_dilated", previous)

    return intercept


# the convolution each intercepted implementation swaps in (``xla``: none, as written)
_INTERCEPTED = {
    "patches": patches_conv_general_dilated,
    "xla_nhwc": nhwc_grad_conv_general_dilated,
}


@contextlib.contextmanager
def convolutions(conv_impl: str | None) -> Iterator[None]:
    """The context in which ``nn.Conv`` layers compute as ``conv_impl`` says (``xla`` or
    ``None``: as written)."""
    conv = _INTERCEPTED.get(conv_impl)
    if conv is None:
        yield
        return
    with nn.intercept_methods(_interceptor(conv)):
        yield


def patches_convolutions() -> contextlib.AbstractContextManager[None]:
    """Within the context, every ``nn.Conv`` computes as patches @ kernel."""
    return convolutions("patches")


def nhwc_grad_convolutions() -> contextlib.AbstractContextManager[None]:
    """Within the context, every ``nn.Conv`` computes with XLA's convolution and channels-last
    gradients."""
    return convolutions("xla_nhwc")


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
