"""``members_cond``: under the members' vmap a branch runs only when some member takes it, and
every member gets what ``lax.cond`` gives it alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.members import MEMBERS_AXIS, inside_members, members_cond


def counting_branches(calls: list[str]):
    """Two branches that log each run (a host callback inside the branch, so a branch that
    is not executed logs nothing) and return a pytree with a key, a vector and a scalar."""

    def true_fn(x, key):
        jax.debug.callback(lambda: calls.append("true"))
        return {"x": x + 1.0, "v": jnp.full((3,), x), "key": jax.random.fold_in(key, 1)}

    def false_fn(x, key):
        jax.debug.callback(lambda: calls.append("false"))
        return {"x": x * 2.0, "v": jnp.zeros((3,)), "key": jax.random.fold_in(key, 2)}

    return true_fn, false_fn


def per_member_conds(preds, xs, keys, true_fn, false_fn):
    return [
        jax.jit(lambda p, x, k: jax.lax.cond(p, true_fn, false_fn, x, k))(p, x, k)
        for p, x, k in zip(preds, xs, keys, strict=True)
    ]


@pytest.mark.parametrize(
    "preds, runs",
    [
        ([True, True, True], {"true"}),
        ([False, False, False], {"false"}),
        ([True, False, True], {"true", "false"}),
    ],
)
def test_members_cond_runs_only_the_branches_members_take(preds, runs):
    calls: list[str] = []
    true_fn, false_fn = counting_branches(calls)
    xs = jnp.arange(3, dtype=jnp.float32) + 0.5
    keys = jax.random.split(jax.random.key(0), 3)
    batched = jax.jit(
        jax.vmap(lambda p, x, k: members_cond(p, true_fn, false_fn, x, k), axis_name=MEMBERS_AXIS)
    )
    out = jax.block_until_ready(batched(jnp.asarray(preds), xs, keys))
    assert set(calls) == runs
    calls.clear()
    for i, alone in enumerate(per_member_conds(preds, xs, keys, true_fn, false_fn)):
        np.testing.assert_array_equal(out["x"][i], alone["x"])
        np.testing.assert_array_equal(out["v"][i], alone["v"])
        np.testing.assert_array_equal(
            jax.random.key_data(out["key"][i]), jax.random.key_data(alone["key"])
        )


def test_without_the_members_axis_it_is_lax_cond():
    calls: list[str] = []
    true_fn, false_fn = counting_branches(calls)
    key = jax.random.key(0)
    out = jax.jit(lambda p, x: members_cond(p, true_fn, false_fn, x, key))(True, 2.0)
    jax.block_until_ready(out)
    assert calls == ["true"] and float(out["x"]) == 3.0
    assert not inside_members()
    # an unnamed vmap (not the members') keeps lax.cond's select: both branches run
    calls.clear()
    jax.block_until_ready(
        jax.jit(jax.vmap(lambda p, x: members_cond(p, true_fn, false_fn, x, key)))(
            jnp.array([True, True]), jnp.array([1.0, 2.0])
        )
    )
    assert set(calls) == {"true", "false"}
