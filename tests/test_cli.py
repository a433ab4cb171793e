"""The command line: outputs, error messages, list, bench."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from fedjax_sel.cli.main import main


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
        (["--parallel", "map:conv=fft"], "conv must be one of"),
        (["--parallel", "map,conv=xla"], "options follow a colon"),
        (["--model", "linreg"], "regression"),
        # the data set's own number of clients (digits: 20), before anything is sized by it
        (["--per-round", "30"], "per_round=30 exceeds the number of clients (20 of data set"),
        (["--seed", "-1"], "seed must be in 0 .. 4294967295, got -1"),
        (["--data-seed", "-5"], "data_seed must be in 0 .. 4294967295, got -5"),
        (["--seed", "99999999999999999999999"], "got 99999999999999999999999"),
        (["--batch-size", "2000000000"], "a minibatch of batch_size=2000000000 examples"),
        (["--model", "mlp", "--model-arg", "hidden=99999999-99999999"], "the parameters of"),
    ],
)
def test_bad_input_gives_a_clear_error(args, message, tmp_path, capsys):
    rc = main(["run", "--rounds", "1", "--out", str(tmp_path), "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "command,text,message",
    [
        ("sweep", "", "neither a [base] table nor [[strategies]] entries"),
        ("sweep", "[sweep]\nseeds = 3\n", "neither a [base] table nor [[strategies]] entries"),
        ("sweep", '[sweep]\nseeds = "12"\n[base]\nrounds = 1\n', "got '12'"),
        ("sweep", "[sweep]\nseeds = [-1]\n[base]\nrounds = 1\n", "each seed must be in 0 .."),
        ("sweep", '[base]\nlr = "0.1"\n', "lr='0.1' is text where a number is expected"),
        ("sweep", '[base]\nrounds = "5"\n', "rounds='5' is text where a number is expected"),
        ("sweep", "[sweep]\nat_rounds = [0]\n[base]\nrounds = 1\n", "not a round >= 1"),
        ("suite", "", "needs at least one [tasks.NAME] and one [scenarios.NAME]"),
        (
            "suite",
            "[suite]\nseeds = [-1]\n[tasks.t]\n[scenarios.s]\n[[strategies]]\n"
            'strategy = "uniform"\n',
            "each seed must be in 0 ..",
        ),
    ],
)
def test_bad_sweep_and_suite_files_fail_before_anything_runs(
    command, text, message, tmp_path, capsys
):
    path = tmp_path / "file.toml"
    path.write_text(text)
    assert main([command, str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_set_values_are_typed_by_their_fields(tmp_path):
    """--set rounds=1 is the command line's text: typed, so the file's strictness holds."""
    from fedjax_sel.cli.cells import spec_with_overrides
    from fedjax_sel.cli.main import build_parser

    path = tmp_path / "s.toml"
    path.write_text("[base]\nrounds = 5\n")
    a = build_parser().parse_args(["sweep", str(path), "--set", "rounds=1,lr=0.5,partition=iid"])
    assert spec_with_overrides(a, "sweep")["override"] == {
        "rounds": 1, "lr": 0.5, "partition": "iid"
    }  # fmt: skip


def test_local_steps_and_epochs_are_exclusive(capsys):
    assert main(["run", "--local-steps", "3", "--local-epochs", "2"]) == 2
    assert "give --local-steps or --local-epochs, not both" in capsys.readouterr().err


def test_list_names_everything(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "traced (a grid of them shares one program): eta, gamma, alpha, tau0" in out
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


@pytest.mark.parametrize("what", ["kernels", "throughput", "scale"])
def test_bench_refuses_no_repeats(what, capsys):
    """Zero timed calls has no median: refused before anything is built or timed."""
    assert main(["bench", what, "--repeats", "0"]) == 2
    err = capsys.readouterr().err
    assert "--repeats must be >= 1, got 0" in err and "Traceback" not in err


def test_bench_subcommands_take_their_own_flags(capsys):
    """Each benchmark is a sub-command with the flags its module declares: another benchmark's
    flag is refused by the parser, and every count and choice is checked before anything is
    built or timed."""
    from fedjax_sel.bench import grid
    from fedjax_sel.cli.main import build_parser

    a = build_parser().parse_args(["bench", "grid", "--seeds", "3", "--rounds", "2"])
    assert (a.what, a.seeds, a.rounds, a.run) == ("grid", 3, 2, grid.main)
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["bench", "kernels", "--model", "cnn"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --model cnn" in capsys.readouterr().err
    for argv, message in [
        (["phases"], "bench phases needs --trace DIR"),
        (["scale", "--per-round", "10", "--per-round", "20"], "bench scale takes one --per-round"),
        (["workloads", "--clients", "0"], "--clients must be a whole number in 1 .."),
        (["grid", "--seeds-together", "0"], "--seeds-together must be 'auto' or a positive"),
        (["throughput", "--input-shape", "28,x"], "--input-shape"),
    ]:
        assert main(["bench", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


def test_plugin_folder_does_not_shadow_an_installed_package(tmp_path, monkeypatch):
    """``--plugin`` finds a module in the working directory, but appends that directory to
    the import path: a folder there named like an installed package (``tqdm/``) does not
    shadow the installed one, for the plugin or anything else."""
    from fedjax_sel.cli.main import load_plugins

    (tmp_path / "tqdm").mkdir()
    (tmp_path / "tqdm" / "__init__.py").write_text("SHADOW = True\n")
    (tmp_path / "shadow_probe_plugin.py").write_text("import tqdm\nTQDM_FILE = tqdm.__file__\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "tqdm"}
    try:
        load_plugins(["shadow_probe_plugin"])
        probe = sys.modules["shadow_probe_plugin"]
        assert not Path(probe.TQDM_FILE).is_relative_to(tmp_path)
        assert not hasattr(sys.modules["tqdm"], "SHADOW")
        assert sys.path[-1] == str(tmp_path)
    finally:
        sys.modules.pop("shadow_probe_plugin", None)
        for k in [k for k in sys.modules if k.split(".")[0] == "tqdm"]:
            del sys.modules[k]
        sys.modules.update(saved)


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
            "3",
            "--system",
            "lognormal",
            "--async",
            "fedbuff:buffer=4",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    row = json.loads(out.read_text())
    # FedBuff at concurrency P = 8: each timed event step is one update of 4 arrivals
    assert row["asynchronous"] == "fedbuff:concurrency=8,buffer=4"
    assert row["fedbuff_client_updates_per_s"] == pytest.approx(4 / row["fedbuff_step_seconds"])
    assert row["system_overhead"] == pytest.approx(
        row["system_round_seconds"] / row["engine_round_seconds"] - 1
    )
    for key in (
        "engine_client_updates_per_s",
        "loop_client_updates_per_s",
        "engine_gflops",
        "loop_gflops",
        "matmul_gflops",
    ):
        assert row[key] > 0, key
    import jax

    assert row["per_round"] == 8 and row["machine"]["backend"] == jax.default_backend()
    # the speedup is the median ratio of loop and engine rounds timed in turn
    pairs = zip(row["loop_round_times"], row["engine_round_times"], strict=True)
    ratios = sorted(lt / et for lt, et in pairs)
    assert len(ratios) == 3 and row["speedup_vs_loop"] == pytest.approx(ratios[1])
    assert row["speedup_range"] == pytest.approx([ratios[0], ratios[2]]) and row["turns"] == 3
    # one loop variant for every turn, whose median round is the loop's upd/s
    assert row["loop_variant"] in ("loop_step", "loop_client")
    median_loop = sorted(row["loop_round_times"])[1]
    assert row["loop_client_updates_per_s"] == pytest.approx(8 / median_loop)


def test_throughput_compares_every_turn_with_the_loop_of_smaller_median():
    """Not each turn's faster loop variant: the minimum of two noisy times is biased low."""
    from fedjax_sel.bench.throughput import faster_loop

    times = {
        "loop_step": {"times": [1.0, 1.0, 1.0], "seconds": 1.0},
        "loop_client": {"times": [0.5, 2.0, 2.0], "seconds": 2.0},  # one lucky turn
    }
    assert faster_loop(times, ["loop_step", "loop_client"]) == "loop_step"
    assert faster_loop(times, ["loop_client"]) == "loop_client"


def test_interleaved_times_alternates_the_calls():
    from fedjax_sel.bench.common import interleaved_times

    log = []
    seconds = {"a": 0.002, "b": 0.02}

    def call(name):
        def fn():
            log.append(name)
            time.sleep(seconds[name])
            return 0

        return fn

    times = interleaved_times({"a": call("a"), "b": call("b")}, repeats=3)
    assert log == ["a", "b"] * 4  # one warm-up each, then three turns
    for name in "ab":
        t = times[name]
        assert len(t["times"]) == 3 and t["seconds"] == sorted(t["times"])[1]
        assert t["min_seconds"] == min(t["times"]) >= seconds[name]
    assert times["b"]["seconds"] > times["a"]["seconds"]
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved_times({"a": call("a")}, repeats=0)


def test_bench_throughput_epochs_with_a_users_flax_model(tmp_path):
    """FedJAX's workload (one local epoch, batch 10, LogNormal client sizes) on a user's own
    flax module given as FILE.py:NAME; the engine's padded steps are reported."""
    (tmp_path / "net.py").write_text(
        "from __future__ import annotations\n\nimport flax.linen as nn\n\n\n"
        "class Net(nn.Module):\n    width: int = 4\n\n    @nn.compact\n"
        "    def __call__(self, x):\n        x = nn.relu(nn.Conv(self.width, (3, 3))(x))\n"
        "        return nn.Dense(5)(x.reshape(x.shape[0], -1))\n"
    )
    out = tmp_path / "t.json"
    rc = main(
        [
            "bench",
            "throughput",
            "--model-def",
            f"{tmp_path / 'net.py'}:Net",
            "--input-shape",
            "6,6,1",
            "--classes",
            "5",
            "--work",
            "epochs",
            "--per-round",
            "3",
            "--mode",
            "vmap",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    row = json.loads(out.read_text())
    assert row["model"] == "Net" and row["work"] == "epochs" and row["batch_size"] == 10
    assert 100 <= row["client_sizes"][0] <= row["client_sizes"][2] <= 400
    assert 0 <= row["padded_step_fraction"] < 1 and row["mode"].startswith("vmap:conv=")
    assert row["engine_client_updates_per_s"] > 0 and row["loop_client_updates_per_s"] > 0
    # the analytic FLOP count: per example 6*6*9*1*4 (conv) + 144*5 (dense) multiply-adds
    per_step_per_example = 3 * 2 * (6 * 6 * 9 * 4 + 144 * 5)
    steps = row["flops_per_client_update"] / (10 * per_step_per_example)
    assert 10 <= steps <= 40  # one epoch of 100-400 examples in batches of 10


def test_throughput_scan_loop_runs_the_same_sgd_with_a_scan_friendly_convolution():
    """``loop_client`` (one jitted ``lax.scan`` per client) runs a convolution model with
    ``xla_nhwc``, not XLA's own convolution (ten times slower inside a scan on a CPU): the same
    SGD, so the same aggregate as the scan with ``xla``, up to float rounding."""
    import flax.linen as nn
    import jax
    import numpy as np

    from fedjax_sel.bench import throughput as tp
    from fedjax_sel.models.base import from_linen
    from fedjax_sel.training.local import LocalConfig

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(3, (3, 3))(x))
            return nn.Dense(4)(x.reshape(x.shape[0], -1))

    model = from_linen(Net(), name="net", input_shape=(6, 6, 1))
    assert tp.scan_loop_model(model).conv_impl == "xla_nhwc"
    assert tp.loop_model(model).conv_impl == "xla"
    dense = from_linen(nn.Dense(4), name="dense", input_shape=(5,))
    assert tp.scan_loop_model(dense) is dense  # no convolution: unchanged
    sizes = np.array([12, 12, 12])
    data = tp.random_clients((6, 6, 1), 4, False, sizes)
    local = LocalConfig(batch_size=4, local_steps=3)
    params = model.init(jax.random.key(0))
    fast = tp._loop_client(tp.scan_loop_model(model), data, sizes, local, params)()
    plain = tp._loop_client(tp.loop_model(model), data, sizes, local, params)()
    moved = jax.tree.map(
        lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), fast, params
    )
    assert max(jax.tree.leaves(moved)) > 1e-3  # the SGD moved the weights
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_trace_is_written_and_split_by_phase(tmp_path, capsys):
    """``run --trace`` writes a profiler trace of the second chunk with the compiled programs;
    ``bench phases`` charges the traced device work to the round's named phases."""
    from fedjax_sel.bench.trace_phases import PHASES, phase_seconds

    trace = tmp_path / "trace"
    rc = main(
        [
            "run",
            "--clients",
            "10",
            "--per-round",
            "3",
            "--rounds",
            "4",
            "--eval-every",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--trace",
            str(trace),
            "--no-progress",
        ]
    )
    assert rc == 0
    assert list(trace.glob("hlo_*.txt")) and list(trace.rglob("*.trace.json.gz"))
    seconds = phase_seconds(trace)
    assert set(seconds) <= {*PHASES, "other"}
    assert seconds["local_training"] > 0
    if "evaluation" not in seconds and jax.default_backend() != "cpu":
        pytest.xfail(
            "on a GPU (H200, jax 0.11.2) the trace charged no kernel to the evaluation scope; "
            "the cause is not traced yet"
        )
    assert seconds["evaluation"] > 0
    assert main(["bench", "phases", "--trace", str(trace), "--out", str(tmp_path / "p.png")]) == 0
    assert "local_training" in capsys.readouterr().out and (tmp_path / "p.png").exists()


def benchmark_script(name: str, monkeypatch):
    """``benchmarks/<name>.py`` as a module, its folder on ``sys.path`` as when it runs as a
    script (for ``labelled_runs``)."""
    import importlib.util

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, script)  # a dataclass looks its module up there
    spec.loader.exec_module(script)
    return script


def test_streamed_aggregation_script_times_the_same_round_both_ways(monkeypatch):
    """The benchmark builds the round twice (streamed, stacked: the strategy's flag alone
    differs), times them in turns and reports their ratio; a mode that cannot stream is
    refused before timing."""
    script = benchmark_script("streamed_aggregation", monkeypatch)
    out = script.measure("logreg", "steps", per_round=3, mode="map", repeats=3)
    assert len(out["streamed_times"]) == len(out["stacked_times"]) == 3
    ratios = sorted(b / a for a, b in zip(out["streamed_times"], out["stacked_times"], strict=True))
    assert out["stacked_over_streamed"] == pytest.approx(ratios[1])
    assert out["ratio_range"] == [pytest.approx(ratios[0]), pytest.approx(ratios[-1])]
    with pytest.raises(SystemExit, match="does not stream"):
        script.measure("logreg", "steps", per_round=3, mode="vmap", repeats=1)


def test_seed_batches_map_script_rows(monkeypatch):
    """Both modes, masks the same and differing, each ratio its two timings' quotient."""
    script = benchmark_script("seed_batches_map", monkeypatch)
    rows = script.measure(per_round=3, repeats=1)
    assert [(r["mode"], r["active masks"]) for r in rows] == [
        (m, k) for m in ("map", "vmap") for k in ("the same", "differing")
    ]
    for r in rows:
        ratio = r["two_members_seconds_per_member"] / r["one_member_seconds"]
        assert r["per_member_ratio"] == pytest.approx(ratio)


def test_seed_batches_cond_script_rows(monkeypatch):
    """DivFL and FilFL, one seed alone and a batch, each ratio its two timings' quotient."""
    script = benchmark_script("seed_batches_cond", monkeypatch)
    rows = script.measure(num_clients=12, per_round=3, members=2, rounds=2, repeats=1)
    assert [(r["strategy"], r["members"]) for r in rows] == [("divfl", 2), ("filfl", 2)]
    for r in rows:
        ratio = r["batched_seconds_per_member_round"] / r["one_member_seconds_per_round"]
        assert r["per_member_ratio"] == pytest.approx(ratio)


def test_engine_vs_loop_parts_times_the_six_parts_against_both_loops(monkeypatch):
    script = benchmark_script("engine_vs_loop_parts", monkeypatch)
    out = script.measure("mlp", per_round=2, mode="map", local_steps=1, repeats=2, batch_size=8)
    # 784-200-200-10: weights and biases
    assert out["num_params"] == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10 == 199_210
    assert out["stacked_model_bytes"] == 2 * 199_210 * 4
    # one step of batch 8: forward 2 x 8 x (weights), backward twice that (the first layer's
    # input gradient included in the analytic count or not: between 4 and 6 passes)
    weights = 784 * 200 + 200 * 200 + 200 * 10
    assert 4 * 8 * weights <= out["flops_per_step"] <= 6 * 8 * weights + 1e5
    assert out["weight_bytes_per_step"] == 5 * 4 * 199_210
    parts = [r["part"] for r in out["rows"]]
    assert parts == [
        "loop",
        "loop, one jitted step per minibatch",
        "loop of the engine's update",
        "trainer (map)",
        "trainer (map), aggregated as it trains",
        "round (map)",
    ]
    loop, step_loop = out["rows"][0], out["rows"][1]
    assert loop["loop_over_this"] == 1.0 and step_loop["step_loop_over_this"] == 1.0
    assert len(loop["times"]) == 2
    for r in out["rows"]:
        for ref, key in ((loop, "loop_over_this"), (step_loop, "step_loop_over_this")):
            ratios = sorted(lt / t for lt, t in zip(ref["times"], r["times"], strict=True))
            assert r[key] == pytest.approx(sum(ratios) / 2)


def test_skinny_matmul_rates_are_the_products_flops_over_their_time(monkeypatch):
    script = benchmark_script("skinny_matmul", monkeypatch)
    rows = script.measure([2, 4], repeats=1)
    assert [r["rows"] for r in rows] == [2, 4]
    for r in rows:
        flops = 4.0 * r["rows"] * 784 * 200 * r["iterations"]
        assert r["gflops"] == pytest.approx(flops / r["seconds"] / 1e9)
    assert max(r["fraction_of_fastest"] for r in rows) == 1.0


def test_skinny_matmul_vmapped_over_clients_runs_each_clients_sgd(monkeypatch):
    script = benchmark_script("skinny_matmul", monkeypatch)
    w = np.asarray(script.products(3, 4, layer=(5, 2), clients=3)())
    a = np.full((3, 5), 0.5)
    ref = np.full((5, 2), 1e-3)
    for _ in range(4):  # the NumPy transcription of the loop's step
        ref = ref - 1e-6 * (a.T @ (a @ ref))
    assert w.shape == (3, 5, 2)
    np.testing.assert_allclose(w, np.broadcast_to(ref, (3, 5, 2)), rtol=1e-6)
    assert not np.allclose(ref, 1e-3, rtol=1e-9, atol=0)  # the steps moved the weights
    (row,) = script.measure([10], repeats=1, layer=(64, 50), clients=7)
    flops = 4.0 * 10 * 64 * 50 * row["iterations"] * 7
    assert row["clients"] == 7
    assert row["gflops"] == pytest.approx(flops / row["seconds"] / 1e9)
    assert row["microseconds_per_client_step"] == pytest.approx(
        1e6 * row["seconds"] / (row["iterations"] * 7)
    )


def test_suite_time_keeps_earlier_sessions_cells(monkeypatch, tmp_path):
    """A suite timed over two sessions: the second sees only its own ``runs``, and the JSON
    keeps the first session's cells (per cell) and a legacy JSON's totals (carried)."""
    script = benchmark_script("suite_time", monkeypatch)

    def cell(path: str, rounds: float, evaluation: float) -> None:
        folder = tmp_path / "runs" / path
        folder.mkdir(parents=True)
        seconds = {"rounds": rounds, "eval": evaluation}
        (folder / "timings.json").write_text(json.dumps({"evaluations": [{"seconds": seconds}]}))
        (folder / "summary.json").write_text("{}")

    legacy = {
        "cells": 5,
        "cell_seconds": 50.0,
        "by_task": [{"task": "digits", "cells": 5, "rounds_seconds": 40.0, "eval_seconds": 10.0}],
        "by_phase": [{"phase": "eval", "cells": 5, "rounds_seconds": 40.0, "eval_seconds": 10.0}],
        "by_strategy": [
            {"strategy": "uniform", "cells": 5, "rounds_seconds": 40.0, "eval_seconds": 10.0}
        ],
    }
    cell("mnist/ideal/uniform/seed0", 3.0, 1.0)
    cell("mnist/tuning/ideal/oort/p0/seed1000", 2.0, 0.5)
    first = script.summarize(tmp_path, legacy)
    assert first["cells"] == 7 and first["cell_seconds"] == pytest.approx(56.5)
    assert {r["task"]: r["cells"] for r in first["by_task"]} == {"digits": 5, "mnist": 2}
    assert {r["strategy"]: r["seconds"] for r in first["by_strategy"]} == {
        "uniform": 54.0,
        "oort": 2.5,
    }
    # The next session: a fresh runs folder with one new cell and one of the first's, rerun.
    shutil.rmtree(tmp_path / "runs")
    cell("mnist/ideal/uniform/seed0", 4.0, 1.0)  # this machine's value wins
    cell("shakespeare/ideal/uniform/seed0", 6.0, 2.0)
    second = script.summarize(tmp_path, json.loads(json.dumps(first)))
    assert second["carried"] == first["carried"] and second["carried"]["cells"] == 5
    assert second["cells"] == 8
    assert second["cell_seconds"] == pytest.approx(50.0 + 5.0 + 2.5 + 8.0)
    assert {r["phase"]: r["cells"] for r in second["by_phase"]} == {"eval": 7, "tune": 1}
    assert [c[0] for c in second["cell_times"]] == [
        "mnist/ideal/uniform/seed0",
        "mnist/tuning/ideal/oort/p0/seed1000",
        "shakespeare/ideal/uniform/seed0",
    ]
    # The legacy cells are run again (digits here): the invocations before that and the
    # carried totals are set aside, listed but counted nowhere, and stay aside in later calls.
    cell("digits/ideal/uniform/seed0", 7.0, 1.0)
    runs = [("2026-11-28T05:00:00Z", 100.0), ("2026-12-07T17:00:00Z", 30.0)]
    runs.append(("2026-12-08T01:00:00Z", 20.0))
    entries = [{"started": t, "wall_seconds": w, "cells_run": 1} for t, w in runs]
    (tmp_path / "invocations.json").write_text(json.dumps(entries))
    third = script.summarize(tmp_path, json.loads(json.dumps(second)), "2026-12-07T00:00:00Z")
    assert third["carried"] is None and third["cells"] == 4
    assert third["cell_seconds"] == pytest.approx(5.0 + 2.5 + 8.0 + 8.0)
    assert third["wall_seconds"] == 50.0 and len(third["invocations"]) == 2
    aside = third["superseded"]
    assert aside["wall_seconds"] == 100.0 and aside["carried"]["cells"] == 5
    fourth = script.summarize(tmp_path, json.loads(json.dumps(third)))
    assert (fourth["superseded"], fourth["wall_seconds"]) == (aside, 50.0)
    assert fourth["cells"] == 4 and fourth["carried"] is None


def test_check_committed_leaves_out_cells_of_another_cpu_target(monkeypatch, tmp_path):
    """A sampled cell whose record names another CPU target is listed, not compared (its bits
    may differ there); one of this target that differs fails the check; a sample left with
    nothing compared fails too (it checked nothing)."""
    script = benchmark_script("check_committed", monkeypatch)
    records = [
        {"phase": "eval", "scenario": s, "strategy": "uniform", "seed": 0, "metrics": {}}
        for s in ("ideal", "devices")
    ]
    folder = tmp_path / script.SUITE_RESULTS / "per_seed"
    folder.mkdir(parents=True)
    (folder / "digits.json").write_text(json.dumps({"meta": {}, "cells": records}))
    monkeypatch.setattr(script, "ROOT", tmp_path)
    sample = script.SuiteSample("s", "eval", ("uniform",), "test")
    monkeypatch.setattr(script, "SUITE_SAMPLES", (sample,))
    results = {  # by scenario: (same_target, recorded, rerun)
        "ideal": (True, 0.5, 0.5),
        "devices": (False, 0.5, 0.25),
    }

    def fake_cli(args, log, env, ok=(0,)):
        same, recorded, rerun = results[args[5].split("/")[1]]
        result = {"recorded": {"final_accuracy": recorded}, "rerun": {"final_accuracy": rerun}}
        result |= {
            "same_target": same,
            "recorded_on": None if same else "GenuineIntel 6/143: avx512f",
        }
        log.write_text(json.dumps(result) + "\n")
        return 1.0

    monkeypatch.setattr(script, "cli", fake_cli)
    [row] = script.check_suite(tmp_path, {})
    assert (row["values"], row["equal"]) == (1, 1)
    assert row["other_target"] == [
        "--rerun digits/devices/uniform --json --seed 0 (GenuineIntel 6/143: avx512f)"
    ]
    assert script.verdict([row], baseline=False)
    results["ideal"] = (True, 0.5, 0.75)  # this target, another value: a failure
    assert not script.verdict(script.check_suite(tmp_path, {}), baseline=False)
    results["ideal"] = (False, 0.5, 0.5)  # every cell elsewhere: nothing was checked
    [row] = script.check_suite(tmp_path, {})
    assert row["values"] == 0 and len(row["other_target"]) == 2
    assert not script.verdict([row], baseline=False)
