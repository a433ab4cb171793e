"""The engine: a round as a value, fedjax's ``FederatedAlgorithm(init, apply)`` made pure and
jittable over a static :class:`RoundSpec`::

    spec = RoundSpec.create(dataset, model, strategy, local=LocalConfig(), per_round=10)
    state = init_state(spec, sim_spec(dataset, params, per_round=spec.slots, num_rounds=T),
                       key, HParams.of(lr=0.05))
    step = jax.jit(functools.partial(round_fn, spec))  # the spec is static, closed over
    state, log = step(state, SimData.of(dataset))

Its rooms: :mod:`.spec` (the spec), :mod:`.state` (the state, :func:`init_state`, stacking),
:mod:`.oracle` (what strategies and runs read of the model), :mod:`.phases` (a synchronous
round's phases), :mod:`.asynchronous` (FedBuff's event step), :mod:`.round` (:func:`round_fn`,
:func:`chunk_fn`), :mod:`.system`, :mod:`.fedbuff` and :mod:`.log`. The host driver that jits,
chunks, batches and evaluates is :class:`fedjax_sel.engine.simulation.Simulation`."""

from fedjax_sel.engine.round import chunk_fn, round_fn
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import (
    NotStackable,
    SimData,
    SimState,
    SlotTiming,
    init_state,
    sim_spec,
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
    "init_state",
    "round_fn",
    "sim_spec",
    "stack_sim_data",
    "stack_states",
    "unstack_state",
]
