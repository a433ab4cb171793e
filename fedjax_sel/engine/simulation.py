"""The host driver of a simulation.

One round: availability -> select -> local training of the selected slots -> weighted
aggregation -> server optimizer step -> strategy update, a pure function of the simulation
state built from a static :class:`~fedjax_sel.engine.round.RoundSpec` (:mod:`fedjax_sel.engine`).
:class:`Simulation` checks the settings, builds the spec, and drives it: a chunk of rounds is
one ``lax.scan`` inside one ``jax.jit`` (no host round trip inside a round or a chunk), seeds
and grid points run vmapped, and the host returns between chunks to evaluate, log and
checkpoint.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.base import (
    Array,
    AvailabilityModel,
    ClientOracle,
    ConfigError,
    Evaluator,
    Params,
    SimSpec,
    Strategy,
)
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.distributed import to_host
from fedjax_sel.engine import round as round_lib
from fedjax_sel.engine.fedbuff import init_slots
from fedjax_sel.engine.log import RoundLog
from fedjax_sel.engine.round import RoundSpec
from fedjax_sel.engine.state import (
    SimData,
    SimState,
    stack_states,
    state_axes,
)
from fedjax_sel.engine.system import (
    SystemModel,
)
from fedjax_sel.members import MEMBERS_AXIS
from fedjax_sel.models import Model
from fedjax_sel.strategies.hyperparams import init_with_hyperparams
from fedjax_sel.training import evaluate as ev
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import LocalConfig, client_optimizer, parallel_spec
from fedjax_sel.training.server import ServerOptimizer


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
      parallel: client parallelism: ``vmap``, ``map`` or ``chunked:C``; a model with
        convolutions also takes ``conv=patches|xla`` (``map:conv=xla``). ``auto`` applies the
        backend's rule (:func:`fedjax_sel.training.local.auto_parallel`); the measured choice
        of ``--parallel auto`` is made before the simulation is built
        (:func:`fedjax_sel.training.autotune.resolve_parallel`, which the experiment layer
        calls) and recorded through ``parallel_choice``.
      parallel_choice: how ``parallel`` was chosen (:class:`~fedjax_sel.training.autotune.
        ParallelChoice`), recorded in the run's ``config.json``.
      persistent_client_state: keep each client's optimizer state (momentum) across rounds.
      chunk_size: rounds per compiled ``lax.scan`` chunk.
      eval_batch_size: batch of the evaluation passes (the least: the passes over every
        client's data take more rows where a small model's activations allow,
        :func:`fedjax_sel.training.evaluate.eval_rows`).
      mesh: a one-axis ``jax.sharding.Mesh`` named ``clients`` to shard the slot axis of local
        training (and a padded data set's client axis) over several devices.
      n_max: the largest client any simulated data set holds (default: ``dataset``'s); larger
        when the data of several seeds run stacked (:meth:`run_rounds_batch`).
      system: device profiles (:mod:`fedjax_sel.engine.system`): every round gets a simulated
        duration and the virtual clock advances; ``None``: no time (strategies that need
        durations, e.g. Oort, get the default log-normal profile).
      deadline: seconds after which a round stops waiting (stragglers contribute the local
        steps they finished; needs ``system``).
      overcommit: select ``ceil(per_round * overcommit)`` clients and keep the first
        ``per_round`` finishers (needs ``system``); the strategy must select that many slots.
      dropout: probability that a selected client fails and sends nothing.
      asynchronous: run asynchronous FL instead of synchronous rounds
        (:class:`fedjax_sel.engine.fedbuff.FedBuff`; needs ``system``): a "round" is then one server
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
        parallel_choice=None,
    ):
        if num_rounds < 1:
            raise ConfigError(f"num_rounds must be >= 1, got {num_rounds}")
        if chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
        spec = RoundSpec.create(
            dataset,
            model,
            strategy,
            local=local,
            per_round=per_round,
            availability=availability,
            server_tx=server_tx,
            parallel=parallel,
            persistent_client_state=persistent_client_state,
            eval_batch_size=eval_batch_size,
            mesh=mesh,
            n_max=n_max,
            system=system,
            deadline=deadline,
            overcommit=overcommit,
            dropout=dropout,
            asynchronous=asynchronous,
        )
        self.round_spec = spec
        self.dataset, self.num_rounds = dataset, int(num_rounds)
        self.chunk_size, self.mesh = int(chunk_size), mesh
        self.overcommit = float(overcommit)
        self.n_max = int(n_max or dataset.train.n_max)
        self.parallel_choice = parallel_choice
        # the spec's settings, read by drivers and notebooks
        self.model, self.strategy, self.availability = spec.model, spec.strategy, spec.availability
        self.local, self.server_tx, self.trainer = spec.local, spec.server_tx, spec.trainer
        self.per_round, self.slots = spec.per_round, spec.slots
        self.system, self.deadline, self.dropout = spec.system, spec.deadline, spec.dropout
        self.persistent_client_state = spec.persistent_client_state
        self.eval_batch_size, self.kbit = spec.eval_batch_size, spec.kbit
        self.asynchronous = spec.asynchronous
        self.parallel = self.trainer.mode
        mode, chunk = self.parallel
        self.parallel_spec = parallel_spec(mode, chunk, self.model.conv_impl)
        self.data = self._place(SimData.of(dataset))
        self._chunk = jax.jit(self._chunk_fn, static_argnums=(2,))
        # the same program with the state's buffers given to its outputs (``donate=True``): a
        # round does not hold the state twice (at 10^6 clients FedCVR-Bolt's is 1.1 GiB)
        self._chunk_donated = jax.jit(self._chunk_fn, static_argnums=(2,), donate_argnums=(0,))
        self._evaluate = jax.jit(self.evaluate_fn)
        self._batched_fns: dict = {}
        self._phases: dict = {}  # donate -> the three phase programs, compiled on first use

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
        # one label per example; sequence targets (next-word prediction) have no histogram:
        # [K, vocabulary] would be 13.7 GB for Stack Overflow's 342,477 users
        if ds.num_classes is not None and ds.task == "classification" and not ds.train.target_shape:
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
        strategy_state = init_with_hyperparams(
            self.strategy, jax.random.fold_in(sim_key, 101), spec, strategy_hparams or {}
        )
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
            server_opt_state=self.round_spec.server_transform(None).init(params),
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

    # ----------------------------------------------------------------------------- the round
    def oracle(
        self, data: SimData, client_opt_states=None, train_key=None, hparams=None
    ) -> ClientOracle:
        """The :class:`ClientOracle` a strategy sees (:func:`fedjax_sel.engine.round.
        client_oracle`)."""
        return round_lib.client_oracle(self.round_spec, data, client_opt_states, train_key, hparams)

    def round_fn(self, state: SimState, data: SimData) -> tuple[SimState, RoundLog]:
        """One round (pure; trace it inside ``jit``): :func:`fedjax_sel.engine.round.round_fn`
        of this simulation's spec."""
        return round_lib.round_fn(self.round_spec, state, data)

    def _chunk_fn(self, state: SimState, data: SimData, length: int, num_active):
        return round_lib.chunk_fn(self.round_spec, state, data, length, num_active)

    # ----------------------------------------------------------------------------- running
    def run_rounds(
        self,
        state: SimState,
        num_rounds: int,
        data: SimData | None = None,
        *,
        donate: bool = False,
    ) -> tuple[SimState, RoundLog]:
        """Runs ``num_rounds`` rounds in compiled chunks of ``chunk_size``; returns the new
        state and the host-side logs of those rounds (stacked on axis 0). ``data``: another
        data set of the same shapes (default: the simulation's). ``donate``: the rounds
        reuse ``state``'s buffers for their outputs (``state`` is unusable afterwards; same
        results, one copy of the state less at peak)."""
        data = self.data if data is None else data
        logs = []
        done = 0
        while done < num_rounds:
            n = min(self.chunk_size, num_rounds - done)
            state, log = self.run_chunk(state, data, n, donate=donate)
            logs.append(jax.tree.map(lambda a, n=n: a[:n], to_host(log)))
            done += n
        return state, jax.tree.map(lambda *a: np.concatenate(a), *logs)

    def run_chunk(
        self,
        state: SimState,
        data: SimData | None = None,
        num_active: int | None = None,
        *,
        donate: bool = False,
    ) -> tuple[SimState, RoundLog]:
        """One call of the compiled chunk: ``num_active`` rounds (default ``chunk_size``),
        state and logs left on the device (``donate``: see :meth:`run_rounds`)."""
        data = self.data if data is None else data
        n = self.chunk_size if num_active is None else num_active
        if donate:
            return self._chunk_donated(distinct_buffers(state), data, self.chunk_size, jnp.int32(n))
        return self._chunk(state, data, self.chunk_size, jnp.int32(n))

    def compiled_texts(
        self, states: SimState, data: SimData | None = None, batched: bool = False
    ) -> list[str]:
        """The compiled programs of a chunk and of the evaluation (``states`` stacked when
        ``batched``; for trace analysis)."""
        shared = data is None
        d = self.data if shared else data
        n = jnp.int32(self.chunk_size)
        if batched:
            chunk = self._batched("chunk", self.chunk_size, shared).lower(states, d, n)
            evaluate = self._batched("evaluate", 0, shared).lower(states, d)
        else:
            chunk = self._chunk.lower(states, d, self.chunk_size, n)
            evaluate = self._evaluate.lower(states.params, states.strategy_state, d)
        return [chunk.compile().as_text(), evaluate.compile().as_text()]

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
        chunks = [self._chunk, self._chunk_donated]
        chunks += [f for k, f in self._batched_fns.items() if k[0] == "chunk"]
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
                    axes = state_axes(states)
                    return jax.vmap(
                        lambda s, d: self._chunk_fn(s, d, length, num_active),
                        in_axes=(axes, data_axis),
                        out_axes=(axes, 0),
                        axis_name=MEMBERS_AXIS,  # members_cond's branches
                    )(states, data)

            else:

                def fn(states, data):
                    axes = state_axes(states)
                    return jax.vmap(
                        lambda s, d: self.evaluate_fn(s.params, s.strategy_state, d),
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

    def run_rounds_profiled(
        self,
        state: SimState,
        num_rounds: int,
        data: SimData | None = None,
        *,
        donate: bool = False,
    ):
        """Runs rounds with each phase compiled and timed separately (``--profile``).

        Returns ``(state, logs, seconds)`` where ``seconds`` maps ``select``, ``train`` and
        ``aggregate`` to total wall seconds. Slower than :meth:`run_rounds` (a host round trip
        per phase); the results agree up to floating-point reassociation. ``donate``: see
        :meth:`run_rounds` (the selection and aggregation phases reuse the state's buffers).
        """
        if donate not in self._phases:
            spec, gives = self.round_spec, {"donate_argnums": (0,)} if donate else {}
            self._phases[donate] = (
                jax.jit(functools.partial(round_lib.select_phase, spec), **gives),
                jax.jit(functools.partial(round_lib.train_phase, spec)),
                jax.jit(functools.partial(round_lib.aggregate_phase, spec), **gives),
            )
        select, train, aggregate = self._phases[donate]
        given = distinct_buffers if donate else (lambda tree: tree)
        data = self.data if data is None else data
        seconds = {"select": 0.0, "train": 0.0, "aggregate": 0.0}
        logs = []
        for _ in range(num_rounds):
            t0 = time.perf_counter()
            state, selection, available = jax.block_until_ready(select(given(state), data))
            t1 = time.perf_counter()
            result = jax.block_until_ready(train(state, data, selection))
            t2 = time.perf_counter()
            state, log = jax.block_until_ready(
                aggregate(given(state), data, selection, available, result)
            )
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

        def every_client(params, clients):
            rows = ev.eval_rows(model, params, clients, bs)
            return ev.evaluate_all_clients(model, params, clients, rows, mesh)

        def client_test(params):
            return every_client(params, data.test)

        def client_train(params):
            loss_k, acc_k, _ = every_client(params, data.train)
            return loss_k, acc_k

        return Evaluator(central, client_test if data.test is not None else None, client_train)

    def evaluate_fn(self, params: Params, strategy_state, data: SimData) -> dict[str, Array]:
        """The evaluation's scalars (pure; :meth:`evaluate` runs it compiled)."""
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


def distinct_buffers(tree):
    """``tree`` with every array leaf in a buffer of its own: a leaf whose buffer an earlier
    leaf already holds (a strategy's init may put one array in two fields; a program may
    return one buffer twice) is copied, since a donated call rejects a buffer given twice."""
    seen: set = set()

    def one(x):
        if not isinstance(x, jax.Array) or x.size == 0:
            return x
        try:
            where = tuple(s.data.unsafe_buffer_pointer() for s in x.addressable_shards)
        except (AttributeError, RuntimeError, TypeError, ValueError):  # e.g. PRNG key arrays
            where = ("object", id(x))
        if where in seen:
            return x.copy()
        seen.add(where)
        return x

    return jax.tree.map(one, tree)


@functools.lru_cache(maxsize=1)
def default_mesh() -> jax.sharding.Mesh | None:
    """A one-axis ``clients`` mesh over all local devices when there are several."""
    devices = jax.devices()
    if len(devices) < 2:
        return None
    return jax.sharding.Mesh(np.array(devices), ("clients",))
