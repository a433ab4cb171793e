"""``seeds_together="auto"``: how many members (seeds and grid points) run vmapped together,
measured on the machine at hand.

Vmapping members is not free: on a 2-core CPU a batch of an MLP's members runs each member's
matmuls as many small batched products, slower per member than one member after another
(``fedjax-sel bench grid``), while logistic regression gains from it. :func:`choose_batch`
times one round per member at batch sizes 1, 2, 4, ... (up to the memory bound of
:func:`fedjax_sel.experiment.run.batch_size`), stops at the first size that is not faster per
member than the best so far, and keeps the fastest. Each size's program is the one the run then
uses, so the measurement's compilation is not wasted for the size chosen; the choice is cached
on disk per (configuration's program, batch bound, backend, device, jax version), next to
``--parallel auto``'s, so later sweeps of the same shape reuse it. ``FEDJAX_SEL_AUTOTUNE=0``
keeps the memory bound alone.

A run's bits can depend on its batch (XLA:CPU's reductions are shaped by it), so the choice is
deterministic for a machine: the memory bound comes from the device's total memory (not what
is free at the moment), and once measured the choice is read from the cache, so the same
configuration gets the same batches on one machine, run after run. Every run records its batch
in ``config.json`` (``seeds_vmapped``, ``batch_choice``), and every suite per-seed record its
cell's batch (``batch``: the members vmapped with it, the size and how it was chosen), so a
rerun with the same batch (``--seeds-together`` the recorded size, the same seeds) reproduces
it. A new machine, or a cleared cache, may measure another size.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from fedjax_sel.training.autotune import (
    autotune_enabled,
    cache_path,
    hashed_key,
    read_cache,
    write_cache,
)

CACHE_VERSION = 2  # 2: map rounds and branching strategies batch faster (measured again)
IMPROVEMENT = 0.95  # a larger batch must be at least 5% faster per member to go on


@dataclasses.dataclass(frozen=True)
class BatchChoice:
    """Members per vmapped batch and how that was decided.

    Attributes:
      size: members per batch.
      source: ``measured``, ``cache``, ``memory`` (the memory bound alone) or ``given``
        (``seeds_together`` a number).
      bound: the memory bound (largest batch that fits half the device's memory).
      seconds_per_member_round: batch size -> measured seconds of one round per member.
    """

    size: int
    source: str
    bound: int
    seconds_per_member_round: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sizes_to_try(bound: int) -> list[int]:
    """1, 2, 4, ... below ``bound``, then ``bound`` itself."""
    sizes, b = [], 1
    while b < bound:
        sizes.append(b)
        b *= 2
    return sizes + [bound]


def choose_batch(bound: int, seconds_per_member_round: Callable[[int], float]) -> BatchChoice:
    """The fastest batch size per member among :func:`sizes_to_try`, timed in increasing order
    until a size is not ``IMPROVEMENT`` times faster than the best so far; then every measured
    size is timed once more (the lower of the two counts: a 2-core machine's timings of one
    round jump by 2x now and then) and the fastest is kept."""
    timings: dict[int, float] = {}
    best = None
    for b in sizes_to_try(bound):
        timings[b] = float(seconds_per_member_round(b))
        if best is not None and timings[b] > IMPROVEMENT * timings[best]:
            break
        if best is None or timings[b] < timings[best]:
            best = b
    for b in timings:
        timings[b] = min(timings[b], float(seconds_per_member_round(b)))
    best = min(timings, key=lambda b: (timings[b], b))
    return BatchChoice(best, "measured", bound, {str(b): t for b, t in timings.items()})


def cache_key(program: str, bound: int) -> str:
    return hashed_key({"version": CACHE_VERSION, "program": program, "bound": bound})


def _cache_file():
    return cache_path().with_name("batch.json")


def read_cached(key: str) -> BatchChoice | None:
    entry = read_cache(_cache_file()).get(key)
    return None if entry is None else BatchChoice(**{**entry, "source": "cache"})


def measured_batch(
    program: str,
    bound: int,
    time_batch: Callable[[int], float],
    echo: Callable = print,
) -> BatchChoice:
    """:func:`choose_batch`, read from the cache when this program and bound were measured
    on this machine before; the memory bound alone when measuring is switched off or there is
    nothing to choose (``bound`` 1)."""
    if bound <= 1 or not autotune_enabled():
        return BatchChoice(max(1, bound), "memory", bound)
    key = cache_key(program, bound)
    cached = read_cached(key)
    if cached is not None:
        return cached
    t0 = time.perf_counter()
    choice = choose_batch(bound, time_batch)
    write_cache(key, choice.to_dict(), _cache_file())
    timings = ", ".join(
        f"{b}: {t * 1e3:.2f} ms" for b, t in choice.seconds_per_member_round.items()
    )
    echo(
        f"members per batch: {choice.size} (seconds per member-round {timings}; measured in "
        f"{time.perf_counter() - t0:.1f} s, cached)"
    )
    return choice
