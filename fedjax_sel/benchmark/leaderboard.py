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

Writes ``leaderboard.json`` (``rows``, ``ranking``, ``scenarios``, ``tuned_lr``, ``coverage``),
``leaderboard.csv`` (the rows), ``leaderboard.md``, ``ranking.json``, ``heatmap.png`` (paired
differences of stable accuracy against the baseline, Holm-significant cells starred),
``heatmap_<metric>.png`` for each other headline metric, and ``ranking.png``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.benchmark.suite import SUITE_VERSION, Suite
from fedjax_sel.experiment.compare import holm, mean_ci, paired_stats
from fedjax_sel.experiment.metric_table import (
    CELL_METRICS,
    TARGET_METRICS,
    higher_is_better,
    is_accuracy,
)
from fedjax_sel.experiment.outputs import (
    csv_text,
    save_figure,
    subplots,
    write_atomic,
    write_json,
)
from fedjax_sel.experiment.records import Store, read_invocations

LEVEL = 0.95
BOOTSTRAP = 2000
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
)
DEADLINE_BOUNDS = (0.05, 0.95)  # a deadline hit in fewer or more rounds is misconfigured


def metrics_of(suite: Suite, task_name: str) -> list[str]:
    task = next(t for t in suite.tasks if t.name == task_name)
    return list(CELL_METRICS[:3]) + [f"accuracy@{b}" for b in task.budgets] + list(CELL_METRICS[3:])


def per_seed(store: Store, scenario: str, strategy: str, seeds: Sequence[int]) -> dict[int, dict]:
    """The evaluation records of one strategy in one scenario, by seed (seeds of the suite)."""
    out = {}
    for s in seeds:
        r = store.records.get(
            Store.id({"phase": "eval", "scenario": scenario, "strategy": strategy, "seed": s})
        )
        if r is not None and r.get("suite_version") == SUITE_VERSION:
            out[s] = r
    return out


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
    coverage = {"cells": 0, "finished": 0, "not_applicable": 0}
    stores = {}
    for task in suite.tasks:
        path = out / "per_seed" / f"{task.name}.json"
        store = Store(path)
        stores[task.name] = store
        tuned[task.name] = store.meta.get("tuned_lr", {})
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
                for metric in metrics:
                    row = _row(task.name, scenario.name, entry.label, metric, mine, base, suite)
                    if row is not None:
                        rows.append(row)
            shares = [
                v
                for e in suite.strategies
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
    for metric in sorted({r["metric"] for r in rows}):
        family = [r for r in rows if r["metric"] == metric and r.get("p_value") is not None]
        for r, adj in zip(family, holm([r["p_value"] for r in family]), strict=True):
            r["p_holm"] = adj
    ranking = rank(suite, stores)
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
        "ranking": ranking,
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
        if pairs:
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


def rank(suite: Suite, stores: Mapping[str, Store]) -> list[dict[str, Any]]:
    """Mean rank over (task, scenario) cells with a seed-bootstrap interval (module doc)."""
    labels = [e.label for e in suite.strategies]
    cells = []
    for task in suite.tasks:
        store = stores[task.name]
        for scenario in suite.scenarios:
            usable = [
                e.label for e in suite.strategies if e.reason(task.name, scenario.name) is None
            ]
            metric = suite.rank_metric(scenario)
            kept, matrix = _cell_matrix(store, scenario.name, usable, suite.seeds, metric)
            if len(kept) == len(usable) >= 2:  # a cell is ranked once all of it has run
                cells.append((f"{task.name}/{scenario.name}", kept, matrix))
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
            }
        )
    return sorted(out, key=lambda r: (r["mean_rank"], r["strategy"]))


# ----------------------------------------------------------------------------- text
def fmt(metric: str, v: float | None, *, signed: bool = False) -> str:
    """Accuracies in percent (differences in percentage points), seconds and rounds as they
    are, other metrics to 3 decimals."""
    if v is None:
        return "-"
    if is_accuracy(metric):  # the client spread included: a standard deviation of accuracies
        return f"{100 * v:+.2f}" if signed else f"{100 * v:.2f}"
    if metric in TARGET_METRICS:
        return f"{v:+.0f}" if signed else f"{v:.0f}"
    return f"{v:+.3f}" if signed else f"{v:.3f}"


def _interval(metric: str, lo, hi, signed: bool = False) -> str:
    if lo is None:
        return ""
    return f" [{fmt(metric, lo, signed=signed)}, {fmt(metric, hi, signed=signed)}]"


def ranking_table(doc: Mapping[str, Any]) -> str:
    lines = [
        "| rank | strategy | mean rank [95% bootstrap CI] | cells |",
        "|---:|---|---|---:|",
    ]
    for i, r in enumerate(doc["ranking"], 1):
        lines.append(
            f"| {i} | {r['strategy']} | {r['mean_rank']:.2f} [{r['ci_low']:.2f}, "
            f"{r['ci_high']:.2f}] | {r['cells']} |"
        )
    return "\n".join(lines)


def markdown(doc: Mapping[str, Any], images: str = "") -> str:
    """The leaderboard as Markdown (``images``: the folder prefix of its pictures)."""
    rows = doc["rows"]
    cov = doc["coverage"]
    run = cov["cells"] - cov["not_applicable"]
    lines = [
        f"Suite `{doc['suite']}`: {len(doc['seeds'])} paired evaluation seeds per cell, "
        f"baseline `{doc['baseline']}`; {cov['finished']} of {run} applicable cells finished"
        + (
            " (partial: the same command resumes it, and the ranking covers only the task and "
            "scenario cells whose every strategy has every seed)"
            if cov["finished"] < run
            else ""
        )
        + f". Stable accuracy is the {doc['stable_accuracy']}. Accuracies in %, differences "
        "in percentage points; p: paired t-test; p Holm: adjusted over every comparison of the "
        "metric in the suite; win: share of seeds on which the strategy beats the baseline.",
        "",
    ]
    if doc["ranking"]:
        ranked = ", ".join(f"{s}: {m}" for s, m in doc["ranked_metric"].items())
        lines += [
            f"### Overall ranking (ranked metric per scenario: {ranked})",
            "",
            ranking_table(doc),
            "",
            f"![ranking]({images}ranking.png)",
            "",
            f"![paired differences]({images}heatmap.png)",
            "",
        ]
    if doc["scenarios"]:
        lines += [
            "### Deadlines",
            "",
            "| task | scenario | deadline (s) | rounds cut, baseline | rounds cut, all | "
            "configured well (5-95%) |",
            "|---|---|---:|---:|---:|---|",
        ]
        for s in doc["scenarios"]:
            share = s["deadline_hit_share_baseline"]
            lines.append(
                f"| {s['task']} | {s['scenario']} | {s['deadline_s']} | "
                f"{'-' if share is None else f'{100 * share:.0f}%'} | "
                f"{100 * s['deadline_hit_share_all']:.0f}% | "
                f"{'yes' if s['configured_well'] else 'NO'} |"
            )
        lines.append("")
    cells = list(dict.fromkeys((r["task"], r["scenario"]) for r in rows))
    for task, scenario in cells:
        part = [r for r in rows if r["task"] == task and r["scenario"] == scenario]
        headline = doc["headline"][scenario]
        shown = [headline] + (["stable_accuracy"] if headline != "stable_accuracy" else [])
        shown += [
            m for m in ("final_accuracy", "jain_fairness", "client_accuracy_std") if m not in shown
        ]
        lines += [
            f"### {task} / {scenario}",
            "",
            "| strategy | metric | seeds | mean [95% CI] | diff [95% CI] | p | p Holm | win |",
            "|---|---|---:|---|---|---:|---:|---:|",
        ]
        for metric in shown:
            for r in (r for r in part if r["metric"] == metric):
                n = r["seeds"] if r.get("reached") is None else r["reached"]
                mean = fmt(metric, r["mean"]) + _interval(metric, r["ci_low"], r["ci_high"])
                diff = "-"
                if r["diff"] is not None:
                    diff = fmt(metric, r["diff"], signed=True) + _interval(
                        metric, r["diff_ci_low"], r["diff_ci_high"], signed=True
                    )
                star = "**" if r["p_holm"] is not None and r["p_holm"] < 0.05 else ""
                p = "-" if r["p_value"] is None else f"{r['p_value']:.3f}"
                ph = "-" if r["p_holm"] is None else f"{star}{r['p_holm']:.3f}{star}"
                win = "-" if r["win_rate"] is None else f"{r['win_rate']:.2f}"
                lines.append(
                    f"| {r['strategy']} | {metric} | {n} | {mean} | {diff} | {p} | {ph} | {win} |"
                )
        na = [r for r in part if not r["applicable"]]
        if na:
            lines.append("")
            lines += [f"- not applicable: **{r['strategy']}**: {r['reason']}" for r in na]
        lines.append("")
    if any(doc["tuned_lr"].values()):
        t = doc["tuning"]
        lines += [
            "### Tuned client learning rates",
            "",
            f"Chosen per task and strategy from {t['lr']} on tuning seeds {t['seeds']} "
            f"(scenario `{t['scenario']}`, metric `{t['metric']}`), never used for the "
            "comparison.",
            "",
            "| task | " + " | ".join(e for e in _labels(doc)) + " |",
            "|---|" + "---:|" * len(_labels(doc)),
        ]
        for task, chosen in doc["tuned_lr"].items():
            by_label = {k.split("/", 1)[1]: v for k, v in chosen.items()}
            lines.append(
                f"| {task} | "
                + " | ".join(
                    "-" if by_label.get(e) is None else f"{by_label[e]:g}" for e in _labels(doc)
                )
                + " |"
            )
        lines.append("")
    if doc["notes"]:
        lines += ["### Strategy settings", ""]
        lines += [f"- **{k}**: {v}" for k, v in doc["notes"].items()]
        lines.append("")
    return "\n".join(lines)


def _labels(doc: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["strategy"] for r in doc["rows"]))


# ----------------------------------------------------------------------------- pictures
def plot_heatmap(doc: Mapping[str, Any], metric: str, path: Path) -> Path | None:
    """Paired differences against the baseline, strategies x task/scenario; cells whose
    Holm-adjusted p is below 0.05 are starred, cells where a strategy does not run are grey.
    Accuracy metrics in percentage points, others relative to the baseline's mean (%)."""
    rows = [r for r in doc["rows"] if r["metric"] in (metric, "*")]
    cols = list(
        dict.fromkeys(f"{r['task']}/{r['scenario']}" for r in rows if r["metric"] == metric)
    )
    labels = [x for x in _labels(doc) if x != doc["baseline"]]
    if not cols or not labels:
        return None
    base_mean = {
        f"{r['task']}/{r['scenario']}": r["mean"]
        for r in rows
        if r["strategy"] == doc["baseline"] and r["metric"] == metric
    }
    grid = np.full((len(labels), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in labels]
    for r in rows:
        col = f"{r['task']}/{r['scenario']}"
        if r["strategy"] not in labels or col not in cols:
            continue
        i, j = labels.index(r["strategy"]), cols.index(col)
        if not r["applicable"]:
            text[i][j] = "n/a"
            continue
        if r["diff"] is None:
            continue
        if is_accuracy(metric):
            v = 100 * r["diff"]
        else:
            b = base_mean.get(col)
            v = 100 * r["diff"] / abs(b) if b else np.nan
        grid[i, j] = v if higher_is_better(metric) else -v
        star = "*" if r["p_holm"] is not None and r["p_holm"] < 0.05 else ""
        text[i][j] = f"{(100 * r['diff'] if is_accuracy(metric) else v):+.1f}{star}"
    fig, ax = subplots(1, 1, figsize=(1.3 * len(cols) + 3, 0.4 * len(labels) + 2))
    limit = np.nanmax(np.abs(grid)) if np.any(np.isfinite(grid)) else 1.0
    image = ax.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    ax.set_facecolor("#dddddd")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i in range(len(labels)):
        for j in range(len(cols)):
            if text[i][j]:
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7)
    unit = "percentage points" if is_accuracy(metric) else "% of the baseline's mean"
    ax.set_title(
        f"{metric}: paired difference against {doc['baseline']} ({unit}); "
        "* Holm p < 0.05; blue = better",
        fontsize=9,
    )
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_ranking(doc: Mapping[str, Any], path: Path) -> Path | None:
    ranking = doc["ranking"]
    if not ranking:
        return None
    fig, ax = subplots(1, 1, figsize=(7, 0.35 * len(ranking) + 1.5))
    ys = np.arange(len(ranking))[::-1]
    means = np.array([r["mean_rank"] for r in ranking])
    lo = means - np.array([r["ci_low"] for r in ranking])
    hi = np.array([r["ci_high"] for r in ranking]) - means
    ax.errorbar(means, ys, xerr=[lo, hi], fmt="o", capsize=3)
    ax.set_yticks(ys, [r["strategy"] for r in ranking])
    ax.set_xlabel("mean rank over tasks and scenarios (1 = best), 95% bootstrap CI over seeds")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def invocations(out: str | Path) -> list[dict[str, Any]]:
    """The suite's invocations that ran cells (``OUT/invocations.json``): machine and wall
    seconds of each."""
    return [e for e in read_invocations(Path(out)) if e.get("cells_run")]


def write(
    suite: Suite,
    out: str | Path,
    *,
    echo: Callable | None = print,
) -> dict[str, Any]:
    """Builds the leaderboard of ``out`` and writes its files (module docstring)."""
    out = Path(out)
    doc = build(suite, out)
    doc["runs"] = invocations(out)
    write_json(out / "leaderboard.json", doc)
    write_json(out / "ranking.json", doc["ranking"])
    write_atomic(out / "leaderboard.csv", csv_text(doc["rows"], list(ROW_KEYS)))
    write_atomic(out / "leaderboard.md", markdown(doc) + "\n")
    plot_heatmap(doc, "stable_accuracy", out / "heatmap.png")
    for metric in sorted(set(doc["headline"].values()) - {"stable_accuracy"}):
        plot_heatmap(doc, metric, out / f"heatmap_{metric}.png")
    plot_ranking(doc, out / "ranking.png")
    if echo is not None:
        for s in doc["scenarios"]:
            if not s["configured_well"]:
                echo(
                    f"warning: {s['task']}/{s['scenario']}: the deadline cuts "
                    f"{s['deadline_hit_share_baseline']} of the baseline's rounds (outside "
                    f"{DEADLINE_BOUNDS}): the scenario is misconfigured"
                )
        if doc["ranking"]:
            echo(ranking_table(doc))
        echo(f"leaderboard written to {out}/ (leaderboard.json/csv/md, ranking.png, heatmap.png)")
    return doc


# ----------------------------------------------------------------------------- docs
README_START = "<!-- selection-benchmark:start (generated by benchmarks/selection/report.py) -->"
README_END = "<!-- selection-benchmark:end -->"


def _setup_tables(suite: Suite) -> list[str]:
    def fields(d: Mapping[str, Any]) -> str:
        return ", ".join(f"`{k}={v}`" for k, v in d.items()) or "(defaults)"

    lines = ["| task | settings | target | budgets |", "|---|---|---:|---|"]
    for t in suite.tasks:
        lines.append(
            f"| {t.name} | {fields(t.fields)} | {t.target if t.target is not None else '-'} | "
            f"{', '.join(str(b) for b in t.budgets) or '-'} |"
        )
    lines += ["", "| scenario | settings | headline metric |", "|---|---|---|"]
    for s in suite.scenarios:
        extra = dict(s.fields)
        if s.deadline_quantile is not None:
            extra["deadline_quantile"] = s.deadline_quantile
        lines.append(f"| {s.name} | {fields(extra)} | `{s.headline}` |")
    return lines


def cluster_section(suite_file: str, results: str) -> list[str]:
    """The page's "On a cluster" section: Ray and shards, each with a worked example."""
    return [
        "### On a cluster",
        "",
        "The cells are independent, so the suite spreads over machines two ways, with the same "
        "records either way (a cell's record holds its batch, so whichever machine ran it, the "
        "same kind of machine gives the same bytes; a test runs a tiny suite here, on a local "
        "Ray of 2 CPUs and in two shards, and compares the files).",
        "",
        "**On Ray** (`pip install 'fedjax-sel[ray]'`): `--executor ray` sends each unit of work "
        "(one compiled program: a strategy's tuning grid on a task, or its evaluation seeds in "
        "one scenario) to Ray as a task that declares its resources (`--job-cpus`, default 1; "
        "one GPU where the cluster has GPUs, or `--job-gpus`); a strategy's evaluations go out "
        "once its tuning is back. Without `RAY_ADDRESS` or `--executor ray:ADDRESS` it starts a "
        "local cluster (`--ray-cpus N`), so the same command works on a laptop. Workers record "
        "their cells in parts of their own (`OUT/parts/`), the driver merges them into "
        "`per_seed/` atomically: a killed driver loses no finished unit and a rerun picks up "
        "where it stopped. Ray retries a unit once; one that fails twice is listed with its "
        "error (exit 1). One bar counts cells, with the cluster's throughput. On a cluster, "
        "every node needs this package (the same version) and `--out` on a shared file system:",
        "",
        "```bash",
        "ray start --head --port 6379                    # on the head node",
        "ray start --address HEAD:6379                   # on every other node",
        f"fedjax-sel suite {suite_file} --out /shared/cpu --executor ray:HEAD:6379",
        "```",
        "",
        "**In shards** (a batch scheduler, or machines without Ray): `--shard I/N` runs the "
        "`I`-th of `N` deterministic shares of the jobs (a job is one strategy on one task: its "
        "tuning and the evaluations at the lr it chose) into `OUT/parts/shard-I-of-N/`. Shards "
        "may share one `--out` (each holds the folder's lock shared and its part's "
        "exclusively; a whole-suite run or a merge waits for them), or run apart and have "
        "their `parts/` copied into one folder. `--report-only` merges the parts into "
        "`per_seed/` (refusing a record that would replace another configuration's) and "
        "writes the leaderboard. A SLURM array:",
        "",
        "```bash",
        "#!/bin/bash",
        "#SBATCH --array=1-8 --cpus-per-task=2 --time=04:00:00",
        f"fedjax-sel suite {suite_file} --out /shared/cpu --shard $SLURM_ARRAY_TASK_ID/8 "
        "--no-progress",
        "```",
        "",
        "then, once all eight have finished (`sbatch --dependency=afterok:JOBID`), "
        f"`fedjax-sel suite {suite_file} --out /shared/cpu --report-only`.",
        "",
    ]


def docs_page(doc: Mapping[str, Any], suite: Suite, suite_file: str, results: str) -> str:
    """``docs/benchmark.md``: the setup, the method and the leaderboard of the committed
    results in ``results`` (a path relative to ``docs/``'s parent)."""
    runs = doc.get("runs", [])
    wall = sum(r["wall_seconds"] for r in runs)
    machines = sorted({f"`{r['cpu']}` ({r['cores']} cores, {r['backend']})" for r in runs})
    lines = [
        "# The client-selection benchmark",
        "",
        "<!-- generated by benchmarks/selection/report.py from "
        f"{results}/leaderboard.json; do not edit by hand -->",
        "",
        "Every strategy on the same tasks, under the same availability and device conditions, "
        "paired by seed: a seed fixes the partition, the initial model, the availability "
        "trajectory and every random draw, so two strategies run with one seed form a pair. "
        "Run it (resumable: a killed suite restarts where it stopped, and a cell whose record "
        "is in `per_seed/` is never rerun, on this machine or another):",
        "",
        "```bash",
        f"fedjax-sel suite {suite_file} --out {results}",
        f"fedjax-sel suite {suite_file} --out {results} --report-only   # tables and pictures",
        "python benchmarks/selection/report.py    # this page and the README summary",
        "```",
        "",
        "A suite file has `[suite]` (evaluation seeds, baseline, `stable_fraction`), "
        "`[tuning]` (the lr grid, the tuning seeds, the metric and scenario it is chosen on), "
        "`[tasks.NAME]` and `[scenarios.NAME]` (any `RunConfig` field; a task's `target` "
        "accuracy, round `budgets` and own `lr_grid`; a scenario's `headline` metric and "
        "`deadline_quantile`) and `[[strategies]]` (fields, a `note`, and `not_applicable` "
        "reasons by task or scenario: such a cell is a row with its reason, never dropped); "
        f"[`{suite_file}`](../{suite_file}) documents each key. `--set KEY=VALUE`, "
        "`--seeds N`, `--no-tuning` and `--tasks A,B` make a quick check. Each (task, "
        "scenario, strategy) runs its seeds together in one compiled program; every finished "
        "cell is recorded in `per_seed/<task>.json` with its configuration's hash and the "
        "suite's version; a record of another configuration is never mixed in: the suite "
        "refuses to replace it unless `--overwrite` is given. A record made by this version "
        "also keeps the cell's whole configuration, its batch and its client parallelism, so "
        f"`fedjax-sel suite {suite_file} --out {results} --rerun TASK/SCENARIO/STRATEGY --seed "
        "S` (a tuning cell: `--lr X`) runs the cell again and compares every metric with its "
        "record (exit 0 when identical); the committed records predate this and lack them.",
        "",
        *cluster_section(suite_file, results),
        f"Committed results: `{results}/` (`leaderboard.json`, `.csv`, `.md`, `ranking.json`, "
        "the pictures, and `per_seed/<task>.json`, every cell's metrics, from which everything "
        f"here is computed). Wall time {wall / 3600:.2f} h over {len(runs)} invocation(s) on "
        f"{', '.join(machines) or '-'}.",
        "",
        "## Setup",
        "",
        *_setup_tables(suite),
        "",
        "Strategies run with the settings their papers recommend (listed at the end). The "
        'strategies defined as "every available client" (full, unbiased, adafed, '
        "more_available, ca_fed) have one slot per client, as in their papers: they train up to "
        "K clients a round where the others train `per_round`. Each strategy's client learning "
        "rate is tuned on its own: the grid point with the best mean tuning metric on the "
        "tuning seeds, which the comparison never uses.",
        "",
        "## Method",
        "",
        "- Metrics per cell: final, peak and stable accuracy (stable: the "
        f"{doc['stable_accuracy']}), accuracy at the round budgets, rounds and simulated "
        "seconds to the task's target accuracy (averaged over the seeds that reached it; the "
        "row says how many did), Jain's fairness index of the selection counts, the standard "
        "deviation of the final accuracy over clients (their own test splits), and the share "
        "of rounds the deadline cut.",
        "- Per task, scenario and strategy: the mean over seeds with a 95% Student-t interval; "
        f"the paired difference against `{doc['baseline']}` with its interval, the paired t-test's "
        "p-value and its Holm adjustment over every comparison of that metric in the suite; "
        "the win rate (ties count one half).",
        "- Ranking: in each task and scenario, strategies are ranked per seed on the scenario's "
        "headline metric (a target never reached ranks last); a strategy's rank there is the "
        "mean over seeds, its overall rank the mean over the cells where it runs, with a "
        "percentile bootstrap interval resampling each cell's seeds (2,000 resamples).",
        "- The devices scenario's deadline is a quantile of a uniform round's length under "
        "the system model's device profiles; the table below reports how many rounds it cut "
        "(outside 5-95% the scenario is misconfigured, and the suite says so).",
        "",
        "## Results",
        "",
        markdown(doc, images=f"../{results}/"),
    ]
    return "\n".join(lines).rstrip() + "\n"


def readme_block(doc: Mapping[str, Any], page: str = "docs/benchmark.md") -> str:
    """The README's summary of the benchmark: coverage and the overall ranking."""
    cov = doc["coverage"]
    run = cov["cells"] - cov["not_applicable"]
    top = doc["ranking"][:5]
    lines = [
        README_START,
        f"**Selection benchmark** (`{doc['suite']}` suite, [{page}]({page})): "
        f"{len(doc['seeds'])} paired seeds per cell, {cov['finished']} of {run} cells "
        f"finished{' so far' if cov['finished'] < run else ''}. Mean rank over tasks and "
        "scenarios (1 = best), 95% bootstrap CI:",
        "",
    ]
    if top:
        lines += [
            "| rank | strategy | mean rank [95% CI] |",
            "|---:|---|---|",
            *(
                f"| {i} | {r['strategy']} | {r['mean_rank']:.2f} [{r['ci_low']:.2f}, "
                f"{r['ci_high']:.2f}] |"
                for i, r in enumerate(top, 1)
            ),
            "",
            *(
                [
                    f"{', '.join(doc['every_client'])} train every available client (a slot per "
                    "client, as their papers define them), the others `per_round` a round."
                ]
                if doc.get("every_client")
                else []
            ),
            f"The other {len(doc['ranking']) - len(top)} strategies, every cell's paired "
            f"difference against {doc['baseline']} with Holm-adjusted p-values, and the "
            f"heatmap: [{page}]({page}).",
        ]
    else:
        lines.append("No cell has finished yet.")
    lines.append(README_END)
    return "\n".join(lines)


def replace_readme_block(text: str, block: str) -> str:
    """``text`` (the README) with its benchmark block replaced by ``block``."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError("README has no selection-benchmark block")
    return text[:start] + block + text[end + len(README_END) :]
