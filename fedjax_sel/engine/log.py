"""What one round logs: :class:`RoundLog` (stacked over rounds by ``Simulation.run_rounds``)
and the diagnostics every round carries (shared by synchronous rounds and FedBuff's event
steps)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array


class RoundLog(NamedTuple):
    """Per-round outputs of :meth:`Simulation.run_rounds` (stacked over rounds)."""

    round: Array
    clients: Array  # int32[P]
    mask: Array  # bool[P]
    weights: Array  # float32[P]
    train_loss: Array  # mean over selected slots (NaN when none)
    num_selected: Array
    num_available: Array
    update_norm: Array  # mean over selected slots
    finite: Array  # bool: global parameters finite after the round
    diagnostics: dict  # the strategy's per-round diagnostics (Selection.diagnostics) + engine's
    duration: Array  # simulated seconds of the round
    sim_time: Array  # the virtual clock after the round
    dropped: Array  # selected slots that failed (dropout)
    stragglers: Array  # kept slots cut by the deadline (partial work)
    client_updates: Array  # int32: model updates received (engine/cost.py: RoundCost)
    uplink_bytes: Array  # float32: their bytes
    client_flops: Array  # float32: clients' training and oracle work FLOPs


def round_diagnostics(diagnostics: dict | None, available: Array, counts: Array) -> dict:
    """The round's logged diagnostics: the strategy's (its sampling ``law`` reduced to
    ``law_entropy_ratio`` and ``law_max_over_uniform``, see :class:`Selection`) and the
    engine's ``never_picked`` (clients not selected in any round so far)."""
    out = dict(diagnostics or {})
    law = out.pop("law", None)
    if law is not None:
        p = jnp.where(available, law, 0.0).astype(jnp.float32)
        p = p / jnp.maximum(jnp.sum(p), 1e-30)
        n = jnp.maximum(jnp.sum(available), 1).astype(jnp.float32)
        entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
        out["law_entropy_ratio"] = jnp.where(n > 1, entropy / jnp.log(n), 1.0)
        out["law_max_over_uniform"] = jnp.max(p) * n
    out["never_picked"] = jnp.sum(counts == 0)
    return out
