"""The round as pure phases over one static :class:`RoundSpec`.

One synchronous round: :func:`select_phase` (availability, the system model's durations, the
strategy's selection, dropouts and deadlines applied to it) -> :func:`train_phase` (local
training of the kept slots) -> :func:`aggregate_phase` (weighted deltas, the server optimizer's
step, the strategy's update, bookkeeping and the round log). :func:`round_fn` chains them (or
runs FedBuff's event step, :func:`event_step`, built from the same pieces),
and :func:`chunk_fn` scans it. Every function is pure in ``(state, data)``: the spec holds only
what the compiled program is built from (the strategy, availability and system models, the
trainer, the server optimizer, slot counts), never an array, so traced hyperparameters and
data vary freely between calls of one program.

Every random draw is a function of ``(seed, round, purpose, client)`` through
``jax.random.fold_in``, so results do not depend on the chunk size, the client-parallelism mode
or the number of devices.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_sel.availability import always
from fedjax_sel.base import (
    Array,
    AvailabilityModel,
    ClientOracle,
    ConfigError,
    RoundFeedback,
    RoundInputs,
    Selection,
    Strategy,
    TrainResult,
)
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.engine.fedbuff import FedBuff, SlotsState, schedule, staleness_weight
from fedjax_sel.engine.log import RoundLog, round_diagnostics
from fedjax_sel.engine.state import SimData, SimState, SlotTiming
from fedjax_sel.engine.system import (
    SystemModel,
    client_work,
    durations,
    lognormal,
    model_kbit,
    overcommitted,
    round_timing,
)
from fedjax_sel.models import Model
from fedjax_sel.models.base import with_conv_impl
from fedjax_sel.training import evaluate as ev
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import LocalConfig, make_trainer, split_conv
from fedjax_sel.training.server import ServerOptimizer, server_spec, server_step, weighted_delta
from fedjax_sel.tree import masked_deltas, stacked_norms

# fold_in tags of the per-round key
_AVAIL, _SELECT, _TRAIN, _SYSTEM, _DROPOUT = 0, 1, 2, 3, 4

_static = functools.partial(struct.field, pytree_node=False)


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


@struct.dataclass
class RoundSpec:
    """What a round's program is built from (every field static: a spec holds no arrays).

    Attributes:
      model: the model.
      strategy: the selection strategy.
      availability: the availability model.
      trainer: local training of a round's slots (:func:`fedjax_sel.training.local.
        make_trainer`).
      local: the local-training settings (batch size and step counts for the system model).
      server_tx: the server optimizer (a :class:`~fedjax_sel.training.server.ServerOptimizer`,
        whose learning rate is traced, or a fixed optax transformation).
      per_round: clients whose updates a round keeps.
      slots: slots the strategy fills (``per_round`` times the over-commitment).
      system: the device profiles, or ``None`` (no virtual clock).
      deadline: seconds after which a round stops waiting, or ``None``.
      dropout: probability that a selected client sends nothing.
      persistent_client_state: clients keep their optimizer state between rounds.
      eval_batch_size: batch of the oracle's loss passes.
      kbit: the model's size in kilobits (communication time).
      asynchronous: FedBuff's settings, or ``None`` for synchronous rounds.
    """

    model: Model = _static()
    strategy: Strategy = _static()
    availability: AvailabilityModel = _static()
    trainer: Any = _static()
    local: LocalConfig = _static()
    server_tx: Any = _static()
    per_round: int = _static()
    slots: int = _static()
    system: SystemModel | None = _static(default=None)
    deadline: float | None = _static(default=None)
    dropout: float = _static(default=0.0)
    persistent_client_state: bool = _static(default=False)
    eval_batch_size: int = _static(default=1024)
    kbit: float = _static(default=0.0)
    asynchronous: Any = _static(default=None)

    @classmethod
    def create(
        cls,
        dataset: FederatedDataset,
        model: Model,
        strategy: Strategy,
        *,
        local: LocalConfig,
        per_round: int,
        availability: AvailabilityModel | None = None,
        server_tx: ServerOptimizer | optax.GradientTransformation | None = None,
        parallel: str = "auto",
        persistent_client_state: bool = False,
        eval_batch_size: int = 1024,
        mesh: jax.sharding.Mesh | None = None,
        n_max: int | None = None,
        system: SystemModel | None = None,
        deadline: float | None = None,
        overcommit: float = 1.0,
        dropout: float = 0.0,
        asynchronous: FedBuff | None = None,
    ) -> RoundSpec:
        """Checks the settings against each other and the data set (each refusal names the
        setting that breaks it) and builds the spec: the trainer in the given parallelism
        (``auto``: the backend's rule; the measured choice is made before, by
        :func:`fedjax_sel.training.autotune.resolve_parallel`), the default availability
        (always on), server optimizer (FedAvg) and, for strategies that read durations, device
        profile (log-normal). Arguments as :class:`fedjax_sel.engine.simulation.Simulation`'s."""
        local.validate()
        k = dataset.num_clients
        if per_round < 1 or per_round > k:
            raise ConfigError(
                f"per_round={per_round} must lie in [1, number of clients]: it exceeds the "
                f"number of clients ({k})"
                if per_round > k
                else f"per_round must be >= 1, got {per_round}"
            )
        if model.task != dataset.task:
            raise ConfigError(
                f"model {model.name!r} solves {model.task} but data set {dataset.name!r} is "
                f"{dataset.task}"
            )
        targets = dataset.train.target_shape
        if model.target_ndim != len(targets):
            raise ConfigError(
                f"model {model.name!r} predicts "
                + ("a token sequence" if model.target_ndim else "one target")
                + f" per example but data set {dataset.name!r} has targets of shape "
                f"{targets or '()'}"
                + (" (next-word prediction: use --model lstm_words)" if targets else "")
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
        if system is None and strategy.needs_system:
            system = lognormal()
        parallel, conv = split_conv(parallel)
        if conv is not None:
            model = with_conv_impl(model, conv)
        trainer = make_trainer(
            model,
            local,
            int(n_max or dataset.train.n_max),
            parallel=parallel,
            persistent_state=persistent_client_state,
            mesh=mesh,
        )
        return cls(
            model=model,
            strategy=strategy,
            availability=availability or always(),
            trainer=trainer,
            local=local,
            # a ServerOptimizer's learning rate is traced (state.hparams.server_lr); a given
            # optax transformation is used as it is
            server_tx=server_tx or server_spec("sgd", 1.0),
            per_round=int(per_round),
            slots=overcommitted(per_round, overcommit, k),
            system=system,
            deadline=deadline,
            dropout=float(dropout),
            persistent_client_state=persistent_client_state,
            eval_batch_size=int(eval_batch_size),
            kbit=model_kbit(jax.eval_shape(model.init, jax.random.key(0))),
            asynchronous=asynchronous,
        )

    def server_transform(self, hparams: HParams | None) -> optax.GradientTransformation:
        """The server optimizer at ``hparams``' (traced) server learning rate."""
        if not isinstance(self.server_tx, ServerOptimizer):
            return self.server_tx
        return self.server_tx.build(None if hparams is None else hparams.server_lr)


def client_oracle(
    spec: RoundSpec, data: SimData, client_opt_states=None, train_key=None, hparams=None
) -> ClientOracle:
    """The :class:`ClientOracle` a strategy sees (closures over the traced data and
    hyperparameters)."""
    model, train_data, bs = spec.model, data.train, spec.eval_batch_size

    def loss(params, clients, key=None):
        del key
        return ev.client_losses(model, params, train_data, clients, min(bs, 256))

    def batch_loss(params, clients, key, batch_size):
        return ev.client_batch_losses(model, params, train_data, clients, key, batch_size)

    def all_losses(params):
        rows = ev.eval_rows(model, params, train_data, bs)
        return ev.evaluate_all_clients(model, params, train_data, rows)[0]

    def train(params, clients, key, active=None):
        clients = jnp.asarray(clients, jnp.int32)
        active = jnp.ones(clients.shape, bool) if active is None else active
        states = None
        if client_opt_states is not None:
            states = jax.tree.map(lambda s: s[clients], client_opt_states)
        return spec.trainer(
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
                raise ConfigError(f"server_loss size={size} must lie in [1, {m}] (server set size)")
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


def round_keys(state: SimState):
    rkey = jax.random.fold_in(state.key, state.round)
    return (jax.random.fold_in(rkey, t) for t in (_AVAIL, _SELECT, _TRAIN))


def round_key(state: SimState, tag: int):
    return jax.random.fold_in(jax.random.fold_in(state.key, state.round), tag)


def client_durations(spec: RoundSpec, state: SimState, data: SimData):
    """Per client this round: compute and communication seconds and full SGD steps."""
    ms, bw = spec.system.step(state.system_state, round_key(state, _SYSTEM))
    samples, steps = client_work(
        data.train.counts,
        spec.local.batch_size,
        spec.local.local_steps,
        spec.local.local_epochs,
    )
    compute, comm = durations(ms, bw, samples, spec.kbit)
    return compute, comm, steps


def apply_timing(spec: RoundSpec, state: SimState, selection: Selection, system) -> tuple:
    """Dropouts, over-commitment and the deadline applied to the selection; the kept
    slots' weights are rescaled to the total the strategy gave all its slots (the
    received updates are averaged as the strategy intended)."""
    requested = selection.mask
    zero = jnp.zeros((), jnp.float32)
    none = jnp.zeros((), jnp.int32)
    k_drop = round_key(state, _DROPOUT)
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
        timing = SlotTiming(requested, limit, full, t.duration, t.dropped, t.stragglers)
    w = selection.weights
    total = jnp.sum(jnp.where(requested, w, 0.0))
    kept = jnp.sum(jnp.where(keep, w, 0.0))
    scale = jnp.where(kept > 0, total / jnp.where(kept > 0, kept, 1.0), 0.0)
    selection = selection._replace(mask=keep, weights=jnp.where(keep, w * scale, 0.0))
    return selection, timing


class _Choice(NamedTuple):
    available: Array
    availability_state: Any
    eligible: Array  # the clients the strategy could pick (available, and idle under FedBuff)
    system: tuple | None  # per client compute and communication seconds and steps
    selection: Selection
    strategy_state: Any


def _choose(spec: RoundSpec, state: SimState, data: SimData, busy: Array | None = None) -> _Choice:
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
    oracle = client_oracle(spec, data, state.client_opt_states, k_train, state.hparams)
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
    return _Choice(available, availability_state, eligible, system, selection, strategy_state)


def select_phase(spec: RoundSpec, state: SimState, data: SimData):
    choice = _choose(spec, state, data)
    with jax.named_scope("system"):
        selection, timing = apply_timing(spec, state, choice.selection, choice.system)
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
        getattr(spec.trainer, "streams", False)
        and not strategy.reads_deltas
        and strategy.start_params is None
        and spec.asynchronous is None
    )


def start_params(spec: RoundSpec, state: SimState, selection: Selection):
    if spec.strategy.start_params is None:
        return None
    return spec.strategy.start_params(state.strategy_state, selection, state.params)


def train_phase(
    spec: RoundSpec, state: SimState, data: SimData, selection: Selection
) -> TrainResult:
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
    # only where it streams: a trainer of one's own need not take the argument
    streamed = {"aggregate_weights": selection.weights} if streams_aggregate(spec) else {}
    with jax.named_scope("local_training"):
        return spec.trainer(
            starts if per_slot else state.params,
            data.train,
            clients,
            selection.mask,
            k_train,
            states,
            per_slot,
            selection.timing.step_limit,
            hparams=state.hparams,
            **streamed,
        )


class _Report(NamedTuple):
    strategy_state: Any
    idx: Array  # each slot's client, K for slots that sent nothing
    counts: Array
    weight_sums: Array
    num_selected: Array
    train_loss: Array
    update_norm: Array
    finite: Array


def _report(
    spec: RoundSpec,
    state: SimState,
    strategy_state: Any,
    data: SimData,
    selection: Selection,
    available: Array,
    new_params: Any,
    deltas: Any,
    result: TrainResult,
    requested: Array,
    durations: Array,
) -> _Report:
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
    return _Report(
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


def _server_update(spec: RoundSpec, state: SimState, delta: Any, apply: Array) -> tuple:
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


def _close(
    state: SimState,
    report: _Report,
    arrived: Selection,
    available: Array,
    eligible: Array,
    diagnostics: dict | None,
    timing: tuple[Array, Array, Array, Array],
    **changes: Any,
) -> tuple[SimState, RoundLog]:
    """The round's log and the state after it, from the report of the updates that arrived
    (``timing``: the round's duration, its end on the clock, dropped and straggler slots;
    ``changes``: the state's other new fields)."""
    duration, sim_time, dropped, stragglers = timing
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
):
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
    new_params, server_state = _server_update(spec, state, delta, jnp.any(mask))
    report = _report(
        spec,
        state,
        state.strategy_state,
        data,
        selection,
        available,
        new_params,
        deltas,
        result,
        timing.requested,
        timing.durations,
    )
    client_states = state.client_opt_states
    if spec.persistent_client_state and result.opt_states is not None:
        client_states = jax.tree.map(
            lambda all_s, new_s: all_s.at[report.idx].set(new_s, mode="drop"),
            client_states,
            result.opt_states,
        )
    clock = (timing.duration, state.sim_time + timing.duration, timing.dropped, timing.stragglers)
    return _close(
        state,
        report,
        selection,
        available,
        available,
        selection.diagnostics,
        clock,
        params=new_params,
        server_opt_state=server_state,
        client_opt_states=client_states,
    )


def round_fn(spec: RoundSpec, state: SimState, data: SimData) -> tuple[SimState, RoundLog]:
    """One round (pure; trace it inside ``jit``); with ``asynchronous``, one server update
    (:func:`event_step`)."""
    if spec.asynchronous is not None:
        return event_step(spec, state, data)
    state, selection, available = select_phase(spec, state, data)
    result = train_phase(spec, state, data, selection)
    return aggregate_phase(spec, state, data, selection, available, result)


def chunk_fn(spec: RoundSpec, state: SimState, data: SimData, length: int, num_active):
    def body(s, i):
        def run(s):
            return round_fn(spec, s, data)

        def skip(s):
            return s, jax.tree.map(jnp.zeros_like, jax.eval_shape(run, s)[1])

        if length == 1:
            return run(s)
        return jax.lax.cond(i < num_active, run, skip, s)

    return jax.lax.scan(body, state, jnp.arange(length))


def event_step(spec, state, data) -> tuple[Any, Any]:
    """One FedBuff server update (the module docstring's steps 1-5) of a round spec
    (:class:`~fedjax_sel.engine.round.RoundSpec`) with ``asynchronous=FedBuff(...)``, built
    from the round's own phases (keys, durations, the oracle, the trainer)."""
    mode: FedBuff = spec.asynchronous
    slots: SlotsState = state.async_state
    _, _, k_train = round_keys(state)
    k = data.train.num_clients
    busy = (
        jnp.zeros((k,), bool)
        .at[jnp.where(jnp.isfinite(slots.finish), slots.client, k)]
        .set(True, mode="drop")
    )
    choice = _choose(spec, state, data, busy)
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
        lambda stored, g: jnp.where(
            arr.fresh.reshape((-1,) + (1,) * g.ndim), g[None], stored[arr.slot]
        ),
        slots.start_params,
        params,
    )
    with jax.named_scope("local_training"):
        result = spec.trainer(
            starts, data.train, arr.client, arr.valid, k_train, None, True, hparams=state.hparams
        )
    deltas = masked_deltas(arr.valid, result.params, starts)
    weights = jnp.where(arr.valid, staleness_weight(arr.staleness, mode.alpha), 0.0)
    with jax.named_scope("aggregation"):
        buffer = jax.tree.map(jnp.add, slots.buffer, weighted_delta(deltas, weights, arr.valid))
        buffered = slots.buffered + jnp.sum(arr.valid)
    full = buffered >= mode.buffer
    new_params, server_state = _server_update(
        spec, state, jax.tree.map(lambda b: b / mode.buffer, buffer), full
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
    report = _report(
        spec,
        state,
        choice.strategy_state,
        data,
        arrived,
        choice.available,
        new_params,
        deltas,
        result,
        arr.valid,
        jnp.where(arr.valid, duration[arr.client], 0.0),
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
    return _close(
        state,
        report,
        arrived,
        choice.available,
        choice.eligible,
        diagnostics,
        (t_end - state.sim_time, t_end, none, none),
        params=new_params,
        server_opt_state=server_state,
        availability_state=choice.availability_state,
        async_state=new_slots,
    )
