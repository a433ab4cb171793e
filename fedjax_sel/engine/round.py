"""The round as a value: :func:`round_fn` is one round (fedjax's ``apply``, pure and
jittable), :func:`chunk_fn` a ``lax.scan`` of rounds; with :func:`fedjax_sel.engine.state.
init_state` (``init``) they are the engine's ``(init, apply)`` pair over a static
:class:`~fedjax_sel.engine.spec.RoundSpec`.

A synchronous round chains the phases of :mod:`fedjax_sel.engine.phases` (select -> train ->
aggregate); with ``spec.asynchronous`` a "round" is one FedBuff server update
(:func:`fedjax_sel.engine.asynchronous.event_step`), built from the same pieces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array
from fedjax_sel.engine.asynchronous import event_step
from fedjax_sel.engine.log import RoundLog
from fedjax_sel.engine.phases import aggregate_phase, select_phase, train_phase
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import SimData, SimState


def round_fn(spec: RoundSpec, state: SimState, data: SimData) -> tuple[SimState, RoundLog]:
    """One round (pure; trace it inside ``jit``); with ``asynchronous``, one server update
    (:func:`~fedjax_sel.engine.asynchronous.event_step`)."""
    if spec.asynchronous is not None:
        return event_step(spec, state, data)
    state, selection, available = select_phase(spec, state, data)
    result = train_phase(spec, state, data, selection)
    return aggregate_phase(spec, state, data, selection, available, result)


def chunk_fn(
    spec: RoundSpec, state: SimState, data: SimData, length: int, num_active: Array | int
) -> tuple[SimState, RoundLog]:
    """``length`` rounds in one ``lax.scan`` (``length`` static), of which the first
    ``num_active`` run and the rest pass the state through with zero logs (a last, shorter
    chunk reuses the compiled program of a full one). The logs are stacked over the rounds."""

    def body(s, i):
        def run(s):
            return round_fn(spec, s, data)

        def skip(s):
            return s, jax.tree.map(jnp.zeros_like, jax.eval_shape(run, s)[1])

        if length == 1:
            return run(s)
        return jax.lax.cond(i < num_active, run, skip, s)

    return jax.lax.scan(body, state, jnp.arange(length))
