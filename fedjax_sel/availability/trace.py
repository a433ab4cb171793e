"""Replay of a recorded availability trace: a ``T x K`` array of 0/1 (round x client).

Users bring real device traces as ``.npy``, ``.npz`` (the array named ``availability`` or
``trace``, else the only array), or text (``.csv``/``.txt``, comma or whitespace separated, one
round per line). Round ``t`` of the simulation reads row ``(start + t) mod T``: a trace shorter
than the run repeats cyclically (like a daily pattern).

The true parameters exposed to oracle estimators are the trace's empirical ones: ``pi_k`` the
fraction of rounds client ``k`` is online, ``lambda_k = p11 + p00 - 1`` from its empirical
transition frequencies (``0`` for a client that never changes state, where it is undefined).

CLI: ``--availability trace:path=/data/trace.npy`` (optionally ``start=S``); the path may not
contain a comma.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel.base import Array, AvailabilityModel, AvailabilityParams, ConfigError, PRNGKey
from fedjax_sel.input_checks import check_claimed_bytes, load_npy, load_npz, npz_members


class TraceState(NamedTuple):
    """``trace`` bool[T, K], ``cursor`` int32 (next row), and the trace's empirical
    ``pi`` and ``lam`` float32[K]."""

    trace: Array
    cursor: Array
    pi: Array
    lam: Array


def load_trace(path: str | os.PathLike) -> np.ndarray:
    """Reads a ``T x K`` 0/1 availability trace (see the module docstring) as bool."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"availability trace {str(p)!r} does not exist")
    try:
        if p.suffix == ".npy":  # headers checked against the free memory before reading
            arr = load_npy(p, "availability trace")
        elif p.suffix == ".npz":
            files = npz_members(p, "availability trace")
            names = [n for n in ("availability", "trace") if n in files]
            if not names and len(files) != 1:
                raise ConfigError(
                    f"availability trace {p.name}: name the array 'availability' or 'trace' "
                    f"(found {files})"
                )
            name = names[0] if names else files[0]
            arr = load_npz(p, "availability trace", [name])[name]
        else:
            check_claimed_bytes(8 * p.stat().st_size, f"availability trace {str(p)!r}")
            text = p.read_text()
            arr = np.loadtxt(text.replace(",", " ").splitlines(), ndmin=2)
    except ConfigError:
        raise
    except (ValueError, OSError) as e:
        raise ConfigError(f"cannot read availability trace {str(p)!r}: {e}") from None
    arr = np.asarray(arr)
    if arr.dtype.kind not in "biuf":
        raise ConfigError(
            f"availability trace {p.name} must hold numbers 0 and 1, got dtype {arr.dtype}"
        )
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ConfigError(
            f"availability trace {p.name} must be a T x K array (rounds x clients), got shape "
            f"{arr.shape}"
        )
    if not np.all((arr == 0) | (arr == 1)):
        bad = arr[(arr != 0) & (arr != 1)].ravel()[:5]
        raise ConfigError(f"availability trace {p.name} must hold only 0 and 1, found {bad}")
    return arr.astype(bool)


def empirical_params(trace: np.ndarray) -> AvailabilityParams:
    """Empirical ``pi`` (fraction of rounds online) and ``lambda = p11 + p00 - 1`` (from the
    transition frequencies) of every client of a ``T x K`` trace."""
    a = np.asarray(trace, bool)
    pi = a.mean(0)
    prev, nxt = a[:-1], a[1:]
    from_on, from_off = prev.sum(0), (~prev).sum(0)
    p11 = np.divide((prev & nxt).sum(0), from_on, out=np.zeros(a.shape[1]), where=from_on > 0)
    p00 = np.divide((~prev & ~nxt).sum(0), from_off, out=np.zeros(a.shape[1]), where=from_off > 0)
    lam = np.where((from_on > 0) & (from_off > 0), p11 + p00 - 1, 0.0)
    return AvailabilityParams(jnp.asarray(pi, jnp.float32), jnp.asarray(lam, jnp.float32))


def trace_replay(
    path: str | os.PathLike | None = None, start: int = 0, *, trace: np.ndarray | None = None
):
    """Availability replayed from a recorded trace (a file ``path`` or an array ``trace``).

    Args:
      path: the trace file (see :func:`load_trace`).
      start: the trace row of round 0.
      trace: a ``T x K`` 0/1 array instead of a file (Python API).
    """
    if (path is None) == (trace is None):
        raise ConfigError("trace availability needs exactly one of path=FILE or a trace array")
    if path is not None:
        arr = load_trace(path)
    else:
        arr = np.asarray(trace)
        if arr.ndim != 2 or not np.all((arr == 0) | (arr == 1)):
            raise ConfigError(f"a trace must be a T x K array of 0/1, got shape {arr.shape}")
        arr = arr.astype(bool)
    if int(start) != start or start < 0:
        raise ConfigError(f"trace start must be a non-negative integer, got {start!r}")
    rounds, width = arr.shape
    truth = empirical_params(arr)

    def init(key: PRNGKey, num_clients: int) -> TraceState:
        del key
        if num_clients != width:
            raise ConfigError(
                f"availability trace has {width} clients (columns) but the simulation has "
                f"{num_clients}"
            )
        return TraceState(jnp.asarray(arr), jnp.int32(int(start) % rounds), *truth)

    def step(state: TraceState, key: PRNGKey) -> tuple[Array, TraceState]:
        del key
        available = state.trace[state.cursor]
        return available, state._replace(cursor=(state.cursor + 1) % rounds)

    def true_params(state: TraceState) -> AvailabilityParams:
        return AvailabilityParams(state.pi, state.lam)

    info = {"path": None if path is None else str(path), "rounds": rounds, "clients": width}
    return AvailabilityModel(init, step, "trace", info, true_params)


availability_lib.register_availability(
    "trace",
    trace_replay,
    {
        "path": "T x K 0/1 trace file (.npy, .npz, .csv, .txt); rows repeat cyclically",
        "start": "trace row of round 0 (default 0)",
    },
)
