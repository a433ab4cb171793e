"""Readers of the published federated data files: one client per writer, role or user, with
each client's examples and published train/test split exactly as the files hold them.

* **LEAF JSON** (Caldas et al. 2018; ``leaf/data/<task>/data/{train,test}/*.json``): every file
  holds ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y":
  [...]}}}`` (and optionally ``"hierarchies"``); a user's train and test examples sit in the
  train and test folders under the same user id. FEMNIST's ``x`` is 784 floats, Shakespeare's
  an 80-character string with the next character as ``y``, Synthetic's a feature vector.
* **TensorFlow Federated HDF5** (``fed_emnist_train.h5``, ``fed_cifar100_train.h5``,
  ``shakespeare_train.h5`` ...): ``examples/<client_id>/<feature>`` datasets, one group per
  client, read client by client (h5py, the ``federated`` extra).
* **FedJAX SQLite** (``federated_emnist_train.sqlite``, ``federated_cifar100_train.sqlite``,
  ``shakespeare_train.sqlite`` ...): a table ``federated_data(client_id BLOB, data BLOB,
  num_examples INTEGER)``, one row per client, ``data`` a zlib-compressed msgpack map of
  feature -> array (FedJAX's ``serialization.msgpack_serialize``); decoded here with the
  standard library's sqlite3 and msgpack (a flax dependency), numeric arrays and byte strings
  only.

Files are read one at a time and each client's examples converted to compact arrays at once
(uint8 where the values are exact multiples of 1/255), so the peak stays near the size of the
final arrays. Nothing is unpickled or evaluated.
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data.loaders import DATA_DIR_ENV
from fedjax_sel.input_checks import check_array_bytes, check_finite


class ClientExamples(NamedTuple):
    """One client's examples as read: features and targets (host arrays)."""

    x: np.ndarray
    y: np.ndarray


# ----------------------------------------------------------------------------- locating files
def find_folder(name: str, path: str | os.PathLike | None, *subdirs: str) -> Path:
    """The folder holding ``subdirs`` for data set ``name``: ``path`` itself, ``path/data``
    (LEAF's layout) or ``path/<name>``, else the same under ``$FEDJAX_SEL_DATA_DIR/<name>``."""
    roots = []
    if path is not None:
        roots.append(Path(path).expanduser())
    elif os.environ.get(DATA_DIR_ENV):
        roots.append(Path(os.environ[DATA_DIR_ENV]).expanduser() / name)
    candidates = [c for r in roots for c in (r, r / "data", r / name, r / name / "data")]
    for c in candidates:
        if all((c / s).is_dir() for s in subdirs):
            return c
    looked = ", ".join(repr(str(c)) for c in candidates) or "nowhere: no --data-dir given"
    raise ConfigError(
        f"{name}: no folder with {'/, '.join(subdirs)}/ found (looked in {looked}); pass "
        f"--data-dir pointing at the data set's folder, or set {DATA_DIR_ENV} to a folder "
        f"holding {name}/"
    )


def find_file(name: str, path: str | os.PathLike | None, filename: str) -> Path:
    """The file ``filename`` of data set ``name``: ``path`` (the file, or a folder holding it),
    else ``$FEDJAX_SEL_DATA_DIR/<name>/filename`` or ``$FEDJAX_SEL_DATA_DIR/filename``."""
    candidates = []
    if path is not None:
        p = Path(path).expanduser()
        candidates += [p] if p.suffix else [p / filename, p / name / filename]
    elif os.environ.get(DATA_DIR_ENV):
        root = Path(os.environ[DATA_DIR_ENV]).expanduser()
        candidates += [root / name / filename, root / filename]
    for c in candidates:
        if c.is_file():
            return c
    looked = ", ".join(repr(str(c)) for c in candidates) or "nowhere: no --data-dir given"
    raise ConfigError(
        f"{name}: file {filename!r} not found (looked in {looked}); pass --data-dir with the "
        f"folder that holds it, or set {DATA_DIR_ENV}"
    )


# ----------------------------------------------------------------------------- compact arrays
def compact_pixels(x: np.ndarray) -> tuple[np.ndarray, float | None]:
    """``(stored, scale)``: uint8 with ``scale = 1/255`` where every value is an exact multiple
    of 1/255 in [0, 1] (a quarter of float32's memory, the same values), else float32."""
    x = np.asarray(x)
    if x.dtype == np.uint8:
        return x, 1.0 / 255.0
    x = x.astype(np.float32)
    q = np.rint(x * 255.0)
    if x.size and q.min() >= 0 and q.max() <= 255 and np.all(np.abs(q / 255.0 - x) < 1e-6):
        return q.astype(np.uint8), 1.0 / 255.0
    return x, None


# ----------------------------------------------------------------------------- LEAF JSON
def _leaf_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ConfigError(f"LEAF folder {str(folder)!r} holds no .json files")
    return files


def read_leaf_folder(
    folder: Path, convert: Callable[[list, list, str], ClientExamples]
) -> dict[str, ClientExamples]:
    """user -> examples for every user of every ``*.json`` file in ``folder`` (LEAF's train or
    test folder); ``convert(x, y, where)`` turns one user's JSON lists into arrays."""
    out: dict[str, ClientExamples] = {}
    for f in _leaf_files(folder):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"LEAF file {str(f)!r} is not valid JSON: {e}") from None
        if not isinstance(data, dict) or not {"users", "user_data"} <= set(data):
            raise ConfigError(
                f"LEAF file {str(f)!r} is not in LEAF's format: it needs 'users' and "
                f"'user_data' (got keys {sorted(data)[:6] if isinstance(data, dict) else []})"
            )
        users, user_data = data["users"], data["user_data"]
        if not (isinstance(users, list) and isinstance(user_data, dict)):
            raise ConfigError(
                f"LEAF file {str(f)!r}: 'users' must be a list and 'user_data' an object"
            )
        counts = data.get("num_samples", [None] * len(users))
        if not isinstance(counts, list) or len(counts) != len(users):
            raise ConfigError(
                f"LEAF file {str(f)!r}: {len(users)} users but num_samples {str(counts)[:40]}"
            )
        for user, n in zip(users, counts, strict=True):
            where = f"LEAF file {str(f)!r}, user {user!r}"
            entry = user_data.get(user) if isinstance(user, str) else None
            if not isinstance(entry, dict) or not {"x", "y"} <= set(entry):
                raise ConfigError(f"{where}: no user_data entry with 'x' and 'y'")
            if not (isinstance(entry["x"], list) and isinstance(entry["y"], list)):
                raise ConfigError(f"{where}: 'x' and 'y' must be lists of examples")
            if len(entry["x"]) != len(entry["y"]):
                raise ConfigError(
                    f"{where}: {len(entry['x'])} examples but {len(entry['y'])} targets"
                )
            if n is not None and not (isinstance(n, int) and n == len(entry["y"])):
                raise ConfigError(f"{where}: num_samples says {n}, user_data has {len(entry['y'])}")
            if user in out:
                raise ConfigError(f"{where}: the user appears in two files of {str(folder)!r}")
            try:
                examples = convert(entry["x"], entry["y"], where)
            except ConfigError:
                raise
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}: examples of an unexpected form ({e})") from None
            check_finite(examples.x, f"{where}: x")
            check_finite(examples.y, f"{where}: y")
            out[user] = examples
        del data
    return out


def read_leaf(
    name: str, path: str | os.PathLike | None, convert: Callable[[list, list, str], ClientExamples]
) -> tuple[dict[str, ClientExamples], dict[str, ClientExamples], Path]:
    """``(train, test, folder)`` of a LEAF data set: user -> examples, from ``train/`` and
    ``test/``."""
    folder = find_folder(name, path, "train", "test")
    train = read_leaf_folder(folder / "train", convert)
    test = read_leaf_folder(folder / "test", convert)
    stray = sorted(set(test) - set(train))
    if stray:
        raise ConfigError(
            f"{name}: {len(stray)} user(s) of {str(folder / 'test')!r} have no training examples "
            f"(first: {stray[0]!r}); LEAF's splits keep every user in train/"
        )
    return train, test, folder


# ----------------------------------------------------------------------------- TFF HDF5
def _h5py():
    try:
        import h5py
    except ImportError:
        raise ConfigError(
            "reading TensorFlow Federated's HDF5 files needs h5py: pip install "
            "'fedjax-sel[federated]'"
        ) from None
    return h5py


def tff_client_ids(path: Path) -> list[str]:
    """The client ids of a TFF HDF5 file (``examples/<client_id>``), in file order."""
    h5py = _h5py()
    try:
        with h5py.File(path, "r") as f:
            if not isinstance(f.get("examples"), h5py.Group):
                raise ConfigError(
                    f"TFF file {str(path)!r} has no 'examples' group (TFF's layout: "
                    "examples/<client_id>/<feature>)"
                )
            return list(f["examples"].keys())
    except OSError as e:
        raise ConfigError(f"TFF file {str(path)!r} is not an HDF5 file: {e}") from None


def iter_tff_clients(
    path: Path, features: tuple[str, ...], clients: list[str] | None = None
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``(client id, {feature: array})`` client by client (``clients``: those ids, in that
    order; default every client): one client's arrays in memory at a time."""
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        group = f["examples"]
        for cid in clients if clients is not None else list(group.keys()):
            if cid not in group:
                raise ConfigError(f"TFF file {str(path)!r}: no client {cid!r}")
            g = group[cid]
            where = f"TFF file {str(path)!r}, client {cid!r}"
            if not isinstance(g, h5py.Group):
                raise ConfigError(f"{where}: a client is a group of features, got {g}")
            missing = [k for k in features if not isinstance(g.get(k), h5py.Dataset)]
            if missing:
                raise ConfigError(f"{where}: no feature {missing[0]!r} (it has {sorted(g.keys())})")
            yield cid, {k: _read_dataset(g[k], f"{where}, feature {k!r}") for k in features}


def _read_dataset(dataset: Any, where: str) -> np.ndarray:
    """An HDF5 dataset's array, the size its header claims checked against memory first."""
    check_array_bytes(tuple(dataset.shape or ()), dataset.dtype, where)
    try:
        return dataset[()]
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"{where} cannot be read: {e}") from None


def tff_feature_lengths(path: Path, feature: str, clients: list[str]) -> np.ndarray:
    """int64[len(clients)]: the examples of ``feature`` held by each of ``clients`` in a TFF
    HDF5 file, read from the datasets' shapes (no example is read)."""
    h5py = _h5py()
    out = np.zeros(len(clients), np.int64)
    with h5py.File(path, "r") as f:
        group = f["examples"]
        for i, cid in enumerate(clients):
            if cid not in group:
                raise ConfigError(f"TFF file {str(path)!r}: no client {cid!r}")
            g = group[cid]
            if feature not in g:
                raise ConfigError(
                    f"TFF file {str(path)!r}, client {cid!r}: no feature {feature!r} "
                    f"(it has {sorted(g.keys())})"
                )
            shape = g[feature].shape
            out[i] = shape[0] if shape else 1
    return out


def subsample(
    ids: list[str], num_clients: int | None, seed: int, name: str
) -> tuple[list[str], dict[str, Any]]:
    """``num_clients`` of ``ids`` (a seeded subset, kept in file order) and what to record
    about it; every id when ``num_clients`` is ``None`` or covers them all."""
    total = len(ids)
    if num_clients is None or num_clients == total:
        return list(ids), {"clients_in_files": total, "clients_subsampled": False}
    if num_clients > total:
        raise ConfigError(f"{name} has {total} clients in its files but {num_clients} were asked")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(total, num_clients, replace=False))
    return [ids[i] for i in chosen], {
        "clients_in_files": total,
        "clients_subsampled": True,
        "subsample_seed": seed,
    }


# ----------------------------------------------------------------------------- FedJAX SQLite
# msgpack extension types of FedJAX's serialization (fedjax/core/serialization.py)
_FEDJAX_NDARRAY, _FEDJAX_SCALAR, _FEDJAX_BYTES_ARRAY = 1, 3, 4


def _sqlite(path: Path) -> sqlite3.Connection:
    """A read-only connection to a FedJAX file, its ``federated_data`` table checked. The
    path is percent-escaped into the ``file:`` URI, so characters such as ``?`` and ``#`` in
    a folder name are part of the path, never URI options (``mode=rwc`` would create a file);
    a missing file is a :class:`ConfigError`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"FedJAX file {str(path)!r} not found (or not a file)")
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise ConfigError(f"FedJAX file {str(path)!r} is not an SQLite database: {e}") from None
    if "federated_data" not in tables:
        con.close()
        raise ConfigError(
            f"FedJAX file {str(path)!r} has no 'federated_data' table (FedJAX's layout: "
            f"federated_data(client_id, data, num_examples)); it has {sorted(tables)}"
        )
    return con


def _fedjax_rows(con: sqlite3.Connection) -> dict[str, int]:
    """client id -> rowid, in row order (ids are stored as bytes; text is accepted too)."""
    rows = con.execute("SELECT rowid, client_id FROM federated_data ORDER BY rowid").fetchall()
    return {(c.decode("utf-8") if isinstance(c, bytes) else str(c)): r for r, c in rows}


def fedjax_client_ids(path: Path) -> list[str]:
    """The client ids of a FedJAX SQLite file, in its row order (FedJAX's iteration order)."""
    con = _sqlite(path)
    try:
        return list(_fedjax_rows(con))
    finally:
        con.close()


def decode_fedjax_record(blob: bytes, where: str) -> dict[str, np.ndarray]:
    """One client's examples from FedJAX's record: ``zlib`` over msgpack of ``{feature:
    array}``, arrays as msgpack extensions (numeric: ``(shape, dtype name, C-order bytes)``;
    byte strings: ``(shape, [bytes, ...])``). Anything else is refused."""
    import msgpack  # flax depends on it

    def ext(code: int, data: bytes):
        if code in (_FEDJAX_NDARRAY, _FEDJAX_SCALAR):
            shape, name, buffer = msgpack.unpackb(data, raw=True)
            dtype = np.dtype(name.decode("ascii"))
            if dtype.kind not in "biuf":
                raise ConfigError(f"{where}: arrays must be numeric, got dtype {dtype}")
            array = np.frombuffer(buffer, dtype).reshape(shape)
            return array if code == _FEDJAX_NDARRAY else array[()]
        if code == _FEDJAX_BYTES_ARRAY:
            shape, flat = msgpack.unpackb(data, raw=True)
            if not all(isinstance(b, bytes) for b in flat):
                raise ConfigError(f"{where}: a bytes array holds something else than bytes")
            return np.array(flat, dtype=object).reshape(shape)
        raise ConfigError(f"{where}: unknown msgpack extension type {code}")

    try:
        raw = zlib.decompress(blob)
        out = msgpack.unpackb(raw, ext_hook=ext, raw=False)
    except (zlib.error, ValueError, msgpack.exceptions.ExtraData, TypeError) as e:
        raise ConfigError(f"{where}: not a FedJAX record (zlib over msgpack): {e}") from None
    if not isinstance(out, dict):
        raise ConfigError(f"{where}: a FedJAX record is a map of features, got {type(out)}")
    return out


def iter_fedjax_clients(
    path: Path, features: tuple[str, ...], clients: list[str] | None = None
) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``(client id, {feature: array})`` client by client from a FedJAX SQLite file
    (``clients``: those ids, in that order; default every client in row order)."""
    con = _sqlite(path)
    try:
        rows = _fedjax_rows(con)
        for cid in clients if clients is not None else list(rows):
            if cid not in rows:
                raise ConfigError(f"FedJAX file {str(path)!r}: no client {cid!r}")
            sql = "SELECT data FROM federated_data WHERE rowid = ?"
            row = con.execute(sql, (rows[cid],)).fetchone()
            where = f"FedJAX file {str(path)!r}, client {cid!r}"
            arrays = decode_fedjax_record(row[0], where)
            missing = [k for k in features if k not in arrays]
            if missing:
                raise ConfigError(f"{where}: no feature {missing[0]!r} (it has {sorted(arrays)})")
            yield cid, {k: arrays[k] for k in features}
    finally:
        con.close()
