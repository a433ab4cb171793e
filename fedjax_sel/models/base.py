"""Models as pure functions, and the model registry.

A :class:`Model` bundles a flax module's ``init``/``apply`` with a per-example loss, a
per-example correctness function and an optional regulariser. Each model lives in a module of
its own in this package and registers a factory ``factory(*, input_shape, num_classes,
**options) -> Model`` with :func:`register_model`; its options are the factory's keyword
parameters. ``ridge`` (an L2 penalty on the weight matrices) is an option of every model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params, PRNGKey
from fedjax_sel.registry import Option, Registry


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
      cpu_parallel: the client parallelism that measured fastest on XLA:CPU for this kind of
        model (``vmap`` for tiny per-client matmuls, ``map`` when one client fills the CPU);
        the rule behind ``--parallel auto`` when nothing was measured.
      module: the flax module behind ``apply`` (``from_linen``), or ``None``.
      conv_impl: how its ``nn.Conv`` layers compute: ``patches`` (im2col + matmul,
        :mod:`fedjax_sel.models.conv`) or ``xla`` (``lax.conv``); ``None`` when it has none.
      target_ndim: dimensions of one example's target: 0 for one label or value per example,
        1 for a sequence of token targets ``y[B, T]`` (outputs ``[B, T, V]``; ``loss`` and
        ``correct`` still give one number per example, see :func:`sequence_cross_entropy`).
    """

    name: str
    init: Callable[[PRNGKey], Params]
    apply: Callable[[Params, Array], Array]
    loss: Callable[[Array, Array], Array]
    correct: Callable[[Array, Array], Array] | None
    regularizer: Callable[[Params], Array] | None
    task: str
    cpu_parallel: str = "map"
    module: Any = None
    conv_impl: str | None = None
    target_ndim: int = 0


def cross_entropy(logits: Array, labels: Array) -> Array:
    """Per-example softmax cross-entropy with integer labels."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, labels.astype(jnp.int32)[..., None], axis=-1)[..., 0]


def squared_error(pred: Array, target: Array) -> Array:
    """Per-example squared error (the regression tasks' test metric is its mean, MSE)."""
    return jnp.square(pred.reshape(target.shape) - target)


def argmax_correct(logits: Array, labels: Array) -> Array:
    return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def sequence_cross_entropy(logits: Array, targets: Array, pad: int = 0) -> Array:
    """Per-sequence next-token loss: the mean cross-entropy over the targets of each sequence
    that are not ``pad`` (``logits[B, T, V]``, ``targets[B, T]`` -> float32[B]; 0 for a
    sequence of padding only)."""
    ce = cross_entropy(logits, targets)
    keep = (targets != pad).astype(jnp.float32)
    return jnp.sum(ce * keep, axis=-1) / jnp.maximum(jnp.sum(keep, axis=-1), 1.0)


def sequence_accuracy(logits: Array, targets: Array, counted: Array) -> Array:
    """Per-sequence token accuracy: the fraction of the ``counted`` targets (bool[B, T]) whose
    argmax prediction is right (float32[B]; 0 for a sequence with no counted target)."""
    right = (jnp.argmax(logits, axis=-1) == targets.astype(jnp.int32)) & counted
    n = jnp.sum(counted.astype(jnp.float32), axis=-1)
    return jnp.sum(right.astype(jnp.float32), axis=-1) / jnp.maximum(n, 1.0)


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


CONV_IMPLS = ("patches", "xla", "xla_nhwc")


def from_linen(
    module: nn.Module,
    *,
    name: str,
    input_shape: tuple[int, ...],
    task: str = "classification",
    input_dtype=jnp.float32,
    cpu_parallel: str = "map",
    jit_init: bool = False,
    conv_impl: str = "patches",
) -> Model:
    """A :class:`Model` around a flax linen ``module`` whose ``__call__(x)`` returns logits
    (classification, cross-entropy) or predictions (regression, squared error).

    ``conv_impl``: how the module's ``nn.Conv`` layers compute inside the simulator: as
    ``patches`` @ kernel (fast vmapped over clients and inside compiled loops; equal to
    ``lax.conv`` up to float rounding), with ``xla``'s convolution as written, or ``xla_nhwc``:
    XLA's convolution with both gradients written channels-last (fast inside compiled
    loops on a CPU; :mod:`fedjax_sel.models.conv`). The module is unchanged.
    """
    if task not in ("classification", "regression"):
        raise ConfigError(f"task must be 'classification' or 'regression', got {task!r}")
    if conv_impl not in CONV_IMPLS:
        raise ConfigError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
    from fedjax_sel.models.conv import convolutions, count_convolutions

    dummy = jnp.zeros((1,) + tuple(input_shape), input_dtype)
    has_convs = count_convolutions(module, dummy) > 0

    def init(key: PRNGKey) -> Params:
        return module.init(key, dummy)["params"]

    def apply(params: Params, x: Array) -> Array:
        with convolutions(conv_impl if has_convs else None):
            return module.apply({"params": params}, x)

    classify = task == "classification"
    return Model(
        name=name,
        init=jax.jit(init) if jit_init else init,
        apply=apply,
        loss=cross_entropy if classify else squared_error,
        correct=argmax_correct if classify else None,
        regularizer=None,
        task=task,
        cpu_parallel=cpu_parallel,
        module=module,
        conv_impl=conv_impl if has_convs else None,
    )


def with_conv_impl(model: Model, conv_impl: str) -> Model:
    """``model`` with its convolutions computed by ``conv_impl`` (same parameters)."""
    if model.conv_impl is None or model.conv_impl == conv_impl:
        return model
    if model.module is None:
        raise ConfigError(f"model {model.name!r} has no flax module to switch convolutions in")
    from fedjax_sel.models.conv import convolutions

    module = model.module
    if conv_impl not in CONV_IMPLS:
        raise ConfigError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")

    def apply(params: Params, x: Array) -> Array:
        with convolutions(conv_impl):
            return module.apply({"params": params}, x)

    return model._replace(apply=apply, conv_impl=conv_impl)


def _with_ridge(model: Model, **common: float) -> Model:
    """The registry's ``finish``: applies the ``ridge`` option every model takes."""
    coef = common["ridge"]
    if not coef >= 0:
        raise ConfigError(f"ridge coefficient must be >= 0, got {coef!r}")
    return model._replace(regularizer=ridge(coef) if coef > 0 else None)


MODELS = Registry(
    "model",
    fixed=("input_shape", "num_classes"),
    package="fedjax_sel.models",
    common={"ridge": Option("ridge", 0.0, float)},
    finish=_with_ridge,
)


def register_model(
    name: str,
    *,
    description: str,
    reference: str = "",
    task: str = "classification",
    replace: bool = False,
) -> Callable:
    """Decorator registering ``factory(*, input_shape, num_classes, **options) -> Model``
    (``task="regression"`` for models that need no classes)."""
    return MODELS.register(
        name, description=description, reference=reference, replace=replace, task=task
    )


def make_model(
    name: str, *, input_shape: tuple[int, ...], num_classes: int | None, **options
) -> Model:
    """Builds the registered model ``name`` for examples of ``input_shape``.

    ``options`` are the model's own (``fedjax-sel list``; text values are converted) and
    ``ridge``. Classification models need ``num_classes >= 2``.
    """
    entry = MODELS[name]
    if entry.info.get("task", "classification") == "classification" and (
        num_classes is None or num_classes < 2
    ):
        raise ConfigError(f"model {name!r} needs a classification data set (num_classes >= 2)")
    model = MODELS.build(name, input_shape=tuple(input_shape), num_classes=num_classes, **options)
    return model._replace(name=name)


def check_image_input(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(f"{name} needs image inputs [H, W, C], got input shape {input_shape}")


def check_positive(name: str, **values: int) -> None:
    for key, v in values.items():
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ConfigError(f"model {name!r}: {key} must be a positive integer, got {v!r}")
