"""One suite, three ways to run it (``fedjax-sel suite``): here, in two shards into one folder
merged by ``--report-only``, and on a local Ray cluster of 2 CPUs. The records are the same
bytes whichever ran them; the shards' lock and the merge of parts are checked on their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.cli.main import main
from fedjax_sel.experiment.outdir import Lock
from fedjax_sel.experiment.records import (
    INVOCATIONS,
    Store,
    merge_parts,
    part_folder,
    shard_share,
)

MINI = {
    "suite": {"name": "mini", "seeds": 2, "baseline": "uniform", "seeds_together": 2},
    "tuning": {"lr": [0.1, 0.2], "seeds": [100, 101, 102], "extend": 1},
    "tasks": {
        "digits": {
            "dataset": "digits",
            "num_clients": 8,
            "per_round": 3,
            "rounds": 2,
            "local_steps": 1,
            "batch_size": 16,
            "eval_every": 1,
            "test_fraction": 0.2,
            "target": 0.3,
        }
    },
    "scenarios": {"ideal": {}},
    "strategies": [{"strategy": "uniform"}, {"strategy": "power_of_choice"}],
}


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """The suite file and its records run here, the reference for the other ways."""
    root = tmp_path_factory.mktemp("executors")
    path = root / "mini.json"
    path.write_text(json.dumps(MINI))
    assert main(["suite", str(path), "--out", str(root / "here"), "--no-progress"]) == 0
    return path, root / "here"


def _suite(path: Path, out: Path, *flags: str) -> int:
    return main(["suite", str(path), "--out", str(out), "--no-progress", *flags])


def test_two_shards_into_one_folder_then_report_only_equal_one_run(mini, tmp_path):
    path, here = mini
    out = tmp_path / "sharded"
    assert _suite(path, out, "--shard", "1/2") == 0
    assert (part_folder(out, "shard-1-of-2") / "per_seed" / "digits.json").exists()
    assert not (out / "per_seed").exists()  # a shard writes its part only
    assert not (out / "leaderboard.json").exists()
    first = Store(part_folder(out, "shard-1-of-2") / "per_seed" / "digits.json")
    assert {r["strategy"] for r in first.records.values()} == {"uniform"}  # the first job
    assert _suite(path, out, "--shard", "2/2") == 0
    assert _suite(path, out, "--report-only") == 0
    assert not (out / "parts").exists()
    assert (out / "per_seed" / "digits.json").read_bytes() == (
        here / "per_seed" / "digits.json"
    ).read_bytes()
    mine, theirs = (json.loads((d / "leaderboard.json").read_text()) for d in (out, here))
    assert mine["rows"] == theirs["rows"] and mine["ranking"] == theirs["ranking"]
    runs = json.loads((out / INVOCATIONS).read_text())
    assert sorted(r["part"] for r in runs) == ["shard-1-of-2", "shard-2-of-2"]
    assert sorted(r["shard"] for r in runs) == ["1/2", "2/2"]
    # a shard whose share is recorded runs nothing again
    assert _suite(path, out, "--shard", "1/2") == 0
    assert not (part_folder(out, "shard-1-of-2") / "per_seed").exists()


def test_on_a_local_ray_cluster_the_records_are_the_same_bytes(mini, tmp_path):
    pytest.importorskip("ray", reason="the ray extra: pip install 'fedjax-sel[ray]'")
    path, here = mini
    out = tmp_path / "ray"
    assert _suite(path, out, "--executor", "ray", "--ray-cpus", "2") == 0
    assert (out / "per_seed" / "digits.json").read_bytes() == (
        here / "per_seed" / "digits.json"
    ).read_bytes()
    assert not (out / "parts").exists()  # every worker's part merged and dropped
    (run,) = json.loads((out / INVOCATIONS).read_text())
    assert run["executor"] == "ray" and run["cluster"]["CPU"] == 2
    # per strategy: its tuning grid, the extensions its choice asked for, its evaluations
    store = Store(here / "per_seed" / "digits.json")
    extensions = sum(t["extensions"] for t in store.meta["tuned"].values())
    assert run["cells_run"] == len(store.records) == 2 * (6 + 2) + 3 * extensions
    assert sum(w["units"] for w in run["workers"]) == 4 + extensions


def test_jobs_are_shared_deterministically_and_completely():
    suite = suite_lib.parse_suite(
        {**MINI, "strategies": [{"strategy": s} for s in ("uniform", "power_of_choice", "full")]}
    )
    jobs = [(t.name, e.label) for t, e in cells_lib.jobs(suite, suite.tasks)]
    shares = [
        [(t.name, e.label) for t, e in shard_share(cells_lib.jobs(suite, suite.tasks), i, 2)]
        for i in (1, 2)
    ]
    assert shares == [[jobs[0], jobs[2]], [jobs[1]]]
    assert sorted(shares[0] + shares[1]) == sorted(jobs)


def test_shards_share_the_folder_and_keep_out_every_exclusive_writer(tmp_path):
    out = tmp_path / "out"
    one = Lock(out, None, shared=True)
    part = Lock(part_folder(out, "shard-1-of-2"), None)
    two = Lock(out, None, shared=True)  # a second shard is welcome
    with pytest.raises(ConfigError, match="being written by shards shard-1-of-2 .*process"):
        Lock(out, None)  # a whole suite, or a merge, is not
    with pytest.raises(ConfigError, match="being written by process"):
        Lock(part_folder(out, "shard-1-of-2"), None)  # nor the same shard twice
    for lock in (part, two, one):
        lock.release()
    Lock(out, None).release()


def _record(strategy: str, seed: int, key: str) -> dict:
    return {"phase": "eval", "scenario": "s", "strategy": strategy, "seed": seed, "key": key}


def test_merging_parts_refuses_another_configuration_and_is_idempotent(tmp_path):
    out = tmp_path / "out"
    main_store = Store(out / "per_seed" / "t.json")
    main_store.put(_record("a", 1, "k1"))
    main_store.meta = {"tuned_lr": {"s/a": 0.1}}
    main_store.save()
    part = Store(part_folder(out, "shard-1-of-2") / "per_seed" / "t.json")
    part.put(_record("b", 1, "k2"))
    part.put(_record("a", 1, "k1"))  # the same record again: no conflict
    part.meta = {"tuned_lr": {"s/b": 0.3}, "deadlines": {}}
    part.save()
    (part_folder(out, "shard-1-of-2") / INVOCATIONS).write_text(json.dumps([{"cells_run": 1}]))
    assert merge_parts(out, echo=None) == 2
    merged = Store(out / "per_seed" / "t.json")
    assert sorted(merged.records) == ["eval/s/a/1", "eval/s/b/1"]
    assert merged.meta["tuned_lr"] == {"s/a": 0.1, "s/b": 0.3}
    assert json.loads((out / INVOCATIONS).read_text()) == [{"cells_run": 1, "part": "shard-1-of-2"}]
    assert merge_parts(out, echo=None) == 0  # nothing left to merge
    clash = Store(part_folder(out, "shard-2-of-2") / "per_seed" / "t.json")
    clash.put(_record("a", 1, "OTHER"))
    clash.save()
    with pytest.raises(ConfigError, match=r"shard-2-of-2/t: eval/s/a/1 .*--overwrite"):
        merge_parts(out, echo=None)
    assert Store(out / "per_seed" / "t.json").records["eval/s/a/1"]["key"] == "k1"
    assert merge_parts(out, overwrite=True, echo=None) == 1
    assert Store(out / "per_seed" / "t.json").records["eval/s/a/1"]["key"] == "OTHER"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--shard", "3/2"], "--shard '3/2': I must be between 1 and N"),
        (["--shard", "one"], "--shard must be I/N"),
        (["--executor", "dask"], "--executor must be local, ray or ray:ADDRESS, got 'dask'"),
        (["--shard", "1/2", "--executor", "ray"], "does not combine with --executor ray"),
        (["--report-only", "--shard", "1/2"], "--report-only runs nothing"),
    ],
)
def test_bad_shard_and_executor_flags_are_named(mini, tmp_path, capsys, flags, message):
    path, _ = mini
    assert _suite(path, tmp_path / "x", *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_unit_that_fails_on_ray_is_reported_with_its_error(tmp_path, capsys):
    pytest.importorskip("ray", reason="the ray extra: pip install 'fedjax-sel[ray]'")
    task = {**MINI["tasks"]["digits"], "dataset": "mnist", "data_path": str(tmp_path / "x.npz")}
    bad = {k: v for k, v in MINI.items() if k != "tuning"} | {"tasks": {"mnist": task}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert _suite(path, tmp_path / "out", "--executor", "ray", "--ray-cpus", "2") == 1
    err = capsys.readouterr().err
    assert "2 unit(s) of the suite failed on Ray (each tried twice)" in err
    for strategy in ("uniform", "power_of_choice"):
        assert f"mnist/eval/ideal/{strategy}: fedjax_sel.base.ConfigError" in err
    assert "x.npz' does not exist" in err
    assert not (tmp_path / "out" / "leaderboard.json").exists()
    assert Store(tmp_path / "out" / "per_seed" / "mnist.json").records == {}


def test_job_units_count_the_cells_the_suite_plans(tmp_path):
    """``job_units`` (what both progress bars count) against the cells actually planned."""
    spec = {**MINI, "scenarios": {"ideal": {}, "flaky": {"availability": "bernoulli:p=0.8"}}}
    spec["tuning"] = {**MINI["tuning"], "scenario": "each"}
    suite = suite_lib.parse_suite(spec)
    by_name = {s.name: s for s in suite.scenarios}
    for task, entry in cells_lib.jobs(suite, suite.tasks):
        planned = []
        for tune, scenarios in cells_lib.tuned_scenarios(suite, task, entry).items():
            cells = cells_lib.tuning_cells(suite, task, by_name[tune], entry, tmp_path, None)
            planned.append((tune, len(cells)))
            for s in scenarios:
                evals = cells_lib.eval_cells(suite, task, s, entry, tmp_path, 0.1, None)
                planned.append((s.name, len(evals)))
        units = [(s.name, n) for s, n in cells_lib.job_units(suite, task, entry)]
        assert units == planned == [("ideal", 6), ("ideal", 2), ("flaky", 6), ("flaky", 2)]
