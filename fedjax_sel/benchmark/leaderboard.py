"""The selection benchmark's statistics and outputs, computed from the per-seed records alone
(``OUT/per_seed/<task>.json``, :mod:`fedjax_sel.benchmark.suite`).

Per task, scenario, strategy and metric: the mean over the evaluation seeds with its 95%
Student-t interval, the paired difference against the baseline (uniform sampling) with its
interval, the paired t-test's p-value, its Holm adjustment over every comparison of that metric
in the suite (one family per metric: the suite's strategies x tasks x scenarios), and the win
rate (ties count one half). Rounds and simulated seconds to the task's target accuracy are
averaged over the seeds that reached it (``reached`` says how many did; pairs need both).

The ranking: in every (task, scenario) the strategies are ranked on each seed by the ranked
metric (each scenario's headline; a target never reached ranks last), a strategy's cell rank
is its mean over seeds, and its overall rank the mean over the cells where it runs; the
interval is a percentile bootstrap that resamples each cell's seeds (2,000 resamples, fixed
generator).

Every row carries the point its strategy's tuning chose (``tuned``: ``lr=0.2`` or
``lr=0.2,beta=1``) and that point's position on its grid (``tuned_position``: ``interior``, or
``edge (REASON)``: :mod:`fedjax_sel.benchmark.tuned`).

The rankings at equal client updates (:func:`budget_rankings`: on ``update_auc`` and on the
accuracy at each task's largest update budget) are :func:`rank` on those metrics; the tasks
with cost curves (``cost_curves``) come from :mod:`fedjax_sel.benchmark.curves`.

:func:`build` computes ``leaderboard.json``'s document (``rows``, ``ranking``, ``scenarios``,
``tuned_lr``, ``tuned``, ``coverage``, ``budget_rankings``, ``cost_curves``);
:mod:`fedjax_sel.benchmark.report` writes it with its tables, pictures and the docs page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.benchmark.cells import per_seed
from fedjax_sel.benchmark.curves import curve_tasks
from fedjax_sel.benchmark.suite import SUITE_VERSION, Scenario, Suite, Task
from fedjax_sel.benchmark.tracks import ranked_entries, track_labels
from fedjax_sel.benchmark.tuned import tuned_text
from fedjax_sel.experiment.metric_table import (
    CELL_METRICS,
    TARGET_METRICS,
    higher_is_better,
)
from fedjax_sel.experiment.metric_table import metric as metric_info
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.stats import (
    LEVEL,
    holm,
    mean_ci,
    min_detectable_effect,
    paired_stats,
)

BOOTSTRAP = 2000  # resamples of the ranking's seed bootstrap
ROW_KEYS = (
    "task",
    "scenario",
    "strategy",
    "metric",
    "seeds",
    "mean",
    "ci_low",
    "ci_high",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "p_value",
    "p_holm",
    "win_rate",
    "applicable",
    "reason",
    "higher_is_better",
    "reached",
    "diverged",
    "baseline",
    "tuned",
    "tuned_position",
    "track",
    "ranked",
    "pairs",
)
MIN_PAIRS = 3  # a difference from fewer seed pairs is not reported as one
DEADLINE_BOUNDS = (0.05, 0.95)  # a deadline hit in fewer or more rounds is misconfigured


def metrics_of(suite: Suite, task_name: str) -> list[str]:
    """The leaderboard's metrics of a task: the cells' accuracies, then the accuracy at each of
    the task's round budgets and client-update budgets, then the cells' other metrics (the
    table's order)."""
    task = next(t for t in suite.tasks if t.name == task_name)
    accuracies = [m for m in CELL_METRICS if metric_info(m).unit == "accuracy"]
    others = [m for m in CELL_METRICS if m not in accuracies]
    budgets = [f"accuracy@{b}" for b in task.budgets]
    budgets += [f"accuracy@updates:{b}" for b in task.update_budgets]
    return [*accuracies, *budgets, *others]


def _value(record: Mapping[str, Any] | None, metric: str) -> float | None:
    if record is None:
        return None
    v = record["metrics"].get(metric)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def build(suite: Suite, out: str | Path) -> dict[str, Any]:
    """The leaderboard document from ``out/per_seed/*.json``."""
    out = Path(out)
    rows: list[dict[str, Any]] = []
    scenarios: list[dict[str, Any]] = []
    tuned: dict[str, Any] = {}
    tunings: dict[str, Any] = {}
    coverage = {"cells": 0, "finished": 0, "not_applicable": 0}
    stores = {}
    for task in suite.tasks:
        path = out / "per_seed" / f"{task.name}.json"
        store = Store(path)
        stores[task.name] = store
        tuned[task.name] = store.meta.get("tuned_lr", {})
        tunings[task.name] = {
            k: {f: v for f, v in t.items() if f != "points"}
            for k, t in store.meta.get("tuned", {}).items()
        }
        metrics = metrics_of(suite, task.name)
        for scenario in suite.scenarios:
            base = per_seed(store, scenario.name, suite.baseline, suite.seeds)
            for entry in suite.strategies:
                reason = entry.reason(task.name, scenario.name)
                coverage["cells"] += len(suite.seeds)
                if reason is not None:
                    coverage["not_applicable"] += len(suite.seeds)
                    rows.append(_na_row(task.name, scenario.name, entry.label, suite, reason))
                    continue
                mine = per_seed(store, scenario.name, entry.label, suite.seeds)
                coverage["finished"] += len(mine)
                chosen = f"{suite.tuning_scenario(scenario.name)}/{entry.label}"
                point, position = tuned_text(store.meta.get("tuned", {}).get(chosen))
                for metric in metrics:
                    row = _row(task.name, scenario.name, entry.label, metric, mine, base, suite)
                    if row is not None:
                        row.update(
                            tuned=point,
                            tuned_position=position,
                            track=entry.track,
                            ranked=not entry.reference,
                        )
                        rows.append(row)
            shares = [  # a not-applicable strategy's leftover records are no cell of it
                v
                for e in suite.strategies
                if e.reason(task.name, scenario.name) is None
                for r in per_seed(store, scenario.name, e.label, suite.seeds).values()
                if (v := _value(r, "deadline_hit_share")) is not None
            ]
            base_shares = [
                v for r in base.values() if (v := _value(r, "deadline_hit_share")) is not None
            ]
            if shares:
                lo, hi = DEADLINE_BOUNDS
                share = float(np.mean(base_shares)) if base_shares else None
                scenarios.append(
                    {
                        "task": task.name,
                        "scenario": scenario.name,
                        "deadline_s": store.meta.get("deadlines", {}).get(scenario.name),
                        "deadline_hit_share_baseline": share,
                        "deadline_hit_share_all": float(np.mean(shares)),
                        "configured_well": share is not None and lo <= share <= hi,
                    }
                )
    # one Holm family per (track, metric): the ranked headline's comparisons are one family,
    # each secondary metric its own
    for track, metric in sorted({(r["track"], r["metric"]) for r in rows if r["track"]}):
        family = [
            r
            for r in rows
            if r["metric"] == metric and r["track"] == track and r.get("p_value") is not None
        ]
        for r, adj in zip(family, holm([r["p_value"] for r in family]), strict=True):
            r["p_holm"] = adj
    rankings = {track: rank(suite, stores, track) for track in suite.tracks}
    ranking = rankings[suite.tracks[0]]
    return {
        "suite": suite.name,
        "suite_version": SUITE_VERSION,
        "baseline": suite.baseline,
        "seeds": list(suite.seeds),
        "tuning": {
            "lr": list(suite.tuning.lr),
            "seeds": list(suite.tuning.seeds),
            "metric": suite.tuning.metric,
            "scenario": suite.tuning.scenario or suite.scenarios[0].name,
            "configurations": suite.tuning.configurations,
            "extend": suite.tuning.extend,
        },
        "stable_accuracy": f"mean test accuracy over the last {suite.stable_fraction:.0%} of "
        "rounds, every one of them evaluated",
        "headline": {s.name: s.headline for s in suite.scenarios},
        "ranked_metric": {s.name: suite.rank_metric(s) for s in suite.scenarios},
        "notes": {e.label: e.note for e in suite.strategies if e.note},
        "every_client": [e.label for e in suite.strategies if e.fields.get("per_round") == "all"],
        "coverage": coverage,
        "scenarios": scenarios,
        "tuned_lr": tuned,
        "tuned": tunings,
        "ranking": ranking,
        "ranked_track": suite.tracks[0],
        "tracks": {t: track_labels(suite.strategies, t) for t in suite.tracks},
        "track_scenarios": {t: [s.name for s in suite.track_scenarios(t)] for t in suite.tracks},
        "track_tasks": {t: [x.name for x in suite.track_tasks(t)] for t in suite.tracks},
        "rankings": rankings,
        "budget_rankings": budget_rankings(suite, stores),
        "cost_curves": curve_tasks(suite, stores),
        "references": [e.label for e in suite.strategies if e.reference],
        "min_detectable_effect": detectable_effects(suite, stores),
        "rows": rows,
    }


def _na_row(task: str, scenario: str, strategy: str, suite: Suite, reason: str) -> dict:
    row = dict.fromkeys(ROW_KEYS)
    row.update(
        task=task,
        scenario=scenario,
        strategy=strategy,
        metric="*",
        seeds=0,
        applicable=False,
        reason=reason,
        baseline=suite.baseline,
    )
    return row


def _row(task, scenario, strategy, metric, mine, base, suite) -> dict[str, Any] | None:
    values = {s: _value(r, metric) for s, r in mine.items()}
    have = {s: v for s, v in values.items() if v is not None}
    target = metric in TARGET_METRICS
    if not have and not (
        target and any(_value(r, "reached_target") is not None for r in mine.values())
    ):
        return None
    better = higher_is_better(metric)
    row = dict.fromkeys(ROW_KEYS)
    row.update(
        task=task,
        scenario=scenario,
        strategy=strategy,
        metric=metric,
        seeds=len(have),
        applicable=True,
        higher_is_better=better,
        baseline=suite.baseline,
        diverged=sum(1 for r in mine.values() if r.get("diverged")),
    )
    if target:
        row["reached"] = f"{len(have)}/{len(mine)}"
    if have:
        row["mean"], row["ci_low"], row["ci_high"] = mean_ci(list(have.values()), LEVEL)
    if strategy != suite.baseline:
        pairs = sorted(s for s in have if _value(base.get(s), metric) is not None)
        row["pairs"] = len(pairs)
        if len(pairs) >= MIN_PAIRS:
            stats = paired_stats(
                [have[s] for s in pairs],
                [_value(base[s], metric) for s in pairs],
                higher_is_better=better,
                level=LEVEL,
            )
            row.update(
                {
                    k: stats[k]
                    for k in ("diff", "diff_ci_low", "diff_ci_high", "p_value", "win_rate")
                }
            )
    return row


def _cell_matrix(
    store: Store, scenario: str, labels: list[str], seeds: Sequence[int], metric: str
) -> tuple[list[str], np.ndarray]:
    """Per-seed values ``[strategies, seeds]`` of the strategies with every seed recorded,
    oriented so that larger is better; a target never reached is the worst (``-inf``)."""
    sign = 1.0 if higher_is_better(metric) else -1.0
    kept, matrix = [], []
    for label in labels:
        mine = per_seed(store, scenario, label, seeds)
        if len(mine) < len(seeds):
            continue
        row = []
        for s in seeds:
            v = _value(mine[s], metric)
            if v is None and metric in TARGET_METRICS:
                row.append(-math.inf)
            elif v is None:
                break
            else:
                row.append(sign * v)
        else:
            kept.append(label)
            matrix.append(row)
    return kept, np.asarray(matrix, np.float64).reshape(len(kept), len(seeds))


def _ranks(matrix: np.ndarray) -> np.ndarray:
    """Rank 1 = best (largest) per column, ties averaged; the mean over columns per row."""
    from scipy.stats import rankdata

    return rankdata(-matrix, axis=0, method="average").mean(axis=1)


def detectable_effects(suite: Suite, stores: Mapping[str, Store]) -> list[dict[str, Any]]:
    """Per task, scenario and track, the ranked metric's minimum detectable effect against the
    baseline (:func:`~fedjax_sel.experiment.stats.min_detectable_effect`: power 0.8 at Holm's
    strictest level over the track's comparisons of that metric), from the paired differences'
    standard deviation pooled over the track's strategies."""
    out = []
    for track in suite.tracks:
        entries = [e for e in ranked_entries(suite.strategies, track) if e.label != suite.baseline]
        cells = [
            (task, scenario, [e for e in entries if e.reason(task.name, scenario.name) is None])
            for task in suite.track_tasks(track)
            for scenario in suite.track_scenarios(track)
        ]
        comparisons = sum(len(compared) for *_, compared in cells)
        for task, scenario, compared in cells:
            metric = suite.rank_metric(scenario)
            store = stores[task.name]
            base = per_seed(store, scenario.name, suite.baseline, suite.seeds)
            variances, pairs = [], []
            for e in compared:
                mine = per_seed(store, scenario.name, e.label, suite.seeds)
                both = [(_value(mine[s], metric), _value(base.get(s), metric)) for s in mine]
                d = [x - y for x, y in both if x is not None and y is not None]
                if len(d) >= MIN_PAIRS:
                    variances.append(float(np.var(d, ddof=1)))
                    pairs.append(len(d))
            if not pairs:
                continue
            sd = math.sqrt(float(np.mean(variances)))
            out.append(
                {
                    "task": task.name,
                    "scenario": scenario.name,
                    "track": track,
                    "metric": metric,
                    "pairs": min(pairs),
                    "comparisons": comparisons,
                    "sd_diff": sd,
                    "mde": min_detectable_effect(sd, min(pairs), comparisons),
                }
            )
    return out


def rank(
    suite: Suite,
    stores: Mapping[str, Store],
    track: str | None = None,
    metric: Callable[[Task, Scenario], str | None] | None = None,
) -> list[dict]:
    """Mean rank over (task, scenario) cells with a seed-bootstrap interval (module doc), of
    the ranked (non-reference) strategies of ``track`` (default: the ranked track), on
    ``metric(task, scenario)`` (default: the scenario's ranked metric; ``None``: the cell is
    not ranked)."""
    track = track or suite.tracks[0]
    entries = ranked_entries(suite.strategies, track)
    labels = [e.label for e in entries]
    cells = []
    identical: dict[str, dict[str, str]] = {}
    for task in suite.track_tasks(track):
        store = stores[task.name]
        for scenario in suite.track_scenarios(track):
            usable = [e.label for e in entries if e.reason(task.name, scenario.name) is None]
            on = suite.rank_metric(scenario) if metric is None else metric(task, scenario)
            if on is None:
                continue
            kept, matrix = _cell_matrix(store, scenario.name, usable, suite.seeds, on)
            if len(kept) == len(usable) >= 2:  # a cell is ranked once all of it has run
                name = f"{task.name}/{scenario.name}"
                kept, matrix = _distinct(kept, matrix, name, identical)
                cells.append((name, kept, matrix))
    if not cells:
        return []
    rng = np.random.default_rng(0)
    point = {label: [] for label in labels}
    boot = {label: np.zeros((BOOTSTRAP, 0)) for label in labels}
    per_cell: dict[str, dict[str, float]] = {label: {} for label in labels}
    for name, kept, matrix in cells:
        ranks = _ranks(matrix)
        n = matrix.shape[1]
        idx = rng.integers(0, n, size=(BOOTSTRAP, n))
        sampled = np.stack([_ranks(matrix[:, i]) for i in idx])  # [B, strategies]
        for j, label in enumerate(kept):
            point[label].append(ranks[j])
            per_cell[label][name] = float(ranks[j])
            boot[label] = np.concatenate([boot[label], sampled[:, j : j + 1]], axis=1)
    out = []
    for label in labels:
        if not point[label]:
            continue
        means = boot[label].mean(axis=1)
        lo, hi = np.quantile(means, [0.5 - LEVEL / 2, 0.5 + LEVEL / 2])
        out.append(
            {
                "strategy": label,
                "mean_rank": float(np.mean(point[label])),
                "ci_low": float(lo),
                "ci_high": float(hi),
                "cells": len(point[label]),
                "of_strategies": {name: len(kept) for name, kept, _ in cells if label in kept},
                "rank_by_cell": per_cell[label],
                "track": track,
                "identical_to": identical.get(label, {}),
            }
        )
    return sorted(out, key=lambda r: (r["mean_rank"], r["strategy"]))


def _distinct(
    labels: list[str], matrix: np.ndarray, cell: str, identical: dict[str, dict[str, str]]
) -> tuple[list[str], np.ndarray]:
    """The strategies of a cell with their per-seed values, each set of identical rows counted
    once (the first in file order; ``identical[label][cell]`` names it for the others)."""
    keep = []
    for i, label in enumerate(labels):
        twin = next((labels[j] for j in keep if np.array_equal(matrix[j], matrix[i])), None)
        if twin is None:
            keep.append(i)
        else:
            identical.setdefault(label, {})[cell] = twin
    return [labels[i] for i in keep], matrix[keep]


# ----------------------------------------------------------------------------- rankings
def _largest_budget(task: Task, scenario: Scenario) -> str | None:
    return f"accuracy@updates:{max(task.update_budgets)}" if task.update_budgets else None


def _auc(task: Task, scenario: Scenario) -> str | None:
    return "update_auc" if task.update_budgets else None


# ranking name -> the metric it ranks on in a (task, scenario) cell (None: not ranked there)
BUDGET_RANKINGS: dict[str, Callable[[Task, Scenario], str | None]] = {
    "update_auc": _auc,
    "accuracy@updates:max": _largest_budget,
}


def budget_rankings(suite: Suite, stores: Mapping[str, Store]) -> dict[str, list[dict]]:
    """The ranked track's mean ranks at equal client updates (module doc), by ranking name."""
    return {
        name: rank(suite, stores, suite.tracks[0], metric=metric)
        for name, metric in BUDGET_RANKINGS.items()
    }
