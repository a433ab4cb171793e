"""Two processes on localhost (JAX's multi-controller runtime, CPU devices, gloo collectives)
run one simulation and get the metrics of the one-process run; only process 0 writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ARGS = [
    "--model", "mlp", "--model-arg", "hidden=16", "--clients", "16", "--per-round", "8",
    "--rounds", "4", "--eval-every", "2", "--local-steps", "3", "--batch-size", "8",
    "--availability", "bernoulli:p=0.8", "--parallel", "vmap", "--no-progress",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env():
    # no forced device count from the caller's XLA_FLAGS; the suite's compile flags stay
    return dict(
        os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("FEDJAX_SEL_TEST_XLA_FLAGS", "")
    )


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    cli = [sys.executable, "-m", "fedjax_sel"]
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                *cli,
                "run",
                *ARGS,
                "--out",
                str(tmp_path / f"p{i}"),
                "--distributed",
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
            ],  # fmt: skip
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i}:\n{outputs[i][-3000:]}"
    one = subprocess.run(
        [*cli, "run", *ARGS, "--out", str(tmp_path / "one")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]

    assert not (tmp_path / "p1").exists()  # process 1 wrote nothing
    config = json.loads((tmp_path / "p0" / "config.json").read_text())
    assert len(config["devices"]) == 2  # the global device list spans both processes
    two, single = (
        _records(tmp_path / "p0" / "metrics.jsonl"),
        _records(tmp_path / "one" / "metrics.jsonl"),
    )
    assert [r["round"] for r in two] == [r["round"] for r in single] == [2, 4]
    for a, b in zip(two, single, strict=True):
        assert a["selected"] == b["selected"]
        np.testing.assert_allclose(a["test_accuracy"], b["test_accuracy"], atol=1e-6)
        np.testing.assert_allclose(a["test_loss"], b["test_loss"], rtol=1e-5)
        np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-5)


def test_partial_distributed_flags_are_refused(capsys):
    from fedjax_sel.cli.main import main

    assert main(["run", "--coordinator", "localhost:1", "--no-progress"]) == 2
    assert "need --distributed" in capsys.readouterr().err
