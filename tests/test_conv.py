"""Convolutions from any flax model as patches @ kernel, against ``lax.conv``."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.models.conv import count_convolutions, patches_convolutions

CASES = [
    dict(features=6, kernel_size=(3, 3)),
    dict(features=6, kernel_size=(3, 3), strides=(2, 2)),
    dict(features=4, kernel_size=(5, 3), strides=(2, 1), padding="VALID"),
    dict(features=4, kernel_size=(3, 3), padding=((2, 1), (0, 2))),
    dict(features=4, kernel_size=(3, 3), padding="CIRCULAR"),
    dict(features=6, kernel_size=(3, 3), feature_group_count=3),
    dict(features=4, kernel_size=(3, 3), kernel_dilation=(2, 2)),
    dict(
        features=8,
        kernel_size=(2, 2),
        strides=2,
        kernel_dilation=(1, 2),
        use_bias=False,
        feature_group_count=2,
    ),
]


@pytest.mark.parametrize("kwargs", CASES, ids=[str(i) for i in range(len(CASES))])
def test_nn_conv_through_patches_equals_lax_conv(kwargs):
    x = jax.random.normal(jax.random.key(0), (3, 9, 10, 6))
    conv = nn.Conv(**kwargs)
    variables = conv.init(jax.random.key(1), x)
    want = conv.apply(variables, x)
    with patches_convolutions():
        got = conv.apply(variables, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, kernel", [((2, 11, 3), (4,)), ((2, 5, 6, 7, 2), (2, 3, 2))])
def test_one_and_three_spatial_dimensions(shape, kernel):
    x = jax.random.normal(jax.random.key(0), shape)
    conv = nn.Conv(5, kernel, strides=2)
    variables = conv.init(jax.random.key(1), x)
    with patches_convolutions():
        got = conv.apply(variables, x)
    np.testing.assert_allclose(got, conv.apply(variables, x), rtol=1e-5, atol=1e-5)


class TinyCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), strides=2)(x))
        x = nn.relu(nn.Conv(4, (3, 3), feature_group_count=2)(x))
        return nn.Dense(3)(x.reshape(x.shape[0], -1))


def test_a_whole_model_vmapped_over_clients_inside_a_scan():
    """Per-client parameters (vmap) and a compiled loop (scan): the cases the patches exist
    for give lax.conv's results."""
    model = TinyCNN()
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 2))
    params = jax.vmap(lambda k: model.init(k, x))(jax.random.split(jax.random.key(1), 4))

    def run(p):
        def body(carry, _):
            return carry + jnp.sum(model.apply(p, x)), None

        return jax.lax.scan(body, 0.0, jnp.arange(3))[0]

    want = jax.jit(jax.vmap(run))(params)

    def run_patches(p):
        with patches_convolutions():
            return run(p)

    got = jax.jit(jax.vmap(run_patches))(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert count_convolutions(model, x) == 2


def test_input_dilation_is_refused_by_name():
    x = jnp.ones((1, 6, 6, 2))
    conv = nn.Conv(3, (3, 3), input_dilation=(2, 2), padding=((1, 1), (1, 1)))
    variables = conv.init(jax.random.key(0), x)
    with pytest.raises(ConfigError, match=r"input dilation \(got \(2, 2\)\)"):
        with patches_convolutions():
            conv.apply(variables, x)


# xla_nhwc: XLA's convolution with a channels-last kernel gradient (fast in compiled loops)
NHWC_CASES = [
    *CASES,
    dict(features=3, kernel_size=(3, 3), input_dilation=(2, 2), padding=((1, 1), (1, 1))),
]


@pytest.mark.parametrize("kwargs", NHWC_CASES, ids=[str(i) for i in range(len(NHWC_CASES))])
def test_nhwc_grad_convolution_equals_lax_conv_and_its_gradients(kwargs):
    """Values and both gradients against jax's own convolution and transpose rules, over
    strides, padding (explicit, asymmetric, circular), kernel dilation, and the cases it
    leaves to lax.conv unchanged (feature groups, input dilation). One jitted program per
    side holds all three, so the comparison is between programs built alike."""
    from fedjax_sel.models.conv import nhwc_grad_convolutions

    x = jax.random.normal(jax.random.key(0), (3, 9, 10, 6))
    conv = nn.Conv(**kwargs)
    variables = conv.init(jax.random.key(1), x)

    def value_and_grads(v, x):
        def loss(v, x):
            return jnp.sum(conv.apply(v, x) ** 2)

        return conv.apply(v, x), jax.grad(loss, argnums=(0, 1))(v, x)

    def ours(v, x):
        with nhwc_grad_convolutions():
            return value_and_grads(v, x)

    want, got = jax.jit(value_and_grads)(variables, x), jax.jit(ours)(variables, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("shape, kernel", [((2, 11, 3), (4,)), ((2, 5, 6, 7, 2), (2, 3, 2))])
def test_nhwc_grad_in_one_and_three_spatial_dimensions(shape, kernel):
    from fedjax_sel.models.conv import nhwc_grad_conv_general_dilated

    x = jax.random.normal(jax.random.key(0), shape)
    w = jax.random.normal(jax.random.key(1), (*kernel, shape[-1], 5))
    n = len(kernel)
    dn = jax.lax.conv_dimension_numbers(
        x.shape,
        w.shape,
        ("N" + "DHW"[3 - n :] + "C", "DHW"[3 - n :] + "IO", "N" + "DHW"[3 - n :] + "C"),
    )

    def grads(conv):
        return jax.jit(
            jax.grad(
                lambda x, w: jnp.sum(conv(x, w, (2,) * n, "SAME", dimension_numbers=dn) ** 2),
                argnums=(0, 1),
            )
        )(x, w)

    for a, b in zip(
        grads(nhwc_grad_conv_general_dilated), grads(jax.lax.conv_general_dilated), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))


def test_nhwc_grad_training_step_inside_a_scan_equals_xla():
    """The case it exists for: clients' SGD steps inside a compiled loop (map over clients,
    scan over steps) give the same parameters as with XLA's own gradient."""
    from fedjax_sel.models import from_linen
    from fedjax_sel.models.base import with_conv_impl

    x = jax.random.normal(jax.random.key(0), (4, 5, 3, 8, 8, 2))  # 4 clients, 5 steps of 3
    model = from_linen(TinyCNN(), name="tiny", input_shape=(8, 8, 2), conv_impl="xla")
    nhwc = with_conv_impl(model, "xla_nhwc")
    params = model.init(jax.random.key(1))

    def train(m):
        def client(xs):
            def step(p, xb):
                g = jax.grad(lambda p: jnp.sum(m.apply(p, xb) ** 2))(p)
                return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), None

            return jax.lax.scan(step, params, xs)[0]

        return jax.jit(lambda xs: jax.lax.map(client, xs))(x)

    assert nhwc.conv_impl == "xla_nhwc"
    for a, b in zip(jax.tree.leaves(train(nhwc)), jax.tree.leaves(train(model)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
