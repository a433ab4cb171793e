"""The round and the run.

One round: availability -> select -> local training of the selected slots -> weighted
aggregation -> server optimizer step -> strategy update. It is one pure function of the
simulation state; :meth:`Simulation.run_rounds` runs a chunk of rounds as one ``lax.scan``
inside one ``jax.jit`` (no host round trip inside a round or a chunk), and the host returns
between chunks to evaluate, log and checkpoint.

Every random draw is a function of ``(seed, round, purpose, client)`` through
``jax.random.fold_in``, so results do not depend on the chunk size, the client-parallelism mode
or the number of devices.
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedjax_sel.availability import always
from fedjax_sel.base import (
    Array,
    AvailabilityModel,
    ClientOracle,
    ConfigError,
    Evaluator,
    Params,
    RoundFeedback,
    RoundInputs,
    Selection,
    SimSpec,
    Strategy,
    TrainResult,
)
from fedjax_sel.data.client_data import ClientData, stack_client_data
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.distributed import to_host
from fedjax_sel.fedbuff import FedBuff, event_step, init_slots
from fedjax_sel.models import Model
from fedjax_sel.models.base import with_conv_impl
from fedjax_sel.round_log import RoundLog, round_diagnostics
from fedjax_sel.strategies.hyperparams import with_hyperparams
from fedjax_sel.system import (
    SystemModel,
    client_work,
    durations,
    model_kbit,
    overcommitted,
    round_timing,
)
from fedjax_sel.training import evaluate as ev
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import LocalConfig, client_optimizer, make_trainer
from fedjax_sel.training.server import ServerOptimizer, server_spec, server_step, weighted_delta
from fedjax_sel.tree import stacked_norms

# fold_in tags of the per-round key
_AVAIL, _SELECT, _TRAIN, _SYSTEM, _DROPOUT = 0, 1, 2, 3, 4


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
        (:class:`fedjax_sel.fedbuff.SlotsState`), or ``None`` for synchronous rounds.
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
    async_state: Any = None
    hparams: HParams | None = None


class SlotTiming(NamedTuple):
    """The system model's decisions for a round's slots (see :func:`fedjax_sel.system.
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

    def pad(a: Array, m: int) -> Array:
        return jnp.pad(a, [(0, m - a.shape[0])] + [(0, 0)] * (a.ndim - 1))

    def padded(name: str) -> tuple[Array, Array]:
        """Arrays of different lengths padded to the longest, and their validity masks."""
        arrays = [getattr(p, name) for p in parts]
        m = max(getattr(p, name).shape[0] for p in [*parts, *pad_like])
        valid = jnp.stack([jnp.arange(m) < a.shape[0] for a in arrays])
        return jnp.stack([pad(a, m) for a in arrays]), valid

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
    rest = _stack_trees([s.replace(round=None) for s in states])
    return rest.replace(round=first.round)


@jax.jit
def _stack_trees(trees: list) -> Any:
    # one compiled program per state structure: stacking leaf by leaf outside jit compiles a
    # small program for every distinct leaf shape
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@jax.jit
def _index_tree(tree: Any, i: Array) -> Any:
    return jax.tree.map(lambda x: x[i], tree)


def split_conv(spec: str) -> tuple[str, str | None]:
    """``"map:conv=xla"`` / ``"chunked:4,conv=patches"`` -> (parallelism spec, conv impl)."""
    from fedjax_sel.registry import parse_spec

    name, positional, pairs = parse_spec(spec, what="client parallelism")
    conv = pairs.pop("conv", None)
    if pairs:
        raise ConfigError(f"client parallelism {spec!r}: unknown option(s) {sorted(pairs)}")
    rest = ":".join([name] + ([",".join(positional)] if positional else []))
    return rest, conv


def _check_asynchronous(
    mode: FedBuff,
    num_clients: int,
    per_round: int,
    strategy: Strategy,
    system,
    deadline,
    overcommit: float,
    dropout: float,
    persistent_client_state: bool,
) -> None:
    """Asynchronous FL's preconditions, each refused with the setting that breaks it."""
    mode.validate(num_clients)
    if per_round != mode.concurrency:
        raise ConfigError(
            f"asynchronous FL runs concurrency={mode.concurrency} clients at once; per_round "
            f"({per_round}) must equal it (the strategy picks that many candidates per step)"
        )
    if system is None:
        raise ConfigError(
            "asynchronous FL needs device profiles for its clock: give a system model "
            "(CLI: --system lognormal, see `fedjax-sel list`)"
        )
    if deadline is not None or overcommit != 1.0 or dropout != 0.0:
        raise ConfigError(
            "deadline, overcommit and dropout are synchronous-round settings; asynchronous "
            f"FL takes none of them (got deadline={deadline}, overcommit={overcommit}, "
            f"dropout={dropout})"
        )
    if persistent_client_state:
        raise ConfigError("asynchronous FL does not keep persistent client optimizer state")
    if not strategy.asynchronous or strategy.start_params is not None:
        raise ConfigError(
            f"strategy {strategy.name!r} cannot pick clients asynchronously; use one with "
            "Strategy.asynchronous (uniform, power_of_choice, oort)"
        )


def _state_axes(states: SimState) -> SimState:
    """``vmap`` axes of stacked states: 0 for every leaf but the shared round counter."""
    return jax.tree.map(lambda _: 0, states.replace(round=None)).replace(round=None)


def unstack_state(states: SimState, i: int) -> SimState:
    """Member ``i`` of a stacked state."""
    member = _index_tree(states.replace(round=None), jnp.int32(i))
    return member.replace(round=states.round)


class Simulation:
    """A federated simulation: data, model, strategy, availability and training settings.

    >>> sim = Simulation(dataset, model, make_strategy("uniform", 10), local=LocalConfig(),
    ...                  num_rounds=100)                                       # doctest: +SKIP
    >>> state = sim.init(seed=0)                                               # doctest: +SKIP
    >>> state, logs = sim.run_rounds(state, 10)                                # doctest: +SKIP
    >>> sim.evaluate(state)["test_accuracy"]                                   # doctest: +SKIP

    Args:
      dataset: the federated data set.
      model: the model (``fedjax_sel.models.make_model``).
      strategy: the selection strategy; its ``per_round`` is the number of slots.
      local: local-training hyperparameters.
      per_round: selection slots per round.
      num_rounds: planned rounds (strategies with schedules read it).
      availability: who is online each round (always-on by default).
      server_tx: server optimizer (FedAvg, plain SGD with learning rate 1, by default).
      parallel: client parallelism: ``auto`` (measured on this round shape and cached,
        :mod:`fedjax_sel.training.autotune`), ``vmap``, ``map`` or ``chunked:C``; a model
        with convolutions also takes ``conv=patches|xla`` (``map:conv=xla``).
      persistent_client_state: keep each client's optimizer state (momentum) across rounds.
      chunk_size: rounds per compiled ``lax.scan`` chunk.
      eval_batch_size: batch of the evaluation passes.
      mesh: a one-axis ``jax.sharding.Mesh`` named ``clients`` to shard the slot axis of local
        training (and a padded data set's client axis) over several devices.
      n_max: the largest client any simulated data set holds (default: ``dataset``'s); larger
        when the data of several seeds run stacked (:meth:`run_rounds_batch`).
      system: device profiles (:mod:`fedjax_sel.system`): every round gets a simulated
        duration and the virtual clock advances; ``None``: no time (strategies that need
        durations, e.g. Oort, get the default log-normal profile).
      deadline: seconds after which a round stops waiting (stragglers contribute the local
        steps they finished; needs ``system``).
      overcommit: select ``ceil(per_round * overcommit)`` clients and keep the first
        ``per_round`` finishers (needs ``system``); the strategy must select that many slots.
      dropout: probability that a selected client fails and sends nothing.
      asynchronous: run asynchronous FL instead of synchronous rounds
        (:class:`fedjax_sel.fedbuff.FedBuff`; needs ``system``): a "round" is then one server
        update, its ``per_round`` the concurrency.
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: Model,
        strategy: Strategy,
        *,
        local: LocalConfig,
        per_round: int,
        num_rounds: int,
        availability: AvailabilityModel | None = None,
        server_tx: ServerOptimizer | optax.GradientTransformation | None = None,
        parallel: str = "auto",
        persistent_client_state: bool = False,
        chunk_size: int = 10,
        eval_batch_size: int = 1024,
        mesh: jax.sharding.Mesh | None = None,
        n_max: int | None = None,
        system: SystemModel | None = None,
        deadline: float | None = None,
        overcommit: float = 1.0,
        dropout: float = 0.0,
        asynchronous=None,
    ):
        local.validate()
        k = dataset.num_clients
        if per_round < 1 or per_round > k:
            raise ConfigError(
                f"per_round={per_round} must lie in [1, number of clients]: it exceeds the "
                f"number of clients ({k})"
                if per_round > k
                else f"per_round must be >= 1, got {per_round}"
            )
        if num_rounds < 1:
            raise ConfigError(f"num_rounds must be >= 1, got {num_rounds}")
        if chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
        if model.task != dataset.task:
            raise ConfigError(
                f"model {model.name!r} solves {model.task} but data set {dataset.name!r} is "
                f"{dataset.task}"
            )
        if system is None and (deadline is not None or overcommit != 1.0):
            raise ConfigError(
                "a deadline or over-commitment needs device profiles: give a system model "
                "(CLI: --system lognormal, see `fedjax-sel list`)"
            )
        if deadline is not None and not deadline > 0:
            raise ConfigError(f"deadline must be a positive number of seconds, got {deadline!r}")
        if not overcommit >= 1.0:
            raise ConfigError(f"overcommit must be >= 1, got {overcommit!r}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), got {dropout!r}")
        if asynchronous is not None:
            _check_asynchronous(
                asynchronous,
                k,
                per_round,
                strategy,
                system,
                deadline,
                overcommit,
                dropout,
                persistent_client_state,
            )
        self.asynchronous = asynchronous
        if system is None and strategy.needs_system:
            from fedjax_sel.system import lognormal

            system = lognormal()
        self.system, self.deadline = system, deadline
        self.overcommit, self.dropout = float(overcommit), float(dropout)
        self.slots = overcommitted(per_round, overcommit, k)
        self.dataset, self.model, self.strategy = dataset, model, strategy
        self.local = local
        self.per_round, self.num_rounds = int(per_round), int(num_rounds)
        self.availability = availability or always()
        # a ServerOptimizer's learning rate is traced (state.hparams.server_lr); a given optax
        # transformation is used as it is
        self.server_tx = server_tx or server_spec("sgd", 1.0)
        self.persistent_client_state = persistent_client_state
        self.chunk_size = int(chunk_size)
        self.eval_batch_size = int(eval_batch_size)
        self.mesh = mesh
        self.n_max = int(n_max or dataset.train.n_max)
        self.parallel_choice = None
        if parallel.strip().lower() == "auto":
            from fedjax_sel.training.autotune import choose_parallel

            self.parallel_choice = choose_parallel(
                model,
                local,
                dataset.train,
                self.per_round,
                persistent_state=persistent_client_state,
            )
            parallel, conv = self.parallel_choice.parallel, self.parallel_choice.conv_impl
        else:
            parallel, conv = split_conv(parallel)
        if conv is not None:
            model = with_conv_impl(model, conv)
            self.model = model
        self.trainer = make_trainer(
            model,
            local,
            self.n_max,
            parallel=parallel,
            persistent_state=persistent_client_state,
            mesh=mesh,
        )
        self.parallel = self.trainer.mode
        mode, chunk = self.parallel
        self.parallel_spec = (mode if chunk is None else f"{mode}:{chunk}") + (
            f",conv={model.conv_impl}" if model.conv_impl else ""
        )
        self.kbit = model_kbit(jax.eval_shape(self.model.init, jax.random.key(0)))
        self.data = self._place(SimData.of(dataset))
        self._chunk = jax.jit(self._chunk_fn, static_argnums=(2,))
        self._evaluate = jax.jit(self._evaluate_fn)
        self._batched_fns: dict = {}
        self._phases = None

    # ----------------------------------------------------------------------------- set-up
    def place(self, data: SimData) -> SimData:
        """``data`` on the simulation's devices (the client axis sharded over a mesh)."""
        return self._place(data)

    def _place(self, data: SimData) -> SimData:
        if self.mesh is None:
            return data
        from jax.sharding import NamedSharding, PartitionSpec

        replicated = NamedSharding(self.mesh, PartitionSpec())
        n = self.mesh.devices.size
        train = data.train
        if train.layout == "padded" and train.num_clients % n == 0:
            clients = NamedSharding(self.mesh, PartitionSpec("clients"))
            train = jax.tree.map(
                lambda a: jax.device_put(a, clients if a.ndim >= 1 else replicated), train
            )
        else:
            train = jax.device_put(train, replicated)
        rest = jax.device_put(
            (data.test, data.test_x, data.test_y, data.server_x, data.server_y), replicated
        )
        return SimData(train, *rest)

    def spec(self, params: Params, dataset: FederatedDataset | None = None) -> SimSpec:
        ds = dataset or self.dataset
        label_counts = None
        if ds.num_classes is not None and ds.task == "classification":
            label_counts = ds.train.label_counts(ds.num_classes)
        return SimSpec(
            num_clients=ds.num_clients,
            per_round=self.slots,
            num_rounds=self.num_rounds,
            num_examples=ds.train.counts,
            params=params,
            num_classes=ds.num_classes,
            label_counts=label_counts,
        )

    def default_hparams(self) -> HParams:
        """The traced hyperparameters of the simulation's own settings."""
        server_lr = self.server_tx.lr if isinstance(self.server_tx, ServerOptimizer) else 1.0
        return HParams.of(self.local.lr, server_lr, self.local.prox_mu)

    def server_transform(self, hparams: HParams | None) -> optax.GradientTransformation:
        """The server optimizer at ``hparams``' (traced) server learning rate."""
        if not isinstance(self.server_tx, ServerOptimizer):
            return self.server_tx
        return self.server_tx.build(None if hparams is None else hparams.server_lr)

    def init(
        self,
        seed: int = 0,
        params: Params | None = None,
        dataset: FederatedDataset | None = None,
        hparams: HParams | None = None,
        strategy_hparams: dict[str, float] | None = None,
    ) -> SimState:
        """The initial state: model parameters from ``seed`` (unless given), strategy and
        availability states, fresh server optimizer. ``dataset``: the seed's own data set when
        seeds run stacked with different partitions (default: the simulation's). ``hparams``:
        the traced hyperparameters of this member (default: the simulation's settings);
        ``strategy_hparams``: values of the strategy's traced hyperparameters
        (``Strategy.hyperparams``; default: those it was built with)."""
        if hparams is not None and self.local.prox_mu == 0 and float(hparams.prox_mu) != 0:
            raise ConfigError(
                f"prox_mu={float(hparams.prox_mu)} needs a simulation built with prox_mu > 0 "
                "(the proximal term is part of the compiled program)"
            )
        base = jax.random.key(seed)
        if params is None:
            params = self.model.init(jax.random.fold_in(base, 1))
        sim_key = jax.random.fold_in(base, 2)
        k = self.dataset.num_clients
        spec = self.spec(params, dataset)
        strategy_state = self.strategy.init(jax.random.fold_in(sim_key, 101), spec)
        strategy_state = with_hyperparams(strategy_state, self.strategy, strategy_hparams or {})
        avail_key = jax.random.fold_in(sim_key, 102)
        if self.availability.needs_spec:
            availability_state = self.availability.init(avail_key, k, spec)
        else:
            availability_state = self.availability.init(avail_key, k)
        client_states = None
        if self.persistent_client_state:
            one = client_optimizer(self.local).init(params)
            client_states = jax.tree.map(lambda x: jnp.broadcast_to(x, (k,) + x.shape), one)
        return SimState(
            round=jnp.zeros((), jnp.int32),
            key=sim_key,
            params=params,
            server_opt_state=self.server_transform(None).init(params),
            strategy_state=strategy_state,
            availability_state=availability_state,
            client_opt_states=client_states,
            selection_counts=jnp.zeros((k,), jnp.int32),
            weight_sums=jnp.zeros((k,), jnp.float32),
            sim_time=jnp.zeros((), jnp.float32),
            system_state=None
            if self.system is None
            else self.system.init(jax.random.fold_in(sim_key, 103), k),
            async_state=None
            if self.asynchronous is None
            else init_slots(params, self.asynchronous.concurrency),
            hparams=self.default_hparams() if hparams is None else hparams,
        )

    # ----------------------------------------------------------------------------- oracle
    def oracle(
        self, data: SimData, client_opt_states=None, train_key=None, hparams=None
    ) -> ClientOracle:
        """The :class:`ClientOracle` a strategy sees (closures over the traced data and
        hyperparameters)."""
        model, train_data, bs = self.model, data.train, self.eval_batch_size

        def loss(params, clients, key=None):
            del key
            return ev.client_losses(model, params, train_data, clients, min(bs, 256))

        def batch_loss(params, clients, key, batch_size):
            return ev.client_batch_losses(model, params, train_data, clients, key, batch_size)

        def all_losses(params):
            return ev.evaluate_all_clients(model, params, train_data, bs)[0]

        def train(params, clients, key, active=None):
            clients = jnp.asarray(clients, jnp.int32)
            active = jnp.ones(clients.shape, bool) if active is None else active
            states = None
            if client_opt_states is not None:
                states = jax.tree.map(lambda s: s[clients], client_opt_states)
            return self.trainer(
                params, train_data, clients, active, key, states, False, hparams=hparams
            )

        def server_loss(params, size=None):
            if data.server_x is None:
                raise ConfigError(
                    "this strategy needs a server-held data set: load the data with "
                    "server_fraction > 0 (CLI: --server-fraction)"
                )
            x, y, valid = data.server_x, data.server_y, data.server_valid
            if size is not None:  # a static subset spread evenly over the set
                m = x.shape[0]
                if not 1 <= int(size) <= m:
                    raise ConfigError(
                        f"server_loss size={size} must lie in [1, {m}] (server set size)"
                    )
                # over the real rows of a padded set (seeds stacked): the same rows as alone
                n = m if valid is None else jnp.sum(valid)
                idx = (jnp.arange(int(size)) * n) // int(size)
                x, y, valid = x[idx], y[idx], None
            return ev.evaluate_central(model, params, x, y, bs, valid)[0]

        def client_test_loss(params, clients):
            if data.test is None:
                raise ConfigError("this strategy needs per-client test splits (test_fraction > 0)")
            return ev.client_losses(model, params, data.test, clients, min(bs, 256))

        if train_key is None:
            train_key = jax.random.key(0)
        return ClientOracle(
            loss, batch_loss, all_losses, train, train_key, server_loss, client_test_loss
        )

    # ----------------------------------------------------------------------------- phases
    def _round_keys(self, state: SimState):
        rkey = jax.random.fold_in(state.key, state.round)
        return (jax.random.fold_in(rkey, t) for t in (_AVAIL, _SELECT, _TRAIN))

    def _round_key(self, state: SimState, tag: int):
        return jax.random.fold_in(jax.random.fold_in(state.key, state.round), tag)

    def _client_durations(self, state: SimState, data: SimData):
        """Per client this round: compute and communication seconds and full SGD steps."""
        ms, bw = self.system.step(state.system_state, self._round_key(state, _SYSTEM))
        samples, steps = client_work(
            data.train.counts,
            self.local.batch_size,
            self.local.local_steps,
            self.local.local_epochs,
        )
        compute, comm = durations(ms, bw, samples, self.kbit)
        return compute, comm, steps

    def _timing(self, state: SimState, selection: Selection, system) -> tuple:
        """Dropouts, over-commitment and the deadline applied to the selection; the kept
        slots' weights are rescaled to the total the strategy gave all its slots (the
        received updates are averaged as the strategy intended)."""
        requested = selection.mask
        zero = jnp.zeros((), jnp.float32)
        none = jnp.zeros((), jnp.int32)
        k_drop = self._round_key(state, _DROPOUT)
        if system is None:
            if self.dropout == 0.0:
                return selection, SlotTiming(
                    requested, None, jnp.zeros(requested.shape), zero, none, none
                )
            keep = requested & (jax.random.uniform(k_drop, requested.shape) >= self.dropout)
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
                keep_count=self.per_round,
                deadline=self.deadline,
                dropout=self.dropout,
            )
            keep = t.keep
            limit = None if self.deadline is None else t.step_limit
            full = jnp.where(requested, compute[c] + comm[c], 0.0)
            timing = SlotTiming(requested, limit, full, t.duration, t.dropped, t.stragglers)
        w = selection.weights
        total = jnp.sum(jnp.where(requested, w, 0.0))
        kept = jnp.sum(jnp.where(keep, w, 0.0))
        scale = jnp.where(kept > 0, total / jnp.where(kept > 0, kept, 1.0), 0.0)
        selection = selection._replace(mask=keep, weights=jnp.where(keep, w * scale, 0.0))
        return selection, timing

    def _select_phase(self, state: SimState, data: SimData):
        k_avail, k_select, k_train = self._round_keys(state)
        with jax.named_scope("availability"):
            available, availability_state = self.availability.step(
                state.availability_state, k_avail
            )
        truth = None
        if self.availability.true_params is not None:
            truth = self.availability.true_params(availability_state)
        system = None
        if self.system is not None:
            with jax.named_scope("system"):
                system = self._client_durations(state, data)
        inputs = RoundInputs(
            state.round,
            available,
            state.params,
            data.train.counts,
            truth,
            None if system is None else system[0] + system[1],
        )
        oracle = self.oracle(data, state.client_opt_states, k_train, state.hparams)
        with jax.named_scope("selection"):
            selection, strategy_state = self.strategy.select(
                state.strategy_state, inputs, oracle, k_select
            )
        chex.assert_shape(selection.clients, (self.slots,))
        chex.assert_shape(selection.mask, (self.slots,))
        chex.assert_shape(selection.weights, (self.slots,))
        selection = selection._replace(
            clients=selection.clients.astype(jnp.int32),
            mask=selection.mask.astype(bool),
            weights=selection.weights.astype(jnp.float32),
        )
        with jax.named_scope("system"):
            selection, timing = self._timing(state, selection, system)
        state = state.replace(strategy_state=strategy_state, availability_state=availability_state)
        return state, selection._replace(timing=timing), available

    def _start_params(self, state: SimState, selection: Selection):
        if self.strategy.start_params is None:
            return None
        return self.strategy.start_params(state.strategy_state, selection, state.params)

    def _train_phase(self, state: SimState, data: SimData, selection: Selection) -> TrainResult:
        if selection.train_result is not None:  # trained by the strategy (FilFL): kept slots only
            r = selection.train_result
            on = selection.mask
            return r._replace(
                loss=jnp.where(on, r.loss, 0.0),
                initial_loss=jnp.where(on, r.initial_loss, 0.0),
                loss_sq=jnp.where(on, r.loss_sq, 0.0),
                num_steps=jnp.where(on, r.num_steps, 0),
            )
        _, _, k_train = self._round_keys(state)
        clients = selection.clients
        states = None
        if self.persistent_client_state:
            states = jax.tree.map(lambda s: s[clients], state.client_opt_states)
        starts = self._start_params(state, selection)
        per_slot = starts is not None
        with jax.named_scope("local_training"):
            return self.trainer(
                starts if per_slot else state.params,
                data.train,
                clients,
                selection.mask,
                k_train,
                states,
                per_slot,
                selection.timing.step_limit,
                hparams=state.hparams,
            )

    def _aggregate_phase(
        self,
        state: SimState,
        data: SimData,
        selection: Selection,
        available: Array,
        result: TrainResult,
    ):
        params = state.params
        timing = selection.timing
        mask = selection.mask
        starts = self._start_params(state, selection)
        if starts is None:
            starts = jax.tree.map(lambda g: g[None], params)
        deltas = jax.tree.map(
            lambda p, g: jnp.where(mask.reshape((-1,) + (1,) * (p.ndim - 1)), p - g, 0.0),
            result.params,
            starts,
        )
        with jax.named_scope("aggregation"):
            delta = weighted_delta(deltas, selection.weights, mask)
        with jax.named_scope("server_step"):
            new_params, server_state = server_step(
                self.server_transform(state.hparams), params, state.server_opt_state, delta
            )
        # A round in which nobody trained leaves the model and the server optimizer as they
        # were (momentum, Adam and weight decay would otherwise still move the model).
        trained = jnp.any(mask)
        new_params, server_state = jax.tree.map(
            lambda new, old: jnp.where(trained, new, old),
            (new_params, server_state),
            (params, state.server_opt_state),
        )
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
            num_examples=jnp.where(mask, data.train.counts[selection.clients], 0),
            num_steps=result.num_steps,
            requested=timing.requested,
            durations=timing.durations,
        )
        with jax.named_scope("strategy_update"):
            strategy_state = self.strategy.update(state.strategy_state, selection, feedback)
        k = data.train.num_clients
        idx = jnp.where(mask, selection.clients, k)
        counts = state.selection_counts.at[idx].add(1, mode="drop")
        weight_sums = state.weight_sums.at[idx].add(
            jnp.where(mask, selection.weights, 0.0), mode="drop"
        )
        client_states = state.client_opt_states
        if self.persistent_client_state and result.opt_states is not None:
            client_states = jax.tree.map(
                lambda all_s, new_s: all_s.at[idx].set(new_s, mode="drop"),
                client_states,
                result.opt_states,
            )
        n_sel = jnp.sum(mask)
        denom = jnp.where(n_sel > 0, n_sel, jnp.nan)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_params)]))
        log = RoundLog(
            round=state.round,
            clients=selection.clients,
            mask=mask,
            weights=selection.weights,
            train_loss=jnp.sum(jnp.where(mask, result.loss, 0.0)) / denom,
            num_selected=n_sel,
            num_available=jnp.sum(available),
            update_norm=jnp.sum(jnp.where(mask, norms, 0.0)) / denom,
            finite=finite,
            diagnostics=round_diagnostics(selection.diagnostics, available, counts),
            duration=timing.duration,
            sim_time=state.sim_time + timing.duration,
            dropped=timing.dropped,
            stragglers=timing.stragglers,
        )
        state = state.replace(
            round=state.round + 1,
            params=new_params,
            server_opt_state=server_state,
            strategy_state=strategy_state,
            client_opt_states=client_states,
            selection_counts=counts,
            weight_sums=weight_sums,
            sim_time=state.sim_time + timing.duration,
        )
        return state, log

    def round_fn(self, state: SimState, data: SimData) -> tuple[SimState, RoundLog]:
        """One round (pure; trace it inside ``jit``); with ``asynchronous``, one server update
        (:func:`fedjax_sel.fedbuff.event_step`)."""
        if self.asynchronous is not None:
            return event_step(self, state, data)
        state, selection, available = self._select_phase(state, data)
        result = self._train_phase(state, data, selection)
        return self._aggregate_phase(state, data, selection, available, result)

    def _chunk_fn(self, state: SimState, data: SimData, length: int, num_active):
        def body(s, i):
            def run(s):
                return self.round_fn(s, data)

            def skip(s):
                return s, jax.tree.map(jnp.zeros_like, jax.eval_shape(run, s)[1])

            if length == 1:
                return run(s)
            return jax.lax.cond(i < num_active, run, skip, s)

        return jax.lax.scan(body, state, jnp.arange(length))

    # ----------------------------------------------------------------------------- running
    def run_rounds(
        self, state: SimState, num_rounds: int, data: SimData | None = None
    ) -> tuple[SimState, RoundLog]:
        """Runs ``num_rounds`` rounds in compiled chunks of ``chunk_size``; returns the new
        state and the host-side logs of those rounds (stacked on axis 0). ``data``: another
        data set of the same shapes (default: the simulation's)."""
        data = self.data if data is None else data
        logs = []
        done = 0
        while done < num_rounds:
            n = min(self.chunk_size, num_rounds - done)
            state, log = self._chunk(state, data, self.chunk_size, jnp.int32(n))
            logs.append(jax.tree.map(lambda a, n=n: a[:n], to_host(log)))
            done += n
        return state, jax.tree.map(lambda *a: np.concatenate(a), *logs)

    def time_round(
        self, states: SimState, data: SimData | None = None, batched: bool = False, repeats: int = 3
    ) -> float:
        """Best-of-``repeats`` seconds of one round of ``states`` (a stacked batch when
        ``batched``), after a call that compiles the chunk program the run itself uses; the
        results are discarded."""
        shared = data is None
        data = self.data if shared else data
        one = jnp.int32(1)
        if batched:
            fn = self._batched("chunk", self.chunk_size, shared)

            def call():
                return fn(states, data, one)

        else:

            def call():
                return self._chunk(states, data, self.chunk_size, one)

        jax.block_until_ready(call())
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            best = min(best, time.perf_counter() - t0)
        return best

    def round_programs(self) -> int:
        """How many compiled programs of a chunk of rounds this simulation holds (one per
        chunk length and batch shape; a grid of traced hyperparameters adds none)."""
        chunks = [self._chunk] + [f for k, f in self._batched_fns.items() if k[0] == "chunk"]
        return sum(f._cache_size() for f in chunks)

    # ------------------------------------------------------------------ several seeds at once
    def _batched(self, what: str, length: int, shared: bool):
        """The vmapped-over-seeds version of the chunk (``what="chunk"``) or of the evaluation;
        ``shared``: every member reads the same data (``in_axes=None``, no copies)."""
        key = (what, length, shared)
        if key not in self._batched_fns:
            data_axis = None if shared else 0
            if what == "chunk":

                def fn(states, data, num_active):
                    axes = _state_axes(states)
                    return jax.vmap(
                        lambda s, d: self._chunk_fn(s, d, length, num_active),
                        in_axes=(axes, data_axis),
                        out_axes=(axes, 0),
                    )(states, data)

            else:

                def fn(states, data):
                    axes = _state_axes(states)
                    return jax.vmap(
                        lambda s, d: self._evaluate_fn(s.params, s.strategy_state, d),
                        in_axes=(axes, data_axis),
                    )(states, data)

            self._batched_fns[key] = jax.jit(fn)
        return self._batched_fns[key]

    def init_batch(
        self, seeds: list[int], datasets: list[FederatedDataset] | None = None
    ) -> SimState:
        """The initial states of ``seeds`` stacked on a leading axis (each from its own data
        set when ``datasets`` are given)."""
        datasets = datasets or [None] * len(seeds)
        return stack_states([self.init(s, dataset=d) for s, d in zip(seeds, datasets, strict=True)])

    def run_rounds_batch(
        self, states: SimState, data: SimData | None, num_rounds: int
    ) -> tuple[SimState, RoundLog]:
        """:meth:`run_rounds` for several seeds at once, vmapped over the leading axis of
        ``states`` (one compiled program). ``data``: stacked per-seed data
        (:func:`stack_sim_data`), or ``None`` when every seed reads the simulation's own.
        Logs are stacked ``[seeds, rounds, ...]``."""
        shared = data is None
        data = self.data if shared else data
        fn = self._batched("chunk", self.chunk_size, shared)
        logs = []
        done = 0
        while done < num_rounds:
            n = min(self.chunk_size, num_rounds - done)
            states, log = fn(states, data, jnp.int32(n))
            logs.append(jax.tree.map(lambda a, n=n: a[:, :n], to_host(log)))
            done += n
        return states, jax.tree.map(lambda *a: np.concatenate(a, axis=1), *logs)

    def evaluate_batch(self, states: SimState, data: SimData | None) -> list[dict[str, float]]:
        """:meth:`evaluate` of every member of stacked ``states``."""
        shared = data is None
        out = self._batched("evaluate", 0, shared)(states, self.data if shared else data)
        out = to_host(out)
        n = next(iter(out.values())).shape[0]
        return [{k: float(v[i]) for k, v in out.items()} for i in range(n)]

    def run_rounds_profiled(self, state: SimState, num_rounds: int, data: SimData | None = None):
        """Runs rounds with each phase compiled and timed separately (``--profile``).

        Returns ``(state, logs, seconds)`` where ``seconds`` maps ``select``, ``train`` and
        ``aggregate`` to total wall seconds. Slower than :meth:`run_rounds` (a host round trip
        per phase); the results agree up to floating-point reassociation.
        """
        if self._phases is None:
            self._phases = (
                jax.jit(self._select_phase),
                jax.jit(self._train_phase),
                jax.jit(self._aggregate_phase),
            )
        select, train, aggregate = self._phases
        data = self.data if data is None else data
        seconds = {"select": 0.0, "train": 0.0, "aggregate": 0.0}
        logs = []
        for _ in range(num_rounds):
            t0 = time.perf_counter()
            state, selection, available = jax.block_until_ready(select(state, data))
            t1 = time.perf_counter()
            result = jax.block_until_ready(train(state, data, selection))
            t2 = time.perf_counter()
            state, log = jax.block_until_ready(aggregate(state, data, selection, available, result))
            t3 = time.perf_counter()
            seconds["select"] += t1 - t0
            seconds["train"] += t2 - t1
            seconds["aggregate"] += t3 - t2
            logs.append(to_host(log))
        return state, jax.tree.map(lambda *a: np.stack(a), *logs), seconds

    def evaluator(self, data: SimData) -> Evaluator:
        """Evaluation functions over ``data`` (for ``Strategy.metrics`` and notebooks)."""
        model, bs, mesh = self.model, self.eval_batch_size, self.mesh

        def central(params):
            return ev.evaluate_central(
                model, params, data.test_x, data.test_y, bs, data.test_valid, mesh
            )

        def client_test(params):
            return ev.evaluate_all_clients(model, params, data.test, bs, mesh)

        def client_train(params):
            loss_k, acc_k, _ = ev.evaluate_all_clients(model, params, data.train, bs, mesh)
            return loss_k, acc_k

        return Evaluator(central, client_test if data.test is not None else None, client_train)

    def _evaluate_fn(self, params: Params, strategy_state, data: SimData) -> dict[str, Array]:
        with jax.named_scope("evaluation"):
            return self._evaluate_body(params, strategy_state, data)

    def _evaluate_body(self, params: Params, strategy_state, data: SimData) -> dict[str, Array]:
        evaluator = self.evaluator(data)
        loss, acc = evaluator.central(params)
        out = {"test_loss": loss, "test_accuracy": acc}
        if evaluator.client_test is not None:
            loss_k, acc_k, count = evaluator.client_test(params)
            has = count > 0
            n = jnp.maximum(jnp.sum(has), 1)
            out["client_test_loss_mean"] = jnp.sum(jnp.where(has, loss_k, 0.0)) / n
            mean_acc = jnp.sum(jnp.where(has, acc_k, 0.0)) / n
            out["client_test_accuracy_mean"] = mean_acc
            # the spread of accuracy over clients (population std over those with test data)
            out["client_test_accuracy_std"] = jnp.sqrt(
                jnp.sum(jnp.where(has, (acc_k - mean_acc) ** 2, 0.0)) / n
            )
        if self.strategy.metrics is not None:
            out.update(self.strategy.metrics(strategy_state, params, evaluator))
        return out

    def evaluate(self, state: SimState, data: SimData | None = None) -> dict[str, float]:
        """Central test loss/accuracy; with per-client test splits, the mean over clients of
        each client's test loss/accuracy; and the strategy's own ``metrics`` (accuracies are
        NaN for regression)."""
        data = self.data if data is None else data
        out = to_host(self._evaluate(state.params, state.strategy_state, data))
        return {k: float(v) for k, v in out.items()}


@functools.lru_cache(maxsize=1)
def default_mesh() -> jax.sharding.Mesh | None:
    """A one-axis ``clients`` mesh over all local devices when there are several."""
    devices = jax.devices()
    if len(devices) < 2:
        return None
    return jax.sharding.Mesh(np.array(devices), ("clients",))
