"""Paired comparisons of strategies over seeds (README, "Comparing strategies").

A seed fixes the partition, the initial model, the availability trajectory and the random
numbers every strategy draws (common random numbers), so two strategies run with the same
seed form a *pair*: their difference on that seed is free of most of the seed-to-seed noise.
:func:`compare` reports, per strategy and metric, the mean over seeds with its 95% confidence
interval (Student t), and against a baseline the mean paired difference with its 95% CI
(paired t, and a percentile bootstrap as a check that does not assume normality), the paired
t-test's p-value and the win rate (share of seeds on which the strategy beats the baseline,
ties count one half).

``fedjax-sel compare DIR... --baseline NAME --out OUT`` writes ``OUT/comparison.json`` (a list
of rows with ``strategy``, ``setting``, ``metric``, ``seeds``, ``runs``, ``diverged``, ``mean``,
``ci_low``, ``ci_high``, ``diff``, ``diff_ci_low``, ``diff_ci_high``, ``win_rate`` ...; the diff
fields are null for the baseline itself), ``comparison.csv``, ``comparison.md`` and
``comparison.png`` (mean test-accuracy curves with 95% CI bands). Diverged runs are counted,
never averaged (:func:`compare`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.metric_table import DEFAULT_METRICS, higher_is_better, is_accuracy
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.outputs import (
    CONFIG,
    METRICS,
    SUMMARY,
    csv_text,
    plot_curves,
    read_json,
    read_metrics,
    write_atomic,
    write_json,
)
from fedjax_sel.experiment.stats import mean_ci, paired_stats


# ----------------------------------------------------------------------------- runs
@dataclasses.dataclass
class Run:
    """A finished run folder: its label (strategy), setting (a sweep cell's non-seed grid
    values, ``""`` outside sweeps), seed, summary and evaluation records."""

    path: Path
    label: str
    setting: str
    seed: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def diverged(self) -> bool:
        """The run stopped on a non-finite loss or model: it has no result to compare."""
        return bool(self.summary.get("diverged"))


def sweep_cell_folders(folder: Path) -> list[Path] | None:
    """The cell folders a sweep folder's ``sweep.json`` lists (``None``: not a sweep's), so
    that comparing a sweep reads its own cells, never what an earlier sweep left under
    ``runs/``."""
    if not (folder / "sweep.json").exists():
        return None
    cells = read_json(folder / "sweep.json").get("cells")
    if not isinstance(cells, list):
        return None
    try:
        return [
            folder
            / "runs"
            / folder_name(str(c["setting"]))
            / folder_name(str(c["label"]))
            / f"seed{int(c['seed'])}"
            for c in cells
        ]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{str(folder / 'sweep.json')!r} lists a malformed cell") from None


def load_runs(dirs: Iterable[str | Path]) -> list[Run]:
    """Every finished run (a folder with ``summary.json`` and ``config.json``) under ``dirs``;
    in a sweep's folder, the finished cells its ``sweep.json`` lists."""
    runs = []
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise ConfigError(f"{str(d)!r} does not exist")
        cells = sweep_cell_folders(d)
        if cells is not None:
            found = [c / SUMMARY for c in cells if (c / SUMMARY).exists()]
        else:
            found = [d / SUMMARY] if (d / SUMMARY).exists() else d.rglob(SUMMARY)
        for summary_path in sorted(found):
            folder = summary_path.parent
            if not (folder / CONFIG).exists():
                continue
            info = read_json(folder / CONFIG)
            config = info.get("config", {})
            sweep = info.get("sweep", {})
            label = sweep.get("label") or config.get("label") or config.get("strategy", "?")
            runs.append(
                Run(
                    path=folder,
                    label=str(label),
                    setting=str(sweep.get("setting", "")),
                    seed=int(config.get("seed", 0)),
                    summary=read_json(summary_path),
                    records=read_metrics(folder / METRICS),
                )
            )
    if not runs:
        raise ConfigError(f"no finished runs (summary.json) under {[str(d) for d in dirs]}")
    return runs


def metric_value(run: Run, metric: str) -> float | None:
    """A metric of a run: a summary key, ``accuracy@R`` (test accuracy at the last evaluation
    at or before round R; ``None`` when that evaluation has none, e.g. a diverged model's),
    ``rounds_to:A`` (first evaluated round with test accuracy >= A; ``None`` when never
    reached) or ``time_to:A`` (the simulated seconds at that evaluation, runs with a system
    model). A value that is not a finite number is ``None``."""
    if metric.startswith("accuracy@"):
        r = int(metric.split("@", 1)[1])
        before = [e for e in run.records if e["round"] <= r]
        v = before[-1].get("test_accuracy") if before else None
        return _finite(v)
    if metric.startswith("rounds_to:") or metric.startswith("time_to:"):
        target = float(metric.split(":", 1)[1])
        key = "round" if metric.startswith("rounds_to:") else "sim_time_s"
        for e in run.records:
            if e.get("test_accuracy") is not None and e["test_accuracy"] >= target:
                return None if e.get(key) is None else float(e[key])
        return None
    return _finite(run.summary.get(metric))


def _finite(v: Any) -> float | None:
    """``v`` as a float, or ``None`` when it is not a finite number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def check_metrics(metrics: Sequence[str], runs: Sequence[Run]) -> None:
    """Raises :class:`ConfigError` for a metric that is none of the forms :func:`metric_value`
    reads: a summary metric (of :data:`~.metric_table.DEFAULT_METRICS`, or a number some run's
    summary holds),
    ``accuracy@R``, ``rounds_to:A`` or ``time_to:A``."""
    numeric = set(DEFAULT_METRICS) | {
        k
        for r in runs
        for k, v in r.summary.items()
        if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
    }
    for metric in metrics:
        if metric in numeric:
            continue
        name, sep, arg = metric.partition("@")
        if not sep:
            name, sep, arg = metric.partition(":")
        try:
            if name == "accuracy" and sep == "@" and int(arg) >= 0:
                continue
            if name in ("rounds_to", "time_to") and sep == ":" and math.isfinite(float(arg)):
                continue
        except ValueError:
            pass
        raise ConfigError(
            f"unknown metric {metric!r}; use a summary metric ({', '.join(sorted(numeric))}), "
            "accuracy@R (R a round), rounds_to:A or time_to:A (A an accuracy)"
        )


def sweep_baseline(dirs: Iterable[str | Path]) -> str | None:
    """The baseline of the sweep folders among ``dirs`` (their ``sweep.json``: the file's
    ``[sweep] baseline``, else its first strategy, as the sweep itself compared them);
    ``None`` when no folder is a sweep's. Sweeps of different baselines are an error."""
    found = {}
    for d in dirs:
        path = Path(d) / "sweep.json"
        if not path.exists():
            continue
        info = read_json(path)
        source = info.get("source") if isinstance(info, dict) else None
        options = source.get("sweep", {}) if isinstance(source, dict) else {}
        base = options.get("baseline") if isinstance(options, dict) else None
        cells = info.get("cells") if isinstance(info, dict) else None
        if base is None and isinstance(cells, list) and cells and isinstance(cells[0], dict):
            base = cells[0].get("label")
        if base is not None:
            found[str(path)] = str(base)
    if len(set(found.values())) > 1:
        raise ConfigError(f"the sweeps have different baselines {found}; give --baseline")
    return next(iter(found.values()), None)


def _scaled(value: float | None, scale: float | None) -> float | None:
    return value if value is None or scale is None else scale * value


# ----------------------------------------------------------------------------- compare
def compare(
    dirs: Iterable[str | Path] | None = None,
    *,
    runs: list[Run] | None = None,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    at_rounds: Sequence[int] = (),
    targets: Sequence[float] = (),
    time_targets: Sequence[float] = (),
    percent: bool = False,
    out: str | Path | None = None,
    echo=print,
) -> list[dict[str, Any]]:
    """Compares the strategies of the runs under ``dirs`` (see the module docstring).

    Args:
      dirs: run or sweep folders (searched recursively); or give ``runs``.
      baseline: the label every other strategy is paired against (default: a sweep folder's
        own baseline, its ``sweep.json``'s; else the first label in sorted order); must exist
        in every setting.
      metrics: summary metrics (default: those of :data:`~.metric_table.DEFAULT_METRICS` the
        runs have); an unknown name is a :class:`ConfigError` (:func:`check_metrics`).
      at_rounds: add ``accuracy@R`` for each R.
      targets: add ``rounds_to:A`` for each accuracy A.
      time_targets: add ``time_to:A`` (simulated seconds to accuracy A; runs with a system
        model) for each A.
      percent: report accuracies (metrics named ``*accuracy*`` and ``accuracy@R``) in percent,
        so their differences are percentage points, as papers quote them; each row's ``unit``
        says ``"percent"`` where applied. ``targets`` stay fractions.
      out: folder for comparison.json/csv/md/png (nothing written when ``None``).

    Diverged runs (``diverged: true`` in their summary) have no result: they are left out of
    every mean, interval and paired difference, and each row counts them (``diverged``). A
    run without a finite value of a metric (never reaching a target, a metric it lacks) is
    left out of that metric: ``seeds`` counts the runs with a value, ``runs`` all of them.

    Returns:
      the rows of ``comparison.json``.
    """
    if runs is None:
        runs = load_runs(dirs or [])
        if baseline is None:
            baseline = sweep_baseline(dirs or [])
    if metrics is None:
        metrics = [m for m in DEFAULT_METRICS if any(metric_value(r, m) is not None for r in runs)]
    metrics = list(metrics) + [f"accuracy@{r}" for r in at_rounds]
    metrics += [f"rounds_to:{a:g}" for a in targets]
    metrics += [f"time_to:{a:g}" for a in time_targets]
    check_metrics(metrics, runs)
    rows: list[dict[str, Any]] = []
    settings = sorted({r.setting for r in runs})
    baselines = {
        s: baseline or sorted({r.label for r in runs if r.setting == s})[0] for s in settings
    }
    for setting in settings:
        group = [r for r in runs if r.setting == setting]
        labels = sorted({r.label for r in group})
        base = baselines[setting]
        if base not in labels:
            raise ConfigError(
                f"baseline {base!r} not found{f' in setting {setting!r}' if setting else ''}; "
                f"strategies there: {labels}"
            )
        by_label: dict[str, dict[int, Run]] = {}
        for r in group:
            seeds = by_label.setdefault(r.label, {})
            if r.seed in seeds:
                raise ConfigError(
                    f"two runs of {r.label!r} with seed {r.seed}: {seeds[r.seed].path} and {r.path}"
                )
            seeds[r.seed] = r
        for metric in metrics:
            better = higher_is_better(metric)
            scale = 100.0 if percent and is_accuracy(metric) else None
            by_label_values = {
                label: {
                    s: None if r.diverged else _scaled(metric_value(r, metric), scale)
                    for s, r in seeds.items()
                }
                for label, seeds in by_label.items()
            }
            base_values = by_label_values[base]
            for label in [base] + [x for x in labels if x != base]:
                values = by_label_values[label]
                have = {s: v for s, v in values.items() if v is not None}
                diverged = sum(r.diverged for r in by_label[label].values())
                if not have and not diverged:
                    continue  # the metric does not apply to these runs
                mean, lo, hi = mean_ci(list(have.values())) if have else (None, None, None)
                row: dict[str, Any] = {
                    "strategy": label,
                    "setting": setting,
                    "metric": metric,
                    "seeds": len(have),
                    "runs": len(values),
                    "diverged": diverged,
                    "mean": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "std": float(np.std(list(have.values()), ddof=1)) if len(have) > 1 else None,
                    "higher_is_better": better,
                    "baseline": base,
                    "unit": "percent" if scale else None,
                }
                none = dict.fromkeys(
                    (
                        "diff",
                        "diff_ci_low",
                        "diff_ci_high",
                        "diff_boot_ci_low",
                        "diff_boot_ci_high",
                        "p_value",
                        "win_rate",
                    ),
                )
                if label == base:
                    row.update(none, pairs=0)
                else:
                    common = sorted(s for s in have if base_values.get(s) is not None)
                    if common:
                        row.update(
                            paired_stats(
                                [have[s] for s in common],
                                [base_values[s] for s in common],
                                higher_is_better=better,
                            )
                        )
                    else:
                        row.update(none, pairs=0)
                rows.append(row)
    if out is not None:
        write_comparison(rows, runs, Path(out), baseline_by_setting=baselines)
    if echo is not None:
        echo(markdown(rows))
    return rows


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The comparison as Markdown tables, one per setting and metric. ``seeds`` reads ``k of
    n`` when only k of the n runs have a value; a ``diverged`` column counts the diverged runs
    (left out of every number) in a table that has any."""
    out = []
    keys = list(dict.fromkeys((r["setting"], r["metric"]) for r in rows))
    for setting, metric in keys:
        part = [r for r in rows if r["setting"] == setting and r["metric"] == metric]
        title = f"### {metric}" + (f" ({setting})" if setting else "")
        arrow = "higher is better" if part[0]["higher_is_better"] else "lower is better"
        unit = " (in %, differences in percentage points)" if part[0].get("unit") else ""
        diverged = any(r.get("diverged") for r in part)
        out += [
            title,
            "",
            f"mean over seeds with 95% CI{unit}; paired difference against "
            f"{part[0]['baseline']} with its 95% CI (t; bootstrap in brackets); {arrow}"
            + ("; diverged runs are left out" if diverged else ""),
            "",
            "| strategy | seeds |"
            + (" diverged |" if diverged else "")
            + " mean [95% CI] | diff [95% CI] | bootstrap CI | p | win rate |",
            "|---|---:|" + ("---:|" if diverged else "") + "---|---|---|---:|---:|",
        ]
        for r in part:
            n = 2 if r.get("unit") else 4  # digits: percent to 0.01, fractions to 0.0001
            ci = ""
            if r["ci_low"] is not None:
                ci = f"[{_fmt(r['ci_low'], n)}, {_fmt(r['ci_high'], n)}]"
            if r["diff"] is None:
                diff = boot = p = win = "-"
            else:
                diff = f"{r['diff']:+.{n}f}"
                if r["diff_ci_low"] is not None:
                    diff += f" [{r['diff_ci_low']:+.{n}f}, {r['diff_ci_high']:+.{n}f}]"
                boot = (
                    f"[{r['diff_boot_ci_low']:+.{n}f}, {r['diff_boot_ci_high']:+.{n}f}]"
                    if r["diff_boot_ci_low"] is not None
                    else "-"
                )
                p = _fmt(r["p_value"], 3)
                win = f"{r['win_rate']:.2f}"
            runs = r.get("runs", r["seeds"])
            seeds = f"{r['seeds']}" + (f" of {runs}" if runs != r["seeds"] else "")
            if diverged:
                seeds += f" | {r.get('diverged') or 0}"
            mean = "-" if r["mean"] is None else f"{r['mean']:.{n}f} {ci}"
            out.append(f"| {r['strategy']} | {seeds} | {mean} | {diff} | {boot} | {p} | {win} |")
        out.append("")
    return "\n".join(out)


def _on_time_grid(runs: list[Run], metric: str, points: int = 60):
    """The runs' curves as step functions of simulated time on a common grid, from the
    latest first evaluation (every run has a value) to the shortest run's end:
    ``(grid, values[runs, points], train[runs, points])``."""
    end = min(r.records[-1]["sim_time_s"] for r in runs)
    start = min(max(r.records[0]["sim_time_s"] for r in runs), end)
    grid = np.linspace(start, end, points)
    values, train = [], []
    for r in runs:
        times = np.array([e["sim_time_s"] for e in r.records])
        idx = np.searchsorted(times, grid, side="right") - 1  # last evaluation at or before
        vals = np.array([np.nan if e.get(metric) is None else e[metric] for e in r.records])
        tl = np.array(
            [np.nan if e.get("train_loss") is None else e["train_loss"] for e in r.records]
        )
        values.append(np.where(idx >= 0, vals[np.maximum(idx, 0)], np.nan))
        train.append(np.where(idx >= 0, tl[np.maximum(idx, 0)], np.nan))
    return grid, np.array(values), np.array(train)


def mean_curves(runs: list[Run], metric: str = "test_accuracy", x: str = "round"):
    """Per label: the evaluated rounds (or, with ``x="sim_time_s"``, a grid of simulated
    seconds), and the mean and 95% CI band of ``metric`` over seeds at each point."""
    curves, bands = {}, {}
    if x == "sim_time_s":
        for label in sorted({r.label for r in runs}):
            mine = [r for r in runs if r.label == label and r.records]
            if not mine or any("sim_time_s" not in r.records[-1] for r in mine):
                continue
            grid, values, train = _on_time_grid(mine, metric)
            stats = [
                mean_ci(col[~np.isnan(col)]) if np.any(~np.isnan(col)) else (np.nan, None, None)
                for col in values.T
            ]
            curves[label] = [
                {
                    "sim_time_s": float(t),
                    metric: float(s[0]),
                    "train_loss": float(np.nanmean(tl)) if np.any(~np.isnan(tl)) else None,
                }
                for t, s, tl in zip(grid, stats, train.T, strict=True)
            ]
            if len(mine) > 1:
                bands[label] = (
                    np.array([np.nan if s[1] is None else s[1] for s in stats]),
                    np.array([np.nan if s[2] is None else s[2] for s in stats]),
                )
        return curves, bands
    for label in sorted({r.label for r in runs}):
        mine = [r for r in runs if r.label == label]
        rounds = sorted(set.intersection(*[{e["round"] for e in r.records} for r in mine]))
        if not rounds:
            continue
        values = np.array(
            [
                [next(e for e in r.records if e["round"] == t).get(metric) for t in rounds]
                for r in mine
            ],
            dtype=np.float64,
        )
        stats = [
            mean_ci(values[:, j][~np.isnan(values[:, j])])
            if np.any(~np.isnan(values[:, j]))
            else (np.nan, None, None)
            for j in range(len(rounds))
        ]
        mean = np.array([s[0] for s in stats])
        lo = np.array([np.nan if s[1] is None else s[1] for s in stats])
        hi = np.array([np.nan if s[2] is None else s[2] for s in stats])
        train = np.array(
            [
                [next(e for e in r.records if e["round"] == t).get("train_loss") for t in rounds]
                for r in mine
            ],
            dtype=np.float64,
        )
        curves[label] = [
            {
                "round": t,
                metric: float(m),
                "train_loss": float(np.nanmean(train[:, j]))
                if np.any(~np.isnan(train[:, j]))
                else None,
            }
            for j, (t, m) in enumerate(zip(rounds, mean, strict=True))
        ]
        if len(mine) > 1:
            bands[label] = (lo, hi)
    return curves, bands


def write_comparison(
    rows: list[dict[str, Any]], runs: list[Run], out: Path, baseline_by_setting: dict[str, str]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "comparison.json", rows)
    write_atomic(out / "comparison.csv", csv_text(rows, list(rows[0]) if rows else []))
    write_atomic(out / "comparison.md", markdown(rows) + "\n")
    for setting in sorted({r.setting for r in runs}):
        group = [r for r in runs if r.setting == setting]
        classification = any(e.get("test_accuracy") is not None for r in group for e in r.records)
        metric = "test_accuracy" if classification else "test_loss"
        title = (
            f"mean over seeds, 95% CI{f' ({setting})' if setting else ''}; baseline "
            f"{baseline_by_setting[setting]}"
        )
        suffix = "" if not setting else f"_{folder_name(setting)}"
        timed = all(r.records and "sim_time_s" in r.records[-1] for r in group)
        for x, name in (
            ("round", f"comparison{suffix}.png"),
            ("sim_time_s", f"comparison{suffix}_time.png"),
        ):
            if x == "sim_time_s" and not timed:
                continue
            curves, bands = mean_curves(group, metric, x=x)
            plot_curves(
                curves,
                out / name,
                task="classification" if classification else "regression",
                bands=bands,
                title=title,
                x=x,
            )
