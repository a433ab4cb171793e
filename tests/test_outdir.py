"""Output folders are owned (``fedjax_sel.experiment.outdir``): a second writer of a run's,
sweep's or suite's ``--out`` is refused naming the first, whose results stay intact; a folder
holding another configuration's results is refused without ``--overwrite``; a lock left by a
killed process is taken over; two labels never share a folder."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_experiment import small as experiment_small

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import run as suite_run
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.cli.main import main
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import run_experiment, run_sweep
from fedjax_sel.experiment.outdir import LOCK, Lock, check_distinct_folders, folder_name
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.sweep import expand_sweep

ROOT = Path(__file__).resolve().parents[1]

# the sweep of tests/test_experiment.py's rerun test: its programs are in the session's cache
SWEEP = (
    '[sweep]\nseeds = 2\nbaseline = "uniform"\n[base]\nnum_clients = 10\nper_round = 3\n'
    "rounds = 4\neval_every = 2\nlocal_steps = 3\nbatch_size = 16\nlr = 0.1\n"
    '[[strategies]]\nstrategy = "uniform"\n[[strategies]]\nstrategy = "full"\n'
    "per_round = 10\n"
)


def quiet(*args) -> None:
    del args


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file aside) and the digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK
    }


# A second process that runs the same sweep and stops inside it, holding the folder's lock,
# until it reads a line: a sweep "still running" for as long as the test needs.
PAUSED_SWEEP = """
import sys
from fedjax_sel.experiment import sweep as sweep_lib
real = sweep_lib.run_cells
def paused(cells, **kw):
    print("running", flush=True)
    sys.stdin.readline()
    return real(cells, **kw)
sweep_lib.run_cells = paused
sweep_lib.run_sweep(sys.argv[1], sys.argv[2], progress=False, echo=lambda *a: None)
print("finished", flush=True)
"""


def test_a_second_sweep_on_the_same_out_is_refused_and_the_first_finishes_intact(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_SWEEP, str(spec), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert first.stdout.readline().strip() == "running"
        holder = json.loads((out / LOCK).read_text())
        assert holder["pid"] == first.pid
        capsys.readouterr()
        assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by process {first.pid}" in err
        assert "Traceback" not in err
        assert not (out / "runs").exists()  # the second wrote nothing
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "finished"
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
    # the first sweep's results are whole: every evaluation once, the comparison written
    metrics = sorted(out.rglob("metrics.jsonl"))
    assert len(metrics) == 4
    for m in metrics:
        rounds = [json.loads(line)["round"] for line in m.read_text().splitlines()]
        assert rounds == [2, 4], m
    assert json.loads((out / "comparison.json").read_text())
    assert (out / LOCK).read_text() == ""  # released
    # now the folder is free: the same sweep reuses every cell and changes no file
    before = digests(out / "runs")
    messages = []
    run_sweep(spec, out, progress=False, echo=messages.append)
    assert "4 of 4 cells already finished; reusing them" in messages
    assert digests(out / "runs") == before


def test_a_lock_is_exclusive_and_a_killed_holders_lock_is_taken_over(tmp_path):
    lock = Lock(tmp_path / "out", echo=None)
    with pytest.raises(ConfigError, match="is being written by process"):
        Lock(tmp_path / "out", echo=None)  # a second writer, even in this process
    lock.release()
    assert not (tmp_path / "out").exists()  # it made the folder, and nothing was written
    (tmp_path / "out").mkdir()
    # a holder killed before it released: its record is left, the kernel dropped its flock
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    pid = int(dead.stdout)
    (tmp_path / "out" / LOCK).write_text(
        json.dumps({"pid": pid, "host": "h", "since": "then", "command": "fedjax-sel sweep x"})
    )
    said = []
    taken = Lock(tmp_path / "out", echo=said.append)
    assert said == [
        f"{tmp_path / 'out'}: taking over the lock of process {pid} on 'h' since then "
        "(fedjax-sel sweep x), which has ended"
    ]
    assert json.loads((tmp_path / "out" / LOCK).read_text())["pid"] != pid
    taken.release()


def test_out_naming_a_file_is_a_clear_error(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    file = tmp_path / "taken"
    file.write_text("not a folder")
    assert main(["sweep", str(spec), "--out", str(file), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(file)!r} is a file, not a folder" in err and "Traceback" not in err
    assert file.read_text() == "not a folder"


def small(**kw) -> RunConfig:
    """test_experiment's small digits run, at the rounds of :data:`SWEEP`."""
    return experiment_small(**{"rounds": 4, **kw})


def test_another_configuration_is_refused_without_overwrite(tmp_path, capsys):
    # a run
    out = tmp_path / "run"
    run_experiment(small(), out, progress=False, echo=quiet)
    before = digests(out)
    with pytest.raises(ConfigError, match="another configuration") as e:
        run_experiment(small(lr=0.05), out, progress=False, echo=quiet)
    assert "--overwrite" in str(e.value)
    assert digests(out) == before
    config = tmp_path / "other.toml"
    config.write_text(
        'dataset = "digits"\nnum_clients = 10\nper_round = 3\nrounds = 4\neval_every = 2\n'
        "local_steps = 3\nbatch_size = 16\nlr = 0.05\n"
    )
    args = ["run", "--config", str(config), "--out", str(out), "--no-progress"]
    assert main(args) == 2
    assert "would overwrite 1 folder(s) of other results" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    stored = json.loads((out / "config.json").read_text())["config"]
    assert stored["lr"] == 0.05
    # the same configuration again is no conflict (it recomputes the same run)
    assert main(args) == 0
    # a sweep: a changed base setting would replace every finished cell
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    sweep_out = tmp_path / "sweep"
    run_sweep(spec, sweep_out, progress=False, echo=quiet)
    before = digests(sweep_out / "runs")
    spec.write_text(SWEEP.replace("lr = 0.1", "lr = 0.05"))
    with pytest.raises(ConfigError, match="4 cells would overwrite 4 folder"):
        run_sweep(spec, sweep_out, progress=False, echo=quiet)
    assert digests(sweep_out / "runs") == before
    said = []
    run_sweep(spec, sweep_out, progress=False, echo=said.append, overwrite=True)
    assert sum(m.startswith("--overwrite: ") for m in said) == 4
    for cfg in (sweep_out / "runs").rglob("config.json"):
        assert json.loads(cfg.read_text())["config"]["lr"] == 0.05


def test_a_suite_record_of_another_configuration_is_not_replaced(tmp_path):
    store = Store(tmp_path / "per_seed" / "t.json")
    ident = {"phase": "eval", "scenario": "ideal", "strategy": "uniform", "seed": 1}
    store.put({**ident, "key": "old", "metrics": {}})
    assert store.conflicts([(ident, "old")]) == []
    assert store.conflicts([(ident, "new")]) == ["eval/ideal/uniform/1"]
    config = small(seed=1)
    planned = [cells_lib.Planned(ident, config, tmp_path / "runs" / "c", None)]
    # refused before anything runs (a run would need the task, which is None here)
    with pytest.raises(ConfigError, match="holds records of another configuration for 1 cell"):
        suite_run._run_cells(planned, store, 1, suite_run._Progress(None, [], False), quiet)
    assert store.records["eval/ideal/uniform/1"]["key"] == "old"


@pytest.mark.parametrize(
    "labels, clash",
    [(["a_b", "a/b"], "'a_b' and 'a/b'"), (["Uniform", "uniform"], "'Uniform' and 'uniform'")],
)
def test_labels_that_would_share_a_folder_are_refused(labels, clash):
    spec = {
        "sweep": {"seeds": 2},
        "base": {"dataset": "digits", "num_clients": 10, "per_round": 3, "rounds": 2},
        "strategies": [{"label": label, "strategy": "uniform"} for label in labels],
    }
    with pytest.raises(ConfigError, match="would share the folder") as e:
        expand_sweep(spec, "unused")
    assert clash in str(e.value)
    from test_suite import TINY  # the suite's tiny file, parsed only

    suite = json.loads(json.dumps(TINY))
    suite["strategies"].append({"strategy": "uniform", "label": "Power_Of_Choice"})
    with pytest.raises(ConfigError, match="'power_of_choice' and 'Power_Of_Choice'"):
        suite_lib.parse_suite(suite)
    suite = json.loads(json.dumps(TINY))
    suite["scenarios"]["Tuning"] = {}
    with pytest.raises(ConfigError, match="no scenario can be named 'tuning'"):
        suite_lib.parse_suite(suite)


def test_folder_names_keep_safe_characters_only():
    assert folder_name("lr=0.1,mu=0.01") == "lr=0.1_mu=0.01"
    assert folder_name("../x") == ".._x"
    assert folder_name("") == "default"
    assert folder_name("..") == "__" and folder_name(".") == "_"  # never a parent folder
    check_distinct_folders(["a", "b", "a"], "labels")  # repeats of one name are one folder


def test_a_sweep_compares_its_own_cells_not_what_an_earlier_sweep_left(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SWEEP)
    out = tmp_path / "out"
    rows = run_sweep(spec, out, progress=False, echo=quiet)
    assert {r["strategy"] for r in rows} == {"uniform", "full"}
    # the same folder, a sweep of uniform alone: full's cells stay on disk but are not its
    spec.write_text(SWEEP.split('[[strategies]]\nstrategy = "full"')[0])
    rows = run_sweep(spec, out, progress=False, echo=quiet)
    assert {r["strategy"] for r in rows} == {"uniform"}
    assert (out / "runs" / "default" / "full" / "seed0" / "summary.json").exists()
    capsys.readouterr()
    assert main(["compare", str(out), "--metric", "final_accuracy"]) == 0
    printed = capsys.readouterr().out
    assert "uniform" in printed and "full" not in printed


def test_results_files_are_written_whole(tmp_path):
    """``write_atomic`` replaces a file through a temporary one it leaves nowhere;
    ``csv_text`` reads back through the standard csv module as the rows it was given;
    ``save_figure`` writes the format its suffix names."""
    import csv
    import io

    from fedjax_sel.experiment.outputs import csv_text, save_figure, subplots, write_atomic

    path = tmp_path / "f.md"
    write_atomic(path, "old")
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["f.md"]
    rows = [{"strategy": "a,b", "mean": 0.5, "diff": None}, {"strategy": 'q"x', "mean": 1}]
    back = list(csv.DictReader(io.StringIO(csv_text(rows, ["strategy", "mean", "diff"]))))
    assert back == [
        {"strategy": "a,b", "mean": "0.5", "diff": ""},
        {"strategy": 'q"x', "mean": "1", "diff": ""},
    ]
    assert csv_text(rows, []) == ""
    fig, ax = subplots(1, 1, figsize=(2, 2))
    ax.plot([0, 1])
    assert save_figure(fig, tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
