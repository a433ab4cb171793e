"""FedScale's client behaviour trace converted to our ``T x K`` availability trace
(``fedjax-sel trace convert``).

FedScale's ``client_behave_trace`` is a pickle (we also read the same structure as JSON)
mapping a client key to ``{"active": [s_0, s_1, ...], "inactive": [e_0, e_1, ...],
"finish_time": F, "duration": D, ...}``: the client is online during ``[s_i, e_i]`` (seconds),
and the pattern repeats every ``finish_time`` seconds (``duration`` when ``finish_time`` is
missing). FedScale's client manager gives its client ``c`` (ids from 1) the entry
``keys[c mod n]`` in file order; our client ``k`` is FedScale's client ``k + 1``.

Round ``t`` of the converted trace is online when the client is online at time
``start + t * round_seconds``:

* ``rule="interval"`` (default): ``norm = time mod finish_time`` lies in some ``[s_i, e_i]``;
* ``rule="fedscale"``: FedScale's own ``ClientMetadata.is_active``, which walks the intervals
  with a cursor that advances at most one interval per query (``if norm > e_idx: idx += 1``),
  so a round longer than an interval lags behind the interval rule. Use it to replay what a
  FedScale run saw.

The result is a bool array for :func:`fedjax_sel.availability.trace.trace_replay`
(``--availability trace:path=OUT.npy``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.input_checks import check_claimed_bytes
from fedjax_sel.safe_pickle import RefusedPickle, load_plain_pickle


def load_behaviour_trace(path: str | os.PathLike) -> list[dict]:
    """The entries of a FedScale behaviour trace in file order, each with float arrays
    ``active`` and ``inactive`` and a positive ``period`` (``finish_time`` or ``duration``)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"behaviour trace {str(p)!r} does not exist")
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
        else:
            data = load_plain_pickle(p, "behaviour trace")
    except RefusedPickle:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"behaviour trace {str(p)!r} cannot be read: {e}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f"behaviour trace {str(p)!r} must map client keys to {{'active', 'inactive', "
            f"'finish_time'}} entries"
        )
    entries = []
    for key, entry in data.items():
        try:
            active = np.asarray(entry["active"], np.float64).reshape(-1)
            inactive = np.asarray(entry["inactive"], np.float64).reshape(-1)
            period = float(entry.get("finish_time", entry.get("duration")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"behaviour trace {p.name}: entry {key!r} needs 'active' and 'inactive' lists "
                f"and a 'finish_time' (or 'duration') number ({e})"
            ) from None
        if len(active) == 0 or len(active) != len(inactive):
            raise ConfigError(
                f"behaviour trace {p.name}: entry {key!r} has {len(active)} active and "
                f"{len(inactive)} inactive times (need equal, non-zero counts)"
            )
        if not np.isfinite(period) or period <= 0:
            raise ConfigError(f"behaviour trace {p.name}: entry {key!r} has period {period!r}")
        times = np.concatenate([active, inactive])
        if not np.all(np.isfinite(times) & (times >= 0)):
            bad = times[~(np.isfinite(times) & (times >= 0))][0]
            raise ConfigError(
                f"behaviour trace {p.name}: entry {key!r} holds the time {bad}; times are "
                "finite seconds >= 0"
            )
        if np.any(inactive < active) or np.any(np.diff(active) < 0):
            raise ConfigError(
                f"behaviour trace {p.name}: entry {key!r} needs sorted intervals with "
                f"active <= inactive"
            )
        entries.append({"active": active, "inactive": inactive, "period": period})
    return entries


def interval_rule(entry: dict, times: np.ndarray) -> np.ndarray:
    """Online at each time: ``time mod period`` inside some ``[active_i, inactive_i]``."""
    norm = np.mod(times, entry["period"])
    i = np.searchsorted(entry["active"], norm, side="right") - 1
    safe = np.maximum(i, 0)
    return (i >= 0) & (norm <= entry["inactive"][safe])


def fedscale_rule(entry: dict, times: np.ndarray) -> np.ndarray:
    """FedScale's stateful ``is_active`` queried at ``times`` in order (see the module
    docstring)."""
    active, inactive, period = entry["active"], entry["inactive"], entry["period"]
    idx, out = 0, np.zeros(len(times), bool)
    for j, time in enumerate(times):
        norm = time % period
        if norm > inactive[idx]:
            idx += 1
        idx %= len(active)
        out[j] = active[idx] <= norm <= inactive[idx]
    return out


def convert_behaviour_trace(
    path: str | os.PathLike,
    *,
    round_seconds: float,
    rounds: int,
    clients: int | None = None,
    start: float = 0.0,
    rule: str = "interval",
) -> np.ndarray:
    """The ``rounds x clients`` bool availability of a FedScale behaviour trace (see the
    module docstring); ``clients`` defaults to the number of trace entries."""
    if not (np.isfinite(round_seconds) and round_seconds > 0):
        raise ConfigError(f"round_seconds must be a positive number, got {round_seconds!r}")
    if int(rounds) != rounds or rounds < 1:
        raise ConfigError(f"rounds must be a positive integer, got {rounds!r}")
    if rule not in ("interval", "fedscale"):
        raise ConfigError(f"rule must be 'interval' or 'fedscale', got {rule!r}")
    if not (np.isfinite(start) and start >= 0):
        raise ConfigError(f"start must be a time in seconds >= 0, got {start!r}")
    if clients is not None and (int(clients) != clients or clients < 1):
        raise ConfigError(f"clients must be a positive integer, got {clients!r}")
    if clients is not None:  # before the trace is read: the output's size alone may not fit
        _check_size(int(rounds), int(clients))
    entries = load_behaviour_trace(path)
    k = len(entries) if clients is None else int(clients)
    _check_size(int(rounds), k)
    times = float(start) + float(round_seconds) * np.arange(int(rounds))
    if not np.isfinite(times[-1]):
        raise ConfigError(
            f"the last round starts at {times[-1]} s (start {start} + {rounds} rounds x "
            f"{round_seconds} s): not a finite time"
        )
    check = interval_rule if rule == "interval" else fedscale_rule
    out = np.zeros((int(rounds), k), bool)
    for client in range(k):
        out[:, client] = check(entries[(client + 1) % len(entries)], times)
    return out


def _check_size(rounds: int, clients: int) -> None:
    """Refuses an output that cannot fit the free memory: the trace and its copy as written,
    the round times and a client's float64 and int64 temporaries in the interval rule (a
    ``--rounds`` typo of 10**9 is not an out-of-memory kill)."""
    check_claimed_bytes(
        rounds * (2 * clients + 48),
        f"a trace of {rounds} rounds x {clients} clients (--rounds x --clients)",
    )


def save_trace(trace: np.ndarray, path: str | os.PathLike) -> Path:
    """Writes a ``T x K`` trace as ``.npy``, ``.npz`` (array ``availability``) or text
    (``.csv``/``.txt``), the formats ``trace:path=`` reads."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".npy":
        np.save(p, trace.astype(np.uint8))
    elif p.suffix == ".npz":
        np.savez_compressed(p, availability=trace.astype(np.uint8))
    elif p.suffix in (".csv", ".txt"):
        np.savetxt(p, trace.astype(int), fmt="%d", delimiter=",")
    else:
        raise ConfigError(f"trace output {p.name!r}: use a .npy, .npz, .csv or .txt name")
    return p
