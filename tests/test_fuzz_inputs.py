"""Fuzzing the input boundary: malformed configurations, sweep and suite files, and data files
(truncated, wrong types, non-finite values, headers claiming huge sizes, random bytes) are
either accepted or refused with a :class:`ConfigError`, never another exception; on the command
line a refusal is exit 2 and one line ``fedjax-sel: error: ...``, with nothing run or written.

Hypothesis draws the inputs from a fixed seed (``derandomize``), in a bounded number of
examples, so CI sees the same cases every time; nothing here runs a simulation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tempfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedjax_sel.availability.fedscale_trace import load_behaviour_trace
from fedjax_sel.availability.trace import load_trace
from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.suite import parse_suite
from fedjax_sel.cli.main import main
from fedjax_sel.config import RunConfig, read_config_file
from fedjax_sel.data import load_dataset
from fedjax_sel.data.loaders import load_npz
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.sweep import expand_sweep

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
FIELDS = [f.name for f in dataclasses.fields(RunConfig)]

# what a TOML or JSON file can hold, biased towards the values that broke the boundary before
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([-1, 0, 2**31, 2**32, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["12", "0.1", "none", "nan", "auto", "uniform", "digits", "all", "iid"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELD_TABLES = st.dictionaries(
    st.sampled_from([*FIELDS, "label", "seeds", "grid", "strategy", "bogus"]), VALUES, max_size=4
)


def accepted_or_config_error(fn, *args, **kwargs) -> None:
    """Calls ``fn``: a result or a ConfigError pass, any other exception fails the test."""
    with contextlib.suppress(ConfigError):
        fn(*args, **kwargs)


# ----------------------------------------------------------------------------- configurations
@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4))
def test_configurations(fields):
    accepted_or_config_error(lambda: resolve(RunConfig.from_dict(fields).validate()))


SWEEP_OPTIONS = st.dictionaries(
    st.sampled_from(
        [
            "seeds",
            "baseline",
            "seeds_together",
            "percent",
            "tune",
            "metrics",
            "at_rounds",
            "targets",
            "time_targets",
            "bogus",
        ]  # fmt: skip
    ),
    VALUES,
    max_size=3,
)


@FUZZ
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "sweep": st.one_of(SWEEP_OPTIONS, VALUES),
            "base": st.one_of(FIELD_TABLES, VALUES),
            "grid": st.one_of(
                st.dictionaries(st.sampled_from(FIELDS), st.lists(SCALARS, max_size=3)), VALUES
            ),
            "strategies": st.one_of(st.lists(FIELD_TABLES, max_size=2), VALUES),
            "override": st.one_of(FIELD_TABLES, VALUES),
            "bogus": VALUES,
        },
    )
)
def test_sweep_files(spec):
    with tempfile.TemporaryDirectory() as out:
        accepted_or_config_error(expand_sweep, spec, out)


@FUZZ
@given(
    st.fixed_dictionaries(
        {
            "suite": st.one_of(
                st.dictionaries(
                    st.sampled_from(["seeds", "baseline", "stable_fraction", "seeds_together"]),
                    VALUES,
                    max_size=3,
                ),
                VALUES,
            ),
            "tasks": st.one_of(st.dictionaries(st.text(max_size=3), FIELD_TABLES, max_size=2)),
            "scenarios": st.one_of(
                st.dictionaries(st.text(max_size=3), FIELD_TABLES, max_size=2), VALUES
            ),
            "strategies": st.one_of(
                st.lists(FIELD_TABLES.map(lambda t: {"strategy": "uniform", **t}), max_size=2),
                VALUES,
            ),
        },
        optional={"tuning": st.one_of(FIELD_TABLES, VALUES), "override": FIELD_TABLES},
    )
)
def test_suite_files(spec):
    accepted_or_config_error(parse_suite, spec)


# ----------------------------------------------------------------------------- data files
DESCRS = ["<f4", "<f8", "|u1", "<i8", "|b1", "<c16", "<U3", "|O", "<M8[s]", "|V4"]
SHAPES = st.lists(
    st.one_of(st.integers(0, 4), st.sampled_from([2**20, 2**40, 2**62])), max_size=3
).map(tuple)


def npy_bytes(shape: tuple, descr: str, payload: bytes) -> bytes:
    """An .npy header claiming ``shape`` and ``descr``, then ``payload`` (often too short)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buf.getvalue() + payload


NPY = st.one_of(
    st.builds(npy_bytes, SHAPES, st.sampled_from(DESCRS), st.binary(max_size=64)),
    st.binary(max_size=64),  # random bytes
    st.builds(
        lambda b, n: b"\x93NUMPY\x01\x00" + b[:n], st.binary(max_size=80), st.integers(0, 80)
    ),
)


@FUZZ
@given(NPY, st.sampled_from([".npy", ".npz", ".csv", ".txt"]), st.booleans())
def test_trace_files(data, suffix, zipped):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"trace{suffix}"
        if suffix == ".npz" and zipped:
            with zipfile.ZipFile(path, "w") as z:
                z.writestr("availability.npy", data)
        else:
            path.write_bytes(data)
        accepted_or_config_error(load_trace, path)


@FUZZ
@given(st.dictionaries(st.sampled_from(["x_train", "y_train", "x_test", "y_test", "z"]), NPY))
def test_keras_layout_npz_files(members):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "mnist.npz"
        with zipfile.ZipFile(path, "w") as z:
            for name, data in members.items():
                z.writestr(f"{name}.npy", data)
        accepted_or_config_error(load_npz, path, "mnist", 10, (28, 28, 1))


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 300), st.text(max_size=2)
)


@FUZZ
@given(
    st.lists(st.lists(NUMBERS, min_size=1, max_size=3), max_size=3),  # x rows (784 wide)
    st.one_of(st.lists(NUMBERS, max_size=3), VALUES),  # y
    st.one_of(st.none(), VALUES),  # num_samples
)
def test_leaf_json_folders(rows, y, num_samples):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        x = [(row * 784)[:784] for row in rows]
        user = {"users": ["w"], "user_data": {"w": {"x": x, "y": y}}}
        if num_samples is not None:
            user["num_samples"] = num_samples
        for split in ("train", "test"):
            (root / split).mkdir()
            (root / split / "a.json").write_text(json.dumps(user))  # NaN, Infinity as JSON does
        accepted_or_config_error(load_dataset, "femnist", data_path=root)


@FUZZ
@given(
    st.sampled_from(["<f4", "|u1", "<i8", "<f8", "|b1"]),
    st.lists(st.integers(0, 3), max_size=4).map(tuple),
    st.floats(allow_nan=True, allow_infinity=True),
    st.one_of(st.none(), st.sampled_from([(2**40, 28, 28), (2**20, 2**20, 28)])),
)
def test_tff_hdf5_files(dtype, shape, fill, claimed):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for split in ("train", "test"):
            with h5py.File(root / f"fed_emnist_{split}.h5", "w") as f:
                if claimed is not None and split == "train":  # chunked: nothing written
                    f.create_dataset("examples/c/pixels", shape=claimed, dtype="f4", chunks=True)
                else:
                    with np.errstate(invalid="ignore", over="ignore"):
                        pixels = np.full(shape, fill).astype(dtype)
                    f.create_dataset("examples/c/pixels", data=pixels)
                f.create_dataset("examples/c/label", data=np.zeros(shape[:1], np.int32))
        accepted_or_config_error(load_dataset, "emnist_writers", data_path=root)


@FUZZ
@given(
    st.one_of(
        st.dictionaries(
            st.text(max_size=3),
            st.one_of(
                st.fixed_dictionaries(
                    {"active": st.lists(NUMBERS, max_size=3)},
                    optional={"inactive": st.lists(NUMBERS, max_size=3), "finish_time": NUMBERS},
                ),
                VALUES,
            ),
            max_size=2,
        ),
        VALUES,
    )
)
def test_behaviour_traces(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        path.write_text(json.dumps(data))
        accepted_or_config_error(load_behaviour_trace, path)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([".toml", ".json"]))
def test_config_file_bytes(data, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"file{suffix}"
        path.write_bytes(data)
        accepted_or_config_error(read_config_file, path)


# ----------------------------------------------------------------------------- the command line
def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def assert_one_line_error(rc: int, err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("fedjax-sel: error: "), err
    assert "Traceback" not in err


BAD_FLAGS = st.one_of(
    st.tuples(
        st.sampled_from(["--seed", "--data-seed"]),
        st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)),
    ),
    st.tuples(
        st.sampled_from(["--rounds", "--per-round", "--clients", "--batch-size", "--eval-every"]),
        st.one_of(st.integers(max_value=0), st.integers(min_value=2**31)),
    ),
    st.tuples(
        st.sampled_from(["--lr", "--server-lr"]),
        st.one_of(st.floats(max_value=0.0), st.sampled_from([float("nan"), float("inf")])),
    ),
)


@settings(FUZZ, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=BAD_FLAGS)
def test_cli_refuses_bad_run_flags_with_one_line(flag, capsys, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    rc, err = run_cli(["run", "--no-progress", "--out", str(out), f"{flag[0]}={flag[1]}"], capsys)
    assert_one_line_error(rc, err)
    assert not out.exists()  # refused before anything was written


@settings(FUZZ, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=120), command=st.sampled_from(["sweep", "suite"]))
def test_cli_refuses_random_sweep_and_suite_files(data, command, capsys, tmp_path_factory):
    folder = tmp_path_factory.mktemp("file")
    path = folder / "file.toml"
    path.write_bytes(data)
    # random bytes are never a runnable sweep (no [base] or [[strategies]]) nor suite
    rc, err = run_cli([command, str(path), "--out", str(folder / "out"), "--no-progress"], capsys)
    assert_one_line_error(rc, err)
    assert not (folder / "out").exists()


@pytest.mark.parametrize(
    "text",
    [
        "",
        '[sweep]\nseeds = "12"\n[base]\nrounds = 1\n',
        "[sweep]\nseeds = [-1]\n[base]\nrounds = 1\n",
        "[sweep]\nseeds = 99999999999\n[base]\nrounds = 1\n",
        '[base]\nrounds = "5"\n',
        "[base]\nseed = 3\nrounds = 1\nnum_clients = 3\nper_round = 9\n",
    ],
)
def test_cli_refuses_meaningless_sweep_files_with_one_line(text, capsys, tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    rc, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert_one_line_error(rc, err)
    assert not (tmp_path / "out").exists()
