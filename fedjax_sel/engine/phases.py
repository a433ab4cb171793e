"""A synchronous round's phases, pure functions of ``(spec, state, data)``:
:func:`select_phase` (availability, the system model's durations, the strategy's selection,
dropouts and deadlines applied to it) -> :func:`train_phase` (local training of the kept slots)
-> :func:`aggregate_phase` (weighted deltas, the server optimizer's step, the strategy's update,
bookkeeping and the round log). :func:`choose`, :func:`report_updates`, :func:`server_update` and
:func:`close_round` are the pieces FedBuff's event step (:mod:`fedjax_sel.engine.asynchronous`)
shares with them.

Every random draw is a function of ``(seed, round, purpose, client)`` through
``jax.random.fold_in``, so results do not depend on the chunk size, the client-parallelism mode
or the number of devices.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, RoundFeedback, RoundInputs, Selection, TrainResult
from fedjax_sel.engine.cost import RoundCost, round_cost, work_seconds
from fedjax_sel.engine.log import RoundLog, round_diagnostics
from fedjax_sel.engine.oracle import client_oracle
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import SimData, SimState, SlotTiming
from fedjax_sel.engine.system import client_work, durations, round_timing
from fedjax_sel.training.server import server_step, weighted_delta
from fedjax_sel.tree import masked_deltas, stacked_norms

# fold_in tags of the per-round key
_AVAIL, _SELECT, _TRAIN, _SYSTEM, _DROPOUT = 0, 1, 2, 3, 4


def round_keys(state: SimState) -> tuple[Array, Array, Array]:
    """The round's availability, selection and training keys."""
    rkey = jax.random.fold_in(state.key, state.round)
    return tuple(jax.random.fold_in(rkey, t) for t in (_AVAIL, _SELECT, _TRAIN))


def round_key(state: SimState, tag: int) -> Array:
    """The round's key of one purpose (a ``fold_in`` tag above)."""
    return jax.random.fold_in(jax.random.fold_in(state.key, state.round), tag)


def system_key(state: SimState) -> Array:
    """The round's key of the device profiles' per-round speeds."""
    return round_key(state, _SYSTEM)


def dropout_key(state: SimState) -> Array:
    """The round's key of the selected clients' dropouts."""
    return round_key(state, _DROPOUT)


def client_durations(spec: RoundSpec, state: SimState, data: SimData) -> tuple[Array, Array, Array]:
    """Per client this round: compute and communication seconds and full SGD steps."""
    ms, bw = spec.system.step(state.system_state, system_key(state))
    samples, steps = client_work(
        data.train.counts,
        spec.local.batch_size,
        spec.local.local_steps,
        spec.local.local_epochs,
    )
    compute, comm = durations(ms, bw, samples, spec.kbit)
    return compute, comm, steps


def apply_timing(
    spec: RoundSpec,
    state: SimState,
    selection: Selection,
    system: tuple | None,
    counts: Array,
) -> tuple[Selection, SlotTiming]:
    """Dropouts, over-commitment and the deadline applied to the selection; the kept
    slots' weights are rescaled to the total the strategy gave all its slots (the
    received updates are averaged as the strategy intended). The round's duration includes
    the seconds of the strategy's oracle work (:func:`~fedjax_sel.engine.cost.work_seconds`;
    ``counts``: the clients' example counts)."""
    requested = selection.mask
    zero = jnp.zeros((), jnp.float32)
    none = jnp.zeros((), jnp.int32)
    k_drop = dropout_key(state)
    if system is None:
        if spec.dropout == 0.0:
            return selection, SlotTiming(
                requested, None, jnp.zeros(requested.shape), zero, none, none
            )
        keep = requested & (jax.random.uniform(k_drop, requested.shape) >= spec.dropout)
        timing = SlotTiming(
            requested, None, jnp.zeros(requested.shape), zero, jnp.sum(requested & ~keep), none
        )
    else:
        compute, comm, steps = system
        c = selection.clients
        t = round_timing(
            requested,
            compute[c],
            comm[c],
            steps[c],
            k_drop,
            keep_count=spec.per_round,
            deadline=spec.deadline,
            dropout=spec.dropout,
        )
        keep = t.keep
        limit = None if spec.deadline is None else t.step_limit
        full = jnp.where(requested, compute[c] + comm[c], 0.0)
        # the strategy's oracle work (loss queries, warm starts) comes before the training
        duration = t.duration + work_seconds(spec, selection.work, counts, compute, comm)
        timing = SlotTiming(requested, limit, full, duration, t.dropped, t.stragglers)
    w = selection.weights
    total = jnp.sum(jnp.where(requested, w, 0.0))
    kept = jnp.sum(jnp.where(keep, w, 0.0))
    scale = jnp.where(kept > 0, total / jnp.where(kept > 0, kept, 1.0), 0.0)
    selection = selection._replace(mask=keep, weights=jnp.where(keep, w * scale, 0.0))
    return selection, timing


def size_weights(counts: Array, selection: Selection) -> Array:
    """FedAvg's weights over the selected slots: ``n_k / sum n`` (``aggregation = fedavg``)."""
    raw = jnp.where(selection.mask, counts[selection.clients], 0).astype(jnp.float32)
    return raw / jnp.maximum(jnp.sum(raw), 1e-12)


class Choice(NamedTuple):
    """What :func:`choose` drew and picked."""

    available: Array
    availability_state: Any
    eligible: Array  # the clients the strategy could pick (available, and idle under FedBuff)
    system: tuple | None  # per client compute and communication seconds and steps
    selection: Selection
    strategy_state: Any


def choose(spec: RoundSpec, state: SimState, data: SimData, busy: Array | None = None) -> Choice:
    """Availability, the device timing and the strategy's pick among the available clients
    (not ``busy``): what a synchronous round and FedBuff's server update both start with."""
    k_avail, k_select, k_train = round_keys(state)
    with jax.named_scope("availability"):
        available, availability_state = spec.availability.step(state.availability_state, k_avail)
    truth = None
    if spec.availability.true_params is not None:
        truth = spec.availability.true_params(availability_state)
    system = None
    if spec.system is not None:
        with jax.named_scope("system"):
            system = client_durations(spec, state, data)
    eligible = available if busy is None else available & ~busy
    inputs = RoundInputs(
        state.round,
        eligible,
        state.params,
        data.train.counts,
        truth,
        None if system is None else system[0] + system[1],
        None if system is None else system[0],
        None if system is None else system[1],
    )
    oracle = client_oracle(
        spec, data, state.hparams, client_opt_states=state.client_opt_states, train_key=k_train
    )
    with jax.named_scope("selection"):
        selection, strategy_state = spec.strategy.select(
            state.strategy_state, inputs, oracle, k_select
        )
    chex.assert_shape(selection.clients, (spec.slots,))
    chex.assert_shape(selection.mask, (spec.slots,))
    chex.assert_shape(selection.weights, (spec.slots,))
    selection = selection._replace(
        clients=selection.clients.astype(jnp.int32),
        mask=selection.mask.astype(bool),
        weights=selection.weights.astype(jnp.float32),
    )
    if spec.aggregation == "fedavg":
        selection = selection._replace(weights=size_weights(data.train.counts, selection))
    return Choice(available, availability_state, eligible, system, selection, strategy_state)


def select_phase(
    spec: RoundSpec, state: SimState, data: SimData
) -> tuple[SimState, Selection, Array]:
    """The state with the strategy's and availability's new states, the selection with its
    timing (the kept slots and their weights), and who was online."""
    choice = choose(spec, state, data)
    with jax.named_scope("system"):
        selection, timing = apply_timing(
            spec, state, choice.selection, choice.system, data.train.counts
        )
    state = state.replace(
        strategy_state=choice.strategy_state, availability_state=choice.availability_state
    )
    return state, selection._replace(timing=timing), choice.available


def streams_aggregate(spec: RoundSpec) -> bool:
    """Whether the round's trainer adds each client's update into the aggregate as it trains
    (``map`` on one device, a strategy that neither reads the slots' models nor starts them
    from their own, synchronous rounds): the loop's memory, one model and the running sum."""
    strategy = spec.strategy
    return (
        spec.trainer.streams
        and not strategy.reads_deltas
        and strategy.start_params is None
        and spec.asynchronous is None
    )


def start_params(spec: RoundSpec, state: SimState, selection: Selection) -> Any:
    """Each slot's own start model (``Strategy.start_params``), or ``None``: the global one."""
    if spec.strategy.start_params is None:
        return None
    return spec.strategy.start_params(state.strategy_state, selection, state.params)


def train_phase(
    spec: RoundSpec, state: SimState, data: SimData, selection: Selection
) -> TrainResult:
    """Local training of the selection's kept slots (or what the strategy trained itself)."""
    if selection.train_result is not None:  # trained by the strategy (FilFL): kept slots only
        r = selection.train_result
        on = selection.mask
        return r._replace(
            loss=jnp.where(on, r.loss, 0.0),
            initial_loss=jnp.where(on, r.initial_loss, 0.0),
            loss_sq=jnp.where(on, r.loss_sq, 0.0),
            num_steps=jnp.where(on, r.num_steps, 0),
        )
    _, _, k_train = round_keys(state)
    clients = selection.clients
    states = None
    if spec.persistent_client_state:
        states = jax.tree.map(lambda s: s[clients], state.client_opt_states)
    starts = start_params(spec, state, selection)
    per_slot = starts is not None
    streamed = selection.weights if streams_aggregate(spec) else None
    with jax.named_scope("local_training"):
        return spec.trainer.train(
            starts if per_slot else state.params,
            data.train,
            clients,
            selection.mask,
            k_train,
            opt_states=states,
            per_slot=per_slot,
            step_limit=selection.timing.step_limit,
            hparams=state.hparams,
            aggregate_weights=streamed,
        )


class Report(NamedTuple):
    """What :func:`report_updates` makes of the updates that arrived."""

    strategy_state: Any
    idx: Array  # each slot's client, K for slots that sent nothing
    counts: Array
    weight_sums: Array
    num_selected: Array
    train_loss: Array
    update_norm: Array
    finite: Array


def report_updates(
    spec: RoundSpec,
    state: SimState,
    strategy_state: Any,
    data: SimData,
    selection: Selection,
    available: Array,
    new_params: Any,
    deltas: Any,
    result: TrainResult,
    *,
    requested: Array,
    durations: Array,
) -> Report:
    """What a synchronous round and FedBuff's server update both do once the updates are in
    (``selection``: the slots that sent one, and their weights): the strategy's feedback and
    update, the selection counts and weight sums, and the log's means over those slots
    (``deltas`` is ``None`` where the trainer aggregated as it trained)."""
    mask, clients = selection.mask, selection.clients
    norms = result.update_norm if deltas is None else stacked_norms(deltas)
    feedback = RoundFeedback(
        round=state.round,
        available=available,
        params=state.params,
        new_params=new_params,
        deltas=deltas,
        train_loss=result.loss,
        initial_loss=result.initial_loss,
        loss_sq=result.loss_sq,
        update_norm=norms,
        num_examples=jnp.where(mask, data.train.counts[clients], 0),
        num_steps=result.num_steps,
        requested=requested,
        durations=durations,
    )
    with jax.named_scope("strategy_update"):
        strategy_state = spec.strategy.update(strategy_state, selection, feedback)
    idx = jnp.where(mask, clients, data.train.num_clients)
    n = jnp.sum(mask)
    denom = jnp.where(n > 0, n, jnp.nan)
    return Report(
        strategy_state=strategy_state,
        idx=idx,
        counts=state.selection_counts.at[idx].add(1, mode="drop"),
        weight_sums=state.weight_sums.at[idx].add(
            jnp.where(mask, selection.weights, 0.0), mode="drop"
        ),
        num_selected=n,
        train_loss=jnp.sum(jnp.where(mask, result.loss, 0.0)) / denom,
        update_norm=jnp.sum(jnp.where(mask, norms, 0.0)) / denom,
        finite=jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_params)])),
    )


def server_update(spec: RoundSpec, state: SimState, delta: Any, apply: Array) -> tuple:
    """The server optimizer's step on the aggregated ``delta`` where ``apply`` (else the model
    and the optimizer state as they were: momentum, Adam and weight decay would otherwise
    still move the model)."""
    with jax.named_scope("server_step"):
        new_params, server_state = server_step(
            spec.server_transform(state.hparams), state.params, state.server_opt_state, delta
        )
    return jax.tree.map(
        lambda new, old: jnp.where(apply, new, old),
        (new_params, server_state),
        (state.params, state.server_opt_state),
    )


class Clock(NamedTuple):
    """A round on the virtual clock: its duration, its end, and its dropped and straggler
    slots."""

    duration: Array
    sim_time: Array
    dropped: Array
    stragglers: Array


def close_round(
    state: SimState,
    report: Report,
    arrived: Selection,
    available: Array,
    eligible: Array,
    diagnostics: dict | None,
    clock: Clock,
    cost: RoundCost,
    **changes: Any,
) -> tuple[SimState, RoundLog]:
    """The round's log and the state after it, from the report of the updates that arrived
    and the round's ``cost`` (``changes``: the state's other new fields)."""
    duration, sim_time, dropped, stragglers = clock
    log = RoundLog(
        round=state.round,
        clients=arrived.clients,
        mask=arrived.mask,
        weights=arrived.weights,
        train_loss=report.train_loss,
        num_selected=report.num_selected,
        num_available=jnp.sum(available),
        update_norm=report.update_norm,
        finite=report.finite,
        diagnostics=round_diagnostics(diagnostics, eligible, report.counts),
        duration=duration,
        sim_time=sim_time,
        dropped=dropped,
        stragglers=stragglers,
        client_updates=cost.client_updates,
        uplink_bytes=cost.uplink_bytes,
        client_flops=cost.client_flops,
    )
    state = state.replace(
        round=state.round + 1,
        strategy_state=report.strategy_state,
        selection_counts=report.counts,
        weight_sums=report.weight_sums,
        sim_time=sim_time,
        **changes,
    )
    return state, log


def aggregate_phase(
    spec: RoundSpec,
    state: SimState,
    data: SimData,
    selection: Selection,
    available: Array,
    result: TrainResult,
) -> tuple[SimState, RoundLog]:
    """The weighted deltas through the server optimizer, the strategy's update and the
    round's bookkeeping: the state after the round and its log."""
    timing = selection.timing
    mask = selection.mask
    if result.params is None:  # aggregated by the trainer (streams_aggregate)
        deltas, delta = None, result.weighted_delta
    else:
        starts = start_params(spec, state, selection)
        if starts is None:
            starts = jax.tree.map(lambda g: g[None], state.params)
        deltas = masked_deltas(mask, result.params, starts)
        with jax.named_scope("aggregation"):
            delta = weighted_delta(deltas, selection.weights, mask)
    new_params, server_state = server_update(spec, state, delta, jnp.any(mask))
    rep = report_updates(
        spec,
        state,
        state.strategy_state,
        data,
        selection,
        available,
        new_params,
        deltas,
        result,
        requested=timing.requested,
        durations=timing.durations,
    )
    client_states = state.client_opt_states
    if spec.persistent_client_state and result.opt_states is not None:
        client_states = jax.tree.map(
            lambda all_s, new_s: all_s.at[rep.idx].set(new_s, mode="drop"),
            client_states,
            result.opt_states,
        )
    end = state.sim_time + timing.duration
    counts = data.train.counts
    cost = round_cost(spec, counts, selection.clients, mask, result.num_steps, selection.work)
    return close_round(
        state,
        rep,
        selection,
        available,
        available,
        selection.diagnostics,
        Clock(timing.duration, end, timing.dropped, timing.stragglers),
        cost,
        params=new_params,
        server_opt_state=server_state,
        client_opt_states=client_states,
    )
