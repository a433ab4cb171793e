"""The selection benchmark (``fedjax-sel suite``): a tiny suite run end to end, its statistics
recomputed independently from the per-seed records (NumPy/SciPy), resume, planted rankings,
the stable-accuracy tail and the suite file's errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import leaderboard, page
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.cli.main import main
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.loop import chunk_length
from fedjax_sel.experiment.provenance import cpu_code_target
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.stats import holm

TINY = {
    "suite": {"name": "tiny", "seeds": 3, "baseline": "uniform"},
    "tuning": {"lr": [0.1, 0.2], "seeds": [100, 101, 102], "extend": 0},
    "tasks": {
        "digits": {
            "dataset": "digits",
            "num_clients": 10,
            "per_round": 3,
            "rounds": 6,
            "local_steps": 2,
            "batch_size": 16,
            "eval_every": 3,
            "test_fraction": 0.2,
            "target": 0.3,
            "budgets": [3],
        },
        "synthetic": {
            "dataset": "leaf_synthetic",
            "num_clients": 12,
            "per_round": 3,
            "rounds": 6,
            "local_steps": 2,
            "batch_size": 10,
            "eval_every": 3,
            "test_fraction": 0.2,
            "target": 0.2,
            "lr_grid": [0.05, 0.1],
        },
    },
    "scenarios": {
        "ideal": {},
        "devices": {
            "system": "lognormal",
            "availability": "bernoulli:p=0.8",
            "deadline_quantile": 0.5,
            "overcommit": 1.34,
            "dropout": 0.1,
            "headline": "time_to_target",
        },
    },
    "strategies": [
        {"strategy": "uniform"},
        {"strategy": "power_of_choice", "note": "d = 2 per_round"},
        {
            "strategy": "full",
            "per_round": "all",
            "reference": True,
            "not_applicable": {"devices": "waits for every client"},
        },
    ],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    path = out / "tiny.json"
    path.write_text(json.dumps(TINY))
    assert main(["suite", str(path), "--out", str(out / "res"), "--no-progress"]) == 0
    return path, out / "res"


def _records(res: Path, task: str) -> list[dict]:
    return json.loads((res / "per_seed" / f"{task}.json").read_text())["cells"]


def _values(res, task, scenario, strategy, metric):
    return {
        r["seed"]: r["metrics"].get(metric)
        for r in _records(res, task)
        if r["phase"] == "eval" and r["scenario"] == scenario and r["strategy"] == strategy
    }


def _holm_reference(p):
    """Holm (1979) written out: compare the sorted p_(i) with alpha / (m - i + 1) ... as
    adjusted values, the running maximum of (m - i + 1) p_(i), capped at 1."""
    p = list(p)
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    prev = 0.0
    for i, idx in enumerate(order):
        prev = max(prev, min(1.0, (m - i) * p[idx]))
        out[idx] = prev
    return out


def test_tiny_suite_rows_recomputed_from_the_per_seed_files(tiny):
    _, res = tiny
    doc = json.loads((res / "leaderboard.json").read_text())
    rows = doc["rows"]
    # every (task, scenario, strategy) is present: applicable with its metrics or marked
    for task in ("digits", "synthetic"):
        for scenario in ("ideal", "devices"):
            for strategy in ("uniform", "power_of_choice", "full"):
                mine = [
                    r
                    for r in rows
                    if (r["task"], r["scenario"], r["strategy"]) == (task, scenario, strategy)
                ]
                assert mine, (task, scenario, strategy)
                if strategy == "full" and scenario == "devices":
                    assert [r["applicable"] for r in mine] == [False]
                    assert mine[0]["reason"] == "waits for every client"
                else:
                    assert all(r["applicable"] for r in mine)
    checked = 0
    for r in rows:
        if not r["applicable"] or r["metric"] in leaderboard.TARGET_METRICS:
            continue
        mine = _values(res, r["task"], r["scenario"], r["strategy"], r["metric"])
        base = _values(res, r["task"], r["scenario"], "uniform", r["metric"])
        x = np.array([mine[s] for s in sorted(mine)], np.float64)
        assert r["seeds"] == 3 == x.size
        half = stats.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
        assert r["mean"] == pytest.approx(x.mean(), abs=1e-12)
        assert r["ci_low"] == pytest.approx(x.mean() - half, abs=1e-12)
        if r["strategy"] == "uniform":
            assert r["diff"] is None
            continue
        b = np.array([base[s] for s in sorted(mine)], np.float64)
        d = x - b
        assert r["diff"] == pytest.approx(d.mean(), abs=1e-12)
        if d.std(ddof=1) > 0:
            assert r["p_value"] == pytest.approx(stats.ttest_rel(x, b).pvalue, rel=1e-9)
            dhalf = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
            assert r["diff_ci_high"] == pytest.approx(d.mean() + dhalf, abs=1e-12)
        better = 1 if r["higher_is_better"] else -1
        win = np.mean(np.where(better * d > 0, 1, np.where(d == 0, 0.5, 0)))
        assert r["win_rate"] == pytest.approx(win)
        checked += 1
    assert checked >= 20
    # Holm over every comparison of one metric in the suite
    for metric in {r["metric"] for r in rows if r["applicable"]}:
        family = [r for r in rows if r["metric"] == metric and r["p_value"] is not None]
        want = _holm_reference([r["p_value"] for r in family])
        assert [r["p_holm"] for r in family] == pytest.approx(want, abs=1e-12)


def test_tiny_suite_targets_deadlines_and_tuning(tiny):
    path, res = tiny
    doc = json.loads((res / "leaderboard.json").read_text())
    # rounds and seconds to target: interpolated linearly between the evaluation below the
    # target and the first at or above it; the cost series and update budgets from metrics.jsonl
    (task,) = [t for t in suite_lib.load_suite(path).tasks if t.name == "digits"]
    assert task.update_budgets == (3 * 3, 3 * 6)  # per_round x the round budget and x rounds
    for r in _records(res, "digits"):
        if r["phase"] != "eval":
            continue
        folder = res / "runs" / "digits" / r["scenario"] / r["strategy"] / f"seed{r['seed']}"
        evals = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        acc = np.array([e["test_accuracy"] for e in evals])
        timed = "sim_time_s" in evals[0]
        assert ("time_to_target" in r["metrics"]) == timed == ("sim_seconds" in r["series"])
        for metric, x in (
            ("rounds_to_target", [e["round"] for e in evals]),
            *([("time_to_target", [e["sim_time_s"] for e in evals])] if timed else []),
        ):
            i = int(np.argmax(acc >= 0.3)) if np.any(acc >= 0.3) else None
            want = (
                None if i is None
                else x[0] if i == 0
                else np.interp(0.3, acc[i - 1 : i + 1], x[i - 1 : i + 1])
            )  # fmt: skip
            assert r["metrics"][metric] == pytest.approx(want, rel=1e-12)
        series = r["series"]
        assert series["client_updates"] == [e["client_updates"] for e in evals]
        assert series["client_flops"] == [e["client_flops"] for e in evals]
        assert series["uplink_bytes"] == [e["uplink_bytes"] for e in evals]
        if timed:
            assert series["sim_seconds"] == [e["sim_time_s"] for e in evals]
        assert series["test_accuracy"] == [e["test_accuracy"] for e in evals]
        # held accuracy at each integer number of updates: the last evaluation within it
        budget = max(task.update_budgets)
        updates = np.array(series["client_updates"])
        held = [
            acc[j] if (j := np.searchsorted(updates, k, side="right") - 1) >= 0 else 0.0
            for k in range(budget + 1)
        ]
        for b in task.update_budgets:
            want = held[b] if updates[0] <= b else None
            assert r["metrics"][f"accuracy@updates:{b}"] == pytest.approx(want)
        assert r["metrics"]["update_auc"] == pytest.approx(np.mean(held[:budget]), rel=1e-9)
        # the last round (10% of 6 rounds, rounded up) is evaluated on its own
        assert [e["round"] for e in evals] == [3, 5, 6]
        assert r["metrics"]["stable_accuracy"] == pytest.approx(evals[-1]["test_accuracy"])
        if r["scenario"] == "devices":
            config = json.loads((folder / "config.json").read_text())["config"]
            seconds = [s for e in evals for s in e["round_seconds"]]
            share = np.mean([s >= config["deadline"] * (1 - 1e-6) for s in seconds])
            assert r["metrics"]["deadline_hit_share"] == pytest.approx(share)
    (deadline,) = [s for s in doc["scenarios"] if s["task"] == "digits"]
    assert deadline["deadline_s"] > 0
    # tuning: the lr of the best mean tuning metric, on the tuning seeds only (ties: the first)
    tune = [r for r in _records(res, "digits") if r["phase"] == "tune"]
    assert {r["seed"] for r in tune} == {100, 101, 102}
    for label in ("uniform", "power_of_choice", "full"):
        scores = {
            lr: np.mean(
                [r["metrics"]["stable_accuracy"] for r in tune
                 if r["strategy"] == label and r["lr"] == lr]
            )
            for lr in (0.1, 0.2)
        }  # fmt: skip
        best = max(scores, key=lambda lr: (scores[lr], -lr))
        assert doc["tuned_lr"]["digits"][f"ideal/{label}"] == best
        folder = res / "runs" / "digits" / "ideal" / label / "seed0"
        assert json.loads((folder / "config.json").read_text())["config"]["lr"] == best
    assert doc["tuned_lr"]["synthetic"]["ideal/uniform"] in (0.05, 0.1)  # its own grid
    (run,) = doc["runs"]  # the invocation: its machine and wall time
    cells = 2 * 3 * (3 + 3) + 2 * (3 * 3 + 2 * 3)  # tuning grids, then evaluations
    assert run["cells_run"] == cells and run["wall_seconds"] > 0 and run["cpu_model"]
    md = (res / "leaderboard.md").read_text()
    assert "not applicable: **full**: waits for every client" in md
    for name in ("heatmap.png", "heatmap_time_to_target.png", "ranking.png", "leaderboard.csv"):
        assert (res / name).stat().st_size > 0


def test_tiny_suite_resumes_from_records_and_reruns_only_what_is_missing(
    tiny, tmp_path, monkeypatch
):
    path, res = tiny
    copy = tmp_path / "res"
    shutil.copytree(res, copy)
    shutil.rmtree(copy / "runs")  # another machine: only the committed records
    store = json.loads((copy / "per_seed" / "digits.json").read_text())
    dropped = [
        c
        for c in store["cells"]
        if (c["phase"], c["scenario"], c["strategy"], c["seed"]) == ("eval", "ideal", "uniform", 1)
    ]
    assert len(dropped) == 1
    store["cells"].remove(dropped[0])
    (copy / "per_seed" / "digits.json").write_text(json.dumps(store))
    ran = []
    from fedjax_sel.experiment import sweep as sweep_lib

    real = sweep_lib.run_cells

    def spy(cells, **kw):
        ran.extend((c.label, c.setting, c.config.seed, c.config.dataset) for c in cells)
        return real(cells, **kw)

    monkeypatch.setattr(sweep_lib, "run_cells", spy)
    assert main(["suite", str(path), "--out", str(copy), "--no-progress"]) == 0
    assert ran == [("uniform", "ideal", 1, "digits")]
    again = json.loads((copy / "per_seed" / "digits.json").read_text())
    (back,) = [
        c
        for c in again["cells"]
        if c["phase"] == "eval"
        and c["scenario"] == "ideal"
        and c["strategy"] == "uniform"
        and c["seed"] == 1
    ]
    # the same seed, run alone instead of in a batch of three: equal up to the float reduction
    # order a batch can change (README, "Seeds together"), one test example at most here
    for key, value in dropped[0]["metrics"].items():
        assert back["metrics"][key] == pytest.approx(value, abs=0.01), key
    # a record of another configuration is recomputed, never mixed
    suite = suite_lib.parse_suite(TINY)
    task, scenario, entry = suite.tasks[0], suite.scenarios[0], suite.strategies[0]
    a = suite_lib.cell_config(suite, task, scenario, entry, seed=1, lr=0.1, deadline=None)
    b = suite_lib.cell_config(suite, task, scenario, entry, seed=1, lr=0.3, deadline=None)
    c = a.replace(data_path="/elsewhere")
    assert cells_lib.cell_key(a) != cells_lib.cell_key(b)
    assert cells_lib.cell_key(a) == cells_lib.cell_key(c)  # where the files live is no setting


def test_records_carry_config_and_batch_and_a_rerun_gives_byte_identical_records(tiny, tmp_path):
    """Each per-seed record carries the cell's whole configuration (it hashes to the record's
    key) and how the cell ran: the members vmapped with it (its seed among them; the grid
    points where tuning runs them together), the batch size and how it was chosen, and the
    client parallelism. The same suite run twice into new folders gives byte-identical
    ``per_seed`` files: the batching is deterministic (the memory bound comes from the total
    memory, not from what is free) and recorded."""
    path, res = tiny
    argv = ["suite", str(path), "--out", str(tmp_path / "again"), "--tasks", "digits"]
    assert main([*argv, "--no-progress"]) == 0
    first = (res / "per_seed" / "digits.json").read_bytes()
    assert first == (tmp_path / "again" / "per_seed" / "digits.json").read_bytes()
    records = json.loads(first)["cells"]
    assert len(records) == 3 * 2 * 3 + 3 * 3 + 2 * 3  # tuning, ideal, devices (no full)
    for r in records:
        config = RunConfig.from_dict(r["config"])
        assert cells_lib.cell_key(config) == r["key"]
        assert (config.seed, config.label, config.dataset) == (r["seed"], r["strategy"], "digits")
        batch = r["batch"]
        assert batch["chosen_by"] == "memory" and batch["size"] == len(batch["seeds"])
        assert r["parallel"] and r["cpu_target"] == cpu_code_target()
        if r["phase"] == "eval":  # the three seeds of a strategy: one batch
            assert batch["seeds"] == [0, 1, 2] and batch["bound"] == 3 and "hparams" not in batch
        else:  # the tuning seeds at both grid points, vmapped together
            assert config.lr == r["lr"] and batch["seeds"] == [100, 101, 102] * 2
            assert [h["lr"] for h in batch["hparams"]] == [0.1] * 3 + [0.2] * 3


def test_a_not_applicable_strategys_leftover_records_count_nowhere(tiny, tmp_path):
    """A record left in per_seed/ for a cell the suite does not run (``full`` is not
    applicable in ``devices``; the committed digits file held 72 such IFCA/FeSEM records) adds
    nothing to the scenario's deadline statistics."""
    path, res = tiny
    suite = suite_lib.load_suite(path)
    (tmp_path / "per_seed").mkdir()
    records = json.loads((res / "per_seed" / "digits.json").read_text())
    applicable = [
        r["metrics"]["deadline_hit_share"]
        for r in records["cells"]
        if r["phase"] == "eval" and r["scenario"] == "devices"
    ]
    (a_cell,) = [
        r for r in records["cells"]
        if r["phase"] == "eval" and r["scenario"] == "devices" and r["strategy"] == "uniform"
        and r["seed"] == 0
    ]  # fmt: skip
    leftover = dict(a_cell, strategy="full")
    leftover["metrics"] = dict(a_cell["metrics"], deadline_hit_share=1.0)
    records["cells"].append(leftover)
    (tmp_path / "per_seed" / "digits.json").write_text(json.dumps(records))
    doc = leaderboard.build(suite, tmp_path)
    (devices,) = [s for s in doc["scenarios"] if s["task"] == "digits"]
    assert devices["deadline_hit_share_all"] == pytest.approx(np.mean(applicable))
    assert not any(r["strategy"] == "full" and r["scenario"] == "devices" for r in doc["rows"]
                   if r.get("mean") is not None)  # fmt: skip


def test_not_applicable_by_cell_task_scenario_or_everywhere():
    entry = suite_lib.Entry(
        "x", {}, not_applicable={"digits/ideal": "a", "synthetic": "b", "devices": "c"}
    )
    assert entry.reason("digits", "ideal") == "a"
    assert entry.reason("synthetic", "ideal") == "b"
    assert entry.reason("digits", "devices") == "c"
    assert entry.reason("digits", "correlated") is None
    everywhere = suite_lib.Entry("y", {}, not_applicable={"*": "d", "ideal": "e"})
    assert everywhere.reason("digits", "ideal") == "e"
    assert everywhere.reason("mnist", "devices") == "d"


def test_holm_matches_the_written_out_procedure():
    rng = np.random.default_rng(3)
    for m in (1, 2, 7, 40):
        p = rng.uniform(0, 0.2, m).tolist()
        assert holm(p) == pytest.approx(_holm_reference(p))
    # ties and a value that caps at 1
    assert holm([0.01, 0.01, 0.6]) == pytest.approx([0.03, 0.03, 0.6])
    assert holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])


def test_ranking_recovers_a_planted_order(tmp_path):
    spec = json.loads(json.dumps(TINY))
    spec["strategies"] = [
        {"strategy": "uniform"},
        {"strategy": "power_of_choice"},
        {"strategy": "active_fl"},
        {"strategy": "full", "per_round": "all", "reference": True},
    ]
    spec["tuning"] = {}
    suite = suite_lib.parse_suite(spec)
    rng = np.random.default_rng(0)
    # full is a reference: its (best) records are reported, never ranked
    quality = {"full": 0.95, "active_fl": 0.9, "power_of_choice": 0.8, "uniform": 0.7}
    for task in suite.tasks:
        store = Store(tmp_path / "per_seed" / f"{task.name}.json")
        for scenario in suite.scenarios:
            for label, q in quality.items():
                for seed in suite.seeds:
                    acc = q + 0.01 * rng.standard_normal()
                    # a time to target: the best strategy fastest; uniform never gets there
                    time_to = None if label == "uniform" else 100 / q
                    store.put(
                        {
                            "phase": "eval",
                            "scenario": scenario.name,
                            "strategy": label,
                            "seed": seed,
                            "key": "k",
                            "suite_version": suite_lib.SUITE_VERSION,
                            "metrics": {
                                "stable_accuracy": acc,
                                "time_to_target": time_to,
                                "reached_target": float(time_to is not None),
                            },
                        }
                    )
        store.save()
    doc = leaderboard.build(suite, tmp_path)
    ranking = doc["ranking"]
    assert [r["strategy"] for r in ranking] == ["active_fl", "power_of_choice", "uniform"]
    assert ranking[0]["mean_rank"] == 1.0 and ranking[-1]["mean_rank"] == 3.0
    assert ranking[0]["cells"] == 4
    for r in ranking:
        assert r["ci_low"] <= r["mean_rank"] <= r["ci_high"]
    # a cell where one strategy lacks a seed is not ranked yet
    store = Store(tmp_path / "per_seed" / "digits.json")
    del store.records[
        Store.id({"phase": "eval", "scenario": "ideal", "strategy": "uniform", "seed": 2})
    ]
    store.save()
    partial = leaderboard.build(suite, tmp_path)
    assert all(r["cells"] == 3 for r in partial["ranking"])
    assert all("digits/ideal" not in r["rank_by_cell"] for r in partial["ranking"])
    # the time rows average the seeds that reached the target and say how many did
    (row,) = [
        r
        for r in doc["rows"]
        if r["task"] == "digits"
        and r["scenario"] == "devices"
        and r["strategy"] == "uniform"
        and r["metric"] == "time_to_target"
    ]
    assert row["reached"] == "0/3" and row["mean"] is None


def test_stable_accuracy_is_the_tail_of_the_run():
    config = RunConfig(rounds=40, eval_every=5, eval_tail=4)
    done, chunks = 0, []
    while done < config.rounds:
        n = chunk_length(config, done)
        chunks.append(n)
        done += n
    assert chunks == [5] * 7 + [1] * 5  # 35 rounds in chunks of 5, then 36..40 each evaluated
    assert chunk_length(RunConfig(rounds=12, eval_every=5), 10) == 2  # without a tail: as before
    records = [
        {"round": r, "test_accuracy": a}
        for r, a in [(35, 0.1), (36, 0.5), (37, 0.6), (38, 0.7), (39, 0.8), (40, 0.9)]
    ]
    from fedjax_sel import metrics

    summary = metrics.accuracy_summary(
        [r["test_accuracy"] for r in records], window=4, rounds=[r["round"] for r in records]
    )
    assert summary["stable_accuracy"] == pytest.approx(np.mean([0.6, 0.7, 0.8, 0.9]))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s["suite"].update(baseline="nope"), "baseline 'nope'"),
        (lambda s: s["tuning"].update(seeds=[1, 100, 101]), "also evaluation seeds"),
        (lambda s: s["tasks"]["digits"].update(target=1.5), "target must be an accuracy"),
        (lambda s: s["tasks"]["digits"].update(colour="red"), "unknown key(s) ['colour']"),
        (lambda s: s["scenarios"]["devices"].update(deadline_quantile=1.2), "deadline_quantile"),
        (lambda s: s["scenarios"]["ideal"].update(deadline_quantile=0.5), "needs a system"),
        (lambda s: s["strategies"][2].update(not_applicable={"mars": "x"}), "['mars']"),
        (lambda s: s["strategies"].append({"strategy": "uniform"}), "labels must be distinct"),
        (lambda s: s["strategies"].append({"strategy": "teleport", "label": "t"}), "teleport"),
        (lambda s: s["tasks"]["digits"].update(seed=3), "set by the suite"),
    ],
)
def test_suite_file_errors_name_the_bad_value(change, message):
    spec = json.loads(json.dumps(TINY))
    change(spec)
    with pytest.raises(ConfigError, match=None) as e:
        suite_lib.parse_suite(spec)
    assert message in str(e.value)


ROOT = Path(__file__).resolve().parents[1]


def _assert_same(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


RESULTS = ROOT / "benchmarks" / "results" / "selection" / "cpu"


def test_committed_leaderboard_docs_and_readme_are_the_per_seed_records():
    """Deleting every run folder and rebuilding from the committed per-seed records gives the
    committed leaderboard, docs/benchmark.md and the README's summary, number for number."""
    import importlib.util

    from fedjax_sel.experiment.outputs import dumps

    committed = json.loads((RESULTS / "leaderboard.json").read_text())
    suite = suite_lib.load_suite(ROOT / "benchmarks" / "selection" / "cpu.toml")
    rebuilt = json.loads(dumps(leaderboard.build(suite, RESULTS)))
    for key in rebuilt:  # floats to 1e-9: another CPU may sum in another order
        _assert_same(rebuilt[key], committed[key], key)
    # the committed leaderboard names its machine and wall time (once any cell has run)
    assert committed["runs"] or committed["coverage"]["finished"] == 0
    spec = importlib.util.spec_from_file_location(
        "selection_report", ROOT / "benchmarks" / "selection" / "report.py"
    )
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    for path, text in report.generated().items():
        assert path.read_text() == text, (
            f"{path.name} is stale: run python benchmarks/selection/report.py"
        )
    # the README's first screen links the benchmark with its headline ranking
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert "docs/benchmark.md" in head and page.README_START in head


@pytest.mark.parametrize(
    "argv",
    [
        ["--rerun", "digits/ideal/power_of_choice", "--seed", "1"],  # a batch of three seeds
        ["--rerun", "digits/devices/uniform", "--seed", "2"],  # the clock, a deadline, dropouts
        ["--rerun", "digits/ideal/uniform", "--seed", "101", "--lr", "0.2"],  # two grid points
    ],
)
def test_rerun_of_a_recorded_cell_reproduces_its_metrics_bit_for_bit(tiny, argv, capsys):
    """``suite --rerun`` runs the cell's program group again from the records alone (their
    configurations, batches and parallelism) and finds every metric identical; a planted
    change in the record is found."""
    path, res = tiny
    before = {p: p.stat().st_mtime_ns for p in res.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["suite", str(path), "--out", str(res), *argv]) == 0
    printed = capsys.readouterr().out
    assert "every metric equals its record, bit for bit" in printed
    assert before == {p: p.stat().st_mtime_ns for p in res.rglob("*") if p.is_file()}
    from fedjax_sel.benchmark.rerun import rerun_cell

    suite = suite_lib.load_suite(path)
    cell, seed = argv[1], int(argv[3])
    lr = float(argv[5]) if len(argv) > 4 else None
    store_path = res / "per_seed" / "digits.json"
    original = store_path.read_bytes()
    try:
        data = json.loads(original)
        for r in data["cells"]:
            if (r["scenario"], r["strategy"], r["seed"], r.get("lr")) == (
                *cell.split("/")[1:],
                seed,
                lr,
            ):
                r["metrics"]["final_accuracy"] += 1e-7
        store_path.write_text(json.dumps(data))
        result = rerun_cell(suite, res, cell, seed, lr=lr, echo=lambda *a: None)
        assert result["differs"] == ["final_accuracy"]
    finally:
        store_path.write_bytes(original)


def test_rerun_names_what_it_cannot_find(tiny, capsys):
    path, res = tiny
    for argv, message in (
        (["--rerun", "digits/ideal/uniform"], "--rerun needs --seed"),
        (["--rerun", "digits/ideal/nope", "--seed", "1"], "'nope' is not a strategy"),
        (
            ["--rerun", "digits/ideal/uniform", "--seed", "7"],
            "has no record 'eval/ideal/uniform/7'",
        ),
        (["--rerun", "digits/ideal", "--seed", "1"], "takes TASK/SCENARIO/STRATEGY"),
        (["--seed", "1"], "go with --rerun"),
    ):
        assert main(["suite", str(path), "--out", str(res), *argv]) == 2
        assert message in capsys.readouterr().err


def test_rerun_of_a_tuning_cell_with_a_knob_and_a_planted_series_change(tmp_path, capsys):
    """A tuning cell of a strategy that tunes a knob is named by its lr and ``--knob``; the
    rerun compares the cost series too, so a planted change in one is found."""
    spec = {
        "suite": {"name": "knob", "seeds": [0], "baseline": "uniform"},
        "tuning": {"lr": [0.1, 0.2], "seeds": [100, 101, 102], "extend": 0, "configurations": 4},
        "tasks": {
            "digits": {
                "dataset": "digits",
                "num_clients": 8,
                "per_round": 2,
                "rounds": 3,
                "local_steps": 1,
                "batch_size": 16,
                "eval_every": 3,
                "test_fraction": 0.2,
            }
        },
        "scenarios": {"ideal": {}},
        "strategies": [{"strategy": "uniform"}, {"strategy": "f3ast", "tune": {"beta": [0, 0.1]}}],
    }
    path = tmp_path / "knob.json"
    path.write_text(json.dumps(spec))
    res = tmp_path / "res"
    assert main(["suite", str(path), "--out", str(res), "--no-progress"]) == 0
    records = Store(res / "per_seed" / "digits.json").records.values()
    tuned = next(r for r in records if r["strategy"] == "f3ast" and r["phase"] == "tune")
    assert tuned["knobs"] and tuned["series"]["client_updates"][-1] == 2 * 3  # per_round x rounds
    argv = ["suite", str(path), "--out", str(res), "--rerun", "digits/ideal/f3ast"]
    argv += ["--seed", str(tuned["seed"]), "--lr", f"{tuned['lr']:g}"]
    knobs = [f"--knob={k}={v:g}" for k, v in tuned["knobs"].items()]
    capsys.readouterr()
    assert main([*argv, *knobs]) == 0
    assert "every metric equals its record, bit for bit" in capsys.readouterr().out
    assert main(argv) == 2  # without its knob: no such record, and the error says what to add
    assert "--knob NAME=VALUE" in capsys.readouterr().err
    assert main([*argv, "--knob", "beta"]) == 2
    assert "--knob takes NAME=VALUE" in capsys.readouterr().err
    from fedjax_sel.benchmark.rerun import print_rerun, rerun_cell

    store_path = res / "per_seed" / "digits.json"
    data = json.loads(store_path.read_text())
    for r in data["cells"]:
        if r["phase"] == "eval" and r["strategy"] == "uniform":
            r["series"]["client_flops"][-1] += 1.0
    store_path.write_text(json.dumps(data))
    suite = suite_lib.load_suite(path)
    result = rerun_cell(suite, res, "digits/ideal/uniform", 0, echo=lambda *a: None)
    assert result["differs"] == ["series:client_flops"]
    assert result["same_target"] is True and result["recorded_on"] == cpu_code_target()
    # made on another CPU target, or on one the record does not name: the difference says so
    for target, same, says in (
        ("GenuineIntel 6/143: avx2 avx512f", False, "made on another CPU target (GenuineIntel"),
        (None, None, "does not name the CPU target"),
    ):
        for r in data["cells"]:
            if r["phase"] == "eval" and r["strategy"] == "uniform":
                r.pop("cpu_target")
                if target is not None:
                    r["cpu_target"] = target
        store_path.write_text(json.dumps(data))
        result = rerun_cell(suite, res, "digits/ideal/uniform", 0, echo=lambda *a: None)
        assert result["same_target"] is same and result["recorded_on"] == target
        lines: list[str] = []
        print_rerun(result, echo=lines.append)
        assert says in lines[-1] and cpu_code_target() in lines[-1]
