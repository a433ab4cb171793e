"""Models as pure functions, one module per model, registered by name.

>>> m = make_model("logreg", input_shape=(60,), num_classes=10)
>>> params = m.init(jax.random.key(0))
>>> m.apply(params, jnp.zeros((4, 60))).shape
(4, 10)

Adding a model is one file in this package: a flax module and a factory decorated with
:func:`register_model` (see :mod:`fedjax_sel.models.mlp`); a model defined elsewhere registers
the same way, or is wrapped with :func:`from_linen` and passed to ``Simulation`` directly.
"""

from fedjax_sel.models.base import (
    MODELS,
    Model,
    argmax_correct,
    cross_entropy,
    from_linen,
    make_model,
    masked_mean,
    register_model,
    ridge,
    sequence_accuracy,
    sequence_cross_entropy,
    squared_error,
)

__all__ = [
    "MODELS",
    "Model",
    "argmax_correct",
    "cross_entropy",
    "from_linen",
    "make_model",
    "masked_mean",
    "register_model",
    "ridge",
    "sequence_accuracy",
    "sequence_cross_entropy",
    "squared_error",
]
