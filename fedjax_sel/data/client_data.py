"""Stacked on-device storage of all clients' examples (docs/data.md, "Layouts").

Two layouts behind one interface:

* ``padded``: ``x[K, n_max, ...]``; every client padded to the largest client. Cheap when sizes
  are similar, and the client axis can be sharded across devices.
* ``flat``: ``x[N, ...]`` with ``offsets[K]`` and ``counts[K]``; no padding at all, for strongly
  skewed sizes (Dirichlet quantity skew, LogNormal LEAF sizes) where padding would cost 5-20x.

Both answer :meth:`ClientData.gather` (examples of given clients at given positions, with a
validity mask) and :meth:`ClientData.rows` (every stored example with its client id), which is
all the training and evaluation code uses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_sel.base import Array, ConfigError
from fedjax_sel.data.partition import FlatParts

LAYOUTS = ("auto", "padded", "flat")
# the most rows a padded [K, n_max] array's int32 row numbers can address
FLAT_ROWS_LIMIT = 2**31 - 1


def _flat(a: Array) -> Array:
    """``[K, n_max, ...]`` as ``[K * n_max, ...]`` (a view: the array is contiguous)."""
    return a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])


@struct.dataclass
class ClientData:
    """Examples of K clients, stacked.

    Attributes:
      x: padded ``[K, n_max, *feature_shape]`` or flat ``[N, *feature_shape]`` features.
      y: padded ``[K, n_max, *target_shape]`` or flat ``[N, *target_shape]`` targets (int
        labels or float regression targets: ``target_shape`` is ``()``; token sequences
        ``[T]`` for next-word prediction).
      counts: int32[K], examples held by each client.
      offsets: int32[K], first row of each client in the flat layout (zeros when padded).
      layout: ``"padded"`` or ``"flat"`` (static).
      n_max: largest client size (static).
      x_scale: features stored as integers are multiplied by this on the way out (static);
        ``None`` keeps them as stored (token ids).
    """

    x: Array
    y: Array
    counts: Array
    offsets: Array
    layout: str = struct.field(pytree_node=False, default="flat")
    n_max: int = struct.field(pytree_node=False, default=0)
    x_scale: float | None = struct.field(pytree_node=False, default=None)

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[2:] if self.layout == "padded" else self.x.shape[1:])

    @property
    def target_shape(self) -> tuple[int, ...]:
        """Shape of one example's target: ``()`` for a label, ``(T,)`` for a sequence."""
        return tuple(self.y.shape[2:] if self.layout == "padded" else self.y.shape[1:])

    @property
    def num_rows(self) -> int:
        """Stored rows, padding included."""
        return int(
            self.x.shape[0] * self.x.shape[1] if self.layout == "padded" else self.x.shape[0]
        )

    def _features(self, x: Array) -> Array:
        if self.x_scale is not None:
            return x.astype(jnp.float32) * self.x_scale
        return x

    def gather(self, clients: Array, positions: Array) -> tuple[Array, Array, Array]:
        """Examples of ``clients`` at ``positions`` (within each client's own range).

        Args:
          clients: int32 array of client ids, any shape ``S``.
          positions: int32 ``[*S, B]`` example positions; positions at or beyond a client's
            count are clamped and masked out.

        Returns:
          ``(x[*S, B, ...], y[*S, B], mask bool[*S, B])``.
        """
        clients = jnp.asarray(clients, jnp.int32)
        counts = self.counts[clients][..., None]
        mask = positions < counts
        safe = jnp.clip(positions, 0, jnp.maximum(counts - 1, 0))
        if self.layout == "padded":
            k, n = self.x.shape[:2]
            if k * n <= FLAT_ROWS_LIMIT:  # rows of the [K * n_max] view: XLA:CPU's row gather
                rows = clients[..., None] * n + safe
                x = _flat(self.x).at[rows].get(mode="promise_in_bounds")
                y = _flat(self.y).at[rows].get(mode="promise_in_bounds")
            else:  # row numbers past int32: index (client, position) pairs
                c = jnp.broadcast_to(clients[..., None], safe.shape)
                x = self.x.at[c, safe].get(mode="promise_in_bounds")
                y = self.y.at[c, safe].get(mode="promise_in_bounds")
        else:
            rows = self.offsets[clients][..., None] + safe
            x = self.x.at[rows].get(mode="promise_in_bounds")
            y = self.y.at[rows].get(mode="promise_in_bounds")
        return self._features(x), y, mask

    def rows(self) -> tuple[Array, Array, Array, Array]:
        """Every stored row: ``(x[R, ...], y[R], client[R], valid bool[R])``."""
        if self.layout == "padded":
            k, n = self.x.shape[:2]
            x, y = _flat(self.x), _flat(self.y)
            client = jnp.repeat(jnp.arange(k, dtype=jnp.int32), n)
            valid = (jnp.arange(n)[None, :] < self.counts[:, None]).reshape(-1)
            return self._features(x), y, client, valid
        client = jnp.repeat(
            jnp.arange(self.num_clients, dtype=jnp.int32),
            self.counts,
            total_repeat_length=self.x.shape[0],
        )
        # rows past the last client's are padding (data sets stacked over seeds)
        valid = jnp.arange(self.x.shape[0]) < jnp.sum(self.counts)
        return self._features(self.x), self.y, client, valid

    def client_arrays(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """One client's examples as host arrays (for tests and notebooks)."""
        n = int(self.counts[client])
        if self.layout == "padded":
            x, y = np.asarray(self.x[client, :n]), np.asarray(self.y[client, :n])
        else:
            o = int(self.offsets[client])
            x, y = np.asarray(self.x[o : o + n]), np.asarray(self.y[o : o + n])
        if self.x_scale is not None:
            x = x.astype(np.float32) * self.x_scale
        return x, y

    def label_counts(self, num_classes: int) -> Array:
        """float32[K, num_classes] histogram of each client's labels (one label per example).
        Counted on the host: exact integers, no compiled program per array shape and no
        ``[rows, classes]`` one-hot."""
        if self.target_shape:
            raise ConfigError(
                f"label histograms need one label per example; these targets are sequences "
                f"of shape {self.target_shape}"
            )
        counts = np.asarray(self.counts)
        y = np.asarray(self.y)
        k = self.num_clients
        if self.layout == "padded":
            valid = np.arange(y.shape[1])[None, :] < counts[:, None]
            client = np.broadcast_to(np.arange(k)[:, None], valid.shape)[valid]
            y = y[valid]
        else:
            client = np.repeat(np.arange(k), counts)
            y = y[: len(client)]
        cells = client * num_classes + y.astype(np.int64)
        hist = np.bincount(cells, minlength=k * num_classes).reshape(k, num_classes)
        return jnp.asarray(hist, jnp.float32)


def from_parts(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    *,
    layout: str = "auto",
    x_scale: float | None = None,
    max_padding_ratio: float = 1.5,
    allow_empty: bool = False,
) -> ClientData:
    """Builds :class:`ClientData` from a pool of examples and one index array per client.

    Args:
      x, y: the example pool (host arrays).
      parts: ``parts[k]`` are the indices into the pool held by client ``k``.
      layout: ``"padded"``, ``"flat"`` or ``"auto"`` (padded unless padding would store more
        than ``max_padding_ratio`` times the real examples).
      x_scale: see :class:`ClientData`.
      allow_empty: accept clients with no examples (per-client test splits of tiny clients).
    """
    counts = _part_sizes(parts, layout, allow_empty)
    layout, n_max = _choose_layout(counts, layout, max_padding_ratio)
    x = np.asarray(x)
    y = np.asarray(y)
    order = _rows_of(parts)
    shape, slots, offsets = _placement(counts, layout, n_max)
    where = np.unravel_index(slots, shape)  # padded: (its client, its position in the client)
    return ClientData(
        x=_gathered_on_device(x, order, where, shape),
        y=_gathered_on_device(y, order, where, shape),
        counts=jnp.asarray(counts, jnp.int32),
        offsets=jnp.asarray(offsets, jnp.int32),
        layout=layout,
        n_max=n_max,
        x_scale=x_scale,
    )


def _part_sizes(parts: Sequence[np.ndarray], layout: str, allow_empty: bool) -> np.ndarray:
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if len(parts) == 0:
        raise ConfigError("a federated data set needs at least one client (got 0 parts)")
    if isinstance(parts, FlatParts):
        counts = np.asarray(parts.counts, np.int64)
    else:
        counts = np.array([len(p) for p in parts], dtype=np.int64)
    if not allow_empty and np.any(counts == 0):
        empty = np.flatnonzero(counts == 0)[:5].tolist()
        raise ConfigError(f"clients {empty} hold no examples; every client needs at least one")
    return counts


def _choose_layout(counts: np.ndarray, layout: str, max_padding_ratio: float) -> tuple[str, int]:
    """The layout (``auto``: padded unless padding would store more than
    ``max_padding_ratio`` times the real examples) and ``n_max``."""
    total, n_max, k = int(counts.sum()), max(int(counts.max()), 1), len(counts)
    if layout == "auto":
        layout = "padded" if k * n_max <= max_padding_ratio * total else "flat"
    return layout, n_max


def _placement(
    counts: np.ndarray, layout: str, n_max: int
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Where the concatenated parts' rows go: ``(shape, slots, offsets)``, ``slots[r]`` the
    flat index of row ``r`` in an array of ``shape`` (padded: ``(K, n_max)``, each client's rows
    at the start of its own row; flat: ``(total,)``, in order) and the clients' offsets."""
    k, total = len(counts), int(counts.sum())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    if layout == "padded":
        slots = np.repeat(np.arange(k, dtype=np.int64) * n_max - starts, counts)
        return (k, n_max), slots + np.arange(total), np.zeros(k, np.int64)
    return (total,), np.arange(total, dtype=np.int64), starts


@dataclasses.dataclass(frozen=True)
class RowChunks:
    """A pool of examples made a chunk of rows at a time (a generator), never held whole.

    Attributes:
      num_rows: rows in the pool.
      chunk_rows: rows per chunk; chunk ``i`` holds rows ``i * chunk_rows ...``.
      make: ``make(i) -> (x[chunk_rows, *x.shape], y[chunk_rows, *y.shape])`` (device or host
        arrays); the last chunk is padded past ``num_rows`` with rows that are never stored.
      x, y: shape and dtype of one row's features and target.
    """

    num_rows: int
    chunk_rows: int
    make: Callable[[int], tuple[Array, Array]]
    x: jax.ShapeDtypeStruct
    y: jax.ShapeDtypeStruct

    @property
    def num_chunks(self) -> int:
        return -(-self.num_rows // self.chunk_rows)


def from_row_chunks(
    pool: RowChunks,
    client_parts: Sequence[tuple[Sequence[np.ndarray], bool]],
    row_sets: Sequence[np.ndarray] = (),
    *,
    layout: str = "auto",
    x_scale: float | None = None,
    max_padding_ratio: float = 1.5,
) -> tuple[list[ClientData], list[tuple[Array, Array]]]:
    """Client data sets (and plain row sets) assembled from a pool made in chunks, all in one
    pass over the pool: each chunk is made once and its rows are written straight into the
    final device arrays (buffers donated, updated in place). The peak is the results, one
    chunk and an int32 slot per pool row and result: no copy of the pool, no second copy of a
    result.

    Args:
      pool: the examples, made a chunk at a time.
      client_parts: ``(parts, allow_empty)`` per :class:`ClientData` to build, as
        :func:`from_parts` takes them (``parts[k]``: pool rows of client ``k``; each pool row
        at most once per data set); each picks its own layout as :func:`from_parts` does.
      row_sets: arrays of pool rows; each becomes ``(x[len], y[len])`` in that order (a
        central test set).
      layout, x_scale, max_padding_ratio: as :func:`from_parts`.

    Returns:
      ``(client data sets, row sets)``, equal to what :func:`from_parts` and ``x[rows]`` give
      on the whole pool.
    """
    n = pool.num_rows
    built, targets = [], []
    for parts, allow_empty in client_parts:
        counts = _part_sizes(parts, layout, allow_empty)
        kind, n_max = _choose_layout(counts, layout, max_padding_ratio)
        shape, slots, offsets = _placement(counts, kind, n_max)
        targets.append((shape, _slot_of_rows(n, _rows_of(parts), slots, int(np.prod(shape)))))
        built.append((counts, offsets, kind, n_max))
    for rows in row_sets:
        rows = np.asarray(rows, np.int64)
        targets.append(((len(rows),), _slot_of_rows(n, rows, np.arange(len(rows)), len(rows))))
    bufs = tuple(
        (
            jnp.zeros(shape + pool.x.shape, pool.x.dtype),
            jnp.zeros(shape + pool.y.shape, pool.y.dtype),
        )
        for shape, _ in targets
    )
    size = pool.chunk_rows
    for i in range(pool.num_chunks):
        x, y = pool.make(i)
        lo, hi = i * size, min((i + 1) * size, n)
        # rows past the pool (the last chunk's padding) go to no slot
        slots = tuple(
            np.pad(s[lo:hi], (0, size - (hi - lo)), constant_values=s.dtype.type(-1))
            for _, s in targets
        )
        bufs = _scatter_chunk(bufs, slots, x, y)
    data = [
        ClientData(
            x=bx,
            y=by,
            counts=jnp.asarray(counts, jnp.int32),
            offsets=jnp.asarray(offsets, jnp.int32),
            layout=kind,
            n_max=n_max,
            x_scale=x_scale,
        )
        for (bx, by), (counts, offsets, kind, n_max) in zip(bufs, built, strict=False)
    ]
    return data, list(bufs[len(built) :])


def _rows_of(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The parts' pool rows, client after client."""
    if isinstance(parts, FlatParts):
        return parts.rows
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


def _slot_of_rows(n: int, rows: np.ndarray, slots: np.ndarray, size: int) -> np.ndarray:
    """int32 (int64 past 2^31 slots) ``[n]``: the slot of each pool row listed in ``rows``, -1
    for the others."""
    dtype = np.int32 if size < 2**31 else np.int64
    out = np.full(n, -1, dtype)
    out[rows] = slots
    if len(rows) and not np.array_equal(out[rows], slots):
        raise ConfigError("a pool row is listed twice in one data set")
    return out


@functools.partial(jax.jit, donate_argnums=0)
def _scatter_chunk(bufs, slots, x, y):
    """Each buffer pair with the chunk's rows written at their slots (slot -1: not stored)."""
    out = []
    for (bx, by), s in zip(bufs, slots, strict=True):
        lead = bx.shape[: bx.ndim - x.ndim + 1]
        size = int(np.prod(lead))
        s = jnp.where(s < 0, size, s)  # out of bounds: dropped
        fx = bx.reshape((size,) + bx.shape[len(lead) :]).at[s].set(x, mode="drop")
        fy = by.reshape((size,) + by.shape[len(lead) :]).at[s].set(y, mode="drop")
        out.append((fx.reshape(bx.shape), fy.reshape(by.shape)))
    return tuple(out)


# above this many bytes an array is assembled on the device in chunks (a host copy in the
# final layout, then a device copy, held three times the data at 10^6 clients)
CHUNKED_ASSEMBLY_BYTES = 1 << 28
ASSEMBLY_CHUNK_ROWS = 1 << 18


def _gathered_on_device(
    pool: np.ndarray, order: np.ndarray, where: tuple[np.ndarray, ...], shape: tuple[int, ...]
) -> Array:
    """A device array of ``shape + pool.shape[1:]``, zero except ``out[where] = pool[order]``.

    Small arrays are built on the host and copied once. Large ones are written into a device
    buffer a chunk of rows at a time (a jitted scatter that donates the buffer, so it is
    updated in place): the peak is the pool, the result and one chunk, not the pool and two
    copies of the result."""
    full = shape + pool.shape[1:]
    if np.prod(full, dtype=np.int64) * pool.dtype.itemsize <= CHUNKED_ASSEMBLY_BYTES:
        out = np.zeros(full, pool.dtype)
        out[where] = pool[order]
        # device_put copies once (jnp.asarray can stage a second copy of a large array)
        return jax.device_put(out)
    buf = jnp.zeros(full, pool.dtype)
    rows = ASSEMBLY_CHUNK_ROWS
    for start in range(0, len(order), rows):
        idx = np.arange(start, min(start + rows, len(order)))
        # the last chunk repeats its final row up to the chunk size: one compiled scatter,
        # and writing the same value twice changes nothing
        idx = np.pad(idx, (0, rows - len(idx)), mode="edge")
        buf = _scatter_rows(buf, tuple(w[idx] for w in where), pool[order[idx]])
    return buf


@functools.partial(jax.jit, donate_argnums=0)
def _scatter_rows(buf: Array, where: tuple[Array, ...], values: Array) -> Array:
    return buf.at[where].set(values)


def from_client_arrays(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    *,
    layout: str = "auto",
    x_scale: float | None = None,
    allow_empty: bool = False,
) -> ClientData:
    """Builds :class:`ClientData` from one ``(x_k, y_k)`` pair of host arrays per client."""
    if len(xs) != len(ys):
        raise ConfigError(f"got {len(xs)} feature arrays but {len(ys)} target arrays")
    sizes = [len(a) for a in xs]
    for k, (a, b) in enumerate(zip(xs, ys, strict=True)):
        if len(a) != len(b):
            raise ConfigError(f"client {k}: {len(a)} examples but {len(b)} targets")
    x = np.concatenate(xs) if xs else np.zeros((0,))
    y = np.concatenate(ys) if ys else np.zeros((0,))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    parts = [np.arange(s, s + n) for s, n in zip(starts, sizes, strict=True)]
    return from_parts(x, y, parts, layout=layout, x_scale=x_scale, allow_empty=allow_empty)


def to_flat(data: ClientData) -> ClientData:
    """The same clients in the flat layout (host-side copy)."""
    if data.layout == "flat":
        return data
    k = data.num_clients
    counts = np.asarray(data.counts)
    keep = (np.arange(data.x.shape[1])[None, :] < counts[:, None]).reshape(-1)
    x = np.asarray(data.x).reshape((-1,) + data.x.shape[2:])[keep]
    y = np.asarray(data.y).reshape((-1,) + data.y.shape[2:])[keep]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if k else np.zeros(0)
    return data.replace(
        x=jnp.asarray(x),
        y=jnp.asarray(y),
        offsets=jnp.asarray(offsets, jnp.int32),
        layout="flat",
    )


def _pad_axis(a: Array, axis: int, size: int) -> Array:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jnp.pad(a, widths)


@functools.partial(jax.jit, static_argnames=("axis", "size"))
def stack_padded(arrays: list[Array], axis: int, size: int) -> Array:
    """``arrays`` zero-padded along ``axis`` to ``size`` and stacked on a new leading axis:
    one compiled program per list of shapes (padding and stacking each array eagerly would
    compile a small program for every distinct shape)."""
    return jnp.stack([_pad_axis(a, axis, size) for a in arrays])


def stack_client_data(
    parts: Sequence[ClientData], pad_like: Sequence[ClientData] = ()
) -> ClientData:
    """Client data of several simulations (one per seed) stacked on a new leading axis.

    Every part must hold the same number of clients with the same feature shape; example
    storage is zero-padded to the largest part (``n_max`` is the largest client of any part),
    or of ``pad_like`` too (every batch of a group then has one shape: one compiled program).
    Padding is never read as data: ``gather`` masks positions past a client's count and
    ``rows`` marks padded rows invalid, and minibatch positions depend on a client's own count
    only, so each member computes exactly what it computes alone.
    """
    if not parts:
        raise ConfigError("stack_client_data needs at least one part")
    first = parts[0]
    for p in parts:
        if p.num_clients != first.num_clients or p.feature_shape != first.feature_shape:
            raise ConfigError(
                "cannot stack client data of different shapes: "
                f"{first.num_clients} clients x {first.feature_shape} and "
                f"{p.num_clients} x {p.feature_shape}"
            )
        if p.x_scale != first.x_scale or p.x.dtype != first.x.dtype:
            raise ConfigError("cannot stack client data stored with different dtypes or scales")
    if len({p.layout for p in [*parts, *pad_like]}) > 1:
        parts = [to_flat(p) for p in parts]
        pad_like = [to_flat(p) for p in pad_like]
    layout = parts[0].layout
    axis = 1 if layout == "padded" else 0
    size = max(p.x.shape[axis] for p in [*parts, *pad_like])
    x = stack_padded([p.x for p in parts], axis, size)
    y = stack_padded([p.y for p in parts], axis, size)
    return ClientData(
        x=x,
        y=y,
        counts=stack_padded([p.counts for p in parts], 0, first.num_clients),
        offsets=stack_padded([p.offsets for p in parts], 0, first.num_clients),
        layout=layout,
        n_max=max(p.n_max for p in [*parts, *pad_like]),
        x_scale=first.x_scale,
    )
