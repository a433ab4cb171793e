"""Branches that stay branches when members (seeds, grid points) are vmapped together.

Under ``jax.vmap`` a ``lax.cond`` whose predicate is batched becomes a select, even when every
member's predicate is the same: every member runs both branches. The seed batch
(:meth:`fedjax_sel.engine.simulation.Simulation.run_rounds_batch`) vmaps members whose
predicates are nearly always equal (DivFL's warm start is round 0 for every seed; FilFL filters
on the same schedule), so a round that branches paid for both branches in every member, every
round. The members' vmap is named :data:`MEMBERS_AXIS`, and inside it :func:`members_cond` runs
each branch only when some member takes it (a collective over the members tells), then picks
each member's result: one branch when all agree, both (the select, as before) when they differ.
Outside that vmap it is ``lax.cond``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

MEMBERS_AXIS = "fedjax_sel_members"


def inside_members() -> bool:
    """Whether the code being traced runs under the members' vmap (:data:`MEMBERS_AXIS`)."""
    try:
        jax.lax.axis_size(MEMBERS_AXIS)
    except NameError:
        return False
    return True


def members_cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``lax.cond(pred, true_fn, false_fn, *operands)`` that runs one branch for all members
    when their predicates agree (the module docstring); the same values either way. The
    branches return the same pytree structure and shapes, as ``lax.cond``'s must."""
    if not inside_members():
        return jax.lax.cond(pred, true_fn, false_fn, *operands)
    flag = jnp.asarray(pred).astype(jnp.int32)
    # collectives over the members' axis give one value for the whole batch (not batched), so
    # the conds below are branches; each branch runs when some member needs it
    any_true = jax.lax.pmax(flag, MEMBERS_AXIS) > 0
    any_false = jax.lax.pmin(flag, MEMBERS_AXIS) == 0

    # both branches return the same types (lax.cond's rule), so one shape stands for both
    shape = jax.eval_shape(true_fn, *operands)

    def zeros(*_):
        return jax.tree.map(jnp.zeros_like, shape)

    on_true = jax.lax.cond(any_true, true_fn, zeros, *operands)
    on_false = jax.lax.cond(any_false, false_fn, zeros, *operands)
    return jax.tree.map(lambda t, f: jnp.where(pred, t, f), on_true, on_false)
