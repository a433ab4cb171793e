"""Keeping a long run under the kernel's limit on memory mappings.

XLA's CPU backend loads every compiled program's machine code into memory mappings of its own
(code, constants and data: a few per program, more where codegen splits a program). A long
reproduction or sweep compiles hundreds to thousands of distinct programs and jax keeps each
alive in its caches, so the process can reach Linux's ``vm.max_map_count`` (65,530 by default):
LLVM then fails with "Cannot allocate memory" or the process crashes. Between groups of cells,
:func:`release_if_crowded` drops jax's compiled-program caches once the process holds more than
half the limit; programs still needed compile again.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import jax

_MAPS = Path("/proc/self/maps")
_LIMIT = Path("/proc/sys/vm/max_map_count")


def mapping_count() -> int | None:
    """The process's memory mappings (lines of /proc/self/maps); None where there is none."""
    try:
        with _MAPS.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def mapping_limit() -> int | None:
    """``vm.max_map_count``; None where the kernel does not say."""
    try:
        return int(_LIMIT.read_text().strip())
    except (OSError, ValueError):
        return None


def release_if_crowded(
    fraction: float = 0.5,
    echo: Callable[[str], None] | None = None,
    *,
    limit: int | None = None,
) -> tuple[int, int] | None:
    """Clears jax's caches (and collects) when the process holds more than ``fraction`` of the
    mapping limit (``limit``, default the kernel's). Returns (mappings before, after) when it
    cleared, else None."""
    limit = limit if limit is not None else mapping_limit()
    before = mapping_count()
    if limit is None or before is None or before <= fraction * limit:
        return None
    jax.clear_caches()
    gc.collect()
    after = mapping_count() or 0
    if echo is not None:
        echo(
            f"{before:,} memory mappings of the {limit:,} allowed (vm.max_map_count): compiled "
            f"programs released, {after:,} left"
        )
    return before, after
