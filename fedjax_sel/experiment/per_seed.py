"""A study's per-seed record (``per_seed.json``): every run folder's metrics seed by seed,
and the statistics of ``results.json`` that name their source in it, so that each number a
study reports is recomputed from the committed per-seed values alone
(``tests/test_docs.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.outputs import read_json
from fedjax_sel.experiment.reproductions import REPRODUCTIONS
from fedjax_sel.experiment.stats import mean_ci, paired_stats

# summary.json metrics written to per_seed.json and cells.json (accuracies in %, as the tables
# print them), where a run has them: the personalized runs' target accuracies are what their
# paired comparisons (paired_vs_*) read, for every method, not only a claim's arms
CELL_METRICS = {
    "final_accuracy": 100.0,
    "peak_accuracy": 100.0,
    "stable_accuracy": 100.0,
    "final_client_test_accuracy_mean": 100.0,
    "final_test_loss": 1.0,
    "target_accuracy": 100.0,
    "worst_target_accuracy": 100.0,
}


PER_SEED_VERSION = 1


def per_seed_cells(out: str | Path) -> dict[str, dict[str, Any]]:
    """Every configuration run under ``out/runs`` (tuning runs included), seed by seed, from
    its seeds' ``summary.json``: ``{"SETTING/LABEL": {"label", "seeds": {"S": {METRIC:
    value}}, "batches": [[S, ...], ...]}}`` with the :data:`CELL_METRICS` (raw values, not in
    %). ``batches``: the seeds that ran vmapped together (each run's ``config.json``), because
    a seed's last bits can depend on its batch ("Seeds together" in docs/performance.md)."""
    runs = Path(out) / "runs"
    cells: dict[str, dict[str, Any]] = {}
    for path in sorted(runs.glob("**/seed*/summary.json")):
        key = path.parent.parent.relative_to(runs).as_posix()
        summary = json.loads(path.read_text())
        cell = cells.setdefault(key, {"label": summary.get("label"), "seeds": {}, "batches": []})
        seed = int(summary.get("seed", 0))
        cell["seeds"][str(seed)] = {
            m: float(summary[m])
            for m in CELL_METRICS
            if isinstance(summary.get(m), (int, float)) and math.isfinite(summary[m])
        }
        batch = _seeds_vmapped(path.parent / "config.json")
        if batch is not None and batch not in cell["batches"]:
            cell["batches"].append(batch)
    for cell in cells.values():
        cell["seeds"] = dict(sorted(cell["seeds"].items(), key=lambda kv: int(kv[0])))
        cell["batches"].sort()
    return cells


def _seeds_vmapped(config_file: Path) -> list[int] | None:
    """The seeds a run's ``config.json`` says ran in its batch (a grid's members of other
    configurations included), or ``None`` where it does not say."""
    config = read_json(config_file) if config_file.is_file() else {}
    together = config.get("seeds_vmapped")
    return sorted(int(s) for s in together) if together else None


def summarize_per_seed(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``cells.json`` from per-seed cells: ``{"SETTING/LABEL": {"label", "seeds", METRIC:
    {"mean", "ci_low", "ci_high"}}}``, accuracies in %, so that every number of a
    reproduction's ``tables.md`` is in a JSON file computed from the committed per-seed
    values."""
    out = {}
    for key, cell in cells.items():
        seeds = cell["seeds"]
        row: dict[str, Any] = {"label": cell["label"], "seeds": [int(s) for s in seeds]}
        for metric, scale in CELL_METRICS.items():
            v = [scale * x[metric] for x in seeds.values() if metric in x]
            if v:
                m, lo, hi = mean_ci(v)
                row[metric] = {"mean": m, "ci_low": lo, "ci_high": hi}
        out[key] = row
    return out


def cell_values(cells: dict[str, dict[str, Any]], arm: str, metric: str) -> dict[int, float]:
    """seed -> value of ``metric`` in the per-seed cell ``arm`` (seeds without it left out)."""
    seeds = cells.get(arm, {}).get("seeds", {})
    return {int(s): v[metric] for s, v in seeds.items() if metric in v}


def paired_values(
    cells: dict[str, dict[str, Any]], arms: Sequence[str], metric: str, scale: float
) -> list[np.ndarray]:
    """``scale * metric`` of each cell in ``arms`` over the seeds every one of them has (in
    seed order): the arrays a paired difference is taken over."""
    values = [cell_values(cells, arm, metric) for arm in arms]
    common = sorted(set.intersection(*(set(v) for v in values)))
    return [np.asarray([v[s] for s in common], np.float64) * scale for v in values]


def per_seed_stat(
    cells: dict[str, dict[str, Any]],
    arm: str,
    metric: str,
    scale: float = 1.0,
    baseline: str | None = None,
    test: bool = False,
) -> dict[str, Any]:
    """A ``results.json`` statistic that is not a claim, from per-seed cells alone: the mean,
    95% CI, std and count over seeds of ``scale * metric`` in cell ``arm``, or, with
    ``baseline`` (a cell key), of the paired difference ``arm - baseline`` over the seeds both
    have (computed as :func:`claim_row` computes a claim's); ``test``: the paired difference's
    :func:`~fedjax_sel.experiment.stats.paired_stats` instead (t and bootstrap intervals,
    p-value, win rate). The result names its source under ``from_per_seed``, so that a test
    recomputes it from the committed ``per_seed.json``."""
    values = cell_values(cells, arm, metric)
    source = {"arm": arm, "metric": metric, "scale": scale, "baseline": baseline}
    if baseline is None:
        if test:
            raise ConfigError(f"per_seed_stat of {arm!r}: a paired test needs a baseline")
        v = np.asarray(list(values.values()), np.float64) * scale
        return {"from_per_seed": source, **summary_stat(v)}
    xs, bs = paired_values(cells, (arm, baseline), metric, scale)
    if test:
        return {"from_per_seed": {**source, "test": True}, **paired_stats(xs, bs)}
    return {"from_per_seed": source, **summary_stat(xs - bs)}


DERIVES: dict[str, Callable[..., dict[str, Any]]] = {}
"""The functions a ``results.json`` may name as a ``derive`` (see :func:`per_seed_means`), by
registered name. A results file names one of these, never an import path: reading a results
folder copied in from elsewhere runs no code it names."""


def register_derive(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``function(means, **args) -> dict`` in :data:`DERIVES` as
    ``name``; another function under a taken name is an error."""

    def wrap(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        old = DERIVES.get(name)
        if old is not None and old.__qualname__ != function.__qualname__:
            raise ConfigError(f"derive {name!r} is already registered by {old.__qualname__}")
        DERIVES[name] = function
        return function

    return wrap


def derive_function(name: str) -> Callable[..., dict[str, Any]]:
    """The registered derive ``name``; a :class:`ConfigError` names an unknown one and the
    known names. The reproduction modules (which register theirs) are loaded first."""
    if isinstance(name, str) and name not in DERIVES:
        len(REPRODUCTIONS)  # loading the registry imports the studies, which register theirs
    if not isinstance(name, str) or name not in DERIVES:
        raise ConfigError(f"unknown derive {name!r}; known: {', '.join(sorted(DERIVES))}")
    return DERIVES[name]


def per_seed_means(
    cells: dict[str, dict[str, Any]],
    arm: str,
    keys: Sequence[str],
    prefix: str,
    derive: str | None = None,
    derive_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The mean over seeds of each per-seed value ``prefix + key`` of cell ``arm`` (a number,
    or an array averaged element-wise; seeds without it left out): a run's diagnostics read
    from its curves, each seed's reduced to one value in ``per_seed.json``. ``derive``: the
    name of a function registered in :data:`DERIVES` (:func:`register_derive`), called as
    ``function(means, **derive_args)`` (a ratio of two means, per-class means of a per-client
    one), whose fields are added; an unknown name is a :class:`ConfigError`. The result names
    its source under ``from_per_seed``, as :func:`per_seed_stat`'s does."""
    seeds = cells.get(arm, {}).get("seeds", {})
    source = {"arm": arm, "prefix": prefix, "keys": list(keys)}
    means: dict[str, Any] = {}
    for key in keys:
        values = [v[prefix + key] for v in seeds.values() if prefix + key in v]
        if values:
            mean = np.mean(np.asarray(values, np.float64), axis=0)
            means[key] = float(mean) if mean.ndim == 0 else mean.tolist()
    if derive is None:
        return {"from_per_seed": source, **means}
    function = derive_function(derive)
    args = dict(derive_args or {})
    extra = function(means, **args)
    source = {**source, "derive": derive, "derive_args": args}
    return {"from_per_seed": source, **means, **extra}


def recompute_from_per_seed(cells: dict[str, dict[str, Any]], stat: dict[str, Any]):
    """``stat`` (a :func:`per_seed_stat` or :func:`per_seed_means` result) recomputed from
    the per-seed cells alone, from the source it names."""
    src = stat["from_per_seed"]
    if "keys" in src:
        return per_seed_means(
            cells, src["arm"], src["keys"], src["prefix"], src.get("derive"), src.get("derive_args")
        )
    return per_seed_stat(
        cells, src["arm"], src["metric"], src["scale"], src["baseline"], src.get("test", False)
    )


def per_seed_stats_in(obj: Any) -> list[dict[str, Any]]:
    """Every :func:`per_seed_stat` or :func:`per_seed_means` result nested in ``obj`` (a
    loaded ``results.json``)."""
    if isinstance(obj, dict):
        found = [obj] if isinstance(obj.get("from_per_seed"), dict) else []
        return found + [x for v in obj.values() for x in per_seed_stats_in(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in per_seed_stats_in(v)]
    return []


def not_recomputed(results: Any, cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The sources of the statistics in ``results`` that the per-seed ``cells`` do not give
    back bit for bit (a row's other fields beside its statistic, such as a mechanism row's
    names, are not compared)."""
    wrong = []
    for stat in per_seed_stats_in(results):
        again = recompute_from_per_seed(cells, stat)
        if again != {k: stat.get(k) for k in again}:
            wrong.append(stat["from_per_seed"])
    return wrong


def summary_stat(v: np.ndarray) -> dict[str, Any]:
    """Mean, 95% CI, standard deviation and count of the per-seed values ``v``."""
    if v.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "std": None, "seeds": 0}
    m, lo, hi = mean_ci(v)
    sd = float(np.std(v, ddof=1)) if v.size > 1 else None
    return {"mean": m, "ci_low": lo, "ci_high": hi, "std": sd, "seeds": int(v.size)}
