"""The selection benchmark's report: from the document :func:`fedjax_sel.benchmark.
leaderboard.build` computes, the files of an output folder and the docs page.

Writes ``leaderboard.json`` (``rows``, ``ranking``, ``scenarios``, ``tuned_lr``, ``tuned``,
``coverage``, ``runs``), ``leaderboard.csv`` (the rows), ``leaderboard.md``, ``ranking.json``,
``heatmap.png`` (paired differences of stable accuracy against the baseline, Holm-significant
cells starred), ``heatmap_<metric>.png`` for each other headline metric, ``ranking.png``,
``tuning.json`` (every strategy's tuning curve: :func:`~fedjax_sel.benchmark.tuned.
tuning_curves`) and ``tuning.png`` (those curves, :func:`plot_tuning`), and, where the records
have cost series, ``cost_curves.json`` and ``cost_curves_<task>.png`` (accuracy held at equal
cost: :mod:`fedjax_sel.benchmark.curves`); the docs page and the README's block are
:mod:`fedjax_sel.benchmark.page`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.benchmark import curves as curves_lib
from fedjax_sel.benchmark.leaderboard import DEADLINE_BOUNDS, ROW_KEYS, build
from fedjax_sel.benchmark.suite import Suite
from fedjax_sel.benchmark.tuned import tuned_text, tuning_curves
from fedjax_sel.experiment.metric_table import (
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
from fedjax_sel.experiment.records import read_invocations


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


TRACK_TEXT = {
    "selection": "Selection track: every strategy trains the task's `per_round` clients a round "
    "and aggregates them by size-weighted FedAvg, without a proximal term, with FedAvg's server "
    "step: only the choice of clients differs.",
    "bundle": "Bundle track: each strategy with its paper's aggregation, local objective and "
    "server step (strategies whose own bundle is FedAvg's share their selection-track cells).",
}


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
        track = doc.get("ranked_track", "bundle")
        references = doc.get("references") or []
        lines += [
            f"### Overall ranking, {track} track (ranked metric per scenario: {ranked})",
            "",
            TRACK_TEXT.get(track, "")
            + (
                f" Reported, never ranked: {', '.join(f'`{x}`' for x in references)}."
                if references
                else ""
            ),
            "",
            ranking_table(doc),
            "",
            f"![ranking]({images}ranking.png)",
            "",
            f"![paired differences]({images}heatmap.png)",
            "",
        ]
        for other, ranking in (doc.get("rankings") or {}).items():
            if other == track or not ranking:
                continue
            where = (doc.get("track_scenarios") or {}).get(other)
            scope = f"scenarios: {', '.join(where)}" if where else ""
            tasks = doc.get("track_tasks") or {}
            on = tasks.get(other)
            if on and on != tasks.get(track):
                scope = f"tasks: {', '.join(on)}" + (f"; {scope}" if scope else "")
            scope = f" ({scope})" if scope else ""
            lines += [
                f"### Ranking, {other} track{scope}",
                "",
                TRACK_TEXT.get(other, ""),
                "",
                ranking_table({"ranking": ranking}),
                "",
            ]
    lines += _budget_section(doc, images)
    if doc.get("min_detectable_effect"):
        lines += [
            "### Minimum detectable effect",
            "",
            "The smallest paired difference from the baseline in the ranked metric that a "
            "paired t-test finds with power 0.8 at Holm's strictest level over the track's "
            "comparisons (the paired differences' standard deviation pooled over strategies).",
            "",
            "| task | scenario | track | metric | pairs | comparisons | MDE |",
            "|---|---|---|---|---:|---:|---:|",
        ]
        for m in doc["min_detectable_effect"]:
            lines.append(
                f"| {m['task']} | {m['scenario']} | {m['track']} | {m['metric']} | "
                f"{m['pairs']} | {m['comparisons']} | {fmt(m['metric'], m['mde'])} |"
            )
        lines.append("")
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
        lines += [f"### {task} / {scenario}", ""]
        if any(r["applicable"] for r in part):
            lines += [
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
        if na:  # one line per reason, its strategies listed
            reasons: dict[str, list[str]] = {}
            for r in na:
                reasons.setdefault(r["reason"], []).append(f"**{r['strategy']}**")
            if len(na) == len(part):  # the whole cell: its reasons only
                lines.append("Not applicable: " + "; ".join(reasons) + ".")
            else:
                lines.append("")
                lines += [f"- not applicable: {', '.join(s)}: {why}" for why, s in reasons.items()]
        lines.append("")
    if any(doc["tuned_lr"].values()):
        lines += _tuned_section(doc, images)
    if doc["notes"]:
        lines += ["### Strategy settings", ""]
        lines += [f"- **{k}**: {v}" for k, v in doc["notes"].items()]
        lines.append("")
    return "\n".join(lines)


BUDGET_TEXT = {
    "update_auc": "on `update_auc`, the mean accuracy held over [0, B] client updates",
    "accuracy@updates:max": "on `accuracy@updates:B`, the accuracy held at B client updates",
}


def _budget_section(doc: Mapping[str, Any], images: str) -> list[str]:
    """The rankings at equal client updates and the cost-curve figures."""
    lines = []
    budget = {k: v for k, v in (doc.get("budget_rankings") or {}).items() if v}
    if budget:
        lines += [
            "### Ranking at equal client updates",
            "",
            f"The {doc.get('ranked_track', 'bundle')} track's strategies ranked as above, in "
            "every task and scenario, on the accuracy they hold at equal numbers of client "
            "updates (B: the task's largest update budget).",
            "",
        ]
        for name, ranking in budget.items():
            table = ranking_table({"ranking": ranking})
            lines += [f"Ranked {BUDGET_TEXT.get(name, name)}:", "", table, ""]
    tasks = doc.get("cost_curves") or []
    if tasks:
        lines += [
            "### Cost curves",
            "",
            "Test accuracy held at equal cost (client updates, uploaded bytes, client FLOPs, "
            "simulated seconds where the scenario has a clock), mean and 95% Student-t band "
            "over the seeds, up to the baseline's median total; `cost_curves.json` holds the "
            "numbers of every track.",
            "",
        ]
        for t in tasks:
            lines += [f"![cost curves, {t}]({images}{curves_lib.figure_name(t)})", ""]
    return lines


def _tuned_section(doc: Mapping[str, Any], images: str) -> list[str]:
    """The tuned settings per task and strategy, each with its position on its grid."""
    t = doc["tuning"]
    extend = t.get("extend")
    lines = [
        "### Tuned settings",
        "",
        f"Chosen per task and strategy on tuning seeds {t['seeds']} (scenario `{t['scenario']}`, "
        f"metric `{t['metric']}`: the best mean over them), never used for the comparison. The "
        f"lr grid is {t['lr']} in x2 steps"
        + (
            f", {t['configurations']} configurations per strategy"
            if t.get("configurations")
            else ""
        )
        + (
            f", extended by up to {extend} x2 steps while the best point sat at an edge; an "
            "*edge* choice says why it stopped there"
            if extend is not None
            else ""
        )
        + ". The curves: `tuning.json`, and below.",
        "",
        "| task | " + " | ".join(e for e in _labels(doc)) + " |",
        "|---|" + "---|" * len(_labels(doc)),
    ]
    for task, chosen in doc["tuned_lr"].items():
        by_label = {k.split("/", 1)[1]: v for k, v in chosen.items()}
        summaries = {k.split("/", 1)[1]: v for k, v in doc.get("tuned", {}).get(task, {}).items()}
        cells = []
        for label in _labels(doc):
            summary = summaries.get(label)
            point, _ = tuned_text(summary)
            if point is None:
                lr = by_label.get(label)
                cells.append("-" if lr is None else f"{lr:g}")
            else:
                shown = point.removeprefix("lr=")
                edge = summary["position"] != "interior"
                cells.append(f"{shown} (edge: {summary['reason']})" if edge else shown)
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    if doc.get("tuned"):
        lines += ["", f"![tuning curves]({images}tuning.png)"]
    return [*lines, ""]


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


def plot_tuning(curves: Mapping[str, Any], path: Path) -> Path | None:
    """The tuning curves of ``tuning.json``: per task and tuning scenario, each strategy's
    mean tuning metric over the tuning seeds against the lr (log2 axis), with its 95% interval,
    one line per strategy and knob setting; the chosen point is a star, an edge choice a hollow
    one, and a point where a seed diverged an x at the panel's foot."""
    from matplotlib.ticker import FuncFormatter

    rows = curves["curves"]
    panels = list(dict.fromkeys((c["task"], c["scenario"]) for c in rows))
    if not panels:
        return None
    cols = min(3, len(panels))
    grid_rows = -(-len(panels) // cols)
    fig, axes = subplots(grid_rows, cols, figsize=(6.5 * cols, 4.2 * grid_rows), squeeze=False)
    metric = curves["metric"]
    scale = 100.0 if is_accuracy(metric) else 1.0
    for ax, (task, scenario) in zip(axes.flat, panels, strict=False):
        for c in (c for c in rows if (c["task"], c["scenario"]) == (task, scenario)):
            _tuning_lines(ax, c, scale)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("client learning rate")
        ax.set_ylabel(f"{metric}{' (%)' if scale == 100.0 else ''}, mean and 95% CI")
        ax.set_title(f"{task} / {scenario}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"Tuning curves over {len(curves['seeds'])} tuning seeds (star: chosen; hollow: at an "
        "edge; x: a seed diverged)",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _tuning_lines(ax: Any, curve: Mapping[str, Any], scale: float) -> None:
    """One strategy's tuning curve(s) on ``ax``: a line per knob setting, its chosen point a
    star (hollow at an edge)."""
    by_knobs: dict[str, list[Mapping[str, Any]]] = {}
    for p in curve["points"]:
        name = ",".join(f"{k}={v:g}" for k, v in p["knobs"].items())
        by_knobs.setdefault(name, []).append(p)
    for name, every in by_knobs.items():
        points = sorted((p for p in every if p["score"] is not None), key=lambda p: p["lr"])
        gone = [p["lr"] for p in every if p["score"] is None]  # a seed diverged: no mean
        if not points:
            ax.plot(gone, [0.03] * len(gone), "x", transform=ax.get_xaxis_transform())
            continue
        ys = scale * np.array([p["mean"] for p in points])
        lo = scale * np.array(
            [p["ci_low"] if p["ci_low"] is not None else p["mean"] for p in points]
        )
        hi = scale * np.array(
            [p["ci_high"] if p["ci_high"] is not None else p["mean"] for p in points]
        )
        line = ax.errorbar(
            [p["lr"] for p in points],
            ys,
            yerr=[ys - lo, hi - ys],
            marker="o",
            ms=3,
            capsize=2,
            label=curve["strategy"] + (f" [{name}]" if name else ""),
        )
        colour = line[0].get_color()
        if gone:  # at the foot of the panel, in the line's colour
            ax.plot(gone, [0.03] * len(gone), "x", color=colour, transform=ax.get_xaxis_transform())
        for p, y in zip(points, ys, strict=True):
            if p["lr"] == curve["lr"] and p["knobs"] == curve["knobs"]:
                hollow = curve["position"] != "interior"
                ax.plot([p["lr"]], [y], "*", ms=13, color=colour, mfc="none" if hollow else colour)


def machine_text(run: Mapping[str, Any]) -> str:
    """An invocation's machine in a line (records before the one ``machine_info`` named the CPU
    ``cpu`` and its count ``cores``; those since 2026-12-08 name what XLA compiled for,
    ``cpu_target``)."""
    cpu = run.get("cpu_model", run.get("cpu"))
    cores = run.get("cpu_count", run.get("cores"))
    target = f", `{run['cpu_target']}`" if run.get("cpu_target") else ""
    return f"`{cpu}` ({cores} cores, {run['backend']}{target})"


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
    curves = tuning_curves(suite, out)
    write_json(out / "tuning.json", curves)
    plot_tuning(curves, out / "tuning.png")
    costs = curves_lib.write(suite, out)
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
        extra = ", cost_curves.json, cost_curves_<task>.png" if costs is not None else ""
        echo(
            f"leaderboard written to {out}/ (leaderboard.json/csv/md, ranking.png, "
            f"heatmap.png{extra})"
        )
    return doc
