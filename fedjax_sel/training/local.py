"""Local training of many clients at once.

One client's local work is a loop of SGD steps on minibatches of its own examples:

* ``local_steps=S``: S steps; each draws a fresh minibatch of ``batch_size`` positions uniformly
  (with replacement) from the client's examples; a client holding no more than ``batch_size``
  examples takes its whole data set every step (full-batch gradient descent).
* ``local_epochs=E``: E passes; each pass draws one permutation of the client's examples
  (uniform keys + argsort, padding pushed to the end) and walks it in ``ceil(n_k / B)``
  minibatches, the last one partial (masked). Clients of different sizes take different step
  counts; under ``vmap`` the loop runs to the largest selected client and the extra steps of the
  others are masked out (a batched ``while_loop``), under ``map`` each client runs its own count.

The optimizer is optax SGD with optional momentum and (PyTorch-style, coupled) weight decay;
FedProx adds ``mu / 2 * ||w - w_global||^2`` to the objective. Randomness is a function of
``(key, client id)`` only, so a client's result does not depend on its slot, on the parallelism
mode or on the number of devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.base import Array, ConfigError, PRNGKey, TrainResult
from fedjax_sel.data.client_data import ClientData
from fedjax_sel.models import Model, masked_mean
from fedjax_sel.models.base import CONV_IMPLS, with_conv_impl
from fedjax_sel.registry import convert, parse_spec
from fedjax_sel.training.hparams import HParams
from fedjax_sel.tree import masked_rows, sq_norm

PARALLEL_MODES = ("auto", "vmap", "map", "chunked")


class LocalConfig(NamedTuple):
    """Static local-training settings: what the compiled program is built from. The learning
    rate and FedProx's mu are traced values (:class:`~fedjax_sel.training.hparams.HParams`),
    given to each call.

    Attributes:
      batch_size: minibatch size B.
      local_steps: S fixed steps (exclusive with ``local_epochs``).
      local_epochs: E passes over the client's data.
      momentum: SGD momentum (0 disables it).
      weight_decay: L2 weight decay added to the gradient (PyTorch SGD semantics).
      nesterov: Nesterov momentum.
      prox: the objective has FedProx's proximal term ``mu / 2 * ||w - w_global||^2`` (mu from
        ``HParams.prox_mu``; without it the program has no such term and mu must be 0).
    """

    batch_size: int = 32
    local_steps: int | None = 10
    local_epochs: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    prox: bool = False

    def validate(self) -> None:
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ConfigError(
                "give exactly one of local_steps and local_epochs, got "
                f"local_steps={self.local_steps}, local_epochs={self.local_epochs}"
            )
        for name in ("local_steps", "local_epochs"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if int(self.batch_size) != self.batch_size or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must lie in [0, 1), got {self.momentum!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay!r}")


def client_optimizer(cfg: LocalConfig, lr: float | Array) -> optax.GradientTransformation:
    """SGD with coupled weight decay (as ``torch.optim.SGD``) and optional momentum at
    learning rate ``lr`` (may be traced). Its state does not depend on ``lr``."""
    parts = []
    if cfg.weight_decay > 0:
        parts.append(optax.add_decayed_weights(cfg.weight_decay))
    parts.append(
        optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov and cfg.momentum > 0)
    )
    return optax.chain(*parts)


def stable_argsort_uint(keys: Array, key_bits: int) -> Array:
    """``jnp.argsort(keys, stable=True)`` for a 1-D array of unsigned keys below
    ``2**key_bits``, bit for bit, by least-significant-digit radix passes of single-operand
    uint32 sorts: each pass sorts ``digit << b | position`` (``b`` bits hold a position), so
    ties keep the previous pass's order. XLA:CPU sorts one uint32 operand several times
    faster than it sorts the (key, index) pairs of an argsort; with ``n`` keys a pass takes
    ``32 - ceil(log2 n)`` key bits (two passes for 24-bit keys up to 2^14 = 16384 keys, three
    up to 2^20).

    Returns:
      uint32[n], the stable ascending order.
    """
    n = keys.shape[0]
    position_bits = max(1, (n - 1).bit_length())
    digit_bits = 32 - position_bits
    if digit_bits < 1:  # more than 2^31 keys: no room for a digit
        return jnp.argsort(keys, stable=True).astype(jnp.uint32)
    keys = keys.astype(jnp.uint32)
    position = jnp.arange(n, dtype=jnp.uint32)
    low = jnp.uint32((1 << position_bits) - 1)
    perm = None
    for shift in range(0, key_bits, digit_bits):
        current = keys if perm is None else keys[perm]
        digit = (current >> shift) & jnp.uint32((1 << digit_bits) - 1)
        order = jnp.sort((digit << position_bits) | position) & low
        perm = order if perm is None else perm[order]
    return position if perm is None else perm


def epoch_positions(key: PRNGKey, count: Array, n_max: int, batch_size: int) -> Array:
    """One epoch's minibatch positions for a client holding ``count`` examples.

    Draws a uniform permutation of ``0..count-1`` (uniform keys + argsort, padding pushed to
    the end) and cuts it into ``ceil(n_max / batch_size)`` rows of ``batch_size``; the first
    ``ceil(count / batch_size)`` rows hold every position exactly once, the rest of the entries
    are ``>= count`` (masked by :meth:`ClientData.gather`).

    Returns:
      int32[ceil(n_max / batch_size), batch_size].
    """
    u = jax.random.uniform(key, (n_max,))
    # u = k / 2^23 exactly (23 random mantissa bits), so sorting k (2^23 for padding) sorts u
    keys = jnp.where(jnp.arange(n_max) < count, (u * 2.0**23).astype(jnp.uint32), 2**23)
    perm = stable_argsort_uint(keys, key_bits=24).astype(jnp.int32)
    rows = -(-n_max // batch_size)
    perm = jnp.pad(perm, (0, rows * batch_size - n_max), constant_values=n_max)
    return perm.reshape(rows, batch_size)


def step_positions(key: PRNGKey, count: Array, batch_size: int) -> Array:
    """One fixed-step minibatch: ``batch_size`` uniform positions (with replacement), or the
    whole client (``0..batch_size-1``, masked past ``count``) when it holds no more than
    ``batch_size`` examples."""
    random_pos = jax.random.randint(key, (batch_size,), 0, jnp.maximum(count, 1))
    return jnp.where(count <= batch_size, jnp.arange(batch_size), random_pos)


def make_client_update(model: Model, cfg: LocalConfig, n_max: int) -> Callable:
    """Builds ``update(params, opt_state, data, client, key, hparams, step_limit=None)
    -> (params, opt_state, metrics)``.

    ``opt_state`` may be ``None`` (a fresh optimizer state each round). ``metrics`` is
    ``(mean_loss, initial_loss, mean_loss_sq, num_steps)``. ``hparams``
    (:class:`~fedjax_sel.training.hparams.HParams`, may be traced): the learning rate and
    FedProx mu (the proximal term exists only when ``cfg.prox``). ``step_limit`` (int32
    scalar): the client stops after that many SGD steps (a straggler cut by the round's
    deadline); its minibatches are the ones it would have drawn, so it computes a prefix of
    its full work.
    """
    cfg.validate()
    bsz = int(cfg.batch_size)
    prox = cfg.prox

    def objective(p, global_params, mu, x, y, mask):
        per_example = model.loss(model.apply(p, x), y)
        loss = masked_mean(per_example, mask)
        obj = loss
        if model.regularizer is not None:
            obj = obj + model.regularizer(p)
        if prox:
            diff = jax.tree.map(lambda a, b: a - b, p, global_params)
            obj = obj + 0.5 * mu * sq_norm(diff)
        return obj, (loss, masked_mean(jnp.square(per_example), mask))

    grad_fn = jax.grad(objective, has_aux=True)

    def sgd_step(carry, global_params, data, client, positions, tx, mu):
        p, opt_state, loss_sum, sq_sum, first_loss, steps = carry
        x, y, mask = data.gather(client, positions)
        g, (loss, sq) = grad_fn(p, global_params, mu, x, y, mask)
        updates, opt_state = tx.update(g, opt_state, p)
        p = optax.apply_updates(p, updates)
        first_loss = jnp.where(steps == 0, loss, first_loss)
        return (p, opt_state, loss_sum + loss, sq_sum + sq, first_loss, steps + 1)

    def limited_step(carry, global_params, data, client, positions, tx, mu, limit):
        """A step taken only while under the limit (the carry passes through after it)."""
        new = sgd_step(carry, global_params, data, client, positions, tx, mu)
        go = carry[-1] < limit
        return jax.tree.map(lambda a, b: jnp.where(go, a, b), new, carry)

    def update(params, opt_state, data: ClientData, client, key, hparams: HParams, step_limit=None):
        tx = client_optimizer(cfg, hparams.lr)
        mu = hparams.prox_mu
        if opt_state is None:
            opt_state = tx.init(params)
        count = data.counts[client]
        zero = jnp.zeros((), jnp.float32)
        carry = (params, opt_state, zero, zero, zero, jnp.zeros((), jnp.int32))
        if cfg.local_steps is not None:

            def body(s, c):
                pos = step_positions(jax.random.fold_in(key, s), count, bsz)
                if step_limit is None:
                    return sgd_step(c, params, data, client, pos, tx, mu)
                return limited_step(c, params, data, client, pos, tx, mu, step_limit)

            carry = jax.lax.fori_loop(0, int(cfg.local_steps), body, carry)
        else:
            steps_per_epoch = (count + bsz - 1) // bsz

            def epoch(e, c):
                batches = epoch_positions(jax.random.fold_in(key, e), count, n_max, bsz)

                def cond(state):
                    more = state[0] < steps_per_epoch
                    if step_limit is not None:
                        more = more & (state[1][-1] < step_limit)
                    return more

                def body(state):
                    b, inner = state
                    return b + 1, sgd_step(inner, params, data, client, batches[b], tx, mu)

                return jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), c))[1]

            carry = jax.lax.fori_loop(0, int(cfg.local_epochs), epoch, carry)
        p, opt_state, loss_sum, sq_sum, first_loss, steps = carry
        denom = jnp.maximum(steps, 1).astype(jnp.float32)
        return p, opt_state, (loss_sum / denom, first_loss, sq_sum / denom, steps)

    return update


class Parallel(NamedTuple):
    """How a round's clients are trained side by side, parsed once (:func:`parse_parallel`).

    Attributes:
      mode: ``auto`` (the backend's rule, :func:`auto_parallel`), ``vmap``, ``map`` or
        ``chunked``.
      chunk: slots per chunk of ``chunked`` (``None`` otherwise).
      conv: the convolution implementation of a convolution model (``patches``, ``xla``,
        ``xla_nhwc``); ``None`` keeps the model's own.
    """

    mode: str = "auto"
    chunk: int | None = None
    conv: str | None = None

    def text(self) -> str:
        """The setting as ``--parallel`` accepts it, for records and display:
        ``map:conv=xla``, ``chunked:4,conv=patches``."""
        spec = self.mode if self.chunk is None else f"{self.mode}:{self.chunk}"
        if self.conv is not None:
            spec += f"{',' if ':' in spec else ':'}conv={self.conv}"
        return spec


AUTO_PARALLEL = Parallel()  # the backend's rule


def parse_parallel(spec: str) -> Parallel:
    """``auto``, ``vmap``, ``map`` or ``chunked:C``, with an optional ``conv=`` option
    (``map:conv=xla``, ``chunked:4,conv=patches``) -> :class:`Parallel`; a malformed setting
    is refused with its text, before anything is built or timed."""
    name, positional, pairs = parse_spec(spec, what="client parallelism")
    if "," in name:  # "map,conv=xla": the options belong after a colon
        mode, _, options = name.partition(",")
        raise ConfigError(
            f"client parallelism {spec!r}: options follow a colon, e.g. {mode}:{options}"
        )
    conv = pairs.pop("conv", None)
    if pairs:
        raise ConfigError(f"client parallelism {spec!r}: unknown option(s) {sorted(pairs)}")
    mode, chunk = _mode(name, positional)
    if conv is not None and conv not in CONV_IMPLS:
        raise ConfigError(
            f"client parallelism {spec!r}: conv must be one of {CONV_IMPLS}, got {conv!r}"
        )
    return Parallel(mode, chunk, conv)


def _mode(mode: str, positional: list[str]) -> tuple[str, int | None]:
    """``auto``, ``vmap``, ``map`` or ``chunked:C`` (the setting without its options) ->
    ``(mode, chunk)``."""
    spec = ":".join([mode] + ([",".join(positional)] if positional else []))  # for messages
    if mode not in PARALLEL_MODES:
        raise ConfigError(
            f"unknown client parallelism {spec!r}; choose auto, vmap, map or chunked:C"
        )
    if mode != "chunked":
        if positional:
            raise ConfigError(f"client parallelism {mode!r} takes no argument, got {spec!r}")
        return mode, None
    if len(positional) != 1:
        raise ConfigError(f"client parallelism {spec!r} needs a chunk size, e.g. chunked:8")
    chunk = convert(positional[0], int, what=f"client parallelism {spec!r}", key="chunk")
    if chunk < 1:
        raise ConfigError(f"chunk size must be >= 1, got {chunk}")
    return mode, chunk


def auto_parallel(model: Model, backend: str | None = None) -> Parallel:
    """The client-parallelism rule, as measured with ``bench throughput``.

    On accelerators every model vmaps (batched GEMMs). On XLA:CPU a model follows its
    ``cpu_parallel``: small models vmap (a loop is dispatch-bound), while the MLP, the CNN
    (im2col convolutions) and the LSTM run one client after another inside the compiled round
    (``lax.map``): vmapping them turns each client's matmuls into many small batched dot
    products, which XLA:CPU runs below the speed of one client's large ones.
    """
    backend = backend or jax.default_backend()
    if backend != "cpu":
        return Parallel("vmap")
    return parse_parallel(model.cpu_parallel)


def active_slots_loop(step: Callable, carry, init_outs, args, active: Array):
    """``carry, out_i = step(carry, *args_i)`` for the active slots only, one after another in
    slot order, each ``out_i`` written at slot i of ``init_outs`` (the inactive slots'
    outputs); returns ``(carry, outs)``.

    A ``while_loop`` over the active slots' indices rather than a ``lax.cond`` per slot: under
    ``vmap`` (seeds batched, devices grouped) a cond whose flag is batched runs as a select,
    even where the members' flags are equal, which XLA:CPU ran about 8 times slower per member
    than one member alone (`benchmarks/results/cpu_xeon/seed_batches_map.json`); the loop runs
    to the largest member's count of active slots instead."""
    order = jnp.argsort(jnp.logical_not(active), stable=True)  # active slots first
    count = jnp.sum(active.astype(jnp.int32))

    def body(state):
        i, c, outs = state
        j = order[i]
        c, res = step(c, *jax.tree.map(lambda a: a[j], args))
        outs = jax.tree.map(lambda o, r: o.at[j].set(r), outs, res)
        return i + 1, c, outs

    state = (jnp.zeros((), jnp.int32), carry, init_outs)
    _, carry, outs = jax.lax.while_loop(lambda s: s[0] < count, body, state)
    return carry, outs


def parallel_over_slots(
    fn: Callable,
    mode: str,
    chunk: int | None,
    active: Array | None = None,
    mesh: jax.sharding.Mesh | None = None,
    skip_fn: Callable | None = None,
):
    """Maps ``fn`` over the leading (slot) axis of its arguments in the given mode.

    * ``vmap``: all slots at once.
    * ``map``: one slot after another inside the compiled program (``lax.map``); with an
      ``active`` mask and a ``skip_fn`` (same arguments and output structure as ``fn``),
      only the active slots run ``fn`` (:func:`active_slots_loop`), the others output
      ``skip_fn``'s (computed for every slot at once).
    * ``chunked``: ``lax.map`` over chunks of ``chunk`` slots, ``vmap`` inside a chunk
      (with local epochs, :func:`make_trainer` first sorts the slots by size, so each chunk's
      batched loop runs to a step count close to its clients' own).

    With a ``mesh`` of n devices (axis ``clients``) and a slot count divisible by n, the slots
    are split into n groups placed on the n devices (a sharding constraint on the group axis);
    each device runs its group in the chosen mode.
    """

    def run_local(args, on):
        if mode == "vmap":
            return jax.vmap(fn)(*args)
        if mode == "map" and on is not None and skip_fn is not None:
            skipped = jax.vmap(skip_fn)(*args)
            return active_slots_loop(lambda c, *a: (c, fn(*a)), (), skipped, args, on)[1]
        return jax.lax.map(
            lambda a: fn(*a), tuple(args), batch_size=chunk if mode == "chunked" else None
        )

    def run(*args):
        n_slots = jax.tree.leaves(args)[0].shape[0]
        n_dev = 1 if mesh is None else mesh.devices.size
        if n_dev == 1 or n_slots % n_dev:
            return run_local(args, active)
        from jax.sharding import NamedSharding, PartitionSpec

        sharding = NamedSharding(mesh, PartitionSpec("clients"))

        def split(x):
            x = x.reshape((n_dev, n_slots // n_dev) + x.shape[1:])
            return jax.lax.with_sharding_constraint(x, sharding)

        grouped = jax.tree.map(split, (args, active))
        out = jax.vmap(run_local)(*grouped)
        out = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), out)
        return jax.tree.map(lambda x: x.reshape((n_slots,) + x.shape[2:]), out)

    return run


class Trainer(NamedTuple):
    """Local training of a round's slots, as a value (:func:`make_trainer` builds it).

    Attributes:
      train: ``train(params, data, clients, active, key, *, hparams, opt_states=None,
        per_slot=False, step_limit=None, aggregate_weights=None) -> TrainResult``
        (:func:`make_trainer` describes the arguments).
      parallel: the parallelism it runs, concrete (``auto`` resolved by the backend's rule;
        ``conv`` the model's convolution implementation): what a run records.
      streams: ``train`` takes ``aggregate_weights`` (the ``map`` mode on one device).
    """

    train: Callable[..., TrainResult]
    parallel: Parallel
    streams: bool


def make_trainer(
    model: Model,
    cfg: LocalConfig,
    n_max: int,
    *,
    parallel: Parallel = AUTO_PARALLEL,
    persistent_state: bool = False,
    mesh: jax.sharding.Mesh | None = None,
) -> Trainer:
    """Builds the :class:`Trainer` of ``model`` (its convolutions as ``parallel.conv`` says)
    whose ``train(params, data, clients, active, key, *, hparams, opt_states=None,
    per_slot=False, step_limit=None, aggregate_weights=None)`` trains a round's slots.

    ``train`` trains the listed clients (int32[P]) and returns a :class:`TrainResult` (with the
    slots' new optimizer states when ``persistent_state``, from ``opt_states`` stacked over the
    slots). All slots start from ``params``, or, with ``per_slot``, slot i from ``params[i]`` (a
    pytree stacked over slots). Slots with ``active == False`` return their start parameters
    and zero metrics. Each client's randomness is ``fold_in(key, client_id)``. ``step_limit``
    (int32[P]): slot i stops after that many SGD steps (stragglers cut by a deadline).
    ``hparams``: the learning rate and FedProx mu
    (:class:`~fedjax_sel.training.hparams.HParams`, traced).

    ``aggregate_weights`` (float32[P], where ``Trainer.streams``: the ``map`` mode on one
    device, slots starting from the shared ``params``): the active slots run in a loop that
    adds ``w_i (theta_i - theta)`` into a running sum as each finishes, as a plain loop over
    the clients would, so the P updated models are never held at once; the result has
    ``params=None``, the sum as ``weighted_delta`` and each slot's ``update_norm``.
    """
    if parallel.conv is not None:
        model = with_conv_impl(model, parallel.conv)
    mode, chunk, _ = auto_parallel(model) if parallel.mode == "auto" else parallel
    update = make_client_update(model, cfg, n_max)
    streams = mode == "map" and (mesh is None or mesh.devices.size == 1)

    def train(
        params,
        data,
        clients,
        active,
        key,
        *,
        hparams: HParams,
        opt_states=None,
        per_slot=False,
        step_limit=None,
        aggregate_weights=None,
    ):
        clients = jnp.asarray(clients, jnp.int32)
        keys = jax.vmap(lambda c: jax.random.fold_in(key, c))(clients)
        # Per-slot arguments are only what differs between slots: shared start parameters
        # and fresh optimizer states are built inside the slot function, not stacked P times.
        args = [clients, keys]
        if persistent_state:
            args.append(opt_states)
        if per_slot:
            args.append(params)
        if step_limit is not None:
            args.append(jnp.asarray(step_limit, jnp.int32))

        def unpack(rest):
            rest = list(rest)
            opt_state = rest.pop(0) if persistent_state else None
            p0 = rest.pop(0) if per_slot else params
            limit = rest.pop(0) if step_limit is not None else None
            if opt_state is None:
                opt_state = client_optimizer(cfg, hparams.lr).init(p0)
            return opt_state, p0, limit

        def one(client, k, *rest):
            opt_state, p0, limit = unpack(rest)
            p, s, (loss, first, sq, steps) = update(p0, opt_state, data, client, k, hparams, limit)
            return p, s, loss, first, sq, steps

        def skip(client, k, *rest):
            opt_state, p0, _ = unpack(rest)
            zero = jnp.zeros((), jnp.float32)
            return p0, opt_state, zero, zero, zero, jnp.zeros((), jnp.int32)

        if aggregate_weights is not None:
            if not streams or per_slot:
                raise ValueError(
                    "aggregate_weights needs the map mode on one device and shared start "
                    f"parameters (mode {mode!r}, per_slot={per_slot})"
                )
            return _streamed(one, skip, params, args, active, aggregate_weights, persistent_state)
        on = active
        group = cfg.local_epochs is not None and mode == "chunked"
        if group:  # chunks of clients with close step counts: little padding per chunk
            order = jnp.argsort(data.counts[clients], stable=True)
            args = jax.tree.map(lambda a: a[order], args)
            on = active[order]
        run = parallel_over_slots(one, mode, chunk, on, mesh, skip)
        outs = run(*args)
        if group:
            inverse = jnp.argsort(order)
            outs = jax.tree.map(lambda a: a[inverse], outs)
        p, s, loss, first, sq, steps = outs
        starts = params if per_slot else jax.tree.map(lambda x: x[None], params)
        p = masked_rows(active, p, starts)
        return _result(active, (loss, first, sq, steps), s if persistent_state else None, p)

    return Trainer(train, Parallel(mode, chunk, model.conv_impl), streams)


def _streamed(one, skip, params, args, active, weights, persistent_state: bool) -> TrainResult:
    """The ``map`` mode with the aggregation inside: a loop over the active slots whose carry
    is ``sum_i w_i (theta_i - theta)`` (float32), in slot order."""
    w = jnp.where(active, weights, 0.0).astype(jnp.float32)

    def body(total, w_i, *rest):
        p, s, loss, first, sq, steps = one(*rest)
        delta = jax.tree.map(lambda a, g: (a - g).astype(jnp.float32), p, params)
        norm = jnp.sqrt(sq_norm(delta))
        total = jax.tree.map(lambda t, d: t + w_i * d, total, delta)
        # the optimizer states are stacked only when kept (momentum: one model per slot)
        return total, (norm, s if persistent_state else None, loss, first, sq, steps)

    # the skipped slots' outputs (a zero norm; their states and zero metrics), computed at once;
    # the loop writes only the active slots, so the skipped ones keep these
    _, s0, *zeros = jax.vmap(skip)(*args)
    skipped = (jnp.zeros(active.shape, jnp.float32), s0 if persistent_state else None, *zeros)
    zero = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), params)
    total, (norms, s, *metrics) = active_slots_loop(body, zero, skipped, (w, *args), active)
    return _result(active, metrics, s, None, weighted_delta=total, update_norm=norms)


def _result(active, metrics, opt_states, params, **aggregate) -> TrainResult:
    """The slots' result, inactive slots' metrics zeroed: ``metrics`` = (loss, first loss,
    squared loss, steps)."""
    loss, first, sq, steps = metrics
    on = active.astype(jnp.float32)
    return TrainResult(
        params=params,
        loss=loss * on,
        initial_loss=first * on,
        loss_sq=sq * on,
        num_steps=steps * active.astype(jnp.int32),
        opt_states=opt_states,
        **aggregate,
    )


def executed_steps(step_counts: np.ndarray, mode: str, chunk: int | None) -> int:
    """SGD steps a parallelism mode executes for clients needing ``step_counts`` steps each:
    ``vmap`` runs every slot to the largest count, ``map`` each to its own, ``chunked`` each
    chunk of slots (sorted by count, as :func:`make_trainer` does with local epochs) to the
    chunk's largest. ``1 - sum(step_counts) / executed`` is the fraction of padded steps."""
    c = np.sort(np.asarray(step_counts, np.int64))
    if mode == "vmap":
        return int(c.size * c.max(initial=0))
    if mode == "map":
        return int(c.sum())
    size = int(chunk or 1)
    return int(sum(len(part) * part.max() for part in np.split(c, range(size, c.size, size))))
