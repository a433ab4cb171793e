"""Device profiles and time: how long each client takes, on a virtual clock (beside
availability; on device, fixed shapes, one key per round).

A :class:`SystemModel` gives every client a compute speed (milliseconds per example of forward
and backward work) and a bandwidth (kbit/s), drawn once from a distribution or read from a
FedScale device-capacity file, optionally with per-round multiplicative noise. A client's round
takes, as in FedScale's ``get_completion_time``,

    duration = 3 * samples * ms_per_example / 1000  +  2 * model_kbit / bandwidth

(``3`` = forward plus backward; the model is downloaded and uploaded once), where ``samples``
is its local work: ``local_steps * min(batch, n_k)`` or ``local_epochs * n_k``. The engine turns
durations into rounds (:func:`round_timing`): a synchronous round lasts as long as its slowest
kept client, or until the deadline; over-commitment keeps the first P finishers; dropouts send
nothing; a straggler past the deadline contributes the local steps it finished (FedProx's
inexact clients).

Specs (``--system NAME:key=value,...``): ``lognormal:compute_ms=150,sigma=0.8,
bandwidth_kbps=2200,bandwidth_sigma=0.8``, ``pareto:compute_ms=..,shape=..``, ``normal:...``,
``fedscale:path=FILE``; every one takes ``noise`` (per-round log-normal jitter).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import Array, ConfigError, PRNGKey
from fedjax_sel.registry import Registry
from fedjax_sel.safe_pickle import RefusedPickle, load_plain_pickle

AUGMENTATION = 3.0  # FedScale: forward + backward ~ 3 forward passes


class SystemState(NamedTuple):
    """Per-client base speeds: ``ms_per_example`` and ``bandwidth_kbps``, float32[K]."""

    ms_per_example: Array
    bandwidth_kbps: Array


class SystemModel(NamedTuple):
    """``init(key, num_clients) -> SystemState``; ``step(state, key) -> (ms_per_example[K],
    bandwidth_kbps[K])`` this round (with the per-round noise)."""

    init: Callable[[PRNGKey, int], SystemState]
    step: Callable[[SystemState, PRNGKey], tuple[Array, Array]]
    name: str
    info: dict


SYSTEMS = Registry("system model")


def _noisy(noise: float):
    def step(state: SystemState, key: PRNGKey) -> tuple[Array, Array]:
        if noise <= 0:
            return state.ms_per_example, state.bandwidth_kbps
        k1, k2 = jax.random.split(key)
        k = state.ms_per_example.shape[0]
        z1, z2 = jax.random.normal(k1, (k,)), jax.random.normal(k2, (k,))
        return state.ms_per_example * jnp.exp(noise * z1), state.bandwidth_kbps * jnp.exp(
            noise * z2
        )

    return step


def _check_positive(name: str, **values: float) -> None:
    for key, v in values.items():
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"system model {name!r}: {key} must be a positive number, got {v!r}")


def _check_noise(name: str, noise: float) -> None:
    if not (noise >= 0 and math.isfinite(noise)):
        raise ConfigError(f"system model {name!r}: noise must be >= 0, got {noise!r}")


def _drawn(
    name: str, draw: Callable[[PRNGKey, PRNGKey, int], SystemState], info: dict[str, float]
) -> SystemModel:
    """A model whose devices draw their speeds once: ``draw(compute key, bandwidth key, K)``;
    ``info``: its settings (``noise``, the per-round noise, among them)."""

    def init(key: PRNGKey, num_clients: int) -> SystemState:
        k1, k2 = jax.random.split(key)
        return draw(k1, k2, num_clients)

    return SystemModel(init, _noisy(info["noise"]), name, info)


@SYSTEMS.register("lognormal", description="log-normal compute and bandwidth around the medians")
def lognormal(
    compute_ms: float = 150.0,
    sigma: float = 0.8,
    bandwidth_kbps: float = 2200.0,
    bandwidth_sigma: float = 0.8,
    noise: float = 0.0,
) -> SystemModel:
    """Heavy-tailed devices (FedScale's traces; its example profile is about 153 ms per
    example and 2,209 kbit/s): ``ms = compute_ms * exp(sigma z)``, ``kbps = bandwidth_kbps *
    exp(bandwidth_sigma z')``."""
    settings = dict(locals())  # the arguments, in order: the model's info
    _check_positive("lognormal", compute_ms=compute_ms, bandwidth_kbps=bandwidth_kbps)
    _check_noise("lognormal", noise)
    if sigma < 0 or bandwidth_sigma < 0:
        raise ConfigError("system model 'lognormal': sigma and bandwidth_sigma must be >= 0")

    def draw(k1: PRNGKey, k2: PRNGKey, num_clients: int) -> SystemState:
        z1 = jax.random.normal(k1, (num_clients,), jnp.float32)
        z2 = jax.random.normal(k2, (num_clients,), jnp.float32)
        return SystemState(
            compute_ms * jnp.exp(sigma * z1), bandwidth_kbps * jnp.exp(bandwidth_sigma * z2)
        )

    return _drawn("lognormal", draw, settings)


@SYSTEMS.register("pareto", description="Pareto (Zipf-like) slow tail: ms = compute_ms * Pareto")
def pareto(
    compute_ms: float = 100.0,
    shape: float = 2.0,
    bandwidth_kbps: float = 2200.0,
    bandwidth_shape: float = 2.0,
    noise: float = 0.0,
) -> SystemModel:
    """``ms = compute_ms * X`` and ``kbps = bandwidth_kbps / Y`` with X, Y ~ Pareto(shape) on
    [1, inf): most devices near the fast end, a power-law tail of slow ones."""
    settings = dict(locals())  # the arguments, in order: the model's info
    _check_positive(
        "pareto",
        compute_ms=compute_ms,
        shape=shape,
        bandwidth_kbps=bandwidth_kbps,
        bandwidth_shape=bandwidth_shape,
    )
    _check_noise("pareto", noise)

    def draw(k1: PRNGKey, k2: PRNGKey, num_clients: int) -> SystemState:
        x = jax.random.pareto(k1, shape, (num_clients,), jnp.float32) + 1.0
        y = jax.random.pareto(k2, bandwidth_shape, (num_clients,), jnp.float32) + 1.0
        return SystemState(compute_ms * x, bandwidth_kbps / y)

    return _drawn("pareto", draw, settings)


@SYSTEMS.register("normal", description="normal compute and bandwidth, clipped at 5% of the mean")
def normal(
    compute_ms: float = 150.0,
    std: float = 30.0,
    bandwidth_kbps: float = 2200.0,
    bandwidth_std: float = 400.0,
    noise: float = 0.0,
) -> SystemModel:
    settings = dict(locals())  # the arguments, in order: the model's info
    _check_positive("normal", compute_ms=compute_ms, bandwidth_kbps=bandwidth_kbps)
    _check_noise("normal", noise)

    def draw(k1: PRNGKey, k2: PRNGKey, num_clients: int) -> SystemState:
        ms = compute_ms + std * jax.random.normal(k1, (num_clients,), jnp.float32)
        bw = bandwidth_kbps + bandwidth_std * jax.random.normal(k2, (num_clients,), jnp.float32)
        return SystemState(
            jnp.maximum(ms, 0.05 * compute_ms), jnp.maximum(bw, 0.05 * bandwidth_kbps)
        )

    return _drawn("normal", draw, settings)


def load_device_capacity(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """FedScale's ``client_device_capacity``: a pickle (or JSON) mapping client ids to
    ``{"computation": ms per sample, "communication": kbit/s}``; rows in sorted id order."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"device capacity file {str(path)!r} does not exist")
    try:
        if path.suffix.lower() == ".json":
            import json

            data = json.loads(path.read_text())
        else:
            data = load_plain_pickle(path, "device capacity file")
    except RefusedPickle:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"device capacity file {str(path)!r} cannot be read: {e}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"device capacity file {str(path)!r} must map client ids to profiles")
    try:
        keys = sorted(data, key=lambda k: (str(type(k)), k))
        ms = np.array([float(data[k]["computation"]) for k in keys])
        kbps = np.array([float(data[k]["communication"]) for k in keys])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"device capacity file {str(path)!r}: every entry needs 'computation' and "
            f"'communication' numbers ({e})"
        ) from None
    if (
        np.any(~np.isfinite(ms))
        or np.any(ms <= 0)
        or np.any(~np.isfinite(kbps))
        or np.any(kbps <= 0)
    ):
        raise ConfigError(f"device capacity file {str(path)!r} holds non-positive speeds")
    return ms, kbps


@SYSTEMS.register("fedscale", description="FedScale device-capacity file (ms/sample, kbit/s)")
def fedscale(path: str = "", noise: float = 0.0) -> SystemModel:
    """Profiles read from a FedScale ``client_device_capacity`` file; client k gets entry
    ``k mod n`` (FedScale's assignment when there are more clients than profiles)."""
    if not path:
        raise ConfigError("system model 'fedscale' needs path=FILE")
    _check_noise("fedscale", noise)
    ms, kbps = load_device_capacity(path)

    def init(key: PRNGKey, num_clients: int) -> SystemState:
        del key
        idx = np.arange(num_clients) % len(ms)
        return SystemState(jnp.asarray(ms[idx], jnp.float32), jnp.asarray(kbps[idx], jnp.float32))

    return SystemModel(init, _noisy(noise), "fedscale", {"path": str(path), "profiles": len(ms)})


def from_spec(spec: str) -> SystemModel:
    return SYSTEMS.from_spec(spec)


# ----------------------------------------------------------------------------- the round
def overcommitted(per_round: int, overcommit: float, num_clients: int) -> int:
    """Slots selected for ``per_round`` kept clients: ``int(per_round * overcommit)`` (FedScale
    and Oort round down), at least ``per_round``, at most the number of clients."""
    return max(per_round, min(int(per_round * overcommit + 1e-6), num_clients))


def model_kbit(params: Any) -> float:
    """Size of a float32 model in kbit (one transfer direction)."""
    n = sum(int(math.prod(x.shape)) for x in jax.tree.leaves(params))
    return 32.0 * n / 1000.0


def client_work(
    counts: Array, batch_size: int, local_steps: int | None, local_epochs: int | None
) -> tuple[Array, Array]:
    """Per client: examples processed in a round and SGD steps taken (the engine's local work:
    fixed steps of ``min(batch, n_k)`` examples, or epochs over all ``n_k`` examples)."""
    n = counts.astype(jnp.float32)
    if local_steps is not None:
        return local_steps * jnp.minimum(n, batch_size), jnp.full(counts.shape, local_steps)
    steps = local_epochs * jnp.ceil(n / batch_size)
    return local_epochs * n, steps.astype(jnp.int32)


def durations(
    ms_per_example: Array, bandwidth_kbps: Array, samples: Array, kbit: float
) -> tuple[Array, Array]:
    """``(compute seconds, communication seconds)`` of a client's round (FedScale's formula)."""
    compute = AUGMENTATION * samples * ms_per_example / 1000.0
    return compute, 2.0 * kbit / bandwidth_kbps


class RoundTiming(NamedTuple):
    """The engine's decisions for one synchronous round (over the ``P'`` selected slots).

    Attributes:
      keep: bool[P'], slots whose update arrives (not dropped, among the first P finishers,
        with at least one step done by the deadline).
      step_limit: int32[P'], SGD steps each kept slot completes (its full work, or what fits
        before the deadline).
      duration: the round's length in seconds.
      dropped: number of selected slots that failed (dropout).
      stragglers: number of kept slots cut by the deadline.
    """

    keep: Array
    step_limit: Array
    duration: Array
    dropped: Array
    stragglers: Array


def round_timing(
    mask: Array,
    compute_s: Array,
    comm_s: Array,
    steps: Array,
    key: PRNGKey,
    *,
    keep_count: int,
    deadline: float | None,
    dropout: float,
) -> RoundTiming:
    """Applies dropouts, over-commitment (the ``keep_count`` earliest finishers) and the
    deadline to the selected slots (``mask``; per slot ``compute_s``, ``comm_s`` and the full
    ``steps``)."""
    full = compute_s + comm_s
    alive = mask & (jax.random.uniform(key, mask.shape) >= dropout)
    dropped = jnp.sum(mask & ~alive)
    # the first keep_count finishers among the live slots (ties: lower slot first)
    order = jnp.argsort(jnp.where(alive, full, jnp.inf), stable=True)
    rank = jnp.zeros(mask.shape, jnp.int32).at[order].set(jnp.arange(mask.shape[0]))
    keep = alive & (rank < keep_count)
    limit = steps
    stragglers = jnp.zeros((), jnp.int32)
    length = jnp.max(jnp.where(keep, full, 0.0))
    if deadline is not None:
        per_step = compute_s / jnp.maximum(steps, 1)
        fits = jnp.floor((deadline - comm_s) / jnp.maximum(per_step, 1e-30)).astype(jnp.int32)
        late = keep & (full > deadline)
        limit = jnp.where(late, jnp.clip(fits, 0, steps), steps)
        keep = keep & (limit > 0)
        stragglers = jnp.sum(late & keep)
        length = jnp.where(jnp.any(late), deadline, jnp.max(jnp.where(keep, full, 0.0)))
    return RoundTiming(keep, limit.astype(jnp.int32), length, dropped, stragglers)
