"""FedCVR-Bolt's study (:mod:`studies.fedcvr_bolt`): what its runs are read for (the final
client MSE, the mechanism's diagnostics), the paper's claims and the paired mechanism rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedjax_sel.experiment.study import (
    Study,
    markdown_table,
)
from fedjax_sel.experiment.verdicts import Claim
from studies.fedcvr_bolt_setup import (
    AFL_LITERAL,
    BETA0,
    BOLT,
    FEDAVG,
    KERNEL_LABELS,
    PAPER_TABLE1,
    PAPER_TABLE2,
    PAPER_TABLE4,
    SCALE_FREE,
)

# ----------------------------------------------------------------------------- reading
FINAL_MSE = "final_client_test_mse"
MSE_PCT = "mse_pct_of_fedavg"


class BoltStudy(Study):
    """A :class:`Study` that also reads the final client-averaged test MSE (``FINAL_MSE``,
    from the last evaluation record) and that MSE as a percentage of FedAvg's on the same seed
    (``MSE_PCT``)."""

    def values(self, setting: str, label: str, metric: str) -> dict[int, float]:
        if metric == FINAL_MSE:
            out = {}
            for r in self.runs(setting, label):
                v = r.records[-1].get("client_test_loss_mean") if r.records else None
                if v is not None and math.isfinite(v):
                    out[r.seed] = float(v)
            return out
        if metric == MSE_PCT:
            x, base = (
                self.values(setting, label, FINAL_MSE),
                self.values(setting, FEDAVG, FINAL_MSE),
            )
            return {s: 100.0 * v / base[s] for s, v in x.items() if base.get(s, 0) > 0}
        return super().values(setting, label, metric)


DIAGNOSTIC_KEYS = (
    "law_entropy_ratio",
    "law_max_over_uniform",
    "coalition_entropy_ratio",
    "coalition_max_over_uniform",
    "coalition_sizes",
    "logit_spread",
    "ari_dominant_label",
    "ari_previous_round",
    "kept",
    "top_mass",
    "soft_entropy_ratio",
)


def diagnostics_after(study: Study, setting: str, label: str, after: int) -> dict[str, Any]:
    """Per diagnostic: each seed's mean over the evaluation chunks that start at or after
    round ``after`` (arrays element-wise) and its final ``never_picked``, then the mean over
    seeds; each seed's values go into ``per_seed.json`` (:meth:`Study.per_seed_means`), which
    gives these means back."""
    by_seed: dict[int, dict[str, Any]] = {}
    for r in study.runs(setting, label):
        rows = [
            e["diagnostics"]
            for i, e in enumerate(r.records)
            if (r.records[i - 1]["round"] if i else 0) >= after and e.get("diagnostics")
        ]
        mine: dict[str, Any] = {}
        for k in DIAGNOSTIC_KEYS:
            values = [np.asarray(d[k], np.float64) for d in rows if k in d]
            if values:
                mean = np.mean(values, axis=0)
                mine[k] = float(mean) if mean.ndim == 0 else mean.tolist()
        last = r.records[-1].get("diagnostics") if r.records else None
        if last and last.get("never_picked") is not None:
            mine["never_picked"] = float(last["never_picked"])
        by_seed[r.seed] = mine
    return study.per_seed_means(setting, label, by_seed)


def diagnostics_text(d: dict[str, Any]) -> list[str]:
    """Table cells: law entropy ratio, law max / uniform, mean coalition entropy ratio, largest
    coalition max / uniform, logit spread, ARI vs dominant label, largest / smallest coalition,
    never picked."""

    def f(key, fn=lambda v: v, digits=3):
        v = d.get(key)
        return "-" if v is None else f"{fn(v):.{digits}f}"

    return [
        f("law_entropy_ratio"),
        f("law_max_over_uniform", digits=2),
        f("coalition_entropy_ratio", np.mean),
        f("coalition_max_over_uniform", np.max, 2),
        f("logit_spread", digits=3),
        f("ari_dominant_label"),
        "-"
        if d.get("coalition_sizes") is None
        else f"{d['coalition_sizes'][0]:.1f} / {d['coalition_sizes'][-1]:.1f}",
        f("never_picked", digits=1),
    ]


DIAG_HEADER = [
    "law H ratio",
    "law max/unif",
    "coalition H ratio",
    "max coalition max/unif",
    "logit spread",
    "ARI vs label",
    "largest / smallest coalition",
    "never picked",
]


# ----------------------------------------------------------------------------- claims
def table1_claims(settings: list[tuple[str, str, str, bool, int]]) -> list[Claim]:
    """Table 1's claims in ``settings`` (:func:`table1_settings`' rows that ran)."""
    out = []
    for setting, model, het, _, _ in settings:
        p = PAPER_TABLE1[(model, het)]
        pct = 100.0 * p[BOLT][0] / p[FEDAVG][0]
        out.append(
            Claim(
                f"Table 1 {model}, {het}: MSE (% of FedAvg's)",
                setting,
                BOLT,
                FEDAVG,
                MSE_PCT,
                round(pct - 100.0, 2),
                round(pct, 2),
                higher_is_better=False,
                scale=1.0,
                note="MSE relative to FedAvg's on the same seed (data scale-free)",
            )
        )
    return out


def image_claims(dataset: str, tables: tuple[str, ...]) -> list[Claim]:
    """Table 2's claims (FedCVR-Bolt against each baseline) when ``"2"`` is in ``tables``, and
    Table 4's (the RBF kernel against each other kernel) when ``"4"`` is, on ``dataset``."""
    out = []
    if "2" in tables:
        paper = PAPER_TABLE2[dataset]
        out += [
            Claim(
                f"Table 2 {dataset}: accuracy",
                dataset,
                BOLT,
                base,
                "final_client_test_accuracy_mean",
                round(paper[BOLT][0] - paper[base][0], 2),
                paper[BOLT][0],
            )
            for base in (FEDAVG, "Active FL", "FedProx", "IFCA")
        ]
    if "4" in tables and dataset in PAPER_TABLE4:
        p4 = PAPER_TABLE4[dataset]
        out += [
            Claim(
                f"Table 4 {dataset}: RBF kernel vs {label}",
                dataset,
                BOLT,
                label,
                "final_client_test_accuracy_mean",
                round(p4["rbf"] - p4[kernel], 2),
                p4["rbf"],
            )
            for kernel, label in KERNEL_LABELS.items()
        ]
    return out


MECHANISM_PAIRS = (
    (BETA0, FEDAVG, "coalitions (beta = 0) vs uniform"),
    (BOLT, BETA0, "Boltzmann draw (beta = 1) vs beta = 0"),
    (SCALE_FREE, BETA0, "scale-free beta = 1 (ours) vs beta = 0"),
    ("Active FL", AFL_LITERAL, "Active FL: every valuation fresh vs participants only"),
)


def mechanism_rows(
    study: Study, setting: str, metric: str, scale: float, ran: set[tuple[str, str]]
) -> list[dict]:
    """Paired differences of the mechanism pairs that ran (no claim of the paper)."""
    rows = []
    for label, base, what in MECHANISM_PAIRS:
        if (setting, label) not in ran or (setting, base) not in ran:
            continue
        if not set(study.values(setting, label, metric)) & set(study.values(setting, base, metric)):
            continue
        st = study.per_seed_stat(setting, label, metric, scale, baseline=base, test=True)
        rows.append({"setting": setting, "pair": what, "method": label, "baseline": base, **st})
    return rows


def mechanism_table(rows: list[dict], unit: str) -> str:
    def f(v):
        return "-" if v is None else f"{v:+.2f}"

    return markdown_table(
        ["pair", "seeds", f"diff ({unit}) [95% CI]", "p", "win rate"],
        [
            [
                r["pair"],
                str(r["pairs"]),
                f"{f(r['diff'])} [{f(r['diff_ci_low'])}, {f(r['diff_ci_high'])}]",
                "-" if r["p_value"] is None else f"{r['p_value']:.3f}",
                f"{r['win_rate']:.2f}",
            ]
            for r in rows
        ],
    )
