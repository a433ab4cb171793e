"""Analytic FLOP counts of flax models (one count per model, the same on every backend).

XLA's cost analysis depends on the backend's fusions and counts a loop body once (so a
recurrent model's time loop counts as one step): the H100 and the CPU reported 10.7 and 23.5
GFLOP per client update for the same CNN. Counting the multiply-adds of each layer from its
shapes gives one number everywhere: :func:`forward_flops` traces the model once (abstractly)
and adds ``2 m n k`` for every matmul-like layer (``nn.Dense``, ``nn.Conv``, the LSTM cells
inside ``nn.RNN``); elementwise work (activations, pooling, normalisation, the loss) is left
out. A training step is counted as three forward passes (:func:`train_step_flops`; the backward
pass costs about two).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError


def forward_flops(module: nn.Module, x: Array) -> float:
    """FLOPs of one forward pass of ``module`` on the batch ``x`` (see the module docstring)."""
    total = [0.0]
    inside_rnn = [0]

    def count(next_fun, args, kwargs, context):
        m, method = context.module, context.method_name
        if method != "__call__":
            return next_fun(*args, **kwargs)
        if isinstance(m, nn.RNN):
            inputs = args[0]
            cell = m.cell
            hidden = getattr(cell, "features", None)
            if not isinstance(cell, (nn.OptimizedLSTMCell, nn.LSTMCell)) or hidden is None:
                raise ConfigError(f"FLOP count: recurrent cell {type(cell).__name__} unsupported")
            batch, steps = math.prod(inputs.shape[:-2]), inputs.shape[-2]
            total[0] += 2.0 * batch * steps * (inputs.shape[-1] + hidden) * 4 * hidden
            inside_rnn[0] += 1
            try:
                return next_fun(*args, **kwargs)
            finally:
                inside_rnn[0] -= 1
        out = next_fun(*args, **kwargs)
        if inside_rnn[0]:
            return out
        if isinstance(m, nn.Dense):
            inputs = args[0]
            total[0] += 2.0 * math.prod(inputs.shape[:-1]) * inputs.shape[-1] * m.features
        elif isinstance(m, nn.Conv):
            inputs = args[0]
            kernel = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,)
            c_in = inputs.shape[-1] // m.feature_group_count
            total[0] += 2.0 * math.prod(out.shape[:-1]) * math.prod(kernel) * c_in * m.features
        return out

    with nn.intercept_methods(count):
        jax.eval_shape(lambda: module.init_with_output(jax.random.key(0), x))
    return total[0]


def train_step_flops(module: nn.Module, x: Array) -> float:
    """FLOPs of one SGD step on the batch ``x``: forward plus backward, three forward passes."""
    return 3.0 * forward_flops(module, x)


def example_flops(module: nn.Module | None, feature_shape: tuple[int, ...], dtype) -> float:
    """FLOPs of one example's forward pass through ``module`` (features of ``feature_shape``
    and ``dtype``); 0 for a model without a flax module."""
    if module is None:
        return 0.0
    return forward_flops(module, jnp.zeros((1,) + tuple(feature_shape), dtype))
