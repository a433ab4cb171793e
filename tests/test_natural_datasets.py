"""The published federated files read back as written: small LEAF JSON folders, TFF HDF5 and
FedJAX SQLite files built here (a few writers of unequal sizes, a held-out test split per
writer), loaded through ``load_dataset`` and checked client by client against what the test
wrote; clear errors for missing and malformed files; a run on them from the command line."""

from __future__ import annotations

import json
import sqlite3
import zlib

import h5py  # the federated extra, also in the test extra
import msgpack  # a flax dependency
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.data import load_dataset
from fedjax_sel.data import shakespeare as sp

WRITERS = {"f0003_12": (7, 3), "f0001_40": (12, 4), "f0002_08": (2, 1)}  # train, test sizes


def _pixels(rng, n):
    return rng.integers(0, 256, (n, 784)) / 255.0  # LEAF: floats that are k / 255


def _write_leaf(root, per_user, split_files=2):
    """LEAF's layout: train/ and test/ folders, users spread over several JSON files."""
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        users = sorted(per_user)
        for f in range(split_files):
            mine = users[f::split_files]
            data = {
                "users": mine,
                "num_samples": [len(per_user[u][split][1]) for u in mine],
                "user_data": {
                    u: {"x": per_user[u][split][0], "y": per_user[u][split][1]} for u in mine
                },
            }
            (root / split / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(
                json.dumps(data)
            )


@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory):
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("femnist")
    per_user = {}
    for u, (n_train, n_test) in WRITERS.items():
        per_user[u] = {
            split: (_pixels(rng, n).tolist(), rng.integers(0, 62, n).tolist())
            for split, n in (("train", n_train), ("test", n_test))
        }
    _write_leaf(root / "data", per_user)
    return root, per_user


def _client(cd, k):
    x, y = cd.client_arrays(k)
    return np.asarray(x), np.asarray(y)


def test_femnist_reads_every_writer_with_its_own_split(femnist_dir):
    root, per_user = femnist_dir
    ds = load_dataset("femnist", data_path=root)  # the task folder, LEAF's data/ below it
    ids = sorted(WRITERS)
    assert ds.num_clients == 3 and ds.info["clients"] == ids
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 62
    assert ds.train.x.dtype == np.uint8  # exact multiples of 1/255: stored compactly
    for k, u in enumerate(ids):
        for split, data in (("train", ds.train), ("test", ds.test)):
            x, y = _client(data, k)
            want_x = np.asarray(per_user[u][split][0], np.float32).reshape(-1, 28, 28, 1)
            np.testing.assert_allclose(x, want_x, atol=1e-7)
            np.testing.assert_array_equal(y, per_user[u][split][1])
    # the central test set is the union of the writers' test splits
    assert ds.test_x.shape[0] == sum(t for _, t in WRITERS.values())
    assert not ds.info["clients_subsampled"] and ds.info["clients_in_files"] == 3


def test_a_seeded_subset_of_writers_says_so(femnist_dir):
    root, _ = femnist_dir
    ds = load_dataset("femnist", data_path=root, num_clients=2, seed=5)
    again = load_dataset("femnist", data_path=root, num_clients=2, seed=5)
    assert ds.num_clients == 2 and ds.info["clients"] == again.info["clients"]
    assert set(ds.info["clients"]) < set(WRITERS)
    assert ds.info["clients_subsampled"] and ds.info["subsample_seed"] == 5
    with pytest.raises(ConfigError, match="femnist has 3 clients in its files but 9 were asked"):
        load_dataset("femnist", data_path=root, num_clients=9)


def test_shakespeare_and_synthetic_leaf(tmp_path):
    rng = np.random.default_rng(1)
    text = "To be, or not to be: that is the question. Whether 'tis nobler in the mind" * 3
    per_user = {}
    for r, (n_train, n_test) in zip(("HAMLET", "OPHELIA"), ((5, 2), (3, 1)), strict=True):

        def snippets(n):
            starts = rng.integers(0, len(text) - 81, n)
            return [text[s : s + 80] for s in starts], [text[s + 80] for s in starts]

        per_user[r] = {"train": snippets(n_train), "test": snippets(n_test)}
    _write_leaf(tmp_path / "shakespeare", per_user, split_files=1)
    ds = load_dataset("shakespeare_leaf", data_path=tmp_path / "shakespeare")
    assert ds.num_clients == 2 and ds.num_classes == sp.VOCAB_SIZE
    x, y = _client(ds.train, 0)  # HAMLET
    np.testing.assert_array_equal(x[1], sp.encode(per_user["HAMLET"]["train"][0][1]))
    np.testing.assert_array_equal(y, sp.encode("".join(per_user["HAMLET"]["train"][1])))

    synth = {f"u{i}": {s: (rng.normal(size=(n, 6)).tolist(), rng.integers(0, 4, n).tolist())
                       for s, n in (("train", 4 + i), ("test", 2))} for i in range(3)}  # fmt: skip
    _write_leaf(tmp_path / "synthetic", synth)
    ds = load_dataset("synthetic_leaf", data_path=tmp_path / "synthetic", num_classes=4)
    assert [int(c) for c in np.asarray(ds.train.counts)] == [4, 5, 6]
    x, _ = _client(ds.train, 2)
    np.testing.assert_allclose(x, np.asarray(synth["u2"]["train"][0], np.float32))


def _write_tff(path, clients: dict[str, dict[str, np.ndarray]]):
    with h5py.File(path, "w") as f:
        for cid, feats in clients.items():
            for k, v in feats.items():
                f.create_dataset(f"examples/{cid}/{k}", data=v)


def _fedjax_pack(x):
    """FedJAX's msgpack extensions, written out here from its documented format."""
    if isinstance(x, np.ndarray) and x.dtype == object:
        return msgpack.ExtType(4, msgpack.packb((x.shape, list(x.reshape(-1)))))
    if isinstance(x, np.ndarray):
        return msgpack.ExtType(1, msgpack.packb((x.shape, x.dtype.name, x.tobytes("C"))))
    raise TypeError(type(x))


def _write_fedjax(path, clients: dict[str, dict[str, np.ndarray]]):
    """FedJAX's SQLite layout: one row per client, zlib over msgpack of its features."""
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, "
        "num_examples INTEGER NOT NULL)"
    )
    for cid, feats in clients.items():
        blob = zlib.compress(msgpack.packb(feats, default=_fedjax_pack, strict_types=True))
        n = len(next(iter(feats.values())))
        con.execute("INSERT INTO federated_data VALUES (?, ?, ?)", (cid.encode(), blob, n))
    con.commit()
    con.close()


def _write(file_format, folder, tff_stem, fedjax_stem, split, clients):
    if file_format == "tff":
        _write_tff(folder / f"{tff_stem}_{split}.h5", clients)
    else:
        _write_fedjax(folder / f"{fedjax_stem}_{split}.sqlite", clients)


@pytest.mark.parametrize("file_format", ["tff", "fedjax"])
def test_emnist_writers_from_tff_hdf5_and_fedjax_sqlite(tmp_path, file_format):
    rng = np.random.default_rng(2)
    sizes = {"f0000_14": (9, 2), "f0001_41": (3, 1), "f0005_26": (14, 3)}
    files = {"train": {}, "test": {}}
    for cid, (n_train, n_test) in sizes.items():
        for split, n in (("train", n_train), ("test", n_test)):
            files[split][cid] = {
                "pixels": (rng.integers(0, 256, (n, 28, 28)) / 255.0).astype(np.float32),
                "label": rng.integers(0, 62, n).astype(np.int32),
            }
    for split in files:
        _write(file_format, tmp_path, "fed_emnist", "federated_emnist", split, files[split])
    ds = load_dataset("emnist_writers", data_path=tmp_path, format=file_format)
    assert ds.num_clients == 3 and ds.num_classes == 62
    assert ds.info["source"].startswith("TFF HDF5" if file_format == "tff" else "FedJAX SQLite")
    for k, cid in enumerate(sizes):  # file order
        for split, data in (("train", ds.train), ("test", ds.test)):
            x, y = _client(data, k)
            np.testing.assert_allclose(x[..., 0], files[split][cid]["pixels"], atol=1e-7)
            np.testing.assert_array_equal(y, files[split][cid]["label"])
    missing = {"tff": "fed_emnist_digitsonly_train.h5", "fedjax": "emnist_digitsonly_train.sqlite"}
    with pytest.raises(ConfigError, match=f"{missing[file_format]}' not found"):
        load_dataset("emnist_writers", data_path=tmp_path, only_digits=True, format=file_format)


def test_fedjax_sqlite_path_with_uri_characters_is_a_path_and_nothing_is_created(tmp_path):
    """A folder named ``d?mode=rwc#`` holds FedJAX files: they load (the path is escaped in
    the ``file:`` URI, not read as URI options), and no file ``d`` is created beside it; a
    missing file there is a ConfigError and still creates nothing."""
    from fedjax_sel.data.federated_files import fedjax_client_ids

    folder = tmp_path / "d?mode=rwc#"
    folder.mkdir()
    feats = {"pixels": np.zeros((2, 28, 28), np.float32), "label": np.array([1, 2], np.int32)}
    for split in ("train", "test"):
        _write_fedjax(folder / f"federated_emnist_{split}.sqlite", {"c": feats})
    ds = load_dataset("emnist_writers", data_path=folder, format="fedjax")
    assert ds.num_clients == 1
    with pytest.raises(ConfigError, match="not found"):
        fedjax_client_ids(folder / "missing.sqlite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d?mode=rwc#"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "federated_emnist_test.sqlite",
        "federated_emnist_train.sqlite",
    ]


@pytest.mark.parametrize("file_format", ["tff", "fedjax"])
def test_cifar100_pachinko_and_shakespeare_from_tff_hdf5_and_fedjax_sqlite(tmp_path, file_format):
    rng = np.random.default_rng(3)

    def cifar(n):
        fine = rng.integers(0, 100, n)
        return {
            "image": rng.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8),
            "label": fine.astype(np.int64),
            "coarse_label": (fine // 5).astype(np.int64),
        }

    train = {str(i): cifar(n) for i, n in enumerate((4, 7))}
    test = {str(i): cifar(3) for i in (100, 101)}  # TFF's test clients are others
    _write(file_format, tmp_path, "fed_cifar100", "federated_cifar100", "train", train)
    _write(file_format, tmp_path, "fed_cifar100", "federated_cifar100", "test", test)
    ds = load_dataset("cifar100_tff", data_path=tmp_path, label="coarse", format=file_format)
    assert ds.num_classes == 20 and ds.test is None and ds.test_x.shape[0] == 6
    x, y = _client(ds.train, 1)
    np.testing.assert_allclose(x, train["1"]["image"] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(y, train["1"]["coarse_label"])

    line = "Now is the winter of our discontent made glorious summer by this sun of York; "
    snip = {"THE_TRAGEDY_OF_KING_RICHARD_THE_THIRD_GLOUCESTER": [line * 2, line[:40]],
            "THE_TRAGEDY_OF_KING_RICHARD_THE_THIRD_ANNE": ["short"]}  # fmt: skip
    for split in ("train", "test"):
        _write(file_format, tmp_path, "shakespeare", "shakespeare", split,
               {c: {"snippets": np.array([s.encode() for s in v], dtype=object)}
                for c, v in snip.items()})  # fmt: skip
    ds = load_dataset("shakespeare_tff", data_path=tmp_path, stride=10, format=file_format)
    # ANNE's only snippet is shorter than one window: not a client (and said so)
    assert ds.num_clients == 1 and ds.info["clients_without_a_full_window"] == 1
    x, y = _client(ds.train, 0)
    want_x, want_y = sp.windows(sp.encode(line * 2), 80, 10)  # never across two snippets
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)


def one_user(folder, **user):
    data = {"users": ["w"], "user_data": {"w": user}}
    (folder / "train" / "a.json").write_text(json.dumps(data))


def test_bad_files_get_errors_that_name_them(tmp_path, femnist_dir):
    with pytest.raises(
        ConfigError, match=r"femnist: no folder with train/, test/ found.*--data-dir"
    ):
        load_dataset("femnist", data_path=tmp_path / "nowhere")
    bad = tmp_path / "bad"
    (bad / "train").mkdir(parents=True)
    (bad / "test").mkdir()
    (bad / "train" / "a.json").write_text(json.dumps({"users": ["w"], "num_samples": [2],
                                                      "user_data": {"w": {"x": [[0.0] * 784],
                                                                          "y": [1]}}}))  # fmt: skip
    (bad / "test" / "a.json").write_text(json.dumps({"users": [], "user_data": {}}))
    with pytest.raises(ConfigError, match=r"user 'w': num_samples says 2, user_data has 1"):
        load_dataset("femnist", data_path=bad)
    (bad / "train" / "a.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"a.json' is not valid JSON"):
        load_dataset("femnist", data_path=bad)
    one_user(bad, x=[[0.0] * 784], y=[70])
    with pytest.raises(ConfigError, match=r"labels must lie in \[0, 62\), got 70..70"):
        load_dataset("femnist", data_path=bad)
    one_user(bad, x=[], y=[])
    with pytest.raises(ConfigError, match=r"1 client\(s\) have no training examples"):
        load_dataset("femnist", data_path=bad)
    _write_tff(tmp_path / "fed_emnist_train.h5", {"c": {"pixels": np.zeros((2, 28, 28))}})
    _write_tff(tmp_path / "fed_emnist_test.h5", {"c": {"pixels": np.zeros((1, 28, 28))}})
    with pytest.raises(
        ConfigError, match=r"client 'c': no feature 'label' \(it has \['pixels'\]\)"
    ):
        load_dataset("emnist_writers", data_path=tmp_path)
    (tmp_path / "fed_emnist_train.h5").write_text("not hdf5")
    with pytest.raises(ConfigError, match="is not an HDF5 file"):
        load_dataset("emnist_writers", data_path=tmp_path)
    # FedJAX SQLite: a missing feature, a record that is not FedJAX's, a file that is not a
    # database, a database without FedJAX's table, an unknown format
    sq = tmp_path / "sq"
    sq.mkdir()
    _write_fedjax(sq / "federated_emnist_train.sqlite", {"c": {"pixels": np.zeros((2, 28, 28))}})
    _write_fedjax(sq / "federated_emnist_test.sqlite", {"c": {"pixels": np.zeros((1, 28, 28))}})
    with pytest.raises(
        ConfigError, match=r"client 'c': no feature 'label' \(it has \['pixels'\]\)"
    ):
        load_dataset("emnist_writers", data_path=sq, format="fedjax")
    con = sqlite3.connect(sq / "federated_emnist_train.sqlite")
    con.execute("UPDATE federated_data SET data = ?", (b"not zlib",))
    con.commit()
    con.close()
    with pytest.raises(ConfigError, match=r"client 'c': not a FedJAX record"):
        load_dataset("emnist_writers", data_path=sq, format="fedjax")
    objects = zlib.compress(
        msgpack.packb({"pixels": msgpack.ExtType(1, msgpack.packb(((1,), "object", b"x")))})
    )
    con = sqlite3.connect(sq / "federated_emnist_train.sqlite")
    con.execute("UPDATE federated_data SET data = ?", (objects,))
    con.commit()
    con.close()
    with pytest.raises(ConfigError, match="arrays must be numeric, got dtype object"):
        load_dataset("emnist_writers", data_path=sq, format="fedjax")
    sqlite3.connect(sq / "other.sqlite").execute("CREATE TABLE t (a)").connection.commit()
    (sq / "federated_emnist_train.sqlite").unlink()
    (sq / "other.sqlite").rename(sq / "federated_emnist_train.sqlite")
    with pytest.raises(ConfigError, match=r"has no 'federated_data' table .* it has \['t'\]"):
        load_dataset("emnist_writers", data_path=sq, format="fedjax")
    (sq / "federated_emnist_train.sqlite").write_bytes(b"not a database at all" * 50)
    with pytest.raises(ConfigError, match="is not an SQLite database"):
        load_dataset("emnist_writers", data_path=sq, format="fedjax")
    with pytest.raises(ConfigError, match=r"format must be one of \['fedjax', 'tff'\], got 'csv'"):
        load_dataset("emnist_writers", data_path=sq, format="csv")
    root, _ = femnist_dir
    with pytest.raises(ConfigError, match="keeps the published train/test split"):
        load_dataset("femnist", data_path=root, test_fraction=0.2)


def test_non_finite_features_are_refused_naming_the_file_and_the_client(tmp_path):
    """NaN or infinity in a LEAF JSON or TFF HDF5 file is refused at load (the run would
    otherwise diverge and blame the learning rate)."""
    leaf = tmp_path / "leaf"
    (leaf / "train").mkdir(parents=True)
    (leaf / "test").mkdir()
    (leaf / "test" / "a.json").write_text(json.dumps({"users": [], "user_data": {}}))
    for bad in (float("nan"), float("inf")):
        one_user(leaf, x=[[0.5] * 783 + [bad]], y=[1])  # json writes NaN / Infinity
        with pytest.raises(ConfigError, match=r"a.json', user 'w': x holds a non-finite value"):
            load_dataset("femnist", data_path=leaf)
    pixels = np.zeros((2, 28, 28), np.float32)
    pixels[1, 3, 4] = np.nan
    _write_tff(tmp_path / "fed_emnist_train.h5", {"c": {"pixels": pixels, "label": [0, 1]}})
    _write_tff(tmp_path / "fed_emnist_test.h5", {"c": {"pixels": pixels[:1], "label": [0]}})
    with pytest.raises(
        ConfigError, match=r"fed_emnist_train.h5, client 'c': pixels holds a non-finite value"
    ):
        load_dataset("emnist_writers", data_path=tmp_path)


def test_an_hdf5_dataset_claiming_more_than_the_memory_is_refused_before_it_is_read(tmp_path):
    """A header's claimed size is checked against the free memory (no MemoryError)."""
    with h5py.File(tmp_path / "fed_emnist_train.h5", "w") as f:  # chunked: nothing written
        f.create_dataset("examples/c/pixels", shape=(2**34, 28, 28), dtype="f4", chunks=True)
        f.create_dataset("examples/c/label", data=np.zeros(2, np.int32))
    _write_tff(tmp_path / "fed_emnist_test.h5", {"c": {"pixels": np.zeros((1, 28, 28))}})
    with pytest.raises(
        ConfigError,
        match=r"fed_emnist_train.h5', client 'c', feature 'pixels' \(shape \(17179869184, 28, "
        r"28\), dtype float32\) needs 49 TiB of memory, more than the .* free",
    ):
        load_dataset("emnist_writers", data_path=tmp_path)


@pytest.mark.slow
def test_run_on_leaf_files_from_the_command_line(femnist_dir, tmp_path, capsys):
    root, _ = femnist_dir
    out = tmp_path / "run"
    rc = main(["run", "--dataset", "femnist", "--data-dir", str(root), "--model", "logreg",
               "--per-round", "2", "--rounds", "2", "--eval-every", "1", "--local-steps", "2",
               "--batch-size", "4", "--no-progress", "--out", str(out)])  # fmt: skip
    assert rc == 0
    config = json.loads((out / "config.json").read_text())
    assert config["dataset"]["clients"] == sorted(WRITERS)  # one client per writer, as filed
    assert config["dataset"]["num_clients"] == 3 and not config["dataset"]["clients_subsampled"]
    assert main(["run", "--dataset", "femnist", "--data-dir", str(tmp_path / "none"),
                 "--rounds", "1", "--no-progress"]) == 2  # fmt: skip
    assert "no folder with train/, test/ found" in capsys.readouterr().err


def test_pixels_that_are_not_multiples_of_1_255_keep_float32_for_every_writer(tmp_path):
    rng = np.random.default_rng(4)
    per_user = {
        "exact": {s: (_pixels(rng, 3).tolist(), [1, 2, 3]) for s in ("train", "test")},
        "blurred": {s: ((_pixels(rng, 3) * 0.999).tolist(), [4, 5, 6]) for s in ("train", "test")},
    }
    _write_leaf(tmp_path / "data", per_user, split_files=1)
    ds = load_dataset("femnist", data_path=tmp_path)
    assert ds.train.x.dtype == np.float32 and ds.train.x_scale is None
    for k, u in enumerate(sorted(per_user)):
        x, _ = _client(ds.train, k)
        want = np.asarray(per_user[u]["train"][0], np.float32).reshape(-1, 28, 28, 1)
        np.testing.assert_allclose(x, want, atol=1e-7)
