"""What every reproduction shares: cells run through the experiment layer, tables with 95%
confidence intervals beside the paper's numbers, and verdicts on the paper's claims.

A reproduction builds a :class:`Study`: it adds configurations (one per method and setting;
the study makes one cell per seed), runs them all at once with
:func:`fedjax_sel.experiment.run_cells` (seeds of one configuration run together in one
compiled program; a finished cell of the same configuration is never recomputed; an
interrupted one resumes), then reads metrics per seed for its tables and claims
(:mod:`fedjax_sel.experiment.per_seed`), and judges the claims
(:mod:`fedjax_sel.experiment.verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import fedjax_sel
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.compare import Run, metric_value
from fedjax_sel.experiment.execution import Execution, SeedsRunOnly
from fedjax_sel.experiment.loop import RunResult
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.outputs import write_json
from fedjax_sel.experiment.per_seed import (
    PER_SEED_VERSION,
    per_seed_cells,
    per_seed_means,
    per_seed_stat,
    summarize_per_seed,
    summary_stat,
)
from fedjax_sel.experiment.provenance import code_record
from fedjax_sel.experiment.reproductions import PROFILES, SIZES
from fedjax_sel.experiment.sweep import Cell, run_cells
from fedjax_sel.experiment.verdicts import Claim, claim_row, verdict_table


def check_profile_size(name: str, profile: str, size: str, seeds: int, min_seeds: int) -> None:
    if profile not in PROFILES:
        raise ConfigError(f"{name}: profile must be one of {PROFILES}, got {profile!r}")
    if size not in SIZES:
        raise ConfigError(f"{name}: size must be one of {SIZES}, got {size!r}")
    if not (isinstance(seeds, int) and seeds >= 1):
        raise ConfigError(f"{name}: seeds must be a positive integer, got {seeds!r}")
    del min_seeds  # the verdict rows carry the number of seeds; fewer than 5 is flagged there


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
            where = self.out / "runs" / folder_name(setting) / folder_name(label) / f"seed{s}"
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
        return f"{folder_name(setting)}/{folder_name(label)}"

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
