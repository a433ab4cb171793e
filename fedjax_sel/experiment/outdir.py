"""Output folders that are owned: one writer at a time, no silent overwrite, one folder a name.

* :func:`owned` takes an exclusive lock on a run's, sweep's or suite's ``--out`` for as long as
  it writes there (:class:`Lock`: ``flock`` on the file :data:`LOCK`, which names its holder:
  process id, host, start time, command). A second writer gets a
  :class:`~fedjax_sel.base.ConfigError` naming the holder (the CLI's exit 2). The kernel drops
  the lock of a process that ends, however it ends, so a killed run leaves no lock behind: the
  next writer takes the folder over and says whose stale lock it found.
* :func:`conflicting` lists the folders among those a run, sweep or suite is about to write
  that hold results of *another* configuration (finished, or a partial run's records); the
  callers refuse them unless the user says ``overwrite`` (``--overwrite``), so finished
  results are never replaced or mixed silently.
* :func:`folder_name` turns a label into a folder name, and :func:`check_distinct_folders`
  makes that map injective where it matters: two labels that differ only in characters the
  folder name drops (``a_b`` and ``a/b``), or only in letter case (one folder on macOS and
  Windows), are an error when the sweep or suite is read, before anything runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.distributed import is_primary
from fedjax_sel.experiment.outputs import (
    CHECKPOINT,
    CONFIG,
    CURVES,
    METRICS,
    SUMMARY,
    read_json,
)

LOCK = ".fedjax-sel.lock"


def folder_name(text: str) -> str:
    """A label as a folder name: letters, digits and ``-=._`` kept, anything else ``_``; a
    name of dots alone (``.``, ``..``: this folder or its parent) becomes underscores."""
    name = "".join(c if c.isalnum() or c in "-=._" else "_" for c in text) or "default"
    return "_" * len(name) if set(name) == {"."} else name


def check_distinct_folders(names: Iterable[str], what: str) -> None:
    """Raises :class:`ConfigError` when two distinct ``names`` would share one folder (the
    same :func:`folder_name`, letter case ignored)."""
    seen: dict[str, str] = {}
    for name in dict.fromkeys(str(n) for n in names):
        key = folder_name(name).casefold()
        if key in seen:
            raise ConfigError(
                f"{what} {seen[key]!r} and {name!r} would share the folder "
                f"{folder_name(name)!r} (folder names keep letters, digits and -=._ and ignore "
                "case); rename one of them"
            )
        seen[key] = name


# ----------------------------------------------------------------------------- the lock
def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux's
    ``/proc/PID/stat`` field 22), recorded to tell a holder from a later process that reuses
    its id; ``None`` where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def holder_record() -> dict[str, Any]:
    """What a lock file says of its holder: this process."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start_time": _start_time(os.getpid()),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
    }


def describe_holder(holder: dict[str, Any]) -> str:
    return (
        f"process {holder.get('pid')} on {holder.get('host')!r} since {holder.get('since')} "
        f"({holder.get('command') or 'no command recorded'})"
    )


def _read_holder(fd: int) -> dict[str, Any]:
    """The holder a lock file names (``{}``: empty, released, or cut short)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        holder = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class Lock:
    """An exclusive lock on an output folder (see the module docstring): ``fcntl.flock`` on
    :data:`LOCK`, which the kernel drops when the holder's process ends, however it ends; the
    file names the holder while it is held. The file itself stays (removing it would let a
    second writer lock a new file while a third still holds the old one).

    ``shared``: a shared lock instead, which several holders take together (the shards of a
    suite, each writing only its own part, :mod:`.records`) and which keeps out every
    exclusive holder (a whole suite, a merge) while any is held. Shared holders are not named
    in the file; each names itself in the exclusive lock of its part."""

    def __init__(self, out: str | Path, echo: Callable | None = print, *, shared: bool = False):
        out = Path(out)
        self.shared = shared
        self.created = not out.exists()  # a folder made for a run that fails at once goes
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {str(out)!r} is a file, not a folder; name a folder")
        try:
            out.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(
                f"cannot create or lock the output folder {str(out)!r}: {e}"
            ) from None
        self.path = out / LOCK
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(self.fd)
            os.close(self.fd)
            who = describe_holder(holder) if holder else _shard_holders(out)
            raise ConfigError(
                f"{str(out)!r} is being written by {who}: wait for it to finish, or choose "
                "another --out"
            ) from None
        if shared:  # a record left here is a killed exclusive holder's: no exclusive holder now
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            return
        previous = _read_holder(self.fd)
        if previous and echo is not None:  # held, never released: its process was killed
            echo(f"{out}: taking over the lock of {describe_holder(previous)}, which has ended")
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, json.dumps(holder_record()).encode())
        os.fsync(self.fd)

    def release(self) -> None:
        """Empties the file (released) and drops the lock; a folder this lock created that
        holds nothing else (a run refused before it wrote anything) is removed."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if not self.shared:
                os.ftruncate(self.fd, 0)
            if self.created and [p.name for p in self.path.parent.iterdir()] == [LOCK]:
                self.path.unlink()
                self.path.parent.rmdir()
        os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd = -1


def _shard_holders(out: Path) -> str:
    """Who holds ``out`` in shared mode: the shards named by their parts' locks."""
    names = []
    for path in sorted(out.glob(f"parts/*/{LOCK}")):
        try:
            holder = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if holder:
            names.append(f"{path.parent.name} ({describe_holder(holder)})")
    return "shards " + "; ".join(names) if names else "another process"


@contextlib.contextmanager
def owned(
    out: str | Path | None, echo: Callable | None = print, *, shared: bool = False
) -> Iterator[Lock | None]:
    """Holds ``out``'s lock for the ``with`` block (nothing when ``out`` is ``None``, or in a
    process other than the first of a multi-process run, which writes nothing); ``shared``:
    :class:`Lock`'s shared mode."""
    if out is None or not is_primary():
        yield None
        return
    lock = Lock(out, echo, shared=shared)
    try:
        yield lock
    finally:
        lock.release()


# ----------------------------------------------------------------------------- conflicts
def stored_config(info: Mapping[str, Any]) -> RunConfig:
    """The configuration of a run folder's ``config.json`` (``info``, its mapping). A run
    writes its resolved, canonical configuration there, so it is read as it is (validated,
    no registry): its :meth:`~fedjax_sel.config.RunConfig.results_key` is the run's."""
    return RunConfig.from_dict(info["config"]).validate()


def conflicting(
    folders: Iterable[tuple[Path, str]],
) -> list[tuple[Path, str]]:
    """Among ``(folder, results_key)`` pairs, those whose folder holds results of another
    configuration: a ``config.json`` of another results key beside a ``summary.json``, a
    non-empty ``metrics.jsonl`` or a checkpoint. Returns ``(folder, reason)`` pairs."""
    found = []
    for folder, key in folders:
        folder = Path(folder)
        has_results = (folder / SUMMARY).exists() or (folder / CHECKPOINT).exists()
        metrics = folder / METRICS
        has_results = has_results or (metrics.exists() and metrics.stat().st_size > 0)
        if not has_results:
            continue
        if not (folder / CONFIG).exists():
            found.append((folder, "results without a config.json"))
            continue
        try:
            other = stored_config(read_json(folder / CONFIG)).results_key()
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            found.append((folder, f"an unreadable config.json ({e})"))
            continue
        if other != key:
            found.append((folder, f"another configuration (results key {other}, this one {key})"))
    return found


def refuse_conflicts(conflicts: list[tuple[Path, str]], what: str) -> None:
    """Raises :class:`ConfigError` naming the first conflicts and the way out."""
    if not conflicts:
        return
    shown = "; ".join(f"{str(p)!r} holds {why}" for p, why in conflicts[:3])
    more = f" (and {len(conflicts) - 3} more)" if len(conflicts) > 3 else ""
    raise ConfigError(
        f"{what} would overwrite {len(conflicts)} folder(s) of other results: {shown}{more}. "
        "Choose another --out, or pass --overwrite to replace them"
    )


def claim(
    folders: Iterable[tuple[Path, str]], what: str, *, overwrite: bool, echo: Callable
) -> None:
    """Makes ``folders`` (``(folder, results_key)`` pairs) free for their configurations: one
    holding another configuration's results is refused (:func:`refuse_conflicts`), or with
    ``overwrite`` emptied of them (:func:`clear_results`) and said so."""
    conflicts = conflicting(folders)
    if not overwrite:
        refuse_conflicts(conflicts, what)
    for folder, why in conflicts:
        echo(f"--overwrite: {folder} held {why}; recomputing it")
        clear_results(folder)


def clear_results(folder: Path) -> None:
    """Removes a run folder's result files (before ``--overwrite`` recomputes it)."""
    for name in (SUMMARY, METRICS, CHECKPOINT, CONFIG, CURVES, "curves_time.png", "timings.json"):
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
