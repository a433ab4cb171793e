"""Verdicts on a paper's claims, from the paired difference ``d = method - baseline`` over
seeds and its 95% CI, against the paper's claimed difference ``D`` (``D = 0``: a claim of
direction only, "better", with no size):

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
over a family of claims (:func:`holm_verdicts`) the family-wise verdict. A row is computed
from the per-seed cells alone (:mod:`fedjax_sel.experiment.per_seed`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedjax_sel.experiment.per_seed import cell_values, paired_values, summary_stat
from fedjax_sel.experiment.stats import holm, mean_ci, p_from_t, t_critical

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
