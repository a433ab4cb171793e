"""What every reproduction shares: cells run through the experiment layer, tables with 95%
confidence intervals beside the paper's numbers, and verdicts on the paper's claims.

A reproduction builds a :class:`Study`: it adds configurations (one per method and setting;
the study makes one cell per seed), runs them all at once with
:func:`fedjax_sel.experiment.run_cells` (seeds of one configuration run together in one
compiled program; a finished cell of the same configuration is never recomputed; an
interrupted one resumes), then reads metrics per seed for its tables and claims.

Verdicts, on the paired difference ``d = method - baseline`` over seeds and
its 95% CI, against the paper's claimed difference ``D`` (``D = 0``: a claim of direction
only, "better", with no size):

* ``reproduced``: the CI excludes 0 on the side of ``D`` and contains ``D`` (for ``D = 0``:
  lies wholly on the better side);
* ``smaller_effect`` / ``larger_effect``: the CI excludes 0 on the side of ``D``, and lies
  wholly below / above ``D``'s size (the direction holds, the size does not);
* ``not_reproduced``: the CI excludes ``D`` and does not lie beyond 0 on ``D``'s side;
* ``inconclusive``: the CI contains both 0 and ``D``; the row says how many seeds would settle
  it at the observed mean and spread;
* ``not_evidence``: a premise the claim rests on fails in the run (the row says which); kept
  out of the totals.

Each row also carries the paired t-test's two-sided p-values against 0 (``p_zero``) and
against ``D`` (``p_paper``): at 0.05 they give the verdict above exactly, and Holm-adjusted
over a family of claims (:func:`holm_verdicts`) the family-wise verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.compare import Run, mean_ci, metric_value, p_from_t, t_critical
from fedjax_sel.experiment.loop import RunResult
from fedjax_sel.experiment.outputs import read_json, write_json
from fedjax_sel.experiment.provenance import code_record
from fedjax_sel.experiment.sweep import Cell, _slug, run_cells
from fedjax_sel.reproduce import PROFILES, SIZES
from fedjax_sel.reproduce.execution import Execution, SeedsRunOnly

VERDICTS = (
    "reproduced",
    "smaller_effect",
    "larger_effect",
    "not_reproduced",
    "inconclusive",
    "not_evidence",
)
ALPHA = 0.05
MAX_SEEDS = 10_000


def check_profile_size(name: str, profile: str, size: str, seeds: int, min_seeds: int) -> None:
    if profile not in PROFILES:
        raise ConfigError(f"{name}: profile must be one of {PROFILES}, got {profile!r}")
    if size not in SIZES:
        raise ConfigError(f"{name}: size must be one of {SIZES}, got {size!r}")
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ConfigError(f"{name}: seeds must be a positive integer, got {seeds!r}")
    del min_seeds  # the verdict rows carry the number of seeds; fewer than 5 is flagged there


# ----------------------------------------------------------------------------- verdicts
def seeds_to_settle(d: Sequence[float], claimed: float, level: float = 0.95) -> int | None:
    """The number of seeds at which the CI of the mean of ``d`` (at its observed mean and
    standard deviation) would exclude 0 or ``claimed``; ``None`` beyond :data:`MAX_SEEDS`."""
    a = np.asarray(d, np.float64)
    if a.size < 2:
        return None
    m, sd = float(a.mean()), float(a.std(ddof=1))
    gap = max(abs(m), abs(claimed - m))
    if sd == 0:
        return int(a.size)
    if gap == 0:
        return None
    n = max(a.size, 2)
    while n <= MAX_SEEDS:
        if t_critical(n - 1, level) * sd / math.sqrt(n) < gap:
            return n
        n = n + 1 if n < 50 else int(n * 1.1) + 1
    return None


def verdict(lo: float | None, hi: float | None, claimed: float) -> str:
    """The verdict of a paired-difference CI ``[lo, hi]`` on a claimed difference (module
    docstring; ``claimed = 0``: direction only, the better side positive)."""
    if lo is None or hi is None:
        return "inconclusive"
    sign = 1.0 if claimed >= 0 else -1.0
    lo_s, hi_s = sorted((sign * lo, sign * hi))  # the claim's direction made positive
    claim_s = abs(claimed)
    if lo_s > 0:
        if claim_s == 0 or lo_s <= claim_s <= hi_s:
            return "reproduced"
        return "smaller_effect" if hi_s < claim_s else "larger_effect"
    if not (lo_s <= claim_s <= hi_s):
        return "not_reproduced"
    return "inconclusive"


def t_test_p(d: Sequence[float], against: float = 0.0) -> float | None:
    """Two-sided paired t-test p-value of the mean of ``d`` against ``against``."""
    a = np.asarray(d, np.float64)
    if a.size < 2:
        return None
    sd = float(a.std(ddof=1))
    return p_from_t(float(a.mean()) - against, sd / math.sqrt(a.size), a.size - 1)


def p_values_from_ci(mean: float, lo: float, hi: float, seeds: int, claimed: float):
    """``(p_zero, p_paper)`` from a paired t interval ``[lo, hi]`` of ``seeds`` pairs: the
    interval is ``mean +- t_crit * se``, so its half-width gives the standard error back."""
    se = (hi - lo) / 2 / t_critical(seeds - 1)
    return p_from_t(mean, se, seeds - 1), p_from_t(mean - claimed, se, seeds - 1)


def verdict_from_p(
    mean: float, p_zero: float | None, p_paper: float | None, claimed: float, alpha: float = ALPHA
) -> str:
    """The verdict from the two tests at level ``alpha`` (equal to :func:`verdict` on the CI at
    ``alpha = 0.05`` with unadjusted p-values; with Holm-adjusted ones, the family's)."""
    if p_zero is None or p_paper is None:
        return "inconclusive"
    sign = 1.0 if claimed >= 0 else -1.0
    m, claim_s = sign * mean, abs(claimed)
    beyond_zero = p_zero < alpha and m > 0
    excludes_claim = p_paper < alpha
    if beyond_zero:
        if claim_s == 0 or not excludes_claim:
            return "reproduced"
        return "smaller_effect" if m < claim_s else "larger_effect"
    if claim_s == 0:
        return "not_reproduced" if p_zero < alpha else "inconclusive"
    return "not_reproduced" if excludes_claim else "inconclusive"


def holm_verdicts(rows: Sequence[dict[str, Any]], alpha: float = ALPHA) -> list[str]:
    """Family-wise verdicts of ``rows`` (one family: a paper's claims in one profile and size):
    Holm over the family's tests against 0, and apart over its tests against the paper's sizes;
    ``not_evidence`` rows stay so and are not in the family."""
    from fedjax_sel.experiment.compare import holm

    family = [i for i, r in enumerate(rows) if r["verdict"] != "not_evidence"]
    out = [str(r["verdict"]) for r in rows]
    if not family:
        return out

    def adjusted(key: str) -> list[float | None]:
        have = [i for i in family if rows[i].get(key) is not None]
        adj = dict(zip(have, holm([rows[i][key] for i in have]), strict=True))
        return [adj.get(i) for i in family]

    for i, p0, pd in zip(family, adjusted("p_zero"), adjusted("p_paper"), strict=True):
        r = rows[i]
        out[i] = verdict_from_p(r["diff_mean"], p0, pd, r["paper_diff"], alpha)
    return out


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim of the paper: ``label`` beats ``baseline`` on ``metric`` by ``paper_diff``
    (the paper's own numbers: ``paper_value`` for ``label``), in ``setting``.

    ``scale``: multiplies our values before comparing and reporting (100 for accuracies
    quoted in percent). ``contrast``: a pair ``(label2, baseline2)`` makes the claim a
    difference of differences, ``(label - baseline) - (label2 - baseline2)`` paired over
    seeds (an interaction: a change helps one policy more than another); ``paper_value`` is
    then the paper's ``label - baseline`` and "ours" our paired ``label - baseline``.
    ``premise``: set where a premise the claim rests on fails in the run (what failed); the
    verdict is then ``not_evidence``."""

    claim: str
    setting: str
    label: str
    baseline: str
    metric: str
    paper_diff: float
    paper_value: float | None = None
    higher_is_better: bool = True
    scale: float = 100.0
    note: str = ""
    contrast: tuple[str, str] | None = None
    premise: str = ""


# ----------------------------------------------------------------------------- every cell
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
    :func:`~fedjax_sel.experiment.compare.paired_stats` instead (t and bootstrap intervals,
    p-value, win rate). The result names its source under ``from_per_seed``, so that a test
    recomputes it from the committed ``per_seed.json``."""
    from fedjax_sel.experiment.compare import paired_stats

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
    from fedjax_sel.reproduce import REPRODUCTIONS

    if isinstance(name, str) and name not in DERIVES:
        len(REPRODUCTIONS)  # loading the registry imports the package's reproduction modules
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


def claim_row(
    cells: dict[str, dict[str, Any]], c: Claim, arms: Sequence[str], head: dict[str, Any]
) -> dict[str, Any]:
    """A claim's ``verdicts.json`` row from per-seed cells, paired over the seeds every arm
    (``arms``: the cell keys of the claim's label, baseline and contrast pair) has; ``head``:
    the row's leading fields (paper, claim, profile, size, setting)."""
    xs, bs, *contrast = paired_values(cells, arms, c.metric, c.scale)
    d = xs - bs
    if contrast:  # ours: the method's own paired gain; the verdict: gain minus gain
        ours = summary_stat(d)
        d = d - (contrast[0] - contrast[1])
    else:
        own = cell_values(cells, arms[0], c.metric)  # every seed of the method, paired or not
        ours = summary_stat(np.asarray(list(own.values()), np.float64) * c.scale)
    if d.size:
        dm, dlo, dhi = mean_ci(d)
    else:
        dm = dlo = dhi = None
    claimed = c.paper_diff
    v = "not_evidence" if c.premise else verdict(dlo, dhi, claimed)
    row = {
        **head,
        # a contrast's row names both differences: "A - B" vs "C - D"
        "method": " - ".join((c.label, c.baseline)) if c.contrast else c.label,
        "baseline": " - ".join(c.contrast) if c.contrast else c.baseline,
        "metric": c.metric,
        "labels": [c.label, c.baseline, *(c.contrast or ())],
        "arms": list(arms),
        "scale": c.scale,
        "seeds": int(d.size),
        "paper_value": c.paper_value,
        "paper_diff": claimed,
        "ours_mean": ours["mean"],
        "ours_ci_low": ours["ci_low"],
        "ours_ci_high": ours["ci_high"],
        "diff_mean": dm,
        "diff_ci_low": dlo,
        "diff_ci_high": dhi,
        "p_zero": t_test_p(d),
        "p_paper": t_test_p(d, claimed),
        "verdict": v,
        "note": c.note,
    }
    if c.premise:
        row["premise"] = c.premise
    if v == "inconclusive":
        row["seeds_to_settle"] = seeds_to_settle(d, claimed)
    if d.size < 5:
        row["note"] = (row["note"] + "; " if row["note"] else "") + (
            f"only {d.size} seed(s): below the evidence standard of 5"
        )
    return row


def claim_of_row(row: dict[str, Any]) -> Claim:
    """The :class:`Claim` a ``verdicts.json`` row with ``arms`` was computed from (as far as
    the row's numbers depend on it)."""
    labels = row["labels"]
    return Claim(
        row["claim"],
        row["setting"],
        labels[0],
        labels[1],
        row["metric"],
        row["paper_diff"],
        row["paper_value"],
        scale=row["scale"],
        contrast=tuple(labels[2:4]) if len(labels) == 4 else None,
        premise=row.get("premise", ""),
    )


# ----------------------------------------------------------------------------- the study
class Study:
    """The runs of one reproduction at one profile and size (see the module docstring)."""

    def __init__(
        self,
        paper: str,
        *,
        profile: str,
        size: str,
        seeds: int,
        out: str | Path,
        echo: Callable = print,
        progress: bool = True,
        readers: dict[str, Callable[[Run, str], float | None]] | None = None,
        execution: Execution | None = None,
    ):
        """``readers``: metrics of this reproduction's own, ``NAME@ARG`` read by
        ``readers[NAME](run, ARG)`` (the others by :func:`metric_value`); their per-seed values
        go into ``per_seed.json`` like every claim's metric, so rows rebuild without them.
        ``execution``: how the runs are executed (:class:`Execution`)."""
        self.paper, self.profile, self.size, self.seeds = paper, profile, size, int(seeds)
        self.execution = execution or Execution()
        self.readers = dict(readers or {})
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.echo, self.progress = echo, progress
        self.cells: dict[tuple[str, str], list[Cell]] = {}
        self.results: dict[tuple[str, str], list[RunResult]] = {}
        # a configuration added under several labels (a method in two tables) runs once
        self._same: dict[tuple[str, str], tuple[str, str]] = {}
        self._by_key: dict[str, tuple[str, str]] = {}
        # (setting, label, metric) of every per_seed_stat asked for: per_seed.json holds them
        self._stat_metrics: dict[tuple[str, str, str], None] = {}
        # per-seed values given to per_seed_means: cell key -> label, seed -> {name: value}
        self._given: dict[str, tuple[str, dict[int, dict[str, Any]]]] = {}

    def add(self, setting: str, label: str, config: RunConfig, seeds: int | None = None) -> None:
        """Adds ``config`` (its seed is replaced) as ``label`` in ``setting``, one cell per seed
        (``seeds``: a method-specific count, default the study's)."""
        key = (setting, label)
        if key in self.cells or key in self._same:
            raise ConfigError(f"{self.paper}: {label!r} added twice in setting {setting!r}")
        results_key = f"{config.replace(seed=0).results_key()}/{seeds or self.seeds}"
        if results_key in self._by_key:
            self._same[key] = self._by_key[results_key]
            return
        self._by_key[results_key] = key
        cells = []
        for s in range(seeds or self.seeds):
            c = config.replace(seed=s, label=label).validate()
            where = self.out / "runs" / _slug(setting) / _slug(label) / f"seed{s}"
            cells.append(Cell(c, where, label, setting))
        self.cells[key] = cells

    def run(self) -> None:
        """Runs every added cell that is not finished yet (with ``only_seeds``: those seeds'
        cells, then raises :class:`SeedsRunOnly`)."""
        todo = [(k, c) for k, cs in self.cells.items() if k not in self.results for c in cs]
        only = self.execution.only_seeds
        if only is not None:
            todo = [(k, c) for k, c in todo if c.config.seed in only]
            if not todo:
                raise ConfigError(
                    f"{self.paper}: only_seeds {sorted(only)} selects no run (seeds "
                    f"0 to {max((len(cs) for cs in self.cells.values()), default=0) - 1} here)"
                )
        if not todo:
            return
        # a study owns its folder and is its own record of what it ran: a cell whose setting
        # changed is recomputed in place (and said so), as the study's code now defines it
        results = run_cells(
            [c for _, c in todo],
            seeds_together=self.execution.seeds_together,
            progress=self.progress,
            echo=self.echo,
            overwrite=True,
        )
        if only is not None:
            raise SeedsRunOnly(len(todo), sorted(only), self.out)
        for (key, _), r in zip(todo, results, strict=True):
            self.results.setdefault(key, []).append(r)

    # -- reading
    def runs(self, setting: str, label: str) -> list[Run]:
        key = self._same.get((setting, label), (setting, label))
        if key not in self.results:
            raise ConfigError(f"{self.paper}: no runs of {label!r} in setting {setting!r}")
        return [
            Run(r.out_dir, label, setting, r.config.seed, r.summary, r.evals)
            for r in self.results[key]
        ]

    def values(self, setting: str, label: str, metric: str) -> dict[int, float]:
        """seed -> value (seeds without the metric are left out)."""
        out = {}
        name, _, arg = metric.partition("@")
        for r in self.runs(setting, label):
            v = self.readers[name](r, arg) if name in self.readers else metric_value(r, metric)
            if v is not None and math.isfinite(v):
                out[r.seed] = v
        return out

    def stat(self, setting: str, label: str, metric: str, scale: float = 1.0) -> dict[str, Any]:
        """Mean, 95% CI and standard deviation over seeds of ``scale * metric``."""
        v = np.asarray(list(self.values(setting, label, metric).values()), np.float64)
        return summary_stat(v * scale)

    def per_seed_stat(
        self,
        setting: str,
        label: str,
        metric: str,
        scale: float = 100.0,
        baseline: str | None = None,
        test: bool = False,
    ) -> dict[str, Any]:
        """:func:`per_seed_stat` of ``label`` (minus ``baseline``, paired) in ``setting``: a
        number of ``results.json`` that is not a claim, with its source named, computed from
        the values :meth:`per_seed` writes (the metric goes into ``per_seed.json`` for both
        cells), so the committed file recomputes it."""
        labels = (label,) if baseline is None else (label, baseline)
        cells = {}
        for lab in labels:
            self._stat_metrics[(setting, lab, metric)] = None
            seeds = {str(s): {metric: v} for s, v in self.values(setting, lab, metric).items()}
            cells[self.cell_key(setting, lab)] = {"label": lab, "seeds": seeds}
        base = None if baseline is None else self.cell_key(setting, baseline)
        return per_seed_stat(cells, self.cell_key(setting, label), metric, scale, base, test)

    def per_seed_means(
        self,
        setting: str,
        label: str,
        by_seed: dict[int, dict[str, Any]],
        prefix: str = "diagnostic.",
        derive: str | None = None,
        derive_args: dict[str, Any] | None = None,
        arm: str | None = None,
    ) -> dict[str, Any]:
        """:func:`per_seed_means` of values the reproduction reduced from each run of
        ``label`` in ``setting`` (``by_seed``: seed -> {key: a number or an array}):
        :meth:`per_seed` writes them as ``prefix + key``, so the committed file gives the
        means back. ``arm``: the cell key, for runs the study did not add (their folder under
        ``runs/``); default :meth:`cell_key`."""
        arm = arm or self.cell_key(setting, label)
        _, given = self._given.setdefault(arm, (label, {}))
        keys: dict[str, None] = {}
        for seed, values in by_seed.items():
            for key, v in values.items():
                given.setdefault(int(seed), {})[prefix + key] = v
                keys[key] = None
        cells = {arm: {"label": label, "seeds": {str(s): v for s, v in sorted(given.items())}}}
        return per_seed_means(cells, arm, list(keys), prefix, derive, derive_args)

    def cell_text(
        self, setting: str, label: str, metric: str, scale: float = 100.0, digits: int = 2
    ) -> str:
        s = self.stat(setting, label, metric, scale)
        if s["mean"] is None:
            return "-"
        if s["ci_low"] is None:
            return f"{s['mean']:.{digits}f}"
        return f"{s['mean']:.{digits}f} [{s['ci_low']:.{digits}f}, {s['ci_high']:.{digits}f}]"

    def cell_key(self, setting: str, label: str) -> str:
        """The per-seed cell (the run folders' path under ``runs/``) of a configuration."""
        setting, label = self._same.get((setting, label), (setting, label))
        return f"{_slug(setting)}/{_slug(label)}"

    def per_seed(self, claims: Sequence[Claim]) -> dict[str, dict[str, Any]]:
        """Every run folder's per-seed values (:func:`per_seed_cells`), with each claim's
        metric (metrics such as ``accuracy@R`` that are not summary keys included) added to
        every cell of the claim's setting: the cells it reads, and the other methods of that
        setting, which a paired comparison against one baseline (``paired_vs_*``) reads; the
        metric of every :meth:`per_seed_stat` asked for, in the cells it read; and the values
        given to :meth:`per_seed_means`."""
        cells = per_seed_cells(self.out)
        wanted = dict.fromkeys(self._stat_metrics)
        for c in claims:
            others = [lab for s, lab in (*self.cells, *self._same) if s == c.setting]
            for label in dict.fromkeys((c.label, c.baseline, *(c.contrast or ()), *others)):
                wanted[(c.setting, label, c.metric)] = None
        for setting, label, metric in wanted:
            cell = cells.setdefault(self.cell_key(setting, label), {"label": label, "seeds": {}})
            for s, v in self.values(setting, label, metric).items():
                cell["seeds"].setdefault(str(s), {})[metric] = v
        for arm, (label, given) in self._given.items():
            cell = cells.setdefault(arm, {"label": label, "seeds": {}})
            for s, values in given.items():
                cell["seeds"].setdefault(str(s), {}).update(values)
        return cells

    def verdict_row(self, c: Claim, cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The ``verdicts.json`` row of a claim, computed from the per-seed cells
        (:meth:`per_seed`; paired over the seeds every method it reads has)."""
        arms = [self.cell_key(c.setting, x) for x in (c.label, c.baseline, *(c.contrast or ()))]
        head = {"paper": self.paper, "claim": c.claim, "profile": self.profile,
                "size": self.size, "setting": c.setting}  # fmt: skip
        return claim_row(cells, c, arms, head)

    def verdicts(self, claims: Sequence[Claim]) -> list[dict[str, Any]]:
        """Writes ``per_seed.json`` (every cell's values seed by seed), then ``verdicts.json``
        and ``cells.json`` computed from it; returns the verdict rows."""
        import fedjax_sel

        cells = self.per_seed(claims)
        write_json(
            self.out / "per_seed.json",
            {"version": PER_SEED_VERSION, "fedjax_sel": fedjax_sel.__version__,
             "code": code_record(), "paper": self.paper, "profile": self.profile,
             "size": self.size, "cells": cells},
        )  # fmt: skip
        rows = [self.verdict_row(c, cells) for c in claims]
        write_json(self.out / "verdicts.json", rows)
        write_json(self.out / "cells.json", summarize_per_seed(cells))
        return rows


def summary_stat(v: np.ndarray) -> dict[str, Any]:
    """Mean, 95% CI, standard deviation and count of the per-seed values ``v``."""
    if v.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "std": None, "seeds": 0}
    m, lo, hi = mean_ci(v)
    sd = float(np.std(v, ddof=1)) if v.size > 1 else None
    return {"mean": m, "ci_low": lo, "ci_high": hi, "std": sd, "seeds": int(v.size)}


def verdict_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one line per claim with ours, the paper's, the paired difference and the
    verdict."""

    def f(v, digits=2):
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [
        "| claim | method vs baseline | seeds | ours [95% CI] | paper | diff [95% CI] | paper "
        "diff | verdict |",
        "|---|---|---:|---|---:|---|---:|---|",
    ]
    for r in rows:
        ours = f(r["ours_mean"])
        if r["ours_ci_low"] is not None:
            ours += f" [{f(r['ours_ci_low'])}, {f(r['ours_ci_high'])}]"
        diff = "-" if r["diff_mean"] is None else f"{r['diff_mean']:+.2f}"
        if r["diff_ci_low"] is not None:
            diff += f" [{r['diff_ci_low']:+.2f}, {r['diff_ci_high']:+.2f}]"
        v = r["verdict"].replace("_", " ")
        if r.get("seeds_to_settle"):
            v += f" (~{r['seeds_to_settle']} seeds would settle it)"
        elif r["verdict"] == "inconclusive":
            v += f" (more than {MAX_SEEDS} seeds)"
        if r.get("note"):
            v += f"; {r['note']}"
        lines.append(
            f"| {r['claim']} | {r['method']} vs {r['baseline']} | {r['seeds']} | {ours} | "
            f"{f(r['paper_value'])} | {diff} | {r['paper_diff']:+.2f} | {v} |"
        )
    return "\n".join(lines)


def verdicts_and_absent(
    study: Study,
    claims: Sequence[Claim],
    section: Callable[[str, str], None],
    md: list[str],
    absent: dict[str, str],
) -> list[dict[str, Any]]:
    """The end of a reproduction's ``tables.md``: writes the verdicts (:meth:`Study.verdicts`),
    adds their table as a section and the list of what did not run; returns the rows."""
    rows = study.verdicts(claims)
    if rows:
        section("Verdicts (paired differences against each baseline, 95% CI)", verdict_table(rows))
    if absent:
        md.extend(["", "## Not run here", ""])
        md.extend(f"- {k}: {v}" for k, v in absent.items())
    return rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def paper_cell(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def subsampled_npz(name: str, fraction: float, out: Path, data_dir=None) -> Path:
    """A Keras-layout ``name.npz`` under ``out`` holding a label-stratified ``fraction`` of the
    training images (all test images), drawn with a fixed generator. An existing file is
    reused only when it holds exactly that stratified subsample (its class counts match)."""
    from fedjax_sel.data import loaders

    path = out / f"{name}.npz"
    d = loaders.load_image_dataset(name, data_dir)
    classes = np.unique(d.y_train)
    want = {int(c): max(1, int(round(fraction * np.sum(d.y_train == c)))) for c in classes}
    if path.exists():
        with np.load(path) as z:
            have = dict(zip(*np.unique(z["y_train"], return_counts=True), strict=True))
        if {int(c): int(n) for c, n in have.items()} == want:
            return path
    rng = np.random.default_rng(0)
    keep = []
    for c in classes:
        idx = np.flatnonzero(d.y_train == c)
        keep.append(rng.choice(idx, want[int(c)], replace=False))
    keep = np.sort(np.concatenate(keep))
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        path, x_train=d.x_train[keep], y_train=d.y_train[keep], x_test=d.x_test, y_test=d.y_test
    )
    return path
