"""Several processes (hosts) running one simulation: JAX's multi-controller runtime.

Every process runs the same program; ``jax.distributed.initialize`` joins them, after which
``jax.devices()`` lists the devices of all processes and :func:`fedjax_sel.engine.simulation.
default_mesh` spans them, so the slot axis of local training and the evaluation are sharded over
every device of every host. Host-side values (round logs, scores, checkpoints) are gathered
with :func:`to_host` on every process; only process 0 writes files.

CLI::

    fedjax-sel run --distributed --coordinator HOST:PORT --num-processes N --process-id I ...

or ``--distributed`` alone where JAX detects the cluster itself (SLURM, Open MPI, Cloud TPU;
see ``jax.distributed.initialize``). On CPU the processes talk through gloo collectives.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fedjax_sel.base import ConfigError


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Joins this process to the others (``jax.distributed.initialize``); must run before JAX
    touches a device. Without arguments JAX reads the cluster from the environment."""
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ConfigError(
            "--distributed: give all of --coordinator, --num-processes and --process-id, or "
            "none of them (JAX then detects the cluster: SLURM, Open MPI, ...)"
        )
    if num_processes is not None and num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    if process_id is not None and not 0 <= process_id < (num_processes or 1):
        raise ConfigError(
            f"--process-id must lie in [0, num_processes={num_processes}), got {process_id}"
        )
    # CPU devices of different processes need a collectives backend
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
        )
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"--distributed: jax.distributed.initialize failed: {e}") from None


def is_primary() -> bool:
    """Whether this process writes the outputs (process 0; always true in one process)."""
    return jax.process_index() == 0


def to_host(tree: Any) -> Any:
    """NumPy copies of a pytree's arrays, gathered from every process where they span
    several (call it on all processes: it may be a collective)."""

    def one(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            if x.is_fully_addressable:
                return x  # typed PRNG keys stay keys (checkpoints store their data)
            return jax.random.wrap_key_data(one(jax.random.key_data(x)))
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)
