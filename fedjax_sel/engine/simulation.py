"""The host driver of a simulation.

A round is a pure function of the simulation state over a static
:class:`~fedjax_sel.engine.spec.RoundSpec` (:func:`fedjax_sel.engine.round_fn`, with
:func:`fedjax_sel.engine.init_state` for the state before it). :class:`Simulation` drives it
over a data set: a chunk of rounds is one ``lax.scan`` inside one ``jax.jit`` (no host round
trip inside a round or a chunk), seeds and grid points run vmapped, and the host returns
between chunks to evaluate, log and checkpoint.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import ConfigError, Params
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.distributed import to_host
from fedjax_sel.engine import oracle, phases
from fedjax_sel.engine import round as round_lib
from fedjax_sel.engine.log import RoundLog
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import (
    SimData,
    SimState,
    init_state,
    seed_keys,
    sim_spec,
    stack_states,
    state_axes,
)
from fedjax_sel.members import MEMBERS_AXIS
from fedjax_sel.training.autotune import ParallelChoice
from fedjax_sel.training.hparams import HParams


class Simulation:
    """The host driver of a round spec over a data set: the initial states, the compiled chunks
    of rounds (donated or not), several members vmapped, per-phase profiling and evaluation.

    >>> spec = RoundSpec.create(dataset, model, make_strategy("uniform", 10),
    ...                         local=LocalConfig(), per_round=10)           # doctest: +SKIP
    >>> sim = Simulation(spec, dataset, num_rounds=100)                     # doctest: +SKIP
    >>> state = sim.init(seed=0, hparams=HParams.of(lr=0.05))               # doctest: +SKIP
    >>> state, logs = sim.run_rounds(state, 10)                             # doctest: +SKIP
    >>> sim.evaluate(state)["test_accuracy"]                                # doctest: +SKIP

    Args:
      spec: what a round's program is built from (:meth:`RoundSpec.create`).
      dataset: the federated data set (the spec's shapes).
      num_rounds: planned rounds (strategies with schedules read it).
      chunk_size: rounds per compiled ``lax.scan`` chunk.
      mesh: a one-axis ``jax.sharding.Mesh`` named ``clients`` over which a padded data set's
        client axis and the evaluation are sharded (the spec's trainer takes the same mesh).
      parallel_choice: how the spec's client parallelism was chosen (:class:`~fedjax_sel.
        training.autotune.ParallelChoice`), recorded in the run's ``config.json``.
    """

    def __init__(
        self,
        spec: RoundSpec,
        dataset: FederatedDataset,
        *,
        num_rounds: int,
        chunk_size: int = 10,
        mesh: jax.sharding.Mesh | None = None,
        parallel_choice: ParallelChoice | None = None,
    ):
        if num_rounds < 1:
            raise ConfigError(f"num_rounds must be >= 1, got {num_rounds}")
        if chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
        self.spec = spec
        self.dataset, self.num_rounds = dataset, int(num_rounds)
        self.chunk_size, self.mesh = int(chunk_size), mesh
        self.parallel_choice = parallel_choice
        self.data = self.place(SimData.of(dataset))
        chunk = functools.partial(round_lib.chunk_fn, spec)
        self._chunk = jax.jit(chunk, static_argnums=(2,))
        # the same program with the state's buffers given to its outputs (``donate=True``): a
        # round does not hold the state twice (at 10^6 clients FedCVR-Bolt's is 1.1 GiB)
        self._chunk_donated = jax.jit(chunk, static_argnums=(2,), donate_argnums=(0,))
        self._evaluate = jax.jit(functools.partial(oracle.evaluate, spec, mesh=mesh))
        self._batched_fns: dict = {}
        self._phases: dict = {}  # donate -> the three phase programs, compiled on first use

    # ----------------------------------------------------------------------------- set-up
    def place(self, data: SimData) -> SimData:
        """``data`` on the simulation's devices (the client axis sharded over a mesh)."""
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

    def init(
        self,
        seed: int = 0,
        params: Params | None = None,
        dataset: FederatedDataset | None = None,
        *,
        hparams: HParams,
        strategy_hparams: dict[str, float] | None = None,
    ) -> SimState:
        """The initial state of ``seed`` (:func:`~fedjax_sel.engine.state.init_state`): model
        parameters from the seed (unless given), the simulation's key folded from it.
        ``dataset``: the seed's own data set when seeds run stacked with different partitions
        (default: the simulation's). ``hparams``: the traced hyperparameters of this member;
        ``strategy_hparams``: values of the strategy's traced hyperparameters
        (``Strategy.hyperparams``; default: those it was built with)."""
        model_key, sim_key = seed_keys(seed)
        if params is None:
            params = self.spec.model.init(model_key)
        sim = sim_spec(
            dataset or self.dataset,
            params,
            per_round=self.spec.slots,
            num_rounds=self.num_rounds,
        )
        return init_state(self.spec, sim, sim_key, hparams, strategy_hparams)

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
                        lambda s, d: round_lib.chunk_fn(self.spec, s, d, length, num_active),
                        in_axes=(axes, data_axis),
                        out_axes=(axes, 0),
                        axis_name=MEMBERS_AXIS,  # members_cond's branches
                    )(states, data)

            else:

                def fn(states, data):
                    axes = state_axes(states)
                    return jax.vmap(
                        lambda s, d: oracle.evaluate(
                            self.spec, s.params, s.strategy_state, d, self.mesh
                        ),
                        in_axes=(axes, data_axis),
                    )(states, data)

            self._batched_fns[key] = jax.jit(fn)
        return self._batched_fns[key]

    def init_batch(
        self,
        seeds: list[int],
        datasets: list[FederatedDataset] | None = None,
        *,
        hparams: HParams,
    ) -> SimState:
        """The initial states of ``seeds`` stacked on a leading axis (each from its own data
        set when ``datasets`` are given), every member at ``hparams``."""
        datasets = datasets or [None] * len(seeds)
        return stack_states(
            [self.init(s, dataset=d, hparams=hparams) for s, d in zip(seeds, datasets, strict=True)]
        )

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
            spec, gives = self.spec, {"donate_argnums": (0,)} if donate else {}
            self._phases[donate] = (
                jax.jit(functools.partial(phases.select_phase, spec), **gives),
                jax.jit(functools.partial(phases.train_phase, spec)),
                jax.jit(functools.partial(phases.aggregate_phase, spec), **gives),
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
