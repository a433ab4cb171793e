"""Timing helpers, machine description, JSON output and tables shared by the benchmarks."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> dict:
    """Median and min wall seconds of ``fn()`` (blocked until ready) after ``warmup`` calls;
    the first warm-up call's time (compilation included) is returned as ``first_seconds``."""
    t = interleaved_times({"call": fn}, repeats, warmup)["call"]
    return {k: t[k] for k in ("seconds", "min_seconds", "first_seconds")}


def interleaved_times(
    calls: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1
) -> dict[str, dict[str, object]]:
    """Times each call ``repeats`` times in turn (a, b, a, b, ...) after ``warmup`` calls each
    (blocked until ready). On a machine whose speed drifts (a shared or throttled CPU) the calls
    timed next to each other slow alike, so the ratio of their times stays fair where two
    blocks timed one after the other would not. Per call: its ``times`` in order, their median
    ``seconds`` and ``min_seconds``, and ``first_seconds`` (the first warm-up call,
    compilation included)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (a median needs one timing), got {repeats}")

    def timed(fn: Callable[[], object]) -> float:
        t = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - t

    first = {name: timed(fn) for name, fn in calls.items()}
    for _ in range(max(warmup - 1, 0)):
        for fn in calls.values():
            jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(timed(fn))
    return {
        name: {
            "times": ts,
            "seconds": statistics.median(ts),
            "min_seconds": min(ts),
            "first_seconds": first[name],
        }
        for name, ts in times.items()
    }


def matmul_gflops(n: int | None = None, repeats: int = 5) -> float:
    """Achieved GFLOP/s of one large float32 matmul: the machine's practical peak.

    ``n`` defaults to 2048 on a CPU and 8192 on an accelerator, where a 2048-cube product
    (about 0.1 ms on an H100) is too short to reach the peak. Products run at
    ``jax.default_matmul_precision``, so a bfloat16 run is measured against bfloat16's peak."""
    if n is None:
        n = 2048 if jax.default_backend() == "cpu" else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    t = time_call(lambda: f(a), repeats=repeats, warmup=2)
    return 2 * n**3 / t["min_seconds"] / 1e9


def write_json_rows(path: str | os.PathLike | None, payload) -> None:
    if path is None:
        return
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {p}")


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Prints ``rows`` with ``columns`` = ``[(header, key, format), ...]``."""
    cells = [
        [(fmt.format(r[k]) if r.get(k) is not None else "-") for _, k, fmt in columns] for r in rows
    ]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, (h, _, _) in enumerate(columns)]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))
