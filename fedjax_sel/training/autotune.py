"""``--parallel auto``: the client-parallelism mode measured, not guessed.

Which way of training a round's clients is fastest depends on the model, the shapes and the
backend (vmap wins for tiny per-client matmuls, one client after another for models that fill
the CPU, chunks in between; convolutions prefer patches @ kernel inside compiled loops on the
CPU). :func:`choose_parallel` times the candidates on the real round shape (the simulation's
model, data and local work, a realistic selection of clients) once, within a small time budget,
and caches the winner on disk per (model, shapes, local work, backend, device, jax version), so
later runs of the same shape reuse it without measuring. The rule of
:func:`~fedjax_sel.training.local.auto_parallel` remains the fallback (``FEDJAX_SEL_AUTOTUNE=0``,
or when the budget is spent before any measurement).

A run's results do not depend on which mode wins beyond float rounding; and a run records the
mode it used in its ``config.json``, so rerunning that file repeats the same mode exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.data.client_data import ClientData
from fedjax_sel.models import Model
from fedjax_sel.models.base import CONV_IMPLS, with_conv_impl
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import (
    AUTO_PARALLEL,
    LocalConfig,
    Parallel,
    auto_parallel,
    client_optimizer,
    executed_steps,
    make_trainer,
    parse_parallel,
)

CACHE_VERSION = 3  # 2: candidates in a new order, measured on fewer clients when slow; 3: xla_nhwc
DEFAULT_BUDGET_S = 30.0


@dataclasses.dataclass(frozen=True)
class ParallelChoice:
    """The chosen client parallelism and how it was chosen.

    Attributes:
      parallel: the mode spec (``vmap``, ``map``, ``chunked:C``).
      conv_impl: the convolution implementation (``patches``/``xla``/``xla_nhwc``), ``None``
        without convs.
      source: ``measured``, ``cache`` or ``rule``.
      timings: candidate -> median seconds of one call of the round's local training.
      padded_step_fraction: candidate -> share of executed SGD steps that are padding for the
        measured selection (epoch mode; 0 for fixed steps).
      measured_clients: clients in the measured selection: the round's ``per_round``, or fewer
        when one call of the first candidate would spend the budget (a model whose clients
        each fill the machine, where the per-client cost is what the candidates differ in).
    """

    parallel: str
    conv_impl: str | None
    source: str
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    padded_step_fraction: dict[str, float] = dataclasses.field(default_factory=dict)
    measured_clients: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def autotune_enabled() -> bool:
    return os.environ.get("FEDJAX_SEL_AUTOTUNE", "1") not in ("0", "false", "no", "off")


def cache_path() -> Path:
    root = os.environ.get("FEDJAX_SEL_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fedjax_sel"
    )
    return Path(root) / "parallel.json"


# convolutions in the order they are timed after the model's own: XLA's as written last, since
# its kernel gradient is slow inside compiled loops on a CPU (one call can use the budget)
_CONV_ORDER = ("patches", "xla_nhwc", "xla")
assert set(_CONV_ORDER) == set(CONV_IMPLS)


def candidates(model: Model, per_round: int, backend: str) -> list[tuple[str, str | None]]:
    """(mode, conv impl) pairs to time, the plausible winners first: the rule's choice, the
    rule's mode with the other convolution implementations (on the CPU a convolution model's
    winner is one client after another, with whichever convolution is faster), then the other
    modes."""
    rule = auto_parallel(model, backend)
    rule_spec = rule[0] if rule[1] is None else f"{rule[0]}:{rule[1]}"
    modes = [rule_spec] + [m for m in ("vmap", "map") if m != rule_spec]
    modes += [f"chunked:{c}" for c in (4, 16) if c < per_round]
    convs = (
        [model.conv_impl]
        if model.conv_impl is None
        else [model.conv_impl] + [c for c in _CONV_ORDER if c != model.conv_impl]
    )
    return [(m, c) for m in modes for c in convs]  # modes[0] is the rule's


def shape_key(
    model: Model, cfg: LocalConfig, data: ClientData, per_round: int, persistent: bool, params: Any
) -> str:
    """What a measurement depends on, hashed: the model's parameter shapes and convolutions,
    the example shape, the clients' sizes, the local work, the backend and the versions."""
    desc = {
        "version": CACHE_VERSION,
        "model": model.name,
        "params": [list(x.shape) for x in jax.tree.leaves(params)],
        "conv": model.conv_impl is not None,
        "features": list(data.feature_shape),
        "layout": data.layout,
        "n_max": data.n_max,
        "sizes": hashlib.sha256(np.asarray(data.counts).tobytes()).hexdigest()[:12],
        "per_round": per_round,
        "local": [
            cfg.batch_size,
            cfg.local_steps,
            cfg.local_epochs,
            cfg.momentum > 0,
            cfg.prox,
            cfg.weight_decay > 0,
        ],
        "persistent": persistent,
    }
    return hashed_key(desc)


def hashed_key(desc: dict[str, Any]) -> str:
    """A measurement cache's key: ``desc`` with the machine (backend, device kind and count,
    jax version), hashed."""
    dev = jax.devices()[0]
    machine = {
        "backend": jax.default_backend(),
        "device": dev.device_kind,
        "devices": jax.device_count(),
        "jax": jax.__version__,
    }
    return hashlib.sha256(json.dumps({**desc, **machine}, sort_keys=True).encode()).hexdigest()[:24]


def read_cache(path: Path | None = None) -> dict:
    """A measurement cache file's entries (``{}`` when missing or unreadable)."""
    try:
        return json.loads((path or cache_path()).read_text())
    except (OSError, ValueError):
        return {}


def write_cache(key: str, entry: dict, path: Path | None = None) -> None:
    """Adds ``entry`` under ``key`` to a measurement cache file, atomically."""
    path = path or cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache = read_cache(path)
        cache[key] = entry
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    except OSError:  # a read-only home: the choice is simply not remembered
        pass


def _step_counts(cfg: LocalConfig, counts: np.ndarray) -> np.ndarray:
    if cfg.local_steps is not None:
        return np.full(counts.shape, cfg.local_steps)
    return cfg.local_epochs * -(-counts // cfg.batch_size)


def can_win(first_call: float, timings: dict[str, float]) -> bool:
    """Whether a candidate whose first call took ``first_call`` seconds deserves two more
    calls (for its median): not when it is already twice the best so far, which it cannot beat
    (XLA's convolution inside ``lax.map`` can be ten times slower than the patches)."""
    return first_call <= 2 * min(timings.values(), default=np.inf)


def choose_parallel(
    model: Model,
    cfg: LocalConfig,
    data: ClientData,
    per_round: int,
    *,
    persistent_state: bool = False,
    budget_s: float | None = None,
    use_cache: bool = True,
) -> ParallelChoice:
    """The fastest (mode, conv impl) for this round shape: from the cache, by measuring the
    candidates (each compiled ahead of time, then its median of 3 calls, or its one call when
    that is already twice the best; the plausible winners first, and on fewer clients when one
    call is long) until ``budget_s`` seconds are spent, or by the rule when measuring is off."""
    backend = jax.default_backend()
    rule_mode, rule_chunk, _ = auto_parallel(model, backend)
    rule = rule_mode if rule_chunk is None else f"{rule_mode}:{rule_chunk}"
    if not autotune_enabled():
        return ParallelChoice(rule, model.conv_impl, "rule")
    params = model.init(jax.random.key(0))
    key = shape_key(model, cfg, data, per_round, persistent_state, params)
    if use_cache:
        hit = read_cache().get(key)
        if hit is not None:
            return ParallelChoice(**{**hit, "source": "cache"})
    budget = DEFAULT_BUDGET_S if budget_s is None else float(budget_s)
    counts = np.asarray(data.counts)
    rng = np.random.default_rng(0)
    chosen = np.sort(rng.choice(counts.size, per_round, replace=False))
    hparams = HParams.of(0.01, prox_mu=0.01 if cfg.prox else 0.0)  # traced: values time alike
    states = None
    if persistent_state:
        one = client_optimizer(cfg, hparams.lr).init(params)
        states = jax.tree.map(lambda x: jnp.broadcast_to(x, (per_round,) + x.shape), one)

    def arguments(n: int):
        sub_states = None if states is None else jax.tree.map(lambda x: x[:n], states)
        clients = jnp.asarray(chosen[:n], jnp.int32)
        key = jax.random.key(1)
        return (params, data, clients, jnp.ones((n,), bool), key, sub_states, hparams)

    def seconds(train, args) -> float:
        t = time.perf_counter()
        jax.block_until_ready(train(*args))
        return time.perf_counter() - t

    def ahead(mode: str, conv: str | None, args):
        # compiled ahead of time: no call is spent on compiling
        variant = model if conv is None else with_conv_impl(model, conv)
        trainer = make_trainer(
            variant,
            cfg,
            data.n_max,
            parallel=parse_parallel(mode),
            persistent_state=persistent_state,
        )

        def train(params, data, clients, active, key, states, hparams):
            return trainer.train(
                params, data, clients, active, key, opt_states=states, hparams=hparams
            )

        return jax.jit(train).lower(*args).compile()

    todo = candidates(model, per_round, backend)
    n = per_round
    args = arguments(n)
    # one call of the first candidate sizes the measurement: where it alone would spend a
    # candidate's share of the budget, the candidates are timed on fewer clients (at least 16
    # of a larger round, at least 2 of a smaller one)
    first = ahead(*todo[0], args)
    share = budget / len(todo)
    one_call = seconds(first, args)
    floor = 16 if per_round > 16 else min(2, per_round)
    if 3 * one_call > share and per_round > floor:
        n = max(floor, int(per_round * share / (3 * one_call)))
        args = arguments(n)
        first = ahead(*todo[0], args)
    steps = _step_counts(cfg, counts[chosen[:n]])
    timings, padded = {}, {}
    start = time.perf_counter()
    for mode, conv in todo:
        # the budget never skips the first two (the rule's mode with each convolution)
        if len(timings) >= 2 and time.perf_counter() - start > budget:
            break
        name = mode if conv is None else f"{mode}/{conv}"
        train = first if (mode, conv) == todo[0] else ahead(mode, conv, args)
        runs = [seconds(train, args)]
        if can_win(runs[0], timings):
            runs += [seconds(train, args) for _ in range(2)]
        timings[name] = float(np.median(runs))
        kind, _, size = mode.partition(":")
        executed = executed_steps(steps, kind, int(size) if size else None)
        padded[name] = float(1.0 - steps.sum() / max(executed, 1))
    best = min(timings, key=timings.get)
    mode, _, conv = best.partition("/")
    choice = ParallelChoice(mode, conv or model.conv_impl, "measured", timings, padded, n)
    if use_cache:
        write_cache(key, choice.to_dict())
    return choice


def resolve_parallel(
    parallel: Parallel,
    model: Model,
    cfg: LocalConfig,
    data: ClientData,
    per_round: int,
    persistent_state: bool = False,
) -> tuple[Parallel, ParallelChoice | None]:
    """``parallel`` with ``auto`` measured by :func:`choose_parallel`: the concrete setting to
    build the simulation with (with the convolution of a convolution model) and the choice
    (``None`` when ``parallel`` was given: ``auto:conv=...`` follows the backend's rule). The
    experiment layer resolves ``auto`` here, before the engine is built; the engine itself
    never measures."""
    if parallel != AUTO_PARALLEL:
        return parallel, None
    choice = choose_parallel(model, cfg, data, per_round, persistent_state=persistent_state)
    return parse_parallel(choice.parallel)._replace(conv=choice.conv_impl), choice
