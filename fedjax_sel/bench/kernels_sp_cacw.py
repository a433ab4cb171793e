"""Kernel benchmarks of SP-CACW (``--clients`` is M, the peers of one target).

* ``simplex_projection``: the sort-based Euclidean projection of one M-vector onto the simplex.
* ``sp_cacw_weights``: one lazy weight update of one target with the default solver: the bound
  matrix ``H = B^T B + L eta diag(v)`` from M bias vectors of MNIST logistic regression's
  d = 7,850 parameters, FTAL's surrogate update, then 200 accelerated PGD steps on the
  accumulated surrogate over the observed peers (here all but the last).
* ``smoothness_power_iteration``: 20 Hessian-vector products of the 784-200-200-10 MLP's loss
  on a batch of M examples (the smoothness estimate of appendix F).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.bench.kernels import register_kernel
from fedjax_sel.kernels.simplex import project_simplex
from fedjax_sel.kernels.smoothness import hessian_spectral_norm
from fedjax_sel.models import make_model
from fedjax_sel.personalized.weighting import bound_matrix, sp_cacw_weights

LOGREG_DIM = 784 * 10 + 10


@register_kernel(
    "simplex_projection",
    default_clients=(10**3, 10**4, 10**5, 10**6),
    description="sort-based Euclidean projection of an M-vector onto the simplex",
)
def _projection(m: int):
    v = jax.random.normal(jax.random.key(0), (m,), jnp.float32)
    return project_simplex, (v,)


@register_kernel(
    "sp_cacw_weights",
    default_clients=(10, 100, 1000),
    description="one SP-CACW weight update (FTAL, the default): H from M bias vectors "
    "(d = 7,850), the surrogate update, 200 PGD steps",
)
def _weights(m: int):
    k1, k2 = jax.random.split(jax.random.key(1))
    bias = 0.1 * jax.random.normal(k1, (m, LOGREG_DIM), jnp.float32)
    var = jax.random.uniform(k2, (m,), jnp.float32, 0.5, 1.5)
    alpha = jnp.full((m,), 1.0 / m, jnp.float32)
    observed = jnp.arange(m) < m - 1

    def fn(bias, var, alpha):
        h = bound_matrix(bias, var, jnp.float32(1.0), jnp.float32(0.5))
        quad, lin = jnp.zeros_like(h), jnp.zeros_like(alpha)
        new, _, _ = sp_cacw_weights(
            h, var[0], alpha, quad, lin, solver="ftal", num_steps=200, mask=observed
        )
        return new

    return fn, (bias, var, alpha)


@register_kernel(
    "smoothness_power_iteration",
    default_clients=(32, 256),
    description="20 Hessian-vector products of the MLP 784-200-200-10 loss on M examples",
)
def _power(m: int):
    model = make_model("mlp", input_shape=(784,), num_classes=10)
    params = model.init(jax.random.key(2))
    x = jax.random.uniform(jax.random.key(3), (m, 784))
    y = jax.random.randint(jax.random.key(4), (m,), 0, 10)

    def fn(params, x, y):
        def loss(p):
            return jnp.mean(model.loss(model.apply(p, x), y))

        return hessian_spectral_norm(loss, params, jax.random.key(5), 20)

    return fn, (params, x, y)
