"""The experiment layer: seeds vmapped together equal separate runs, a sweep reruns
bit-identically and never recomputes a finished cell, ``config.json`` reruns a run exactly, a
run killed with SIGKILL resumes to bit-identical files, and bad checkpoints are named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import (
    load_checkpoint,
    read_metrics,
    run_experiment,
    run_group,
    run_sweep,
    save_checkpoint,
    strip_timings,
)
from fedjax_sel.experiment.build import build_simulation
from fedjax_sel.experiment.provenance import code_record, same_code, source_digest_of
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.training.hparams import HParams

ROOT = Path(__file__).resolve().parents[1]


def small(**kw) -> RunConfig:
    base = dict(
        dataset="digits",
        num_clients=10,
        per_round=3,
        rounds=6,
        eval_every=2,
        local_steps=3,
        batch_size=16,
        lr=0.1,
    )
    return RunConfig(**{**base, **kw})


def files_without_timings(folder: Path):
    records = [strip_timings(r) for r in read_metrics(folder / "metrics.jsonl")]
    summary = strip_timings(json.loads((folder / "summary.json").read_text()))
    return records, summary


def assert_same_picks_and_metrics(together, alone):
    """A member of a seed batch picked the clients its run alone picks, every round, and its
    metrics agree to float tolerance (an accuracy moves in steps of one test example)."""
    assert [e["selected"] for e in together.evals] == [e["selected"] for e in alone.evals]
    for a, b in zip(together.evals, alone.evals, strict=True):
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("data_seed", [0, None])  # shared data / one partition per seed
def test_seeds_together_equal_separate_runs(tmp_path, data_seed):
    """Uniform selection does not depend on float results: each vmapped seed picks exactly the
    clients its own run picks; the metrics agree to float tolerance."""
    configs = [
        small(seed=s, data_seed=data_seed, local_epochs=1, local_steps=None) for s in range(3)
    ]
    together = run_group(configs, [tmp_path / f"t{s}" for s in range(3)], seeds_together=3)

    def vmapped(folder):
        return json.loads((tmp_path / folder / "config.json").read_text())["seeds_vmapped"]

    for s, r in enumerate(together):
        alone = run_experiment(configs[s], tmp_path / f"a{s}", progress=False)
        assert_same_picks_and_metrics(r, alone)
        assert r.summary["selection_counts"] == alone.summary["selection_counts"]
        # config.json names the batch a run's bits depend on
        assert vmapped(f"t{s}") == [0, 1, 2]
        assert vmapped(f"a{s}") == [s]
        np.testing.assert_allclose(
            r.summary["weight_sums"], alone.summary["weight_sums"], rtol=1e-6
        )


@pytest.mark.parametrize("filter_size", [0, 12])  # the whole server set, or a spread subset
def test_server_sets_of_different_sizes_run_together_as_alone(tmp_path, filter_size):
    """Each seed's partition gives its server-held set its own size: the stacked sets are
    padded with a validity mask, and FilFL filters on each seed's real rows as it does alone."""
    configs = [
        small(
            seed=s,
            strategy="filfl",
            strategy_args={"filter_size": filter_size, "period": 2},
            server_fraction=0.1,
            partition="dirichlet:0.3",
        )
        for s in range(3)
    ]
    together = run_group(configs, [tmp_path / f"t{s}" for s in range(3)], seeds_together=3)
    sizes = set()
    for s, r in enumerate(together):
        info = json.loads((tmp_path / f"t{s}" / "config.json").read_text())
        assert info["seeds_vmapped"] == [0, 1, 2]
        sizes.add(info["dataset"]["num_server_examples"])
        alone = run_experiment(configs[s], tmp_path / f"a{s}", progress=False)
        assert_same_picks_and_metrics(r, alone)
    assert len(sizes) > 1, "the seeds' server sets should differ in size"


def test_divfl_warm_start_seeds_together_as_alone(tmp_path):
    """DivFL's round branches on its warm start (``members_cond``): vmapped seeds take the
    warm branch in round 0 and the regular one after, as each does alone."""
    configs = [small(seed=s, strategy="divfl") for s in range(2)]
    together = run_group(configs, [tmp_path / f"t{s}" for s in range(2)], seeds_together=2)
    for s, r in enumerate(together):
        alone = run_experiment(configs[s], tmp_path / f"a{s}", progress=False)
        assert_same_picks_and_metrics(r, alone)


def test_weight_sums_and_law_diagnostics(tmp_path):
    r = run_experiment(small(availability="bernoulli:p=0.6"), tmp_path, progress=False)
    counts = np.zeros(10)
    for e in r.evals:
        for picks in e["selected"]:
            counts[picks] += 1
    assert r.summary["selection_counts"] == counts.tolist()
    # FedAvg size weights sum to one per round: the weight sums add up to the rounds
    assert sum(r.summary["weight_sums"]) == pytest.approx(6.0, rel=1e-5)
    # the process's peak memory: at least what it holds now, at most the machine's
    import resource

    now_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 2**20 < r.timings["peak_host_memory_bytes"] <= min(now_kib * 1024, pages)
    diag = r.evals[-1]["diagnostics"]
    assert diag["law_entropy_ratio"] == pytest.approx(1.0, abs=1e-6)  # uniform law
    assert diag["law_max_over_uniform"] == pytest.approx(1.0, abs=1e-5)
    assert diag["never_picked"] == int(np.sum(counts == 0))


def test_config_json_reruns_the_run_exactly(tmp_path, capsys):
    args = [
        "run",
        "--strategy",
        "power_of_choice",
        "--strategy-arg",
        "d=6",
        "--clients",
        "10",
        "--per-round",
        "3",
        "--rounds",
        "4",
        "--eval-every",
        "2",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "x")]) == 0
    assert (
        main(
            [
                "run",
                "--config",
                str(tmp_path / "x" / "config.json"),
                "--out",
                str(tmp_path / "y"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert files_without_timings(tmp_path / "x") == files_without_timings(tmp_path / "y")
    # a flag overrides the file
    assert (
        main(
            [
                "run",
                "--config",
                str(tmp_path / "x" / "config.json"),
                "--rounds",
                "2",
                "--out",
                str(tmp_path / "z"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "z" / "summary.json").read_text())["rounds_completed"] == 2
    capsys.readouterr()


def test_toml_config_and_exclusive_override(tmp_path):
    (tmp_path / "c.toml").write_text(
        'strategy = "uniform"\nnum_clients = 10\nper_round = 2\nrounds = 2\neval_every = 2\n'
        "local_steps = 4\n[model_args]\nhidden = [8]\n"
    )
    assert (
        main(
            [
                "run",
                "--config",
                str(tmp_path / "c.toml"),
                "--local-epochs",
                "1",
                "--out",
                str(tmp_path / "o"),
                "--no-progress",
            ]
        )
        == 0
    )
    stored = json.loads((tmp_path / "o" / "config.json").read_text())["config"]
    assert stored["local_epochs"] == 1 and stored["local_steps"] is None  # the flag won
    assert stored["model_args"] == {"hidden": [8]}
    (tmp_path / "bad.toml").write_text("rounds = [1\n")
    assert main(["run", "--config", str(tmp_path / "bad.toml")]) == 2
    (tmp_path / "unknown.toml").write_text("roundz = 3\n")
    assert main(["run", "--config", str(tmp_path / "unknown.toml")]) == 2


def test_sweep_reruns_bit_identically_and_reuses_finished_cells(tmp_path, capsys):
    """The same sweep (seeds batched alike) run twice writes byte-identical ``metrics.jsonl``
    and ``summary.json`` in every cell: wall-clock time goes to ``timings.json`` only."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        '[sweep]\nseeds = 2\nseeds_together = 2\nbaseline = "uniform"\n'
        "[base]\nnum_clients = 10\nper_round = 3\n"
        "rounds = 4\neval_every = 2\nlocal_steps = 3\nbatch_size = 16\nlr = 0.1\n"
        '[[strategies]]\nstrategy = "uniform"\n[[strategies]]\nstrategy = "full"\n'
        "per_round = 10\n"
    )
    rows = run_sweep(sweep, tmp_path / "a", progress=False, echo=lambda *a: None)
    assert {r["strategy"] for r in rows} == {"uniform", "full"}
    run_sweep(sweep, tmp_path / "b", progress=False, echo=lambda *a: None)
    cells = sorted(
        p.parent.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("summary.json")
    )
    assert len(cells) == 4
    for c in cells:
        for name in ("metrics.jsonl", "summary.json"):
            first, second = ((tmp_path / d / c / name).read_bytes() for d in "ab")
            assert first == second, f"{c}/{name}"
        assert (tmp_path / "a" / c / "timings.json").exists()
        info = json.loads((tmp_path / "a" / c / "config.json").read_text())
        assert info["sweep"]["label"] in ("uniform", "full")
    before = {c: (tmp_path / "a" / c / "summary.json").stat().st_mtime_ns for c in cells}
    messages = []
    run_sweep(sweep, tmp_path / "a", progress=False, echo=messages.append)
    assert "4 of 4 cells already finished; reusing them" in messages
    assert before == {c: (tmp_path / "a" / c / "summary.json").stat().st_mtime_ns for c in cells}
    # a cell finished by other code (another source digest in its config.json) is recomputed,
    # the others reused; it runs alone now, so only its last bits may differ from the first run
    stale = tmp_path / "a" / cells[0] / "config.json"
    info = json.loads(stale.read_text())
    assert info["code"] == code_record()
    stale.write_text(json.dumps({**info, "code": {**info["code"], "source": "0" * 16}}))
    messages = []
    run_sweep(sweep, tmp_path / "a", progress=False, echo=messages.append)
    assert "3 of 4 cells already finished; reusing them" in messages
    assert any(m.startswith("1 of 4 cells were finished by other code") for m in messages)
    after = {c: (tmp_path / "a" / c / "summary.json").stat().st_mtime_ns for c in cells}
    assert [c for c in cells if after[c] != before[c]] == [cells[0]]
    again = json.loads(stale.read_text())
    assert again["code"] == code_record() and len(again["seeds_vmapped"]) == 1
    summaries = [json.loads((tmp_path / d / cells[0] / "summary.json").read_text()) for d in "ab"]
    assert summaries[0]["final_accuracy"] == pytest.approx(summaries[1]["final_accuracy"], rel=1e-4)
    assert json.loads((tmp_path / "a" / "comparison.json").read_text())
    # [sweep] percent = true reaches compare: accuracies in %, from the same (reused) cells
    sweep.write_text(sweep.read_text().replace("[sweep]\n", "[sweep]\npercent = true\n"))
    rows = run_sweep(sweep, tmp_path / "a", progress=False, echo=lambda *a: None)
    final = {r["strategy"]: r for r in rows if r["metric"] == "final_accuracy"}
    for label, r in final.items():
        values = [
            json.loads((tmp_path / "a" / c / "summary.json").read_text())["final_accuracy"]
            for c in cells
            if c.parent.name == label
        ]
        assert r["unit"] == "percent" and r["mean"] == pytest.approx(100 * np.mean(values))


def test_a_sweep_with_diverged_cells_marks_them_and_exits_3(tmp_path, capsys):
    """lr = 1e4 diverges on digits: those cells' summaries say ``diverged`` with null final
    metrics (not the NaN model's accuracy), the comparison leaves them out and counts them,
    and ``fedjax-sel sweep`` exits 3 naming them unless ``--allow-diverged`` (then 0)."""
    sweep, out = tmp_path / "d.toml", tmp_path / "out"
    sweep.write_text(
        '[sweep]\nseeds = 2\nseeds_together = 2\nbaseline = "uniform"\n'
        "[base]\nnum_clients = 10\nper_round = 3\n"
        "rounds = 4\neval_every = 2\nlocal_steps = 3\nbatch_size = 16\nlr = 0.1\n"
        '[[strategies]]\nstrategy = "uniform"\n'
        '[[strategies]]\nlabel = "hot"\nstrategy = "uniform"\nlr = 1e4\n'
    )
    status = main(["sweep", str(sweep), "--out", str(out), "--no-progress"])
    cell = out / "runs" / "default" / "hot" / "seed0"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["diverged"] and summary["rounds_completed"] < 4
    for key in ("final_accuracy", "stable_accuracy", "final_test_loss"):
        assert summary[key] is None, key
    last = read_metrics(cell / "metrics.jsonl")[-1]
    assert last["round"] == summary["rounds_completed"] and last["test_accuracy"] is None
    rows = json.loads((out / "comparison.json").read_text())
    by = {r["strategy"]: r for r in rows if r["metric"] == "final_accuracy"}
    assert (by["uniform"]["seeds"], by["uniform"]["diverged"]) == (2, 0)
    assert (by["hot"]["seeds"], by["hot"]["diverged"], by["hot"]["runs"]) == (0, 2, 2)
    assert by["hot"]["mean"] is None and by["hot"]["diff"] is None
    assert "| hot | 0 of 2 | 2 | - |" in (out / "comparison.md").read_text()
    assert status == 3
    assert "2 sweep cell(s) diverged: hot seed 0, hot seed 1" in capsys.readouterr().err
    argv = ["sweep", str(sweep), "--out", str(out), "--no-progress", "--allow-diverged"]
    assert main(argv) == 0  # the finished cells reused
    capsys.readouterr()


def test_run_killed_with_sigkill_resumes_bit_identically(tmp_path):
    """A real run in a subprocess, killed with SIGKILL after its first checkpoints, resumes
    with ``--resume`` to the files of an uninterrupted run (timings aside), no metrics line
    lost or duplicated."""
    args = "--clients 10 --per-round 3 --rounds 400 --eval-every 2 --local-steps 10 "
    args = (args + "--batch-size 8 --checkpoint-every 3 --no-progress").split()
    cmd = [sys.executable, "-m", "fedjax_sel", "run", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [*cmd, "--out", str(killed)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        # complete lines only: the run is writing the file
        metrics = killed / "metrics.jsonl"
        lines = metrics.read_text().count("\n") if metrics.exists() else 0
        if (killed / "checkpoint.npz").exists() and lines > 9:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()
    assert main(["run", "--resume", str(killed), "--no-progress"]) == 0
    assert main(["run", *args, "--out", str(tmp_path / "whole")]) == 0
    a, b = files_without_timings(killed), files_without_timings(tmp_path / "whole")
    assert [r["round"] for r in a[0]] == list(range(2, 401, 2))
    assert a == b
    assert not (killed / "checkpoint.npz").exists()  # removed once the run finished


def test_bad_checkpoints_are_named(tmp_path, host_leaves):
    resolved = resolve(small())
    config = resolved.config
    sim = build_simulation(resolved)
    state = sim.init(0, hparams=HParams.from_config(config))
    path = save_checkpoint(
        tmp_path / "c.npz", state, {"results_key": config.results_key(), "round": 0}
    )
    restored, header = load_checkpoint(path, state, results_key=config.results_key())
    assert header["round"] == 0
    for a, b in zip(host_leaves(restored), host_leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match="written by another configuration"):
        load_checkpoint(path, state, results_key="other")
    (tmp_path / "bad.npz").write_bytes(path.read_bytes()[:200])
    with pytest.raises(ConfigError, match="bad.npz.*corrupt"):
        load_checkpoint(tmp_path / "bad.npz", state, results_key=config.results_key())
    other = build_simulation(resolve(small(num_clients=12))).init(
        0, hparams=HParams.from_config(config)
    )
    with pytest.raises(ConfigError, match="expects"):
        load_checkpoint(path, other, results_key=config.results_key())


def test_sweep_override_sets_every_cell_after_the_strategies(tmp_path):
    from fedjax_sel.experiment.sweep import expand_sweep

    spec = {
        "sweep": {"seeds": 2, "time_targets": [0.8], "percent": True},
        "base": {"dataset": "digits", "rounds": 40},
        "strategies": [{"strategy": "uniform"}, {"strategy": "full", "rounds": 90}],
        "override": {"rounds": 2},  # --set rounds=2, typed by the command line
    }
    sweep = expand_sweep(spec, tmp_path)
    assert [c.config.rounds for c in sweep.cells] == [2, 2, 2, 2]
    assert sweep.compare_options == {"time_targets": [0.8], "percent": True}
    with pytest.raises(ConfigError, match="percent must be true or false, got 'yes'"):
        expand_sweep({**spec, "sweep": {"seeds": 2, "percent": "yes"}}, tmp_path)
    with pytest.raises(ConfigError, match="unknown \\[sweep\\] option"):
        expand_sweep({**spec, "sweep": {"seed": 3}}, tmp_path)


def test_matmul_precision_is_the_one_the_round_is_traced_under(tmp_path):
    """``matmul_precision`` reaches every compiled program of the run (its products carry the
    matching precision), is written to config.json, and a bad value is refused by name;
    ``default`` keeps the process's own setting (the suite's float32, or one set around the
    run). bfloat16 differs from both, so the check fails if the setting is ignored."""
    import flax.linen as nn
    import jax

    from fedjax_sel.data import load_dataset
    from fedjax_sel.models import from_linen

    seen: set[str] = set()

    class Probe(nn.Module):
        @nn.compact
        def __call__(self, x):
            seen.add(str(jax.config.jax_default_matmul_precision))
            return nn.Dense(10)(x.reshape(x.shape[0], -1))

    ds = load_dataset("digits", num_clients=10, seed=0)
    probe = from_linen(Probe(), name="probe", input_shape=ds.input_shape)
    seen.clear()  # from_linen traces the module once to check its output shape
    r = run_experiment(
        small(matmul_precision="bfloat16", rounds=2), tmp_path / "p", progress=False, model=probe
    )
    assert seen == {"bfloat16"}
    assert (
        json.loads((tmp_path / "p" / "config.json").read_text())["config"]["matmul_precision"]
        == "bfloat16"
    )
    assert r.summary["rounds_completed"] == 2
    seen.clear()
    with jax.default_matmul_precision("tensorfloat32"):
        run_experiment(small(rounds=2), tmp_path / "d", progress=False, model=probe)
    assert seen == {"tensorfloat32"}
    with pytest.raises(ConfigError, match="fp8"):
        resolve(small(matmul_precision="fp8"))


def test_the_code_record_is_a_digest_of_the_source(tmp_path):
    """The digest changes with any edit of a ``.py`` file's bytes or path and with nothing
    else; a run records this code's, and a record of other code, or none, is not the same."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    return 2\n")
    first = source_digest_of(pkg)
    assert len(first) == 16 and source_digest_of(pkg) == first
    (pkg / "notes.txt").write_text("not source")
    assert source_digest_of(pkg) == first
    for edit in ("x = 2\n", "x = 1  # a comment\n"):
        (pkg / "a.py").write_text(edit)
        assert source_digest_of(pkg) != first
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").rename(pkg / "sub" / "c.py")
    assert source_digest_of(pkg) != first
    assert same_code(code_record())
    assert not same_code(None) and not same_code({"source": "0" * 16})


def test_a_checkpoint_written_by_other_code_is_not_resumed(tmp_path):
    """``restore_member`` starts over, and says so, where the folder's ``config.json``
    records other code; with this code's record it reads the checkpoint (here a corrupt one,
    which it names)."""
    from fedjax_sel.experiment.loop import Member, restore_member

    (tmp_path / "checkpoint.npz").write_bytes(b"not a checkpoint")
    member = Member(small(), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"code": {"source": "0" * 16}}))
    messages = []
    assert restore_member(member, None, messages.append) is None
    assert messages == [f"{tmp_path}'s checkpoint was written by other code: starting it over"]
    (tmp_path / "config.json").write_text(json.dumps({"code": code_record()}))
    with pytest.raises(ConfigError, match="corrupt"):
        restore_member(member, None, messages.append)
