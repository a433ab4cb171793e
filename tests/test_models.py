"""Models, losses and the im2col convolution against independent references."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.models import cross_entropy, make_model, masked_mean, ridge, squared_error


def test_cross_entropy_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32) * 5
    labels = rng.integers(0, 4, 6)
    z = logits - logits.max(1, keepdims=True)
    ref = -(z[np.arange(6), labels] - np.log(np.exp(z).sum(1)))
    np.testing.assert_allclose(np.asarray(cross_entropy(logits, labels)), ref, rtol=1e-5)


def test_squared_error_and_masked_mean():
    pred = jnp.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(squared_error(pred, jnp.array([0.0, 2.0, 1.0])), [1.0, 0.0, 9.0])
    assert float(masked_mean(jnp.array([1.0, 2.0, 9.0]), jnp.array([True, True, False]))) == 1.5
    assert float(masked_mean(jnp.array([1.0]), jnp.array([False]))) == 0.0


def test_ridge_sums_kernels_only():
    params = {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2) * 10}}
    assert float(ridge(0.5)(params)) == pytest.approx(0.5 * 0.5 * 6)


def test_any_flax_conv_model_switches_convolutions_without_new_parameters():
    from fedjax_sel.models import from_linen
    from fedjax_sel.models.base import with_conv_impl

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(3, (3, 3), strides=2)(x))
            return nn.Dense(4)(x.reshape(x.shape[0], -1))

    patches = from_linen(Net(), name="net", input_shape=(8, 8, 2))
    xla = with_conv_impl(patches, "xla")
    assert (patches.conv_impl, xla.conv_impl) == ("patches", "xla")
    params = jax.jit(patches.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 8, 8, 2))
    np.testing.assert_allclose(
        jax.jit(patches.apply)(params, x), jax.jit(xla.apply)(params, x), rtol=1e-5, atol=1e-5
    )
    dense = from_linen(nn.Dense(3), name="dense", input_shape=(4,))
    assert dense.conv_impl is None and with_conv_impl(dense, "xla") is dense


@pytest.mark.parametrize(
    "name,shape,classes,xdtype",
    [
        ("logreg", (60,), 10, jnp.float32),
        ("linreg", (2,), None, jnp.float32),
        ("mlp", (8, 8, 1), 10, jnp.float32),
        ("cnn", (28, 28, 1), 62, jnp.float32),
        ("lstm", (80,), 80, jnp.int32),
    ],
)
def test_model_shapes(name, shape, classes, xdtype):
    m = make_model(name, input_shape=shape, num_classes=classes)
    params = jax.jit(m.init)(jax.random.key(0))
    out = jax.jit(m.apply)(params, jnp.zeros((3,) + shape, xdtype))
    assert out.shape == ((3,) if classes is None else (3, classes))
    assert m.task == ("regression" if classes is None else "classification")


def test_cnn_implementations_agree():
    a = make_model("cnn", input_shape=(12, 12, 1), num_classes=5, conv_impl="patches")
    b = make_model("cnn", input_shape=(12, 12, 1), num_classes=5, conv_impl="xla")
    params = jax.jit(a.init)(jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (4, 12, 12, 1))
    np.testing.assert_allclose(
        np.asarray(jax.jit(a.apply)(params, x)),
        np.asarray(jax.jit(b.apply)(params, x)),
        rtol=1e-4,
        atol=1e-5,
    )


def test_mlp_parameter_count_is_mnist_784_200_200_10():
    m = make_model("mlp", input_shape=(28, 28, 1), num_classes=10)
    n = sum(x.size for x in jax.tree.leaves(jax.eval_shape(m.init, jax.random.key(0))))
    assert n == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def test_make_model_errors():
    with pytest.raises(ConfigError, match="unknown model 'vgg'"):
        make_model("vgg", input_shape=(4,), num_classes=2)
    with pytest.raises(ConfigError, match="classification"):
        make_model("mlp", input_shape=(4,), num_classes=None)
    with pytest.raises(ConfigError, match="image inputs"):
        make_model("cnn", input_shape=(60,), num_classes=10)
    with pytest.raises(ConfigError, match="ridge"):
        make_model("logreg", input_shape=(4,), num_classes=2, ridge=-1)


def test_resnet18_through_make_model():
    # make_model("resnet18") is the GroupNorm ResNet-18 of models/resnet.py, with the ridge term
    from fedjax_sel.models.resnet import make_resnet18

    model = make_model("resnet18", input_shape=(8, 8, 3), num_classes=5, width=4, ridge=0.1)
    direct = make_resnet18(input_shape=(8, 8, 3), num_classes=5, width=4)
    params = jax.jit(model.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
    # jitted: one program each instead of an eager dispatch per layer
    out = jax.jit(model.apply)(params, x)
    np.testing.assert_array_equal(out, jax.jit(direct.apply)(params, x))
    assert out.shape == (2, 5)
    kernels = [
        leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if "kernel" in jax.tree_util.keystr(path)
    ]
    expected = 0.05 * sum(float(np.sum(np.square(k))) for k in kernels)
    np.testing.assert_allclose(float(jax.jit(model.regularizer)(params)), expected, rtol=1e-5)
    with pytest.raises(ConfigError, match="width=5"):
        make_model("resnet18", input_shape=(8, 8, 3), num_classes=5, width=5, groups=2)


def _np_dense(p, x):
    return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def test_mlp_forward_matches_numpy():
    model = make_model("mlp", input_shape=(4, 3), num_classes=5, hidden=(7, 6))
    params = jax.jit(model.init)(jax.random.key(3))
    x = np.random.default_rng(0).normal(size=(9, 4, 3)).astype(np.float32)
    h = x.reshape(9, -1).astype(np.float64)
    for name in ("Dense_0", "Dense_1"):
        h = np.maximum(_np_dense(params[name], h), 0.0)
    want = _np_dense(params["Dense_2"], h)
    np.testing.assert_allclose(
        jax.jit(model.apply)(params, jnp.asarray(x)), want, rtol=1e-5, atol=1e-6
    )


def _np_lstm_layer(p, xs):
    """The LSTM recurrence (Hochreiter and Schmidhuber; flax's gate layout: input kernels
    ``i*`` without bias, recurrent kernels ``h*`` with bias, gates i, f, g, o) from zeros."""
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    k = {n: np.asarray(v["kernel"], np.float64) for n, v in p.items()}
    b = {n: np.asarray(v["bias"], np.float64) for n, v in p.items() if "bias" in v}
    batch, steps, _ = xs.shape
    hidden = k["hi"].shape[0]
    h, c = np.zeros((batch, hidden)), np.zeros((batch, hidden))
    out = []
    for t in range(steps):
        x = xs[:, t]
        gate = {g: x @ k[f"i{g}"] + h @ k[f"h{g}"] + b[f"h{g}"] for g in "ifgo"}
        c = sig(gate["f"]) * c + sig(gate["i"]) * np.tanh(gate["g"])
        h = sig(gate["o"]) * np.tanh(c)
        out.append(h)
    return np.stack(out, axis=1)


def test_char_lstm_forward_matches_numpy():
    model = make_model(
        "lstm", input_shape=(6,), num_classes=11, embed_dim=3, lstm_hidden=5, lstm_layers=2
    )
    params = jax.jit(model.init)(jax.random.key(2))
    tokens = np.random.default_rng(1).integers(0, 11, (4, 6))
    xs = np.asarray(params["Embed_0"]["embedding"], np.float64)[tokens]
    for layer in ("OptimizedLSTMCell_0", "OptimizedLSTMCell_1"):
        xs = _np_lstm_layer(params[layer], xs)
    want = _np_dense(params["Dense_0"], xs[:, -1])
    got = jax.jit(model.apply)(params, jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["logreg", "mlp", "linreg"])
def test_torch_init_is_pytorchs_linear_default(name):
    """``init=torch``: every weight and bias uniform in +-1/sqrt(fan_in), as PyTorch's
    ``nn.Linear`` (kaiming_uniform with a = sqrt(5)); the default keeps flax's (zero bias)."""
    from scipy import stats

    shape, classes = (784,), 10
    torch_like = make_model(name, input_shape=shape, num_classes=classes, init="torch")
    params = torch_like.init(jax.random.key(0))
    flat = jax.tree_util.tree_leaves_with_path(params)
    assert flat
    for path, leaf in flat:
        layer = path[0].key
        kernel = params[layer]["kernel"]
        bound = 1.0 / np.sqrt(kernel.shape[0])
        v = np.asarray(leaf).ravel()
        assert np.abs(v).max() <= bound
        if v.size >= 2000:  # a uniform's spread and shape (Kolmogorov-Smirnov)
            assert v.std() == pytest.approx(bound / np.sqrt(3), rel=0.03)
            assert stats.kstest(v, stats.uniform(-bound, 2 * bound).cdf).pvalue > 1e-3
    default = make_model(name, input_shape=shape, num_classes=classes).init(jax.random.key(0))
    for layer in default:
        if "bias" in default[layer]:
            assert not np.any(np.asarray(default[layer]["bias"]))
    with pytest.raises(ConfigError, match=r"init must be one of \('flax', 'torch'\), got 'he'"):
        make_model(name, input_shape=shape, num_classes=classes, init="he")
