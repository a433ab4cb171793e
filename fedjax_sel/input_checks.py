"""Checks of what a user types or a file holds, made at the boundary, before anything is
allocated or written: a bad value is a :class:`~fedjax_sel.base.ConfigError` naming it (the CLI
prints one line and exits 2), never a traceback, an out-of-memory kill or a silent NaN.

* seeds: whole numbers in ``0 .. SEED_MAX`` (``jax.random.key`` keeps 32 bits of a seed, so
  ``2**32`` would silently repeat seed 0, and NumPy's generators refuse negative ones);
* sizes: what a file header (``.npy``, each member of an ``.npz``, an HDF5 dataset) or a
  requested output claims, against the memory this machine has free, before reading it;
* values: no NaN or infinity in data read from files.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedjax_sel.base import ConfigError

SEED_MAX = 2**32 - 1
# seeds one sweep, suite or command may list: far beyond any study, short of a typo's 10**12
MAX_SEEDS = 100_000


def check_seed(value: Any, what: str) -> int:
    """``value`` as a seed, or a :class:`ConfigError` naming ``what``, the value and the range
    (booleans and text are not seeds)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{what} must be a whole number in 0 .. {SEED_MAX}, got {value!r}")
    if not 0 <= int(value) <= SEED_MAX:
        raise ConfigError(f"{what} must be in 0 .. {SEED_MAX}, got {int(value)}")
    return int(value)


def seed_list(value: Any, what: str) -> list[int]:
    """The seeds a sweep or suite file gives: a count ``n`` (seeds ``0 .. n-1``, at most
    :data:`MAX_SEEDS`) or a non-empty list of distinct seeds; text (``"12"``) is refused."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise ConfigError(
                f"{what} must be a count in 1 .. {MAX_SEEDS} or a list of seeds, got {value!r}"
            )
        return list(range(int(value)))
    if isinstance(value, (list, tuple)) and 0 < len(value) <= MAX_SEEDS:
        seeds = [check_seed(s, f"{what}: each seed") for s in value]
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{what} repeats a seed: {list(value)}")
        return seeds
    raise ConfigError(
        f"{what} must be a count in 1 .. {MAX_SEEDS} or a non-empty list of seeds, got {value!r}"
    )


def available_memory() -> int:
    """Bytes of host memory free for new arrays now (``MemAvailable``; else free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**40  # unknown: only absurd claims are refused


def _size_text(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError  # unreachable


def check_claimed_bytes(nbytes: float, what: str) -> None:
    """Refuses ``nbytes`` (what ``what`` would take in memory) beyond the free memory."""
    free = available_memory()
    if nbytes > free:
        raise ConfigError(
            f"{what} needs {_size_text(nbytes)} of memory, more than the {_size_text(free)} "
            "free on this machine"
        )


def check_array_bytes(shape: tuple[int, ...], dtype: np.dtype, what: str) -> None:
    """Refuses an array of ``shape`` and ``dtype`` (what a file's header claims) that would
    not fit the free memory, before it is read."""
    claimed = math.prod(shape) * dtype.itemsize
    check_claimed_bytes(claimed, f"{what} (shape {shape}, dtype {dtype})")


def check_finite(array: Any, what: str) -> None:
    """Refuses NaN or infinite values in a floating-point (or complex) ``array``."""
    a = np.asarray(array)
    if a.dtype.kind in "fc" and a.size and not np.all(np.isfinite(a)):
        bad = a[~np.isfinite(a)].ravel()[0]
        raise ConfigError(f"{what} holds a non-finite value ({bad}); data must be finite numbers")


# ----------------------------------------------------------------------------- NumPy files
def npy_header(fp: BinaryIO, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` from the header of the ``.npy`` stream ``fp`` (nothing else read)."""
    try:
        version = np.lib.format.read_magic(fp)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0  # 3.0 differs only in the header's text
        )
        shape, _, dtype = read(fp)
    except (ValueError, EOFError, OSError, SyntaxError, TypeError) as e:
        raise ConfigError(f"{what} is not a NumPy array file: {e}") from None
    return tuple(int(n) for n in shape), np.dtype(dtype)


def _check_header(shape: tuple[int, ...], dtype: np.dtype, what: str) -> None:
    if any(n < 0 for n in shape):
        raise ConfigError(f"{what} claims the shape {shape}")
    if dtype.hasobject:
        raise ConfigError(
            f"{what} holds Python objects (dtype {dtype}); only numeric arrays are read"
        )
    check_array_bytes(shape, dtype, what)


def load_npy(path: str | os.PathLike, what: str) -> np.ndarray:
    """The numeric array of a ``.npy`` file, its header checked against memory first."""
    p = Path(path)
    try:
        with p.open("rb") as fp:
            shape, dtype = npy_header(fp, f"{what} {str(p)!r}")
            _check_header(shape, dtype, f"{what} {str(p)!r}")
        return np.load(p, allow_pickle=False)
    except ConfigError:
        raise
    except (ValueError, OSError, EOFError) as e:
        raise ConfigError(f"cannot read {what} {str(p)!r}: {e}") from None


def npz_members(path: str | os.PathLike, what: str) -> list[str]:
    """The array names of an ``.npz`` file, every member's header checked against memory
    (``what`` names the file in errors)."""
    p = Path(path)
    try:
        with zipfile.ZipFile(p) as z:
            names = []
            for info in z.infolist():
                name = info.filename.removesuffix(".npy")
                where = f"{what} {str(p)!r}, array {name!r}"
                with z.open(info) as fp:
                    shape, dtype = npy_header(fp, where)
                _check_header(shape, dtype, where)
                names.append(name)
    except ConfigError:
        raise
    except (
        zipfile.BadZipFile,
        zlib.error,
        OSError,
        EOFError,
        ValueError,
        NotImplementedError,
    ) as e:
        raise ConfigError(f"cannot read {what} {str(p)!r} as a .npz file: {e}") from None
    return names


def load_npz(path: str | os.PathLike, what: str, names: list[str] | None = None) -> dict:
    """``{name: array}`` of an ``.npz`` file (``names``: those only), each member's header
    checked against memory before it is read."""
    p = Path(path)
    members = npz_members(p, what)
    try:
        with np.load(p, allow_pickle=False) as z:
            return {n: z[n] for n in (members if names is None else names) if n in members}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ConfigError(f"cannot read {what} {str(p)!r}: {e}") from None
