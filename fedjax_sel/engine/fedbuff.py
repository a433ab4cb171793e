"""Asynchronous FL inside the compiled program: FedBuff (Nguyen et al., "Federated Learning
with Buffered Asynchronous Aggregation", AISTATS 2022, Algorithm 1), driven by the virtual
clock of :mod:`fedjax_sel.engine.system`.

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

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params
from fedjax_sel.registry import Registry

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
