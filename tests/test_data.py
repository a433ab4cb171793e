"""Federated data: storage layouts, partitioners, generators, loaders."""

from __future__ import annotations

import io
import sys
import types
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import (
    client_data,
    clustered_regression,
    dirichlet,
    from_client_arrays,
    from_parts,
    iid,
    leaf_synthetic,
    load_dataset,
    loaders,
    natural,
    parse_partition,
    shakespeare,
    shards,
)
from fedjax_sel.data.synthetic import leaf_synthetic_sizes


def _ragged(rng, sizes, dim=3):
    xs = [rng.normal(size=(n, dim)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, 5, n).astype(np.int32) for n in sizes]
    return xs, ys


@pytest.mark.parametrize("layout", ["padded", "flat", "padded, (client, position) pairs"])
def test_gather_returns_each_clients_own_examples(layout, monkeypatch):
    if layout.startswith("padded,"):  # the path for row numbers past int32
        monkeypatch.setattr(client_data, "FLAT_ROWS_LIMIT", 0)
        layout = "padded"
    rng = np.random.default_rng(0)
    sizes = [3, 7, 1, 5]
    xs, ys = _ragged(rng, sizes)
    data = from_client_arrays(xs, ys, layout=layout)
    assert data.layout == layout and data.n_max == 7
    clients = jnp.array([1, 3, 2, 0])
    pos = jnp.tile(jnp.arange(8), (4, 1))
    x, y, mask = data.gather(clients, pos)
    for slot, c in enumerate([1, 3, 2, 0]):
        n = sizes[c]
        np.testing.assert_array_equal(np.asarray(mask[slot]), np.arange(8) < n)
        np.testing.assert_array_equal(np.asarray(x[slot, :n]), xs[c])
        np.testing.assert_array_equal(np.asarray(y[slot, :n]), ys[c])


@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_rows_cover_every_example_once(layout):
    rng = np.random.default_rng(1)
    sizes = [2, 6, 4]
    xs, ys = _ragged(rng, sizes)
    data = from_client_arrays(xs, ys, layout=layout)
    x, y, client, valid = (np.asarray(a) for a in data.rows())
    for c, n in enumerate(sizes):
        sel = (client == c) & valid
        assert sel.sum() == n
        np.testing.assert_array_equal(x[sel], xs[c])
    counts = np.asarray(data.label_counts(5))
    for c in range(3):
        np.testing.assert_array_equal(counts[c], np.bincount(ys[c], minlength=5))


def test_auto_layout_picks_flat_for_skewed_sizes():
    rng = np.random.default_rng(2)
    xs, ys = _ragged(rng, [1000] + [5] * 50)
    assert from_client_arrays(xs, ys).layout == "flat"
    xs, ys = _ragged(rng, [10] * 20)
    assert from_client_arrays(xs, ys).layout == "padded"


def test_large_arrays_are_assembled_on_device_in_chunks(monkeypatch):
    """Above the size threshold a data set is scattered into a device buffer a chunk at a
    time; the result is the host assembly's, bit for bit, in both layouts (also with a last
    chunk shorter than the others and a client without examples)."""
    from fedjax_sel.data import client_data

    rng = np.random.default_rng(4)
    x = rng.normal(size=(300, 3, 2)).astype(np.float32)
    y = rng.integers(0, 7, 300).astype(np.int32)
    perm = rng.permutation(300)
    parts = [perm[:40], perm[40:41], perm[41:41], perm[41:200], perm[200:290]]
    for layout in ("padded", "flat"):
        host = from_parts(x, y, parts, layout=layout, allow_empty=True)
        monkeypatch.setattr(client_data, "CHUNKED_ASSEMBLY_BYTES", 0)
        monkeypatch.setattr(client_data, "ASSEMBLY_CHUNK_ROWS", 64)
        chunked = from_parts(x, y, parts, layout=layout, allow_empty=True)
        monkeypatch.undo()
        assert chunked.layout == host.layout == layout
        for a, b in ((chunked.x, host.x), (chunked.y, host.y)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        # and what each client holds is its part of the pool, in order (NumPy)
        for c, p in enumerate(parts):
            got_x, got_y = host.client_arrays(c)
            np.testing.assert_array_equal(np.asarray(got_x), x[p])
            np.testing.assert_array_equal(np.asarray(got_y), y[p])


def test_empty_client_is_rejected():
    with pytest.raises(ConfigError, match="hold no examples"):
        from_parts(np.zeros((4, 2)), np.zeros(4), [np.arange(4), np.array([], int)])


def test_iid_partition_uses_every_index_once():
    parts = iid(103, 10, np.random.default_rng(0))
    allidx = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(103))
    assert {len(p) for p in parts} <= {10, 11}


def _mean_label_entropy(labels, parts, num_classes):
    ent = []
    for p in parts:
        h = np.bincount(labels[p], minlength=num_classes) / len(p)
        h = h[h > 0]
        ent.append(-(h * np.log(h)).sum())
    return float(np.mean(ent))


def test_dirichlet_partition_properties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 5000)
    parts = dirichlet(labels, 20, 0.1, np.random.default_rng(1), min_size=10)
    allidx = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(5000))
    assert min(len(p) for p in parts) >= 10
    skewed = _mean_label_entropy(labels, parts, 10)
    flat = _mean_label_entropy(labels, dirichlet(labels, 20, 100.0, np.random.default_rng(1)), 10)
    # log(10) = 2.30 for uniform labels; strong skew is far below it
    assert flat > 2.2 and skewed < 1.5


def test_dirichlet_rejects_bad_alpha_and_impossible_min_size():
    labels = np.zeros(50, int)
    with pytest.raises(ConfigError, match="alpha"):
        dirichlet(labels, 5, 0.0, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="min_size=20"):
        dirichlet(labels, 5, 1.0, np.random.default_rng(0), min_size=20)


def test_shards_partition_gives_few_labels_per_client():
    labels = np.repeat(np.arange(10), 100)
    parts = shards(labels, 20, 2, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert max(len(np.unique(labels[p])) for p in parts) <= 2


def test_natural_partition_groups():
    groups = np.array([3, 1, 3, 2, 1, 1])
    parts = natural(groups)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [3], [0, 2]]
    with pytest.raises(ConfigError, match="3 groups"):
        natural(groups, 4)


def test_parse_partition():
    assert parse_partition("iid") == ("iid", {})
    assert parse_partition("dirichlet:0.1") == ("dirichlet", {"alpha": 0.1})
    assert parse_partition("dirichlet:alpha=0.5,min_size=3") == (
        "dirichlet",
        {"alpha": 0.5, "min_size": 3},
    )
    assert parse_partition("shards:3") == ("shards", {"shards_per_client": 3})
    for bad in ["foo", "dirichlet", "dirichlet:abc", "iid:3", "dirichlet:0.1,beta=2"]:
        with pytest.raises(ConfigError):
            parse_partition(bad)


def test_leaf_synthetic_sizes_follow_lognormal_recipe():
    sizes = leaf_synthetic_sizes(jax.random.key(0), 4000)
    assert sizes.min() >= 50
    # floor(LogNormal(4, 2)) + 50 has median floor(e^4) + 50 = 104
    assert abs(np.median(sizes) - 104) < 8


def test_leaf_synthetic_iid_feature_covariance_is_the_recipes():
    x, y, client = leaf_synthetic(jax.random.key(0), 40, iid=True)
    assert x.shape[1] == 60 and len(y) == len(client) == len(x)
    # IID: v_k = 0 and x ~ N(0, diag((j + 1)^-1.2))
    var = x.var(axis=0)
    expected = np.arange(1, 61) ** -1.2
    np.testing.assert_allclose(var, expected, rtol=0.15)
    np.testing.assert_allclose(x.mean(axis=0), 0.0, atol=0.05)
    assert set(np.unique(y)) <= set(range(10))


def test_leaf_synthetic_labels_are_more_heterogeneous_than_iid():
    def spread(iid_flag):
        _, y, client = leaf_synthetic(jax.random.key(3), 30, 1.0, 1.0, iid=iid_flag)
        hist = np.stack([np.bincount(y[client == k], minlength=10) for k in range(30)])
        hist = hist / hist.sum(1, keepdims=True)
        return np.abs(hist - hist.mean(0)).sum(1).mean()

    assert spread(False) > 1.5 * spread(True)


def test_leaf_synthetic_personal_scale_plants_one_shared_model():
    """``personal_scale``: every client's model is the shared ``W, b`` (the generator's own
    draws, recomputed here) plus scaled personal noise. At 0 the shared model labels every row;
    at 0.5 most rows; the plain recipe (no shared model) about one in ten, chance."""
    key = jax.random.key(5)
    ks = jax.random.split(key, 9)
    w = np.asarray(jax.random.normal(ks[3], (60, 10)))
    b = np.asarray(jax.random.normal(ks[4], (10,)))

    def agreement(scale):
        x, y, _ = leaf_synthetic(key, 200, personal_scale=scale, max_examples=30)
        return np.mean(np.argmax(x @ w + b, axis=1) == y)

    assert agreement(0.0) == 1.0
    assert 0.5 < agreement(0.5) < 0.95
    assert agreement(None) < 0.25
    with pytest.raises(ConfigError, match="personal_scale"):
        leaf_synthetic(key, 5, personal_scale=-1.0)


def test_offset_normal_is_a_slice_of_the_whole_draw():
    """Rows ``start ... start + m - 1`` of a normal draw, drawn alone, are those of the whole
    draw (any rank; rows past the whole draw's end too: a larger draw's)."""
    from fedjax_sel.data.synthetic import _counters, offset_normal

    key = jax.random.key(11)
    for shape in [(50,), (50, 7), (50, 6, 5)]:
        whole = np.asarray(jax.random.normal(key, shape))
        for start, m in [(0, 50), (13, 9), (49, 1)]:
            part = np.asarray(offset_normal(key, (m,) + shape[1:], start))
            np.testing.assert_array_equal(part, whole[start : start + m])
    longer = np.asarray(jax.random.normal(key, (60, 7)))
    np.testing.assert_array_equal(np.asarray(offset_normal(key, (20, 7), 40)), longer[40:])
    # 64-bit counters across a 2^32 boundary: one carry into the high word
    start = (3 << 32) + 2**32 - 5
    hi, lo = _counters(np.uint32(start >> 32), np.uint32(start & 0xFFFFFFFF), 10)
    want = start + np.arange(10, dtype=np.uint64)
    np.testing.assert_array_equal(np.asarray(hi, np.uint64), want >> np.uint64(32))
    np.testing.assert_array_equal(np.asarray(lo, np.uint64), want & np.uint64(0xFFFFFFFF))


def _leaf_synthetic_whole(key, k, *, personal_scale=None, chunk_rows=16384, **size_args):
    """LEAF Synthetic as first written: every client's ``v, W, b`` drawn as whole K-row arrays,
    rows made chunk by chunk from them (the reference of the block-wise generator)."""
    dim, c = 60, 10
    ks = jax.random.split(key, 9)
    sizes = leaf_synthetic_sizes(ks[0], k, **size_args)
    u = 1.0 * jax.random.normal(ks[1], (k,))
    big_b = 1.0 * jax.random.normal(ks[2], (k,))
    add = jax.jit(lambda d, s: d + s.reshape((-1,) + (1,) * (d.ndim - 1)))
    v = add(jax.random.normal(ks[5], (k, dim)), big_b)
    w = add(jax.random.normal(ks[6], (k, dim, c)), u)
    b = add(jax.random.normal(ks[7], (k, c)), u)
    if personal_scale is not None:
        around = jax.jit(lambda p, s, a: s[None] + a * p)
        w = around(w, jax.random.normal(ks[3], (dim, c)), personal_scale)
        b = around(b, jax.random.normal(ks[4], (c,)), personal_scale)
    sd = jnp.power(jnp.arange(1, dim + 1, dtype=jnp.float32), -0.6)

    @jax.jit
    def rows(key, cl, v, w, b, sd):
        x = v[cl] + sd * jax.random.normal(key, (cl.shape[0], v.shape[1]))
        logits = jnp.einsum("rd,rdc->rc", x, w[cl]) + b[cl]
        return x, jnp.argmax(logits, axis=-1).astype(jnp.int32)

    client = np.repeat(np.arange(k, dtype=np.int32), sizes)
    n = len(client)
    size = min(chunk_rows, n)
    xs, ys = [], []
    for i, start in enumerate(range(0, n, size)):
        cl = client[start : start + size]
        x, y = rows(
            jax.random.fold_in(ks[8], i), jnp.asarray(np.pad(cl, (0, size - len(cl)))), v, w, b, sd
        )
        xs.append(np.asarray(x)[: len(cl)])
        ys.append(np.asarray(y)[: len(cl)])
    return np.concatenate(xs), np.concatenate(ys), client


@pytest.mark.parametrize(
    "k, chunk_rows, args",
    [
        (40, 16384, {}),  # one chunk, one block of every client
        (60, 64, {"max_examples": 20, "personal_scale": 0.5}),  # ~3 clients per chunk
        (90, 50, {"examples_per_client": 2}),  # 25 clients per chunk, a ragged last block
    ],
)
def test_leaf_synthetic_block_parameters_equal_whole_draws(k, chunk_rows, args):
    """The generator draws ``v, W, b`` a block of clients at a time; rows are bit for bit
    those made from whole K-row draws."""
    key = jax.random.key(3)
    size_args = {a: args[a] for a in ("max_examples", "examples_per_client") if a in args}
    want = _leaf_synthetic_whole(
        key, k, personal_scale=args.get("personal_scale"), chunk_rows=chunk_rows, **size_args
    )
    got = leaf_synthetic(key, k, chunk_rows=chunk_rows, **args)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_leaf_synthetic_without_partitionable_draws_uses_whole_draws():
    """Where a draw's bits depend on its whole size (``jax_threefry_partitionable`` off), the
    generator draws whole K-row parameters, and still makes the recipe's rows."""
    key = jax.random.key(4)
    with jax.threefry_partitionable(False):
        want = _leaf_synthetic_whole(key, 30, chunk_rows=64, max_examples=20)
        got = leaf_synthetic(key, 30, chunk_rows=64, max_examples=20)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def _assembled_reference(x, y, sizes, test_fraction, seed, layout):
    """A generated data set as NumPy assembles it in plain loops: each client's rows shuffled
    by the seed's generator, its first round(f n) rows (at most n - 1) held out, both parts
    sorted; padded arrays filled client by client; the central test set in client order."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    train, test = [], []
    for s, n in zip(starts, sizes, strict=True):
        p = rng.permutation(np.arange(s, s + n))
        m = min(int(round(test_fraction * n)), n - 1)
        test.append(np.sort(p[:m]))
        train.append(np.sort(p[m:]))

    def stacked(parts):
        n_max = max(max(len(p) for p in parts), 1)
        kind = layout
        if kind == "auto":
            total = sum(len(p) for p in parts)
            kind = "padded" if len(parts) * n_max <= 1.5 * total else "flat"
        if kind == "flat":
            rows = np.concatenate(parts)
            return kind, x[rows], y[rows]
        px = np.zeros((len(parts), n_max) + x.shape[1:], x.dtype)
        py = np.zeros((len(parts), n_max), y.dtype)
        for c, p in enumerate(parts):
            px[c, : len(p)] = x[p]
            py[c, : len(p)] = y[p]
        return kind, px, py

    central = np.concatenate(test)
    return stacked(train), stacked(test), (x[central], y[central])


@pytest.mark.parametrize(
    "k, args",
    [
        (120, {"max_examples": 20, "personal_scale": 0.5}),  # the bench scale recipe, padded
        (30, {}),  # LogNormal sizes: flat
        (25, {"layout": "padded", "test_fraction": 0.3}),
        (200, {"examples_per_client": 5, "test_fraction": 0.2, "layout": "flat"}),
    ],
)
def test_leaf_synthetic_data_set_equals_a_plain_numpy_assembly(k, args):
    """``load_dataset("leaf_synthetic")`` writes generated rows straight into the final
    train, test and central test arrays; they equal the generator's pool split and padded by
    plain NumPy loops (train and test x, y and counts, the central test set)."""
    args = dict(args)
    seed, layout = 2, args.pop("layout", "auto")
    test_fraction = args.pop("test_fraction", 0.1)
    ds = load_dataset(
        "leaf_synthetic",
        num_clients=k,
        seed=seed,
        layout=layout,
        test_fraction=test_fraction,
        **args,
    )
    x, y, client = leaf_synthetic(jax.random.key(seed), k, **args)
    sizes = np.bincount(client, minlength=k)
    train, test, central = _assembled_reference(x, y, sizes, test_fraction, seed, layout)
    for got, (kind, want_x, want_y) in ((ds.train, train), (ds.test, test)):
        assert got.layout == kind
        for a, b in ((got.x, want_x), (got.y, want_y)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(np.asarray(a), b)
    n_test = np.array([min(int(round(test_fraction * n)), n - 1) for n in sizes])
    np.testing.assert_array_equal(np.asarray(ds.test.counts), n_test)
    np.testing.assert_array_equal(np.asarray(ds.train.counts), sizes - n_test)
    np.testing.assert_array_equal(np.asarray(ds.test_x), central[0])
    np.testing.assert_array_equal(np.asarray(ds.test_y), central[1])


def test_from_row_chunks_equals_from_parts():
    """Data sets assembled from a pool made chunk by chunk (each chunk made once, the last
    one padded) equal :func:`from_parts` and plain row selection on the whole pool, for any
    parts (shuffled, empty clients) in both layouts."""
    from fedjax_sel.data.client_data import RowChunks, from_row_chunks

    rng = np.random.default_rng(5)
    n, size = 230, 32
    x = rng.normal(size=(n, 3, 2)).astype(np.float32)
    y = rng.integers(0, 9, n).astype(np.int32)
    made = []

    def make(i):
        made.append(i)
        rows = np.arange(i * size, (i + 1) * size)
        rows = np.minimum(rows, n - 1)  # padding past the pool: never stored
        return jnp.asarray(x[rows]), jnp.asarray(y[rows])

    pool = RowChunks(
        n, size, make, jax.ShapeDtypeStruct((3, 2), x.dtype), jax.ShapeDtypeStruct((), y.dtype)
    )
    perm = rng.permutation(n)
    parts_a = [perm[:40], perm[40:41], perm[41:41], perm[41:150]]
    parts_b = [np.sort(perm[150:200]), perm[200:230]]
    central = rng.permutation(n)[:70]
    for layout in ("padded", "flat"):
        made.clear()
        (a, b), (rows,) = from_row_chunks(
            pool, [(parts_a, True), (parts_b, False)], [central], layout=layout
        )
        assert sorted(made) == list(range(pool.num_chunks))
        for got, parts in ((a, parts_a), (b, parts_b)):
            want = from_parts(x, y, parts, layout=layout, allow_empty=True)
            assert (got.layout, got.n_max) == (want.layout, want.n_max)
            for f in ("x", "y", "counts", "offsets"):
                u, v = getattr(got, f), getattr(want, f)
                assert u.shape == v.shape and u.dtype == v.dtype
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        np.testing.assert_array_equal(np.asarray(rows[0]), x[central])
        np.testing.assert_array_equal(np.asarray(rows[1]), y[central])
    with pytest.raises(ConfigError, match="listed twice"):
        from_row_chunks(pool, [([np.array([3, 4]), np.array([4])], False)])


def _split_reference(parts, fraction, rng):
    """Per client: permute, the first round(f * n) (at most n - 1) are the test part."""
    train, test = [], []
    for p in parts:
        p = rng.permutation(p)
        n_test = min(int(round(fraction * len(p))), len(p) - 1)
        test.append(np.sort(p[:n_test]))
        train.append(np.sort(p[n_test:]))
    return train, test


def test_split_train_test_flat_makes_the_same_split():
    """The flat split, and split_train_test's lists of it, draw what a plain per-client loop
    draws (the generator ends in the same state) and hold the same parts, empty and
    one-example clients included."""
    from fedjax_sel.data.partition import FlatParts, split_train_test, split_train_test_flat

    sizes = np.array([20, 1, 0, 7, 33, 2, 20, 5])
    parts = FlatParts.ranges(sizes)
    assert [len(p) for p in parts] == sizes.tolist() and len(parts) == len(sizes)
    for fraction in (0.0, 0.1, 0.25, 0.5):
        r1, r2, r3 = (np.random.default_rng(9) for _ in range(3))
        want = _split_reference([np.asarray(p) for p in parts], fraction, r1)
        for got in (
            split_train_test_flat(parts, fraction, r2),
            split_train_test([np.asarray(p) for p in parts], fraction, r3),
        ):
            for g, w in zip(got, want, strict=True):
                assert len(g) == len(w)
                for a, b in zip(g, w, strict=True):
                    np.testing.assert_array_equal(a, b)
        assert r1.bit_generator.state == r2.bit_generator.state == r3.bit_generator.state


def test_clustered_regression_is_linear_in_its_cluster():
    x, y, client, cluster = clustered_regression(
        jax.random.key(0), 20, 1, dim=1, intercept=True, theta_std_range=(0.0, 0.0)
    )
    assert x.shape == (2000, 2)
    np.testing.assert_array_equal(x[:, 1], 1.0)
    coef, res, *_ = np.linalg.lstsq(x, y, rcond=None)
    assert np.allclose(x @ coef, y, atol=1e-4)
    x2, y2, client2, cluster2 = clustered_regression(jax.random.key(1), 60, 2)
    assert set(np.unique(cluster2)) == {0, 1}
    slopes = [
        np.polyfit(
            x2[np.isin(client2, np.flatnonzero(cluster2 == j)), 0],
            y2[np.isin(client2, np.flatnonzero(cluster2 == j))],
            1,
        )[0]
        for j in (0, 1)
    ]
    assert abs(slopes[0] - slopes[1]) > 0.1


def test_load_digits_dataset():
    ds = load_dataset("digits", num_clients=10, partition="dirichlet:0.5", seed=0)
    assert ds.num_clients == 10 and ds.num_classes == 10 and ds.input_shape == (8, 8, 1)
    total = int(np.asarray(ds.train.counts).sum()) + int(np.asarray(ds.test.counts).sum())
    assert total == 1797
    assert float(ds.test_x.max()) <= 1.0 and len(ds.test_y) == int(np.asarray(ds.test.counts).sum())
    again = load_dataset("digits", num_clients=10, partition="dirichlet:0.5", seed=0)
    np.testing.assert_array_equal(np.asarray(ds.train.x), np.asarray(again.train.x))


def test_server_fraction_holds_out_a_disjoint_set():
    ds = load_dataset(
        "digits", num_clients=8, partition="iid", seed=0, test_fraction=0.1, server_fraction=0.2
    )
    assert ds.server_x.shape[0] == ds.info["num_server_examples"]
    n_test = int(np.asarray(ds.test.counts).sum())
    assert int(np.asarray(ds.train.counts).sum()) + ds.server_x.shape[0] + n_test == 1797
    rows = np.asarray(ds.train.rows()[0]).reshape(-1, 64)
    server = np.asarray(ds.server_x).reshape(-1, 64)
    train_set = {r.tobytes() for r in rows}
    # digits has a few duplicated images; allow those, require the split itself to be disjoint
    shared = sum(r.tobytes() in train_set for r in server)
    assert shared <= 5
    counts = np.bincount(np.asarray(ds.server_y), minlength=10)
    assert counts.min() > 0.5 * counts.mean()


def test_a_data_set_module_of_any_name_is_found(tmp_path, monkeypatch):
    """A module of ``fedjax_sel.data`` that registers a data set is imported the first time the
    registry is read, whatever its name (no ``dataset_`` prefix), and its builder's
    ``assemble`` takes the registration's default model; a private module is not imported."""
    import fedjax_sel.data as data_pkg
    from fedjax_sel.data.datasets import DATASETS

    (tmp_path / "my_blobs.py").write_text(
        "import numpy as np\n"
        "from fedjax_sel.data import assemble, partition_by_client, register_dataset\n"
        "@register_dataset('my_blobs', description='test', default_clients=4,\n"
        "                  default_partition='natural', default_model='mlp')\n"
        "def my_blobs(*, num_clients, partition, seed, data_path, test_fraction, layout):\n"
        "    client = np.repeat(np.arange(num_clients), 10)\n"
        "    x = np.arange(len(client) * 2, dtype=np.float32).reshape(-1, 2)\n"
        "    return assemble('my_blobs', x, (client % 2).astype(np.int32),\n"
        "                    partition_by_client(client, num_clients),\n"
        "                    rng=np.random.default_rng(seed), test_fraction=0.2, layout=layout,\n"
        "                    task='classification', num_classes=2, info={})\n"
    )
    (tmp_path / "_scratch.py").write_text("raise AssertionError('a private module is imported')\n")
    monkeypatch.setattr(data_pkg, "__path__", [*data_pkg.__path__, str(tmp_path)])
    monkeypatch.setattr(DATASETS, "_loaded", False)  # read again: the package scan runs again
    try:
        ds = load_dataset("my_blobs", num_clients=4)
        assert ds.num_clients == 4 and ds.default_model == "mlp"
        assert int(np.asarray(ds.train.counts).sum()) == 4 * 8
    finally:
        DATASETS.unregister("my_blobs")
        sys.modules.pop("fedjax_sel.data.my_blobs", None)


def test_load_dataset_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="unknown data set 'nope'"):
        load_dataset("nope")
    with pytest.raises(ConfigError, match="no option"):
        load_dataset("digits", foo=1)
    with pytest.raises(ConfigError, match="natural"):
        load_dataset("leaf_synthetic", partition="iid")
    with pytest.raises(ConfigError, match="cannot split 1797 examples among 5000"):
        load_dataset("digits", num_clients=5000, partition="iid")


def test_mnist_from_local_npz(data_dir):
    ds = load_dataset(
        "mnist", num_clients=20, partition="dirichlet:0.1", seed=0, data_path=data_dir / "mnist.npz"
    )
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10
    assert int(np.asarray(ds.train.counts).sum()) == 60000
    assert ds.test_x.shape == (10000, 28, 28, 1)
    assert ds.train.x.dtype == jnp.uint8  # stored compactly, scaled on the way out
    x, _, _ = ds.train.gather(jnp.array([0]), jnp.arange(4)[None])
    assert float(x.max()) <= 1.0
    # the data-dir variable alone finds it too
    ds2 = load_dataset("mnist", num_clients=20, partition="iid", seed=0)
    assert ds2.num_clients == 20


def test_malformed_and_missing_files_give_clear_errors(tmp_path, monkeypatch):
    bad = tmp_path / "mnist.npz"
    np.savez(bad, x_train=np.zeros((5, 28, 28), np.uint8), y_train=np.zeros(5))
    with pytest.raises(ConfigError, match=r"lacks the array\(s\) \['x_test', 'y_test'\]"):
        load_dataset("mnist", num_clients=2, partition="iid", data_path=bad)
    np.savez(
        bad,
        x_train=np.zeros((5, 20, 20)),
        y_train=np.zeros(5),
        x_test=np.zeros((2, 28, 28)),
        y_test=np.zeros(2),
    )
    with pytest.raises(ConfigError, match="shape"):
        load_dataset("mnist", num_clients=2, partition="iid", data_path=bad)
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ConfigError, match="cannot read"):
        load_dataset("mnist", num_clients=2, partition="iid", data_path=tmp_path / "junk.npz")
    with pytest.raises(ConfigError, match="does not exist"):
        load_dataset("mnist", data_path=tmp_path / "missing.npz")
    # offline, no file, no tensorflow-datasets: says what to provide
    monkeypatch.setenv("FEDJAX_SEL_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ConfigError, match="FEDJAX_SEL_DATA_DIR"):
        load_dataset("cifar10", num_clients=2, partition="iid")


def _npy_bytes(shape, descr="<f4"):
    """An .npy header claiming ``shape`` (and 16 bytes of data: the file is tiny)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue() + bytes(16)


def test_npz_members_claiming_more_than_the_memory_are_refused_before_they_are_read(tmp_path):
    """An .npz member whose header claims more than the free memory was a MemoryError."""
    path = tmp_path / "mnist.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x_train.npy", _npy_bytes((2**40, 28, 28)))
        for name in ("y_train", "x_test", "y_test"):
            z.writestr(f"{name}.npy", _npy_bytes((1,)))
    with pytest.raises(
        ConfigError,
        match=r"mnist data file '.*mnist.npz', array 'x_train' \(shape \(1099511627776, 28, "
        r"28\), dtype float32\) needs 3.06 PiB of memory",
    ):
        load_dataset("mnist", num_clients=2, partition="iid", data_path=path)


def test_npz_pixels_and_labels_must_be_whole_numbers(tmp_path):
    """Float pixels (NaN, or 0..1 that uint8 would truncate to 0) are refused, not misread."""
    path = tmp_path / "mnist.npz"
    for x in (np.full((4, 28, 28), np.nan), np.full((4, 28, 28), 0.5)):
        np.savez(path, x_train=x, y_train=np.zeros(4, int), x_test=x, y_test=np.zeros(4, int))
        with pytest.raises(ConfigError, match="x_train in .* must hold whole numbers"):
            load_dataset("mnist", num_clients=2, partition="iid", data_path=path)


def test_tensorflow_datasets_path_with_a_fake_tfds(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    fake = types.ModuleType("tensorflow_datasets")
    calls = {}

    def load(name, split, batch_size, as_supervised, data_dir):
        calls["name"] = name
        assert batch_size == -1 and as_supervised
        return [
            (rng.integers(0, 255, (40, 32, 32, 3)), rng.integers(0, 10, 40)),
            (rng.integers(0, 255, (10, 32, 32, 3)), rng.integers(0, 10, 10)),
        ]

    fake.load = load
    fake.as_numpy = lambda x: x
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    monkeypatch.setenv("FEDJAX_SEL_DATA_DIR", str(tmp_path))
    ds = load_dataset("cifar10", num_clients=4, partition="iid", seed=0)
    assert calls["name"] == "cifar10"
    assert ds.input_shape == (32, 32, 3) and ds.test_x.shape == (10, 32, 32, 3)
    assert loaders.load_image_dataset("cifar10").source == "tfds"


def test_shakespeare_parser_and_windows():
    text = (
        "A PLAY\n\nACT I.\n\nHam.\nTo be, or not to be: [Aside] that\nis the question.\n\n"
        "[Enter Ophelia.]\n\nOPHELIA\nGood my lord.\n\nHam.\nSoft you now!\n"
    )
    roles = shakespeare.parse_roles(text)
    assert set(roles) == {"HAM", "OPHELIA"}
    assert roles["HAM"] == "To be, or not to be: that\nis the question.\nSoft you now!"
    ids = shakespeare.encode("ab~c")
    assert shakespeare.VOCAB_SIZE == 80
    assert "".join(shakespeare.VOCAB[i] for i in ids) == "ab c"
    seq = np.arange(100) % 80
    x, y = shakespeare.windows(seq.astype(np.uint8), 80, 1)
    assert x.shape == (20, 80)
    np.testing.assert_array_equal(x[3], seq[3:83])
    assert y[3] == seq[83]


def test_shakespeare_dataset_from_texts(data_dir):
    ds = load_dataset("shakespeare", num_clients=6, seed=0, stride=40, min_examples=20)
    assert ds.num_classes == 80 and ds.input_shape == (80,)
    x, y = ds.train.client_arrays(0)
    # consecutive windows (stride 40) overlap by 40 characters
    np.testing.assert_array_equal(x[1][:40], x[0][40:])
    assert len(ds.info["roles"]) == 6 and all("/" in r for r in ds.info["roles"])
    with pytest.raises(ConfigError, match="roles"):
        load_dataset("shakespeare", num_clients=100000, stride=40)


def test_dirichlet_groups_skew_across_groups_only():
    # CA-Fed Fig. 5b: homogeneous within a group (contiguous id block), heterogeneous across
    from fedjax_sel.data.partition import parse_partition, partition

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 20_000)
    name, kwargs = parse_partition("dirichlet:alpha=0.3,groups=4")
    assert (name, kwargs) == ("dirichlet", {"alpha": 0.3, "groups": 4})
    parts = partition(name, kwargs, labels, 20, np.random.default_rng(1))
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)) == len(labels)  # a partition of the pool
    hist = np.stack([np.bincount(labels[p], minlength=10) / len(p) for p in parts])
    group = np.arange(20) * 4 // 20
    within = max(np.abs(hist[group == g] - hist[group == g].mean(0)).max() for g in range(4))
    across = np.abs(hist[group == 0].mean(0) - hist[group == 1].mean(0)).max()
    assert within < 0.08 < across  # iid split inside a group, Dirichlet(0.3) across groups
    sizes = np.array([len(p) for p in parts])
    for g in range(4):  # sizes within a group differ by at most one example
        assert np.ptp(sizes[group == g]) <= 1
    with pytest.raises(ConfigError, match="groups"):
        partition(name, {"alpha": 0.3, "groups": 30}, labels, 20, rng)
