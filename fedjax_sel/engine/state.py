"""The simulation state and the data a round reads: :func:`init_state` builds the state
before the first round, and the states and data of several members (seeds, grid points) stack
on a leading axis to run vmapped in one program."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_sel.base import Array, ConfigError, Params, PRNGKey, SimSpec
from fedjax_sel.data.client_data import ClientData, stack_client_data, stack_padded
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.engine.fedbuff import init_slots
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.strategies.hyperparams import init_with_hyperparams
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import client_optimizer


@struct.dataclass
class SimState:
    """Everything that changes from round to round (a pytree).

    Attributes:
      round: int32 scalar, rounds completed.
      key: the simulation's base PRNG key (per-round keys are folded from it).
      params: global model parameters.
      server_opt_state: the server optimizer's state.
      strategy_state: the selection strategy's state.
      availability_state: the availability model's state.
      client_opt_states: per-client optimizer states stacked over K (persistent client state),
        or ``None``.
      selection_counts: int32[K], rounds each client was selected in.
      weight_sums: float32[K], each client's aggregation weights summed over the rounds
        (``weight_sums / T`` is CA-Fed's cumulative weight, its Fig. 1d).
      sim_time: simulated seconds since the start (the virtual clock; 0 without a system
        model).
      system_state: the system model's per-client speeds, or ``None``.
      async_state: asynchronous FL's in-flight slots and buffer
        (:class:`fedjax_sel.engine.fedbuff.SlotsState`), or ``None`` for synchronous rounds.
      hparams: the traced hyperparameters (:class:`~fedjax_sel.training.hparams.HParams`:
        client and server learning rates, FedProx mu); members of a vmapped batch may differ
        in them.
    """

    round: Array
    key: Array
    params: Params
    server_opt_state: Any
    strategy_state: Any
    availability_state: Any
    client_opt_states: Any
    selection_counts: Array
    weight_sums: Array
    sim_time: Array
    system_state: Any
    async_state: Any
    hparams: HParams


def sim_spec(
    dataset: FederatedDataset, params: Params, *, per_round: int, num_rounds: int
) -> SimSpec:
    """What a strategy's and an availability model's ``init`` read of a simulation:
    ``per_round`` slots (a spec's ``slots``), the planned rounds, the data set's sizes and
    label histogram, and the initial ``params``."""
    label_counts = None
    # one label per example; sequence targets (next-word prediction) have no histogram:
    # [K, vocabulary] would be 13.7 GB for Stack Overflow's 342,477 users
    if (
        dataset.num_classes is not None
        and dataset.task == "classification"
        and not dataset.train.target_shape
    ):
        label_counts = dataset.train.label_counts(dataset.num_classes)
    return SimSpec(
        num_clients=dataset.num_clients,
        per_round=per_round,
        num_rounds=num_rounds,
        num_examples=dataset.train.counts,
        params=params,
        num_classes=dataset.num_classes,
        label_counts=label_counts,
    )


def seed_keys(seed: int) -> tuple[Array, Array]:
    """A seed's ``(model key, simulation key)``: its initial parameters are drawn from the
    first, and :func:`init_state` folds every state and round key from the second."""
    base = jax.random.key(seed)
    return jax.random.fold_in(base, 1), jax.random.fold_in(base, 2)


def environment_states(
    availability, system, key: Array, num_clients: int, sim: SimSpec | None = None
) -> tuple[Any, Any]:
    """The availability process's and the device profiles' (``None`` without) initial states
    of the simulation whose key is ``key``, as :func:`init_state` draws them (``sim``: for an
    availability model that reads it)."""
    k = num_clients
    avail_key = jax.random.fold_in(key, 102)
    if availability.needs_spec:
        availability_state = availability.init(avail_key, k, sim)
    else:
        availability_state = availability.init(avail_key, k)
    system_state = None if system is None else system.init(jax.random.fold_in(key, 103), k)
    return availability_state, system_state


def init_state(
    spec: RoundSpec,
    sim: SimSpec,
    key: PRNGKey,
    hparams: HParams,
    strategy_hparams: dict[str, float] | None = None,
) -> SimState:
    """The state before the first round (fedjax's ``init``, beside
    :func:`~fedjax_sel.engine.round.round_fn`): the model ``sim.params``, the strategy's and
    the availability model's initial states, a fresh server optimizer, the device profiles
    and FedBuff's empty slots where the spec has them.

    Args:
      spec: the round's static spec.
      sim: what ``init`` functions read of the simulation (:func:`sim_spec`).
      key: the simulation's key; every round's keys are folded from it.
      hparams: the traced hyperparameters of this member.
      strategy_hparams: values of the strategy's traced hyperparameters
        (``Strategy.hyperparams``; default: those it was built with).
    """
    if not spec.local.prox and float(hparams.prox_mu) != 0:
        raise ConfigError(
            f"prox_mu={float(hparams.prox_mu)} needs a simulation built with prox_mu > 0 "
            "(the proximal term is part of the compiled program)"
        )
    params, k = sim.params, sim.num_clients
    strategy_state = init_with_hyperparams(
        spec.strategy, jax.random.fold_in(key, 101), sim, strategy_hparams or {}
    )
    availability_state, system_state = environment_states(
        spec.availability, spec.system, key, k, sim
    )
    client_states = None
    if spec.persistent_client_state:
        one = client_optimizer(spec.local, hparams.lr).init(params)
        client_states = jax.tree.map(lambda x: jnp.broadcast_to(x, (k,) + x.shape), one)
    return SimState(
        round=jnp.zeros((), jnp.int32),
        key=key,
        params=params,
        server_opt_state=spec.server_transform(hparams).init(params),
        strategy_state=strategy_state,
        availability_state=availability_state,
        client_opt_states=client_states,
        selection_counts=jnp.zeros((k,), jnp.int32),
        weight_sums=jnp.zeros((k,), jnp.float32),
        sim_time=jnp.zeros((), jnp.float32),
        system_state=system_state,
        async_state=None
        if spec.asynchronous is None
        else init_slots(params, spec.asynchronous.concurrency),
        # a copy: the state owns its buffers (a donated chunk deletes them), the caller's
        # values may start other members
        hparams=jax.tree.map(jnp.array, hparams),
    )


class SlotTiming(NamedTuple):
    """The system model's decisions for a round's slots (see :func:`fedjax_sel.engine.system.
    round_timing`): the strategy's own mask, each slot's step limit (``None`` without a
    deadline), full duration, and the round's duration, dropouts and stragglers."""

    requested: Array
    step_limit: Array | None
    durations: Array
    duration: Array
    dropped: Array
    stragglers: Array


class SimData(NamedTuple):
    """The device arrays a simulation reads (passed as jit arguments, never baked in).

    ``test_valid`` and ``server_valid`` mark the real rows of a central test set and of a
    server-held set padded to a common length when the data of several seeds are stacked
    (``None``: every row is real).
    """

    train: ClientData
    test: ClientData | None
    test_x: Array
    test_y: Array
    server_x: Array | None = None
    server_y: Array | None = None
    test_valid: Array | None = None
    server_valid: Array | None = None

    @classmethod
    def of(cls, dataset: FederatedDataset) -> SimData:
        return cls(
            dataset.train,
            dataset.test,
            dataset.test_x,
            dataset.test_y,
            dataset.server_x,
            dataset.server_y,
        )


class NotStackable(ConfigError):
    """The data of several seeds cannot share one compiled program (run them one by one)."""


def stack_sim_data(parts: list[SimData], pad_like: list[SimData] = ()) -> SimData:
    """The data of several simulations (one per seed) stacked on a leading axis for
    :meth:`Simulation.run_rounds_batch`; training and per-client test data are padded (see
    :func:`~fedjax_sel.data.client_data.stack_client_data`), the central test set is padded
    with a validity mask, and so are server-held sets (their sizes follow each seed's partition).
    ``pad_like``: pad to the largest of these as well (every batch of a group one shape).
    """
    pad_like = list(pad_like)
    if len({p.test is None for p in parts}) > 1:
        raise NotStackable("some seeds have per-client test splits and others do not")
    servers = {None if p.server_x is None else p.server_x.shape[1:] for p in parts}
    if len(servers) > 1:
        raise NotStackable(f"server-held sets of different shapes across seeds: {servers}")
    try:
        train = stack_client_data([p.train for p in parts], [p.train for p in pad_like])
        test = (
            None
            if parts[0].test is None
            else stack_client_data([p.test for p in parts], [p.test for p in pad_like])
        )
    except ConfigError as e:
        raise NotStackable(str(e)) from None

    def padded(name: str) -> tuple[Array, Array]:
        """Arrays of different lengths padded to the longest, and their validity masks."""
        arrays = [getattr(p, name) for p in parts]
        m = max(getattr(p, name).shape[0] for p in [*parts, *pad_like])
        valid = jnp.asarray(np.arange(m)[None, :] < np.array([a.shape[0] for a in arrays])[:, None])
        return stack_padded(arrays, 0, m), valid

    test_x, test_valid = padded("test_x")
    test_y, _ = padded("test_y")
    server_x = server_y = server_valid = None
    if parts[0].server_x is not None:
        server_x, server_valid = padded("server_x")
        server_y, _ = padded("server_y")
    return SimData(
        train=train,
        test=test,
        test_x=test_x,
        test_y=test_y,
        server_x=server_x,
        server_y=server_y,
        test_valid=test_valid,
        server_valid=server_valid,
    )


def stack_states(states: list[SimState]) -> SimState:
    """States of one configuration at the same round, stacked on a leading seed axis (the
    round counter stays a scalar: every member is at the same round)."""
    first = states[0]
    for s in states:
        if int(s.round) != int(first.round):
            raise ConfigError("stacked states must be at the same round")
    rest = stack_trees([s.replace(round=None) for s in states])
    return rest.replace(round=first.round)


@jax.jit
def stack_trees(trees: list) -> Any:
    # one compiled program per state structure: stacking leaf by leaf outside jit compiles a
    # small program for every distinct leaf shape
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@jax.jit
def index_tree(tree: Any, i: Array) -> Any:
    return jax.tree.map(lambda x: x[i], tree)


def state_axes(states: SimState) -> SimState:
    """``vmap`` axes of stacked states: 0 for every leaf but the shared round counter."""
    return jax.tree.map(lambda _: 0, states.replace(round=None)).replace(round=None)


def unstack_state(states: SimState, i: int) -> SimState:
    """Member ``i`` of a stacked state."""
    member = index_tree(states.replace(round=None), jnp.int32(i))
    return member.replace(round=states.round)
