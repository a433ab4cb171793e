"""``fedjax-sel trace convert`` on a small file in FedScale's behaviour-trace format, checked
against availability worked out by hand."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

from fedjax_sel.availability.fedscale_trace import convert_behaviour_trace
from fedjax_sel.availability.trace import load_trace
from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main

# FedScale's client_behave_trace shape (file order a, b, c); c has no finish_time
TRACE = {
    "a": {"active": [0, 50], "inactive": [20, 70], "finish_time": 100, "duration": 100},
    "b": {"active": [10], "inactive": [30], "finish_time": 40, "duration": 40},
    "c": {"active": [5, 60], "inactive": [15, 90], "duration": 120},
}
# rounds of 10 s, times 0..110; our client k is FedScale's client k + 1 -> entry (k + 1) mod 3
BY_HAND = {
    "b": [0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1],  # t mod 40 in [10, 30]
    "c": [0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0],  # t mod 120 in [5, 15] or [60, 90]
    "a": [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1],  # t mod 100 in [0, 20] or [50, 70]
}
# FedScale's cursor advances one interval per query: at t = 80, 90 it moves on, and at
# t = 100, 110 (the period wrapped) it still looks at [50, 70]
FEDSCALE_A = [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0]


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "client_behave_trace"
    with path.open("wb") as f:
        pickle.dump(TRACE, f)
    return path


def test_interval_rule_matches_the_hand_worked_trace(trace_file):
    out = convert_behaviour_trace(trace_file, round_seconds=10, rounds=12)
    expected = np.array([BY_HAND["b"], BY_HAND["c"], BY_HAND["a"]], bool).T
    np.testing.assert_array_equal(out, expected)
    # more clients than entries wrap around in file order, as FedScale's client manager does
    wide = convert_behaviour_trace(trace_file, round_seconds=10, rounds=12, clients=5)
    np.testing.assert_array_equal(wide[:, 3], BY_HAND["b"])
    np.testing.assert_array_equal(wide[:, 4], BY_HAND["c"])
    shifted = convert_behaviour_trace(trace_file, round_seconds=10, rounds=10, start=20)
    np.testing.assert_array_equal(shifted, expected[2:])


def test_fedscale_rule_replays_its_cursor(trace_file):
    out = convert_behaviour_trace(trace_file, round_seconds=10, rounds=12, rule="fedscale")
    np.testing.assert_array_equal(out[:, 2], FEDSCALE_A)
    np.testing.assert_array_equal(out[:, 0], BY_HAND["b"])  # one interval: no lag


def test_cli_writes_a_trace_the_replay_reads(trace_file, tmp_path, capsys):
    out = tmp_path / "trace.npy"
    code = main(
        ["trace", "convert", str(trace_file), str(out), "--round-seconds", "10", "--rounds", "12"]
    )
    assert code == 0 and "12 rounds x 3 clients" in capsys.readouterr().out
    np.testing.assert_array_equal(load_trace(out)[:, 2], BY_HAND["a"])
    as_json = tmp_path / "trace.json"
    as_json.write_text(json.dumps(TRACE))
    csv = tmp_path / "trace.csv"
    assert (
        main(
            ["trace", "convert", str(as_json), str(csv), "--round-seconds", "10", "--rounds", "12"]
        )
        == 0
    )
    np.testing.assert_array_equal(load_trace(csv), load_trace(out))


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"active": [0], "inactive": [1, 2], "finish_time": 9}, "1 active and 2 inactive"),
        ({"active": [0], "inactive": [1]}, "finish_time"),
        ({"active": [5], "inactive": [1], "finish_time": 9}, "active <= inactive"),
        ({"active": [0], "inactive": [1], "finish_time": -3}, "period -3"),
    ],
)
def test_malformed_entries_are_named(tmp_path, entry, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"7": entry}))
    with pytest.raises(ConfigError, match=match):
        convert_behaviour_trace(path, round_seconds=10, rounds=3)


def test_cli_reports_bad_input_with_exit_2(tmp_path, capsys):
    assert (
        main(
            [
                "trace",
                "convert",
                str(tmp_path / "none.pkl"),
                str(tmp_path / "o.npy"),
                "--round-seconds",
                "10",
                "--rounds",
                "3",
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"active": [float("nan")], "inactive": [1], "finish_time": 9}, "holds the time nan"),
        ({"active": [0], "inactive": [float("inf")], "finish_time": 9}, "holds the time inf"),
        ({"active": [-4], "inactive": [1], "finish_time": 9}, "holds the time -4.0"),
    ],
)
def test_non_finite_or_negative_times_are_refused(tmp_path, entry, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"7": entry}))  # json writes NaN / Infinity
    with pytest.raises(ConfigError, match=match):
        convert_behaviour_trace(path, round_seconds=10, rounds=3)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--start", "nan"], "start must be a time in seconds >= 0, got nan"),
        (["--start=-inf"], "start must be a time in seconds >= 0, got -inf"),
        # the output's size against the free memory, before anything is allocated (this was
        # killed by the kernel at 24 GB)
        (["--rounds", "1000000000"], "a trace of 1000000000 rounds x 3 clients"),
        (["--rounds", "1000000000", "--clients", "100000"], "needs 182 TiB of memory"),
        (["--rounds", "0"], "--rounds must be a whole number in 1 .."),
    ],
)
def test_cli_refuses_meaningless_times_and_outputs_beyond_memory(
    trace_file, tmp_path, flags, message, capsys
):
    argv = ["trace", "convert", str(trace_file), str(tmp_path / "o.npy"), "--round-seconds", "1"]
    assert main([*argv, "--rounds", "3", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o.npy").exists()


def test_replay_files_of_the_wrong_kind_are_named(tmp_path):
    """Text, complex numbers, NaN and a header claiming more than the memory are refused."""
    for name, array, match in [
        ("s.npy", np.array([["1", "0"]]), "must hold numbers 0 and 1, got dtype <U1"),
        ("c.npy", np.ones((2, 2), complex), "got dtype complex128"),
        ("n.npy", np.full((2, 2), np.nan), "must hold only 0 and 1, found"),
    ]:
        np.save(tmp_path / name, array)
        with pytest.raises(ConfigError, match=match):
            load_trace(tmp_path / name)
    header = tmp_path / "huge.npy"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "|u1", "fortran_order": False, "shape": (2**45, 20)}
    )
    header.write_bytes(buf.getvalue())
    with pytest.raises(ConfigError, match=r"huge.npy' \(shape \(35184372088832, 20\), dtype "):
        load_trace(header)
