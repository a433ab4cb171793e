"""FedBuff's event step: one asynchronous server update as a pure function of
``(spec, state, data)``, built from the synchronous round's pieces (:mod:`fedjax_sel.engine.
phases`: keys, durations, the strategy's pick, the report and the close). The algorithm and its
event order are described in :mod:`fedjax_sel.engine.fedbuff`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Selection
from fedjax_sel.engine.cost import round_cost
from fedjax_sel.engine.fedbuff import FedBuff, SlotsState, schedule, staleness_weight
from fedjax_sel.engine.log import RoundLog
from fedjax_sel.engine.phases import (
    Clock,
    choose,
    close_round,
    report_updates,
    round_keys,
    server_update,
)
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import SimData, SimState
from fedjax_sel.training.server import weighted_delta
from fedjax_sel.tree import masked_deltas, row_mask


def event_step(spec: RoundSpec, state: SimState, data: SimData) -> tuple[SimState, RoundLog]:
    """One FedBuff server update (steps 1-5 of :mod:`fedjax_sel.engine.fedbuff`) of a round
    spec with ``asynchronous=FedBuff(...)``."""
    mode: FedBuff = spec.asynchronous
    slots: SlotsState = state.async_state
    _, _, k_train = round_keys(state)
    k = data.train.num_clients
    busy = (
        jnp.zeros((k,), bool)
        .at[jnp.where(jnp.isfinite(slots.finish), slots.client, k)]
        .set(True, mode="drop")
    )
    choice = choose(spec, state, data, busy)
    compute, comm, _ = choice.system
    duration = compute + comm
    cand = choice.selection.clients
    cand_ok = choice.selection.mask & choice.eligible[cand]
    with jax.named_scope("system"):
        arr, new_slots, fresh, t_end = schedule(
            slots, state.sim_time, cand, cand_ok, duration[cand], mode.buffer
        )
    params = state.params
    starts = jax.tree.map(
        lambda stored, g: jnp.where(row_mask(arr.fresh, stored), g[None], stored[arr.slot]),
        slots.start_params,
        params,
    )
    with jax.named_scope("local_training"):
        result = spec.trainer.train(
            starts, data.train, arr.client, arr.valid, k_train, per_slot=True, hparams=state.hparams
        )
    deltas = masked_deltas(arr.valid, result.params, starts)
    weights = jnp.where(arr.valid, staleness_weight(arr.staleness, mode.alpha), 0.0)
    with jax.named_scope("aggregation"):
        buffer = jax.tree.map(jnp.add, slots.buffer, weighted_delta(deltas, weights, arr.valid))
        buffered = slots.buffered + jnp.sum(arr.valid)
    full = buffered >= mode.buffer
    new_params, server_state = server_update(
        spec, state, jax.tree.map(lambda b: b / mode.buffer, buffer), full
    )
    v = slots.model_version
    after = new_slots.version == v + 1  # downloaded after the update
    start_params = jax.tree.map(
        lambda stored, old, new: jnp.where(
            row_mask(after, stored),
            new[None],
            jnp.where(row_mask(fresh, stored), old[None], stored),
        ),
        slots.start_params,
        params,
        new_params,
    )
    new_slots = new_slots._replace(
        start_params=start_params,
        buffer=jax.tree.map(lambda b: jnp.where(full, jnp.zeros_like(b), b), buffer),
        buffered=jnp.where(full, 0, buffered),
        model_version=v + full.astype(jnp.int32),
    )
    arrived = Selection(arr.client, arr.valid, weights / mode.buffer)
    report = report_updates(
        spec,
        state,
        choice.strategy_state,
        data,
        arrived,
        choice.available,
        new_params,
        deltas,
        result,
        requested=arr.valid,
        durations=jnp.where(arr.valid, duration[arr.client], 0.0),
    )
    denom = jnp.where(report.num_selected > 0, report.num_selected, jnp.nan)
    diagnostics = dict(choice.selection.diagnostics or {})
    diagnostics.update(
        staleness_mean=jnp.sum(jnp.where(arr.valid, arr.staleness, 0)) / denom,
        staleness_max=jnp.max(jnp.where(arr.valid, arr.staleness, 0)),
        model_version=new_slots.model_version,
        in_flight=jnp.sum(jnp.isfinite(new_slots.finish)),
    )
    none = jnp.zeros((), jnp.int32)
    # the arrivals' training, and the strategy's oracle work of this pick (no clock charge:
    # an asynchronous server does not wait for it)
    cost = round_cost(
        spec, data.train.counts, arr.client, arr.valid, result.num_steps, choice.selection.work
    )
    return close_round(
        state,
        report,
        arrived,
        choice.available,
        choice.eligible,
        diagnostics,
        Clock(t_end - state.sim_time, t_end, none, none),
        cost,
        params=new_params,
        server_opt_state=server_state,
        availability_state=choice.availability_state,
        async_state=new_slots,
    )
