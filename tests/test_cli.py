"""The command line: outputs, error messages, list, bench."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedjax_sel.cli import main


def test_run_writes_outputs_and_prints_a_table(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            "--strategy",
            "power_of_choice",
            "--strategy-arg",
            "d=6,variant=cpow",
            "--dataset",
            "digits",
            "--clients",
            "10",
            "--per-round",
            "3",
            "--rounds",
            "4",
            "--eval-every",
            "2",
            "--lr",
            "0.1",
            "--local-epochs",
            "1",
            "--batch-size",
            "16",
            "--availability",
            "bernoulli:p=0.8",
            "--seed",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "final acc" in printed and "power_of_choice" in printed
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["strategy_args"] == {"d": 6, "variant": "cpow"}  # typed by the registry
    assert config["local_epochs"] == 1 and config["local_steps"] is None
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "args,message",
    [
        (["--clients", "5", "--per-round", "8"], "exceeds the number of clients (5)"),
        (["--strategy", "nope"], "unknown strategy 'nope'"),
        (["--partition", "dirichlet:0"], "alpha must be a positive number, got 0.0"),
        (["--partition", "dirichlet:-1"], "alpha must be a positive number, got -1.0"),
        (["--strategy", "power_of_choice", "--strategy-arg", "d=1"], "d >= per_round"),
        (["--strategy-arg", "bogus=1"], "no option(s) ['bogus']"),
        (["--availability", "markov:pi=0.9,lam=-5"], "lam=-5.0 is outside its valid range"),
        (["--dataset", "mnist", "--data-dir", "/nonexistent/x.npz"], "does not exist"),
        (["--lr", "-0.1"], "lr must be a positive number"),
        (["--parallel", "pmap"], "unknown client parallelism"),
        (["--model", "linreg"], "regression"),
    ],
)
def test_bad_input_gives_a_clear_error(args, message, tmp_path, capsys):
    rc = main(["run", "--rounds", "1", "--out", str(tmp_path), "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and "Traceback" not in err


def test_local_steps_and_epochs_are_exclusive(capsys):
    assert main(["run", "--local-steps", "3", "--local-epochs", "2"]) == 2
    assert "give --local-steps or --local-epochs, not both" in capsys.readouterr().err


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in (
        "uniform",
        "power_of_choice",
        "digits",
        "leaf_synthetic",
        "mnist",
        "shakespeare",
        "logreg",
        "cnn",
        "lstm",
        "markov",
        "bernoulli",
    ):
        assert word in out


def test_python_dash_m_entry_point():
    r = subprocess.run(
        [sys.executable, "-m", "fedjax_sel", "list"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "strategies" in r.stdout


def test_reproduce_unknown_name(capsys):
    assert main(["reproduce", "no-such-paper"]) == 2
    assert "unknown reproduction 'no-such-paper'" in capsys.readouterr().err


def test_bench_kernels_writes_rows(tmp_path, capsys):
    out = tmp_path / "k.json"
    rc = main(
        [
            "bench",
            "kernels",
            "--kernel",
            "uniform_select",
            "--kernel",
            "markov_step",
            "--clients",
            "100",
            "--clients",
            "1000",
            "--repeats",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())
    assert {(r["kernel"], r["clients"]) for r in rows} == {
        ("uniform_select", 100),
        ("uniform_select", 1000),
        ("markov_step", 100),
        ("markov_step", 1000),
    }
    assert all(r["seconds"] > 0 for r in rows)
    assert main(["bench", "kernels", "--kernel", "nope"]) == 2


def test_bench_throughput_writes_the_documented_keys(tmp_path):
    out = tmp_path / "t.json"
    rc = main(
        [
            "bench",
            "throughput",
            "--model",
            "logreg",
            "--per-round",
            "8",
            "--local-steps",
            "2",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    row = json.loads(out.read_text())
    for key in (
        "engine_client_updates_per_s",
        "loop_client_updates_per_s",
        "engine_gflops",
        "loop_gflops",
        "matmul_gflops",
    ):
        assert row[key] > 0, key
    assert row["per_round"] == 8 and row["machine"]["backend"] == "cpu"
