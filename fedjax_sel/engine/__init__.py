"""The engine: the simulation state (:mod:`.state`) and the round as pure phases over a
static :class:`~fedjax_sel.engine.round.RoundSpec` (:mod:`.round`). The host driver that jits,
chunks, batches and evaluates is :class:`fedjax_sel.engine.simulation.Simulation`."""

from fedjax_sel.engine.round import RoundSpec, chunk_fn, round_fn
from fedjax_sel.engine.state import (
    NotStackable,
    SimData,
    SimState,
    SlotTiming,
    stack_sim_data,
    stack_states,
    unstack_state,
)

__all__ = [
    "NotStackable",
    "RoundSpec",
    "SimData",
    "SimState",
    "SlotTiming",
    "chunk_fn",
    "round_fn",
    "stack_sim_data",
    "stack_states",
    "unstack_state",
]
