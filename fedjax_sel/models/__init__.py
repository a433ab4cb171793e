"""Models as pure functions: a :class:`Model` bundles a flax module's ``init``/``apply`` with a
per-example loss, a per-example correctness function and an optional regulariser.

>>> m = make_model("logreg", input_shape=(60,), num_classes=10)
>>> params = m.init(jax.random.key(0))
>>> m.apply(params, jnp.zeros((4, 60))).shape
(4, 10)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params, PRNGKey
from fedjax_sel.models import zoo


class Model(NamedTuple):
    """A model reduced to pure functions.

    Attributes:
      name: registry name.
      init: ``key -> params``.
      apply: ``(params, x[B, ...]) -> outputs[B, ...]``.
      loss: ``(outputs, y) -> float32[B]`` per-example loss.
      correct: ``(outputs, y) -> float32[B]`` 1.0 where the prediction is right (``None`` for
        regression).
      regularizer: ``params -> scalar`` added to the training objective (ridge), or ``None``.
      task: ``"classification"`` or ``"regression"``.
    """

    name: str
    init: Callable[[PRNGKey], Params]
    apply: Callable[[Params, Array], Array]
    loss: Callable[[Array, Array], Array]
    correct: Callable[[Array, Array], Array] | None
    regularizer: Callable[[Params], Array] | None
    task: str


def cross_entropy(logits: Array, labels: Array) -> Array:
    """Per-example softmax cross-entropy with integer labels."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, labels.astype(jnp.int32)[..., None], axis=-1)[..., 0]


def squared_error(pred: Array, target: Array) -> Array:
    """Per-example squared error (the regression tasks' test metric is its mean, MSE)."""
    return jnp.square(pred.reshape(target.shape) - target)


def argmax_correct(logits: Array, labels: Array) -> Array:
    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def masked_mean(values: Array, mask: Array) -> Array:
    """Mean of ``values`` over ``mask``; 0 when the mask is empty."""
    m = mask.astype(values.dtype)
    return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)


def ridge(coef: float) -> Callable[[Params], Array]:
    """``coef / 2 * ||W||^2`` over weight matrices (leaves named ``kernel``; biases excluded)."""

    def reg(params: Params) -> Array:
        total = jnp.zeros((), jnp.float32)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            if "kernel" in jax.tree_util.keystr(path):
                total = total + jnp.sum(jnp.square(leaf))
        return 0.5 * coef * total

    return reg


MODELS: dict[str, str] = {
    "logreg": "multinomial logistic regression (optional ridge: --model-arg ridge=0.01)",
    "linreg": "linear regression (squared error); D = input features (+ intercept feature)",
    "mlp": "multilayer perceptron, hidden sizes 200-200 by default (MNIST 784-200-200-10)",
    "cnn": "CNN: two 5x5 conv (32, 64) + 2x2 max-pool, dense 512, dense classes",
    "lstm": "character LSTM: 8-dim embedding, two 256-unit LSTM layers, next-character logits",
    "resnet18": "ResNet-18 with GroupNorm (CIFAR stem; --model-arg width=64,groups=2)",
}


def make_model(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int | None,
    ridge_coef: float = 0.0,
    hidden: tuple[int, ...] = (200, 200),
    conv_impl: str = "patches",
    embed_dim: int = 8,
    lstm_hidden: int = 256,
    lstm_layers: int = 2,
    width: int = 64,
    groups: int = 2,
) -> Model:
    """Builds the model ``name`` (a key of :data:`MODELS`) for the given input shape.

    Args:
      name: model name.
      input_shape: one example's feature shape.
      num_classes: output classes (``None`` for ``linreg``).
      ridge_coef: ridge coefficient (any model; 0 disables it).
      hidden: MLP hidden sizes.
      conv_impl: ``"patches"`` (im2col + matmul; vmaps into batched GEMMs, and stays fast inside
        compiled loops on XLA:CPU) or ``"xla"`` (``lax.conv``); both compute the same function.
      embed_dim, lstm_hidden, lstm_layers: the character LSTM's sizes.
      width, groups: ResNet-18's base width and GroupNorm groups.
    """
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if ridge_coef < 0:
        raise ConfigError(f"ridge coefficient must be >= 0, got {ridge_coef}")
    task = "regression" if name == "linreg" else "classification"
    if task == "classification" and (num_classes is None or num_classes < 2):
        raise ConfigError(f"model {name!r} needs a classification data set (num_classes >= 2)")
    if name == "resnet18":
        from fedjax_sel.models.resnet import make_resnet18  # noqa: PLC0415 (cycle: resnet imports us)

        resnet = make_resnet18(
            input_shape=tuple(input_shape), num_classes=num_classes, width=width, groups=groups
        )
        return resnet._replace(regularizer=ridge(ridge_coef) if ridge_coef > 0 else None)
    if name == "logreg":
        module = zoo.Linear(features=num_classes)
    elif name == "linreg":
        module = zoo.Linear(features=1, use_bias=False)
    elif name == "mlp":
        module = zoo.MLP(hidden=tuple(hidden), features=num_classes)
    elif name == "cnn":
        if len(input_shape) != 3:
            raise ConfigError(f"cnn needs image inputs [H, W, C], got input shape {input_shape}")
        if conv_impl not in ("patches", "xla"):
            raise ConfigError(f"conv_impl must be 'patches' or 'xla', got {conv_impl!r}")
        module = zoo.CNN(features=num_classes, conv_impl=conv_impl)
    else:
        if len(input_shape) != 1:
            raise ConfigError(f"lstm needs token-id sequences [T], got input shape {input_shape}")
        module = zoo.CharLSTM(
            vocab_size=num_classes, embed_dim=embed_dim, hidden=lstm_hidden, layers=lstm_layers
        )
    dummy = jnp.zeros((1,) + tuple(input_shape), jnp.int32 if name == "lstm" else jnp.float32)

    def init(key: PRNGKey) -> Params:
        return module.init(key, dummy)["params"]

    def apply(params: Params, x: Array) -> Array:
        return module.apply({"params": params}, x)

    if task == "regression":
        loss, correct = squared_error, None
    else:
        loss, correct = cross_entropy, argmax_correct
    return Model(
        name=name,
        init=init,
        apply=apply,
        loss=loss,
        correct=correct,
        regularizer=ridge(ridge_coef) if ridge_coef > 0 else None,
        task=task,
    )


__all__ = [
    "MODELS",
    "Model",
    "argmax_correct",
    "cross_entropy",
    "make_model",
    "masked_mean",
    "ridge",
    "squared_error",
]
