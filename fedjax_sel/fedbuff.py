"""Asynchronous FL inside the compiled program: FedBuff (Nguyen et al., "Federated Learning
with Buffered Asynchronous Aggregation", AISTATS 2022, Algorithm 1), driven by the virtual
clock of :mod:`fedjax_sel.system`.

``C`` clients are in flight at once (fixed slots). A client trains from the model version it
downloaded; when it finishes, its update enters the server's buffer with the staleness weight
``(1 + s)^-alpha`` (``s`` = server updates since its download; ``alpha = 1/2`` is FedBuff's
``1 / sqrt(1 + s)``), and its slot is refilled at once with a new client that downloads the
current model. Every ``B`` buffered updates the server applies
``Delta = (1 / B) sum_j (1 + s_j)^-alpha Delta_j`` through its optimizer and the version
advances.

One compiled **event step** is one server update, with fixed shapes:

1. availability is drawn and the selection strategy picks ``C`` candidates among the online
   clients that are not in flight (``Strategy.asynchronous``; they start, in order, as slots
   free up during this step; unused candidates are dropped);
2. slots left idle (at the start, or when candidates ran out) are filled first, at the current
   time;
3. a scalar ``lax.while_loop`` pops arrivals in time order (ties: lower slot first) until the
   buffer holds ``B``; each frees its slot, which the next candidate takes at that instant (the
   ``B``-th arrival's replacement downloads the *new* model, after the update);
4. the arrived clients train, in parallel, from the parameters of the version each downloaded
   (kept per slot), with the key ``fold_in(step_key, client)``;
5. the staleness-weighted sum enters the buffer and the server steps.

Durations come from the system model (drawn once per event step); the clock is the time of
the step's last arrival. Dropouts, deadlines and over-commitment are synchronous notions and
are refused. ``tests/test_fedbuff.py`` checks all of this against an event-driven NumPy
simulation that processes one arrival at a time.

CLI: ``fedjax-sel run --async fedbuff:concurrency=C,buffer=B[,alpha=0.5] --system lognormal``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params, RoundFeedback, RoundInputs, Selection
from fedjax_sel.registry import Registry
from fedjax_sel.round_log import RoundLog, round_diagnostics
from fedjax_sel.training.server import server_step, weighted_delta
from fedjax_sel.tree import stacked_norms

ASYNC = Registry("asynchronous mode")


class FedBuff(NamedTuple):
    """FedBuff's settings: ``concurrency`` C clients in flight, a server update every
    ``buffer`` B arrivals, staleness weight ``(1 + s)^-alpha``."""

    concurrency: int
    buffer: int
    alpha: float = 0.5

    def validate(self, num_clients: int) -> None:
        if not 1 <= self.concurrency <= num_clients:
            raise ConfigError(
                f"fedbuff concurrency={self.concurrency} must lie in [1, number of clients "
                f"({num_clients})]"
            )
        if not 1 <= self.buffer <= self.concurrency:
            raise ConfigError(
                f"fedbuff buffer={self.buffer} must lie in [1, concurrency={self.concurrency}]"
            )
        if not self.alpha >= 0:
            raise ConfigError(f"fedbuff alpha must be >= 0, got {self.alpha!r}")


@ASYNC.register("fedbuff", description="buffered asynchronous aggregation (FedBuff)")
def fedbuff(concurrency: int = 0, buffer: int = 10, alpha: float = 0.5) -> FedBuff:
    """FedBuff with ``concurrency`` clients in flight (0: the run's ``per_round``), a server
    update every ``buffer`` arrivals, staleness weight ``(1 + s)^-alpha``."""
    if int(concurrency) != concurrency or concurrency < 0:
        raise ConfigError(f"fedbuff concurrency must be a non-negative integer: {concurrency!r}")
    if int(buffer) != buffer or buffer < 1:
        raise ConfigError(f"fedbuff buffer must be a positive integer, got {buffer!r}")
    return FedBuff(int(concurrency), int(buffer), float(alpha))


def from_spec(spec: str, per_round: int) -> FedBuff:
    """``fedbuff:concurrency=C,buffer=B,alpha=A``; a concurrency of 0 means ``per_round``."""
    mode = ASYNC.from_spec(spec)
    if mode.concurrency == 0:
        mode = mode._replace(concurrency=int(per_round))
    return mode


class SlotsState(NamedTuple):
    """The in-flight slots and the server's buffer (part of ``SimState.async_state``).

    Attributes:
      client: int32[C], each slot's client.
      finish: float32[C], its arrival time (``inf``: the slot is idle).
      version: int32[C], the model version it downloaded.
      start_params: parameters of that version, stacked over C.
      buffer: the staleness-weighted sum of buffered deltas (parameter-shaped).
      buffered: int32, updates in the buffer.
      model_version: int32, server updates applied so far.
    """

    client: Array
    finish: Array
    version: Array
    start_params: Params
    buffer: Params
    buffered: Array
    model_version: Array


def init_slots(params: Params, concurrency: int) -> SlotsState:
    """All slots idle, an empty buffer, version 0."""
    return SlotsState(
        client=jnp.zeros((concurrency,), jnp.int32),
        finish=jnp.full((concurrency,), jnp.inf, jnp.float32),
        version=jnp.zeros((concurrency,), jnp.int32),
        start_params=jax.tree.map(lambda x: jnp.broadcast_to(x, (concurrency,) + x.shape), params),
        buffer=jax.tree.map(jnp.zeros_like, params),
        buffered=jnp.zeros((), jnp.int32),
        model_version=jnp.zeros((), jnp.int32),
    )


class Arrivals(NamedTuple):
    """One event step's arrivals (``B`` rows; ``valid`` marks the real ones)."""

    slot: Array
    client: Array
    staleness: Array
    fresh: Array  # downloaded during this step (start parameters = the current model)
    time: Array
    valid: Array


def schedule(
    slots: SlotsState,
    now: Array,
    candidates: Array,
    candidate_ok: Array,
    candidate_duration: Array,
    buffer: int,
) -> tuple[Arrivals, SlotsState, Array, Array]:
    """Steps 2 and 3 of the module docstring: the pure scalar part of an event step.

    Returns the arrivals, the slots afterwards (``start_params`` untouched), a bool[C] mask
    of slots dispatched before the update (start parameters: the current model) and the time
    of the last arrival (``now`` when nothing arrived).
    """
    c = slots.finish.shape[0]
    v = slots.model_version
    # valid candidates first, in the strategy's order
    order = jnp.argsort(~candidate_ok, stable=True)
    cand, cand_dur = candidates[order], candidate_duration[order]
    num_valid = jnp.sum(candidate_ok)
    idle = ~jnp.isfinite(slots.finish)
    rank = jnp.cumsum(idle) - 1
    fill = idle & (rank < num_valid)
    pick = jnp.where(fill, rank, 0)
    client = jnp.where(fill, cand[pick], slots.client)
    finish = jnp.where(fill, now + cand_dur[pick], slots.finish)
    version = jnp.where(fill, v, slots.version)
    fresh = fill
    nxt = jnp.minimum(jnp.sum(idle), num_valid)
    need = buffer - slots.buffered

    empty = Arrivals(
        slot=jnp.zeros((buffer,), jnp.int32),
        client=jnp.zeros((buffer,), jnp.int32),
        staleness=jnp.zeros((buffer,), jnp.int32),
        fresh=jnp.zeros((buffer,), bool),
        time=jnp.zeros((buffer,), jnp.float32),
        valid=jnp.zeros((buffer,), bool),
    )

    def cond(carry):
        i, _, _, finish, *_ = carry
        return (i < need) & jnp.any(jnp.isfinite(finish))

    def body(carry):
        i, nxt, t, finish, client, version, fresh, arr = carry
        s = jnp.argmin(finish)  # first minimum: ties go to the lower slot
        t = finish[s]
        arr = Arrivals(
            slot=arr.slot.at[i].set(s),
            client=arr.client.at[i].set(client[s]),
            staleness=arr.staleness.at[i].set(v - version[s]),
            fresh=arr.fresh.at[i].set(fresh[s]),
            time=arr.time.at[i].set(t),
            valid=arr.valid.at[i].set(True),
        )
        flushed = i + 1 == need  # the update happens before this slot's next download
        refill = nxt < num_valid
        j = jnp.minimum(nxt, c - 1)
        client = client.at[s].set(jnp.where(refill, cand[j], client[s]))
        finish = finish.at[s].set(jnp.where(refill, t + cand_dur[j], jnp.inf))
        version = version.at[s].set(jnp.where(flushed, v + 1, v))
        fresh = fresh.at[s].set(refill & ~flushed)
        return i + 1, nxt + refill.astype(jnp.int32), t, finish, client, version, fresh, arr

    carry = (jnp.int32(0), nxt, now, finish, client, version, fresh, empty)
    _, _, t, finish, client, version, fresh, arr = jax.lax.while_loop(cond, body, carry)
    new_slots = slots._replace(client=client, finish=finish, version=version)
    return arr, new_slots, fresh, t


def staleness_weight(staleness: Array, alpha: float) -> Array:
    """FedBuff's ``(1 + s)^-alpha`` (``alpha = 1/2``: ``1 / sqrt(1 + s)``)."""
    return (1.0 + staleness.astype(jnp.float32)) ** (-alpha)


def event_step(sim, state, data) -> tuple[Any, Any]:
    """One FedBuff server update (the module docstring's steps 1-5) for a
    :class:`~fedjax_sel.simulation.Simulation` built with ``asynchronous=FedBuff(...)``."""
    mode: FedBuff = sim.asynchronous
    slots: SlotsState = state.async_state
    k_avail, k_select, k_train = sim._round_keys(state)
    with jax.named_scope("availability"):
        available, availability_state = sim.availability.step(state.availability_state, k_avail)
    truth = None
    if sim.availability.true_params is not None:
        truth = sim.availability.true_params(availability_state)
    with jax.named_scope("system"):
        compute, comm, _ = sim._client_durations(state, data)
        duration = compute + comm
    k = data.train.num_clients
    busy = (
        jnp.zeros((k,), bool)
        .at[jnp.where(jnp.isfinite(slots.finish), slots.client, k)]
        .set(True, mode="drop")
    )
    idle_clients = available & ~busy
    inputs = RoundInputs(
        state.round, idle_clients, state.params, data.train.counts, truth, duration
    )
    oracle = sim.oracle(data, None, k_train, state.hparams)
    with jax.named_scope("selection"):
        selection, strategy_state = sim.strategy.select(
            state.strategy_state, inputs, oracle, k_select
        )
    cand = selection.clients.astype(jnp.int32)
    cand_ok = selection.mask.astype(bool) & idle_clients[cand]
    with jax.named_scope("system"):
        arr, new_slots, fresh, t_end = schedule(
            slots, state.sim_time, cand, cand_ok, duration[cand], mode.buffer
        )
    params = state.params
    starts = jax.tree.map(
        lambda stored, g: jnp.where(
            arr.fresh.reshape((-1,) + (1,) * g.ndim), g[None], stored[arr.slot]
        ),
        slots.start_params,
        params,
    )
    with jax.named_scope("local_training"):
        result = sim.trainer(
            starts, data.train, arr.client, arr.valid, k_train, None, True, hparams=state.hparams
        )
    deltas = jax.tree.map(
        lambda p, s: jnp.where(arr.valid.reshape((-1,) + (1,) * (p.ndim - 1)), p - s, 0.0),
        result.params,
        starts,
    )
    weights = jnp.where(arr.valid, staleness_weight(arr.staleness, mode.alpha), 0.0)
    with jax.named_scope("aggregation"):
        buffer = jax.tree.map(jnp.add, slots.buffer, weighted_delta(deltas, weights, arr.valid))
        buffered = slots.buffered + jnp.sum(arr.valid)
    full = buffered >= mode.buffer
    with jax.named_scope("server_step"):
        stepped, server_state = server_step(
            sim.server_transform(state.hparams),
            params,
            state.server_opt_state,
            jax.tree.map(lambda b: b / mode.buffer, buffer),
        )
    new_params, server_state = jax.tree.map(
        lambda new, old: jnp.where(full, new, old),
        (stepped, server_state),
        (params, state.server_opt_state),
    )
    v = slots.model_version
    after = new_slots.version == v + 1  # downloaded after the update
    start_params = jax.tree.map(
        lambda stored, old, new: jnp.where(
            after.reshape((-1,) + (1,) * old.ndim),
            new[None],
            jnp.where(fresh.reshape((-1,) + (1,) * old.ndim), old[None], stored),
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
    norms = stacked_norms(deltas)
    feedback = RoundFeedback(
        round=state.round,
        available=available,
        params=params,
        new_params=new_params,
        deltas=deltas,
        train_loss=result.loss,
        initial_loss=result.initial_loss,
        loss_sq=result.loss_sq,
        update_norm=norms,
        num_examples=jnp.where(arr.valid, data.train.counts[arr.client], 0),
        num_steps=result.num_steps,
        requested=arr.valid,
        durations=jnp.where(arr.valid, duration[arr.client], 0.0),
    )
    with jax.named_scope("strategy_update"):
        strategy_state = sim.strategy.update(strategy_state, arrived, feedback)
    idx = jnp.where(arr.valid, arr.client, k)
    counts = state.selection_counts.at[idx].add(1, mode="drop")
    weight_sums = state.weight_sums.at[idx].add(weights / mode.buffer, mode="drop")
    n = jnp.sum(arr.valid)
    denom = jnp.where(n > 0, n, jnp.nan)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_params)]))
    diagnostics = dict(selection.diagnostics or {})
    diagnostics.update(
        staleness_mean=jnp.sum(jnp.where(arr.valid, arr.staleness, 0)) / denom,
        staleness_max=jnp.max(jnp.where(arr.valid, arr.staleness, 0)),
        model_version=new_slots.model_version,
        in_flight=jnp.sum(jnp.isfinite(new_slots.finish)),
    )
    log = RoundLog(
        round=state.round,
        clients=arr.client,
        mask=arr.valid,
        weights=weights / mode.buffer,
        train_loss=jnp.sum(jnp.where(arr.valid, result.loss, 0.0)) / denom,
        num_selected=n,
        num_available=jnp.sum(available),
        update_norm=jnp.sum(jnp.where(arr.valid, norms, 0.0)) / denom,
        finite=finite,
        diagnostics=round_diagnostics(diagnostics, idle_clients, counts),
        duration=t_end - state.sim_time,
        sim_time=t_end,
        dropped=jnp.zeros((), jnp.int32),
        stragglers=jnp.zeros((), jnp.int32),
    )
    state = state.replace(
        round=state.round + 1,
        params=new_params,
        server_opt_state=server_state,
        strategy_state=strategy_state,
        availability_state=availability_state,
        selection_counts=counts,
        weight_sums=weight_sums,
        sim_time=t_end,
        async_state=new_slots,
    )
    return state, log
