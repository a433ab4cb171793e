"""Vectorised evaluation: the central test set, every client at once, or a subset of clients."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, Params, PRNGKey
from fedjax_sel.data.client_data import ClientData
from fedjax_sel.members import members_cond
from fedjax_sel.models import Model


def segment_sums(
    model: Model,
    params: Params,
    x: Array,
    y: Array,
    segment: Array,
    valid: Array,
    num_segments: int,
    batch_size: int = 1024,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[Array, Array, Array]:
    """Per-segment sums of loss and correct predictions, and counts, over rows ``x, y``.

    Rows run in batches of ``batch_size`` under ``lax.map``, each sliced in place (memory: one
    batch of activations, a few floats per row and per segment). With a ``mesh`` of n devices
    (axis ``clients``) the batches are split into n groups, one per device. Returns
    ``(loss_sum, correct_sum, count)``, each float32[num_segments].
    """
    n = x.shape[0]
    n_dev = 1 if mesh is None else mesh.devices.size
    batch_size = max(1, min(batch_size, -(-n // n_dev)))
    nb = -(-n // batch_size)
    nb = -(-nb // n_dev) * n_dev

    def one(args):
        # per-row masked loss and correct flags: the batches stack to n floats, and one
        # segment sum at the end keeps memory at O(n + num_segments)
        xb, yb, vb = args
        out = model.apply(params, xb)
        w = vb.astype(jnp.float32)
        loss = model.loss(out, yb) * w
        correct = model.correct(out, yb) * w if model.correct is not None else jnp.zeros_like(w)
        return loss, correct

    if n_dev > 1:  # nb batches padded to a multiple of the devices, split among them
        from jax.sharding import NamedSharding, PartitionSpec

        pad = nb * batch_size - n

        def padded(a, value=0):
            a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1), constant_values=value)
            return a.reshape((nb, batch_size) + a.shape[1:])

        xs, ys, segs, vals = padded(x), padded(y), padded(segment), padded(valid, False)

        sharding = NamedSharding(mesh, PartitionSpec("clients"))

        def split(a):
            a = a.reshape((n_dev, nb // n_dev) + a.shape[1:])
            return jax.lax.with_sharding_constraint(a, sharding)

        loss, correct = jax.vmap(lambda g: jax.lax.map(one, g))(jax.tree.map(split, (xs, ys, vals)))
    elif nb > 1:
        # each batch sliced from the rows in place: padding them to a whole number of batches
        # copied the data set (4 GB at 10^6 clients) on every call. The last batch ends at row
        # n, and rows an earlier batch already counted get weight 0.
        def sliced(i):
            first = i * batch_size
            start = jnp.minimum(first, n - batch_size)
            fresh = start + jnp.arange(batch_size) >= first

            def rows(a):
                return jax.lax.dynamic_slice_in_dim(a, start, batch_size)

            vb = rows(valid) & fresh
            loss, correct = one((rows(x), rows(y), vb))
            return loss, correct, rows(segment), vb

        loss, correct, segs, vals = jax.lax.map(sliced, jnp.arange(nb))
    else:  # one batch holds every row
        segs, vals = segment, valid
        loss, correct = one((x, y, valid))
    flat_segs, w = segs.reshape(-1), vals.reshape(-1).astype(jnp.float32)
    return (
        jax.ops.segment_sum(loss.reshape(-1), flat_segs, num_segments),
        jax.ops.segment_sum(correct.reshape(-1), flat_segs, num_segments),
        jax.ops.segment_sum(w, flat_segs, num_segments),
    )


def evaluate_central(
    model: Model,
    params: Params,
    x: Array,
    y: Array,
    batch_size: int = 1024,
    valid: Array | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[Array, Array]:
    """Mean loss and accuracy (NaN for regression) on a centralised test set (the rows where
    ``valid``, when given); split over the devices of ``mesh``."""
    seg = jnp.zeros((x.shape[0],), jnp.int32)
    if valid is None:
        valid = jnp.ones((x.shape[0],), bool)
    loss, correct, count = segment_sums(model, params, x, y, seg, valid, 1, batch_size, mesh)
    acc = correct[0] / count[0] if model.correct is not None else jnp.nan
    return loss[0] / count[0], acc


# activations one pass of an all-client evaluation may hold: small models run many clients a
# pass, since each pass of XLA:CPU's loop costs tens of microseconds on its own (10^6
# clients of 20 rows in passes of 1,024 rows: 1.6-2.2 s against 1.2 s in passes of 16,384)
EVAL_PASS_BYTES = 16 * 2**20


def activation_bytes_per_row(model: Model, params: Params, data: ClientData) -> int:
    """Bytes of every value the model's forward pass computes for one example (its traced
    program's outputs, summed: an upper bound on what one example holds at a time)."""
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    stored = jax.ShapeDtypeStruct((1,) + data.feature_shape, data.x.dtype)
    row = jax.eval_shape(data._features, stored)  # shapes only: nothing joins a traced round
    jaxpr = jax.make_jaxpr(model.apply)(spec, row)
    return sum(v.aval.size * v.aval.dtype.itemsize for e in jaxpr.eqns for v in e.outvars)


def eval_rows(model: Model, params: Params, data: ClientData, batch_size: int) -> int:
    """Rows per pass of an all-client evaluation: ``batch_size``, or more where the model's
    activations for more rows fit :data:`EVAL_PASS_BYTES`."""
    per_row = max(activation_bytes_per_row(model, params, data), 1)
    return max(int(batch_size), EVAL_PASS_BYTES // per_row)


def padded_client_sums(
    model: Model, params: Params, data: ClientData, batch_size: int = 1024
) -> tuple[Array, Array, Array]:
    """:func:`segment_sums` of a padded layout's clients, without the segments.

    Whole clients run in chunks of about ``batch_size`` rows (``lax.map``), each chunk a slice
    ``x[c:c + chunk]`` read in place and summed over its ``n_max`` positions. The last chunk
    ends at client K and its clients an earlier chunk counted are dropped (a static slice).
    Three segment sums of every stored row (2 x 10^7 at 10^6 clients) cost more than the
    forward pass itself on a CPU. Returns ``(loss_sum, correct_sum, count)``, each
    float32[K]."""
    k, n_max = data.x.shape[:2]
    chunk = max(1, min(k, batch_size // n_max))
    nb = -(-k // chunk)
    positions = jnp.arange(n_max)

    def one(i):
        start = jnp.minimum(i * chunk, k - chunk)

        def rows(a):
            return jax.lax.dynamic_slice_in_dim(a, start, chunk)

        x, y, counts = rows(data.x), rows(data.y), rows(data.counts)
        x, y = x.reshape((chunk * n_max,) + x.shape[2:]), y.reshape((chunk * n_max,) + y.shape[2:])
        out = model.apply(params, data._features(x))
        w = (positions[None, :] < counts[:, None]).astype(jnp.float32)
        loss = model.loss(out, y).reshape(chunk, n_max)
        if model.correct is None:
            correct = jnp.zeros_like(w)
        else:
            correct = model.correct(out, y).reshape(chunk, n_max)
        return jnp.sum(loss * w, 1), jnp.sum(correct * w, 1), jnp.sum(w, 1)

    sums = jax.lax.map(one, jnp.arange(nb))
    overlap = nb * chunk - k  # the last chunk's first clients, counted by the one before

    def per_client(a):
        return jnp.concatenate([a[:-1].reshape(-1), a[-1, overlap:]]) if nb > 1 else a[0]

    return tuple(per_client(a) for a in sums)


def evaluate_all_clients(
    model: Model,
    params: Params,
    data: ClientData,
    batch_size: int = 1024,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[Array, Array, Array]:
    """Per-client mean loss, accuracy and example count over all of each client's examples,
    in one pass over every stored row (split over the devices of ``mesh``; a padded layout on
    one device runs whole clients in chunks, :func:`padded_client_sums`). Clients without
    examples get NaN."""
    if data.layout == "padded" and (mesh is None or mesh.devices.size == 1):
        loss, correct, count = padded_client_sums(model, params, data, batch_size)
    else:
        x, y, client, valid = data.rows()
        loss, correct, count = segment_sums(
            model, params, x, y, client, valid, data.num_clients, batch_size, mesh
        )
    denom = jnp.where(count > 0, count, jnp.nan)
    return loss / denom, correct / denom, count


def client_losses(
    model: Model,
    params: Params,
    data: ClientData,
    clients: Array,
    batch_size: int = 256,
    group: int = 8,
) -> Array:
    """Mean loss of ``params`` on each listed client's whole data (float32[n]).

    Each client walks its examples in chunks of ``batch_size`` (a ``while_loop``). The clients
    are sorted by size and run in groups of ``group`` (``vmap`` inside a group, ``lax.map`` over
    groups), so a group's loop runs to its own largest client rather than every client to the
    largest listed one (skewed sizes otherwise pad most of the work).
    """
    clients = jnp.asarray(clients, jnp.int32)
    n = clients.shape[0]
    if n > group:
        order = jnp.argsort(data.counts[clients])
        padded = -(-n // group) * group
        ids = jnp.concatenate([clients[order], jnp.broadcast_to(clients[order[0]], (padded - n,))])
        out = jax.lax.map(
            lambda g: client_losses(model, params, data, g, batch_size, group),
            ids.reshape(-1, group),
        ).reshape(-1)[:n]
        return jnp.zeros((n,), out.dtype).at[order].set(out)

    def one(client):
        count = data.counts[client]
        chunks = (count + batch_size - 1) // batch_size

        def body(state):
            j, total = state
            pos = j * batch_size + jnp.arange(batch_size)
            x, y, mask = data.gather(client, pos)
            loss = model.loss(model.apply(params, x), y)
            return j + 1, total + jnp.sum(loss * mask)

        _, total = jax.lax.while_loop(
            lambda s: s[0] < chunks, body, (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))
        )
        return total / jnp.maximum(count, 1)

    return jax.vmap(one)(clients)


# clients per chunk of client_batch_losses: a minibatch of every one of 10^6 clients gathered
# at once is 10^6 x 32 rows (7.7 GB of 60 float32 features); a chunk's stays in cache
BATCH_LOSS_CHUNK = 8192


def client_batch_losses(
    model: Model,
    params: Params,
    data: ClientData,
    clients: Array,
    key: PRNGKey,
    batch_size: int,
    chunk: int = BATCH_LOSS_CHUNK,
) -> Array:
    """Mean loss on one random minibatch (with replacement; the whole data when smaller), of
    each listed client (float32[n]). More than ``chunk`` clients run ``chunk`` at a time
    (``lax.map`` over chunks, ``vmap`` inside), so memory is bounded whatever n; each client's
    draw depends only on ``key`` and its id, so the result does not depend on ``chunk``.

    Where no client holds more than ``batch_size`` examples (known from the shapes), every
    minibatch is its client's whole data: nothing is drawn and only the largest client's
    positions are read (1.87 -> 1.1-1.2 s at 10^6 clients of at most 20 examples and
    minibatches of 32, ``benchmarks/million_selection_parts.py``)."""
    largest = data.x.shape[1] if data.layout == "padded" else data.n_max
    whole = 0 < largest <= batch_size
    clients = jnp.asarray(clients, jnp.int32)
    n = clients.shape[0]
    if n > chunk:
        padded = -(-n // chunk) * chunk
        ids = jnp.concatenate([clients, jnp.broadcast_to(clients[0], (padded - n,))])
        out = jax.lax.map(
            lambda g: client_batch_losses(model, params, data, g, key, batch_size, chunk),
            ids.reshape(-1, chunk),
        )
        return out.reshape(-1)[:n]

    def one(client, draw: bool):
        pos = jnp.arange(largest if whole else batch_size)
        if draw:
            count = data.counts[client]
            k = jax.random.fold_in(key, client)
            pos = jnp.where(
                count <= batch_size,
                pos,
                jax.random.randint(k, (batch_size,), 0, jnp.maximum(count, 1)),
            )
        x, y, mask = data.gather(client, pos)
        loss = model.loss(model.apply(params, x), y)
        return jnp.sum(loss * mask) / jnp.maximum(jnp.sum(mask), 1)

    if whole:  # positions past the largest client would only be masked out
        return jax.vmap(lambda c: one(c, False))(clients)
    # where no listed client holds more than a minibatch, every draw would be discarded: skip
    # them (the same positions, so the same losses; 3.21 -> 1.87 s at 10^6 clients of at most
    # 20 examples, benchmarks/results/cpu_xeon/million_selection_parts.json)
    return members_cond(
        jnp.all(data.counts[clients] <= batch_size),
        jax.vmap(lambda c: one(c, False)),
        jax.vmap(lambda c: one(c, True)),
        clients,
    )
