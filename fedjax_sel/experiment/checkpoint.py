"""Checkpoints of a whole simulation state, written atomically, restored bit for bit.

Format: one ``.npz`` file per run (NumPy's zip of arrays): the state's leaves in pytree order
(typed PRNG keys as their raw ``key_data``), plus a JSON header with the configuration's
``results_key``, the round and the host-side bookkeeping of the run loop. It is written to a
temporary file and renamed over the previous checkpoint (``os.replace`` is atomic), so a
half-written checkpoint is never read.

Why not orbax-checkpoint (the JAX ecosystem's standard, installed with flax)? Its strengths are
asynchronous, sharded, multi-host saving of large models to object stores; our states are small
(a model, per-client ``[K, ...]`` arrays) and are saved between compiled chunks of rounds,
where a synchronous write of one file is simplest, portable and exactly reversible. In a
multi-process run the state is gathered to process 0, which alone writes.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_sel.base import ConfigError

FORMAT = "fedjax_sel-checkpoint-1"


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def save_checkpoint(path: str | Path, state: Any, header: dict[str, Any]) -> Path:
    """Writes ``state`` (any pytree of arrays) and a JSON-serialisable ``header`` to ``path``."""
    path = Path(path)
    leaves = jax.tree.leaves(state)
    arrays: dict[str, np.ndarray] = {}
    impls = []
    for i, leaf in enumerate(leaves):
        if _is_key(leaf):
            impls.append(str(jax.random.key_impl(leaf)))
            leaf = jax.random.key_data(leaf)
        else:
            impls.append(None)
        arrays[f"leaf_{i}"] = np.asarray(jax.device_get(leaf))
    meta = dict(header, format=FORMAT, num_leaves=len(leaves), key_impls=impls)
    arrays["header"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a checkpoint (a :class:`ConfigError` naming the file when it is
    corrupt or not a checkpoint)."""
    path = Path(path)
    try:
        with np.load(path) as z:
            header = json.loads(bytes(z["header"]).decode())
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {str(path)!r} does not exist") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise ConfigError(f"checkpoint {str(path)!r} is corrupt or not a checkpoint: {e}") from None
    if header.get("format") != FORMAT:
        raise ConfigError(
            f"checkpoint {str(path)!r} has an unknown format {header.get('format')!r}"
        )
    return header


def load_checkpoint(path: str | Path, template: Any, *, results_key: str) -> tuple[Any, dict]:
    """Restores a state shaped like ``template`` (e.g. a freshly initialised state of the same
    configuration) and the header; checks that the checkpoint belongs to the configuration
    ``results_key`` and that every leaf has the template's shape and dtype."""
    path = Path(path)
    header = read_header(path)
    if header.get("results_key") != results_key:
        raise ConfigError(
            f"checkpoint {str(path)!r} was written by another configuration (key "
            f"{header.get('results_key')!r}, this run {results_key!r}); remove it or run with "
            "the configuration that wrote it"
        )
    leaves, treedef = jax.tree.flatten(template)
    if header.get("num_leaves") != len(leaves):
        raise ConfigError(
            f"checkpoint {str(path)!r} holds {header.get('num_leaves')} arrays but this "
            f"configuration's state has {len(leaves)}"
        )
    restored = []
    try:
        with np.load(path) as z:
            for i, (ref, impl) in enumerate(zip(leaves, header["key_impls"], strict=True)):
                arr = z[f"leaf_{i}"]
                if impl is not None:
                    value = jax.random.wrap_key_data(arr, impl=impl)
                    ref_shape, ref_dtype = ref.shape, ref.dtype
                else:
                    value = arr
                    ref_shape, ref_dtype = np.shape(ref), np.asarray(ref).dtype
                if value.shape != ref_shape or value.dtype != ref_dtype:
                    raise ConfigError(
                        f"checkpoint {str(path)!r}: array {i} is {value.dtype}{list(value.shape)}"
                        f" but this configuration expects {ref_dtype}{list(ref_shape)}"
                    )
                restored.append(value if impl is not None else jax.numpy.asarray(value))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        raise ConfigError(f"checkpoint {str(path)!r} is corrupt: {e}") from None
    return jax.tree.unflatten(treedef, restored), header
