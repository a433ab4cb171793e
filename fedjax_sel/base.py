"""Core types and the Strategy protocol shared by every layer of the simulator.

A client-selection strategy is a factory that closes over its hyperparameters and returns a
:class:`Strategy`, a triple of pure functions in the style of ``optax.GradientTransformation``:

``init(key, spec) -> state``
    Builds the strategy's state (a pytree of fixed-shape arrays) for a simulation described by
    ``spec`` (a :class:`SimSpec`).
``select(state, inputs, oracle, key) -> (selection, state)``
    Chooses up to ``spec.per_round`` clients among the available ones. ``inputs`` is a
    :class:`RoundInputs`; ``oracle`` is a :class:`ClientOracle` whose functions the strategy may
    call (they are traced into the same jitted round, and what a strategy calls is what it costs).
``update(state, selection, feedback) -> state``
    Digests what the selected clients reported after local training (a :class:`RoundFeedback`).

All three run inside one ``jax.jit``-compiled round: they must be pure, keep array shapes fixed
(``per_round`` slots whatever the availability: unused slots are masked), and draw randomness
only from the key they are given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
PRNGKey = jax.Array
Params = Any  # a pytree of arrays
PyTree = Any


class SimSpec(NamedTuple):
    """Static description of a simulation, given to ``Strategy.init``.

    Attributes:
      num_clients: K, the number of clients in the federation.
      per_round: the number of selection slots per round (clients trained per round).
      num_rounds: T, the planned number of rounds (some schedules depend on it).
      num_examples: int32[K], training examples held by each client.
      params: the initial global parameters (a template for model-shaped state).
      num_classes: number of classes for classification tasks, ``None`` for regression.
      label_counts: float32[K, num_classes] per-client label histogram (classification only).
    """

    num_clients: int
    per_round: int
    num_rounds: int
    num_examples: Array
    params: Params
    num_classes: int | None = None
    label_counts: Array | None = None


class TrainResult(NamedTuple):
    """Local training of a set of clients from given start parameters (stacked over clients).

    Attributes:
      params: the clients' updated parameters, stacked on a leading axis; ``None`` where the
        trainer added each client's update into ``weighted_delta`` as it trained.
      loss: float32[n], mean training loss over the local steps.
      initial_loss: float32[n], loss of the start parameters on the first minibatch.
      loss_sq: float32[n], mean over local steps of the minibatch mean of squared per-example
        losses (Oort's statistical utility uses its square root).
      num_steps: int32[n], local SGD steps actually taken.
      opt_states: the clients' optimizer states after training, stacked (only with persistent
        client state; ``None`` otherwise).
      weighted_delta: ``sum_i w_i (theta_i - theta)`` over the slots, when the trainer was
        given the aggregation weights ``w`` (then ``params`` is ``None``); else ``None``.
      update_norm: float32[n], each slot's ``||theta_i - theta||`` with ``weighted_delta``.
    """

    params: Params
    loss: Array
    initial_loss: Array
    loss_sq: Array
    num_steps: Array
    opt_states: Any = None
    weighted_delta: Any = None
    update_norm: Any = None


class ClientWork(NamedTuple):
    """What a strategy asked of clients in ``select`` beyond the round's training of the slots
    it keeps, per client (float32[K] each): the benchmark's cost axes and the virtual clock
    charge it (``docs/time.md``, "Oracle work"). Build it with :func:`client_work`.

    Attributes:
      forward_examples: examples each client passed forward for the strategy (loss queries:
        Power-of-Choice's candidates, every client's loss for HeteRo-Select).
      train_steps: local SGD steps each client ran for the strategy besides its kept slot's
        training (warm starts, filtering passes, probes whose update is not aggregated).
      uploads: model-sized messages each client sent besides its kept slot's update (a scalar
        loss is not counted).
    """

    forward_examples: Array
    train_steps: Array
    uploads: Array


def client_work(
    num_clients: int,
    clients: Array,
    active: Array | None = None,
    *,
    forward_examples: Array | float = 0.0,
    train_steps: Array | float = 0.0,
    uploads: Array | float = 0.0,
) -> ClientWork:
    """A :class:`ClientWork` over ``num_clients`` from per-slot amounts: slot ``i`` (where
    ``active``) charges client ``clients[i]`` its ``forward_examples[i]`` (scalars broadcast),
    ``train_steps[i]`` and ``uploads[i]``; repeated clients add up."""
    clients = jnp.asarray(clients, jnp.int32)
    on = jnp.ones(clients.shape, bool) if active is None else jnp.asarray(active, bool)

    def scatter(amount) -> Array:
        amount = jnp.broadcast_to(jnp.asarray(amount, jnp.float32), clients.shape)
        per_slot = jnp.where(on, amount, 0.0)
        return jnp.zeros((num_clients,), jnp.float32).at[clients].add(per_slot, mode="drop")

    return ClientWork(scatter(forward_examples), scatter(train_steps), scatter(uploads))


def no_work(num_clients: int) -> ClientWork:
    """A :class:`ClientWork` of nothing (the branch of a ``lax.cond`` that asks nothing, where
    the other asks something: both must return the same structure)."""
    zeros = jnp.zeros((num_clients,), jnp.float32)
    return ClientWork(zeros, zeros, zeros)


def loss_pass_work(num_examples: Array, asked: Array) -> ClientWork:
    """The :class:`ClientWork` of a loss pass over each ``asked`` client's whole training set
    (``num_examples``: int32[K]; ``asked``: bool[K])."""
    k = num_examples.shape[0]
    return client_work(k, jnp.arange(k), asked, forward_examples=num_examples)


def add_work(a: ClientWork | None, b: ClientWork | None) -> ClientWork | None:
    """The sum of two :class:`ClientWork` (``None``: none)."""
    if a is None or b is None:
        return a if b is None else b
    return ClientWork(*(x + y for x, y in zip(a, b, strict=True)))


class Selection(NamedTuple):
    """The outcome of ``Strategy.select``: ``per_round`` slots.

    Attributes:
      clients: int32[per_round], slot -> client id (any valid id for an empty slot).
      mask: bool[per_round], ``False`` marks an empty slot (it trains nothing, weighs nothing).
      weights: float32[per_round], aggregation weight of each slot. The server applies
        ``sum_i weights_i * (theta_i - theta_start_i)`` as the model update (scaled by the
        server optimizer), so FedAvg-style strategies return weights that sum to one.
      train_result: local training the strategy already ran for these slots (a
        :class:`TrainResult` stacked over ``per_round``, e.g. FilFL trains every available
        client before filtering); the round then skips its own training. ``None`` (the
        default) lets the round train the slots.
      diagnostics: a small dict of per-round mechanism diagnostics (fixed-shape arrays, mostly
        scalars), logged with the round like any metric. The key ``law`` (float32[K], the
        probabilities the selection was drawn from, zero for unavailable clients) is reduced
        by the engine to ``law_entropy_ratio`` (entropy over the entropy of the uniform law on
        the available clients: 1 = uniform) and ``law_max_over_uniform`` (the largest
        probability times the number of available clients), and is not logged itself.
      work: what the strategy asked of clients beyond training the kept slots
        (:class:`ClientWork`), or ``None``: nothing. Training that ``train_result`` holds for
        slots the round drops counts here too (FilFL's considered clients).
    """

    clients: Array
    mask: Array
    weights: Array
    train_result: TrainResult | None = None
    diagnostics: dict[str, Array] | None = None
    timing: Any = None  # set by the engine: the system model's decisions for these slots
    work: ClientWork | None = None


class AvailabilityParams(NamedTuple):
    """True per-client parameters of an availability process, for oracle estimators (CA-Fed
    section V-A c: "an oracle providing the true availability parameters").

    Attributes:
      pi: float32[K], stationary availability ``P(client online)``.
      lam: float32[K], second eigenvalue of the client's two-state on/off chain (the lag-1
        autocorrelation of its availability; 0 for memoryless availability).
    """

    pi: Array
    lam: Array


class RoundInputs(NamedTuple):
    """What the server knows at the start of a round.

    Attributes:
      round: int32 scalar, the 0-based round index.
      available: bool[K], which clients are online this round.
      params: the current global parameters.
      num_examples: int32[K], training examples held by each client.
      availability_params: the availability model's true parameters
        (:class:`AvailabilityParams`) when it exposes them (``AvailabilityModel.true_params``),
        else ``None``. Only oracle-mode strategies read it.
      durations: float32[K], the simulated seconds each client would take for its full local
        work this round (device profile, :mod:`fedjax_sel.engine.system`), or ``None`` without a
        system model (Oort's system utility reads it).
      compute_seconds, comm_seconds: float32[K], the two parts of ``durations``: local
        computation, and communication (one model download plus one upload, each half of it),
        or ``None`` without a system model (FedCS schedules the uploads one after another;
        PyramidFL plans local iterations in the slack).
    """

    round: Array
    available: Array
    params: Params
    num_examples: Array
    availability_params: AvailabilityParams | None = None
    durations: Array | None = None
    compute_seconds: Array | None = None
    comm_seconds: Array | None = None


class ClientOracle(NamedTuple):
    """Functions a strategy may call from ``select``; all are traced into the round.

    Attributes:
      loss: ``(params, clients, key) -> float32[n]``: mean loss of ``params`` on each listed
        client's whole training set (cost: ``n * n_max`` forward passes).
      batch_loss: ``(params, clients, key, batch_size) -> float32[n]``: mean loss on one random
        minibatch of ``batch_size`` examples per client (Power-of-Choice's cpow-d estimate).
      all_losses: ``(params) -> float32[K]``: mean loss of every client on its whole training
        set, computed in one pass over all examples (cost: ``N`` forward passes).
      train: ``(params, clients, key, active=None) -> TrainResult``: local training of the
        listed clients from ``params`` with the simulation's local optimizer; slots with
        ``active == False`` are skipped (they return ``params``). Each client's randomness is
        ``fold_in(key, client)``, the same derivation the round uses, so passing the round's
        training key (``train_key``) reproduces exactly what the round would compute.
      train_key: the key the round uses for local training (see ``train``).
      server_loss: ``(params, size=None) -> scalar`` mean loss on the server-held data set (data
        loaded with ``server_fraction > 0``; FilFL's filtering objective); vmappable over
        params. A static ``size`` uses that many examples spread evenly over the set.
      client_test_loss: ``(params, clients) -> float32[n]`` mean loss on each listed client's
        own test/validation split (needs ``test_fraction > 0``).
    """

    loss: Callable[..., Array]
    batch_loss: Callable[..., Array]
    all_losses: Callable[..., Array]
    train: Callable[..., TrainResult]
    train_key: Array
    server_loss: Callable[..., Array] | None = None
    client_test_loss: Callable[..., Array] | None = None


class RoundFeedback(NamedTuple):
    """What the server learns after the selected clients trained.

    Attributes:
      round: int32 scalar, the 0-based round index.
      available: bool[K], the availability mask of the round.
      params: global parameters before the round.
      new_params: global parameters after aggregation and the server step.
      deltas: pytree stacked over slots, ``theta_i - theta_start_i`` (zero for empty slots);
        ``theta_start_i`` is ``params`` unless the strategy has ``start_params``; ``None`` for
        a strategy with ``reads_deltas=False`` whose clients trained one after another.
      train_loss: float32[per_round], mean local training loss.
      initial_loss: float32[per_round], loss of ``params`` on each client's first minibatch.
      loss_sq: float32[per_round], mean squared per-example loss over local steps.
      update_norm: float32[per_round], L2 norm of each slot's delta.
      num_examples: int32[per_round], training examples of each slot's client.
      num_steps: int32[per_round], local steps taken.
      requested: bool[per_round], the strategy's own mask before the engine's system model
        (a slot requested but not kept was dropped, over-committed out or cut to zero steps);
        equal to the selection's mask without a system model.
      durations: float32[per_round], each slot's full simulated duration (0 without a system
        model).
    """

    round: Array
    available: Array
    params: Params
    new_params: Params
    deltas: Params
    train_loss: Array
    initial_loss: Array
    loss_sq: Array
    update_norm: Array
    num_examples: Array
    num_steps: Array
    requested: Array | None = None
    durations: Array | None = None


InitFn = Callable[[PRNGKey, SimSpec], PyTree]
SelectFn = Callable[[PyTree, RoundInputs, ClientOracle, PRNGKey], tuple[Selection, PyTree]]
UpdateFn = Callable[[PyTree, Selection, RoundFeedback], PyTree]


class Evaluator(NamedTuple):
    """Evaluation functions given to ``Strategy.metrics``.

    Attributes:
      central: ``params -> (loss, accuracy)`` on the central test set.
      client_test: ``params -> (loss float32[K], accuracy float32[K], count float32[K])`` on
        each client's own test split (NaN for clients without one); ``None`` when the data set
        has no per-client test splits.
      client_train: ``params -> (loss float32[K], accuracy float32[K])`` on each client's
        training data.
    """

    central: Callable[..., tuple[Array, Array]]
    client_test: Callable[..., tuple[Array, Array, Array]] | None
    client_train: Callable[..., tuple[Array, Array]]


class Strategy(NamedTuple):
    """A client-selection strategy: three pure functions (see the module docstring), plus
    optional hooks for methods that keep several models.

    Attributes:
      init: ``(key, spec) -> state``.
      select: ``(state, inputs, oracle, key) -> (selection, state)``.
      update: ``(state, selection, feedback) -> state``.
      name: registry name, for logs.
      start_params: optional ``(state, selection, global_params) -> stacked params``: the
        parameters each slot starts local training from (IFCA: the client's cluster model).
        ``None``: every slot starts from the global parameters.
      metrics: optional ``(state, global_params, evaluator) -> dict[str, scalar]``: extra
        evaluation metrics logged at every evaluation (an :class:`Evaluator` is passed;
        clustered methods report the mean client accuracy under each client's own model).
      needs_system: the strategy reads ``RoundInputs.durations`` (a simulation without a
        system model then gives every client the same speed, ``RoundSpec.create``).
      asynchronous: the strategy can pick who starts when a slot frees up in asynchronous FL
        (:mod:`fedjax_sel.engine.fedbuff`): its ``update`` reads only client-indexed feedback, so it
        accepts the arrivals of an event step as the "selection".
      hyperparams: the hyperparameters traced in its state and the values it was built with,
        ``(name, value)`` pairs (``dict(strategy.hyperparams)``), as
        :func:`fedjax_sel.strategies.hyperparams.inject_hyperparams` sets them; a grid of them
        shares one compiled program. Pairs, not a dict, so that a strategy stays hashable (a
        static argument of ``jax.jit``).
      reads_deltas: its ``update`` reads ``RoundFeedback.deltas`` (the slots' models). Where
        it does not (``False``) and the clients train one after another (``map``), the round
        adds each client's update into the aggregate as it trains and never holds the P
        models; ``feedback.deltas`` is then ``None``.
    """

    init: InitFn
    select: SelectFn
    update: UpdateFn
    name: str = "strategy"
    start_params: Callable[[PyTree, Selection, Params], Params] | None = None
    metrics: Callable[[PyTree, Params, Evaluator], dict] | None = None
    needs_system: bool = False
    asynchronous: bool = False
    hyperparams: tuple[tuple[str, float], ...] = ()
    reads_deltas: bool = True


class EmptyState(NamedTuple):
    """State of a stateless strategy."""


def init_empty_state(key: PRNGKey, spec: SimSpec) -> EmptyState:
    del key, spec
    return EmptyState()


def update_identity(state: PyTree, selection: Selection, feedback: RoundFeedback) -> PyTree:
    del selection, feedback
    return state


class AvailabilityModel(NamedTuple):
    """Who is online each round: ``init(key, num_clients) -> state`` and
    ``step(state, key) -> (available bool[K], state)``, both pure and jittable.

    ``step`` is called once per round, before selection; the state carries whatever the model
    needs (a Markov chain's current on/off states, a replay cursor). ``true_params`` (optional):
    ``state -> AvailabilityParams``, the process's true ``pi`` and ``lambda`` per client, passed
    to strategies as ``RoundInputs.availability_params`` (oracle estimators). ``needs_spec``:
    ``init`` takes a third argument, the simulation's :class:`SimSpec` (models whose
    availability follows the clients' data).
    """

    init: Callable[..., PyTree]
    step: Callable[[PyTree, PRNGKey], tuple[Array, PyTree]]
    name: str = "availability"
    info: dict | None = None
    true_params: Callable[[PyTree], AvailabilityParams] | None = None
    needs_spec: bool = False


class ConfigError(ValueError):
    """A configuration, argument or input file that cannot work; the message names it."""
