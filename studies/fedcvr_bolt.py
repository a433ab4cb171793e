"""``fedjax-sel reproduce fedcvr-bolt``: FedCVR-Bolt's Tables 1, 2 and 4 (``Socially Inspired
Coalition Formation and Client Selection in Federated Learning``, section 5 and appendices B.1,
C), with paired seeds, verdicts and the mechanism's diagnostics.

* Table 1: the clustered linear regression of appendix C.3, K = 100 clients, P = 10 a round,
  T = 100 rounds, S = 10 local SGD steps (batch 100, lr 0.01, 100 examples per client, 20% of
  them held out); IID (J = 1) and non-IID (J = 2), without (D = 1) and with (D = 2) intercept;
  FedAvg, Power-of-Choice (d = 2P), Active FL (alpha1 = 0.8, alpha2 = 1, alpha3 = 0, appendix
  C.1) and FedCVR-Bolt; test MSE averaged over clients, 20 paired seeds (each seed draws its own
  data, the same for every method). The paper does not give its data scale: the regression
  vectors are scaled (``theta_scale``) so that FedAvg's IID MSE matches the paper's
  (``T1_THETA_SCALE``, calibrated in ``docs/fedcvr_bolt.md``); verdicts compare MSE relative to
  FedAvg's on the same seed, which does not depend on that scale.
* Table 2: MNIST, Dirichlet alpha = 0.1 over K = 100 clients, MLP 2 x 200, batch 100, lr 0.01,
  P = 10, T = 200, 30 warm-up rounds; FedAvg, Power-of-Choice, Active FL, FedProx (mu = 0.01;
  the paper gives none), IFCA and FeSEM (4 cluster models each; the paper gives no k) and
  FedCVR-Bolt (last-layer sketch); test accuracy averaged over clients (IFCA/FeSEM: each client
  under its assigned model). CIFAR-10/100 (CNN, T = 100, a 300-weight random sketch of the last
  layer) run at the paper size when their files are present (``cifar10.npz`` /
  ``cifar100.npz``); they cannot be fetched here, so the tables say they were not run (the
  path is tested on fake files).
* Table 4: FedCVR-Bolt with the cosine, Laplacian and sigmoid kernels of appendix B.1 beside
  the RBF of eq. 4 (Table 2's run).
* Mechanism rows (no claim of the paper; ours): FedCVR-Bolt with ``beta = 0`` (one uniformly
  drawn client per coalition: coalition-stratified sampling) against FedAvg separates the
  coalitions' effect; ``beta = 1`` against ``beta = 0`` the Boltzmann draw's; and a scale-free
  ``beta = 1`` (values standardised within each coalition, ``value_scale="standardized"``,
  ours) shows what the draw does when it is not uniform in practice. The strategies' per-round
  diagnostics (law entropy and max-over-uniform, coalition sizes, adjusted Rand index against
  the dominant label, per-coalition entropy; Active FL's kept set and top mass) are averaged
  over the rounds after the warm-up.

Active FL: the paper's rule refreshes only participants' valuations, and with ``alpha3 = 0``
it then draws the same ``P`` clients forever (its ``kept`` diagnostic is ``P``); appendix C.1
calls ``alpha1 = 0.8`` "equivalent to d = 2P", which holds only when every client has a fresh
valuation. The main row uses ``refresh="available"`` (every available client reports its
valuation each round); the literal rule is the extra row ``Active FL (participants only)``.

Sizes: ``paper`` is the paper's (10 local epochs on MNIST); ``cpu`` keeps Table 1 at the
paper's size and runs MNIST on a stratified share of its training images with a few local
steps, T = 200 and 30 warm-up rounds (:data:`SCALES`). FedCVR-Bolt has no public code: the
``code`` profile is the ``paper`` profile.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.compare import mean_curves
from fedjax_sel.experiment.execution import Execution
from fedjax_sel.experiment.outputs import plot_curves, subplots, write_atomic, write_json
from fedjax_sel.experiment.reproductions import output_dir, register_reproduction
from fedjax_sel.experiment.study import (
    Study,
    check_profile_size,
    markdown_table,
    verdicts_and_absent,
)
from fedjax_sel.experiment.verdicts import Claim
from studies.fedcvr_bolt_readout import (
    DIAG_HEADER,
    FINAL_MSE,
    MSE_PCT,
    BoltStudy,
    diagnostics_after,
    diagnostics_text,
    image_claims,
    mechanism_rows,
    mechanism_table,
    table1_claims,
)
from studies.fedcvr_bolt_setup import (
    AFL,
    AFL_LITERAL,
    BETA0,
    BOLT,
    CLUSTERS,
    FEDAVG,
    FEDPROX_MU,
    INTERCEPT,
    KERNEL_LABELS,
    PAPER_TABLE1,
    PAPER_TABLE2,
    PAPER_TABLE4,
    PER_ROUND,
    SCALE_FREE,
    SCALES,
    SLOPE,
    T1_THETA_SCALE,
    Method,
    bolt_method,
    image_config,
    image_data_path,
    table1_config,
    table1_settings,
)


def common_methods(sketch: tuple, warmup: int, per_round: int = PER_ROUND) -> list[Method]:
    """The selection methods of both tables, with the mechanism rows (Power-of-Choice draws
    ``d = 2P`` candidates, appendix C.1)."""
    return [
        Method(FEDAVG, "uniform"),
        Method("Power-of-Choice", "power_of_choice", (("d", 2 * per_round), ("weighting", "size"))),
        Method("Active FL", "active_fl", AFL + (("refresh", "available"),)),
        Method(AFL_LITERAL, "active_fl", AFL),
        bolt_method(BOLT, sketch, warmup),
        bolt_method(BETA0, sketch, warmup, beta=0.0),
        bolt_method(SCALE_FREE, sketch, warmup, value_scale="standardized"),
    ]


def table1_methods(warmup: int = 30, per_round: int = PER_ROUND) -> list[Method]:
    return common_methods((("sketch", "all"),), warmup, per_round)


def bolt_sketch(dataset: str) -> tuple:
    """Appendix C.2: the whole last layer on MNIST, 300 of its weights on CIFAR."""
    return (("sketch", "last_layer"),) + ((("sketch_dim", 300),) if dataset != "mnist" else ())


def table2_methods(dataset: str, warmup: int = 30, per_round: int = PER_ROUND) -> list[Method]:
    sketch = bolt_sketch(dataset)
    return common_methods(sketch, warmup, per_round) + [
        Method("FedProx", "uniform", prox_mu=FEDPROX_MU),
        Method("IFCA", "ifca", (("num_clusters", CLUSTERS),)),
        Method("FeSEM", "fesem", (("num_clusters", CLUSTERS), ("sketch", "last_layer"))),
    ]


def table4_methods(dataset: str, warmup: int = 30) -> list[Method]:
    sketch = bolt_sketch(dataset)
    return [bolt_method(label, sketch, warmup, affinity=k) for k, label in KERNEL_LABELS.items()]


# ----------------------------------------------------------------------------- the study
TABLES = ("1", "2", "4")
FAKE_TESTED = "the CIFAR path runs in tests/test_fedcvr_reproduce.py on a fake file"


@register_reproduction(
    "fedcvr-bolt",
    "FedCVR-Bolt Tables 1 (synthetic regression, 20 seeds), 2 (MNIST/CIFAR Dirichlet 0.1 "
    "against FedAvg, Power-of-Choice, Active FL, FedProx, IFCA, FeSEM) and 4 (affinity "
    "kernels), with the coalition / Boltzmann mechanism rows",
)
def run(
    *,
    seeds: int = 5,
    out,
    size: str = "cpu",
    profile: str = "paper",
    data_dir=None,
    execution: Execution | None = None,
    table1_seeds: int = 20,
    tables: tuple[str, ...] = TABLES,
) -> dict:
    """Runs the tables at ``size`` (``table1_seeds`` paired seeds for Table 1, ``seeds`` for
    the others), prints our numbers (mean and 95% CI) beside the paper's and writes
    ``results.json``, ``tables.md``, ``verdicts.json`` and the plots under ``out``."""
    check_profile_size("fedcvr-bolt", profile, size, seeds, 5)
    if not (isinstance(table1_seeds, int) and table1_seeds >= 1):
        raise ConfigError(
            f"fedcvr-bolt: table1_seeds must be a positive integer, got {table1_seeds!r}"
        )
    bad = set(tables) - set(TABLES)
    if bad:
        raise ConfigError(f"fedcvr-bolt: unknown table(s) {sorted(bad)}; known {TABLES}")
    out = output_dir(out)
    scale = SCALES[size]
    study = BoltStudy(
        "fedcvr_bolt",
        profile=profile,
        size=size,
        seeds=seeds,
        out=out,
        execution=execution,
    )
    results: dict[str, Any] = {
        "scale": dataclasses.asdict(scale),
        "profile": profile,
        "size": size,
        "seeds": seeds,
        "table1_seeds": table1_seeds,
        "t1_theta_scale": T1_THETA_SCALE,
        "absent": {},
        "note": "FedCVR-Bolt has no public code: profile 'code' = 'paper'",
    }
    added: list[tuple[str, str]] = []
    if "1" in tables:
        for setting, _, _, intercept, clusters in table1_settings():
            for m in table1_methods(scale.warmup, scale.per_round):
                study.add(
                    setting, m.label, table1_config(m, intercept, clusters, scale), table1_seeds
                )
                added.append((setting, m.label))
    image_sets = []
    if "2" in tables or "4" in tables:
        for name in scale.datasets:
            try:
                path = image_data_path(name, scale, out, data_dir)
            except ConfigError as e:
                results["absent"][name] = f"not run: {e} ({FAKE_TESTED})"
                print(f"{name} absent: {e}; skipped")
                continue
            image_sets.append(name)
            methods = table2_methods(name, scale.warmup, scale.per_round) if "2" in tables else []
            if "4" in tables and name in PAPER_TABLE4:
                methods += table4_methods(name, scale.warmup)
                if "2" not in tables:
                    methods.append(bolt_method(BOLT, bolt_sketch(name), scale.warmup))
            for m in methods:
                study.add(name, m.label, image_config(m, name, scale, path))
                added.append((name, m.label))
        for name in PAPER_TABLE2:
            if name not in scale.datasets:
                results["absent"][name] = (
                    f"not part of size {size!r} (its file cannot be fetched here; {FAKE_TESTED})"
                )
    study.run()
    ran = set(added)

    md = [
        f"# FedCVR-Bolt reproduction (profile {profile}, size {size})",
        "",
        "FedCVR-Bolt has no public code: the `code` profile is the `paper` profile.",
        "Cells: ours, mean [95% CI] over paired seeds, with the paper's mean +- std in "
        "parentheses. Diagnostics: means over the rounds after the warm-up.",
    ]

    def section(title: str, *parts: str) -> None:
        md.extend(["", f"## {title}", "", *parts])
        print(f"\n{title}\n" + "\n".join(parts))

    claims: list[Claim] = []
    mechanism: list[dict] = []
    diagnostics: dict[str, dict] = {}
    if "1" in tables:
        rows = []
        for setting, model, het, _, _ in table1_settings():
            paper = PAPER_TABLE1[(model, het)]
            for m in table1_methods(scale.warmup, scale.per_round):
                p = paper.get(m.label)
                d = diagnostics_after(study, setting, m.label, scale.warmup)
                diagnostics.setdefault(setting, {})[m.label] = d
                rows.append(
                    [
                        model,
                        het,
                        m.label,
                        study.cell_text(setting, m.label, FINAL_MSE, 1.0, 4)
                        + ("" if p is None else f" ({p[0]:.4f} +- {p[1]:.4f})"),
                        study.cell_text(setting, m.label, MSE_PCT, 1.0, 2)
                        + ("" if p is None else f" ({100 * p[0] / paper[FEDAVG][0]:.2f})"),
                        *diagnostics_text(d)[:5],
                    ]
                )
            mechanism += mechanism_rows(study, setting, MSE_PCT, 1.0, ran)
        section(
            f"Table 1: regression, test MSE averaged over clients ({table1_seeds} paired seeds)",
            f"Data scale: theta_scale {T1_THETA_SCALE[SLOPE]} (D=1) and "
            f"{T1_THETA_SCALE[INTERCEPT]} (D=2), chosen so FedAvg's IID MSE matches the "
            "paper's; the D=2 IID row cannot also match the D=1 one (docs/fedcvr_bolt.md).",
            "",
            markdown_table(
                ["model", "setting", "method", "MSE (paper)", "% of FedAvg (paper)"]
                + DIAG_HEADER[:5],
                rows,
            ),
        )
        claims += table1_claims(table1_settings())
        plot_table1(study, out / "table1_mse_pct.png", scale.warmup)
    for name in image_sets:
        paper = PAPER_TABLE2.get(name, {})
        labels = (
            [m.label for m in table2_methods(name, scale.warmup, scale.per_round)]
            if "2" in tables
            else []
        )
        if "4" in tables and name in PAPER_TABLE4:
            labels += [BOLT] * ("2" not in tables) + list(KERNEL_LABELS.values())
        rows, diag_rows = [], []
        for label in labels:
            p = paper.get(label)
            rows.append(
                [
                    label,
                    study.cell_text(name, label, "final_client_test_accuracy_mean")
                    + ("" if p is None else f" ({p[0]:.2f} +- {p[1]:.2f})"),
                ]
            )
            d = diagnostics_after(study, name, label, scale.warmup)
            diagnostics.setdefault(name, {})[label] = d
            diag_rows.append([label, *diagnostics_text(d)])
        section(
            f"{' and '.join(f'Table {t}' for t in ('2', '4') if t in tables)} on {name}: "
            "test accuracy (%) averaged "
            f"over clients ({seeds} paired seeds, {scale.rounds_of(name)} rounds, warm-up "
            f"{scale.warmup})",
            markdown_table(["method", "accuracy (paper)"], rows),
            "",
            "Mechanism diagnostics (after the warm-up; Active FL: its softmax):",
            "",
            markdown_table(["method"] + DIAG_HEADER, diag_rows),
        )
        afl = {
            lab: {k: diagnostics[name][lab].get(k) for k in ("kept", "top_mass")}
            for lab in ("Active FL", AFL_LITERAL)
            if lab in diagnostics[name]
        }
        if afl:
            md.append("")
            md.append(
                "Active FL's softmax: "
                + "; ".join(
                    f"{lab}: {v['kept'] or 0:.1f} clients kept, top-{scale.per_round} mass "
                    f"{v['top_mass'] or 0:.3f}"
                    for lab, v in afl.items()
                )
            )
        # Table 4's claims whether or not Table 2 ran (tables=4 alone reruns the kernels)
        claims += image_claims(name, tables)
        if "2" in tables:
            mechanism += mechanism_rows(study, name, "final_client_test_accuracy_mean", 100.0, ran)
        table = "2" if "2" in tables else "4"  # the curves of the table that ran
        plot_image_table(study, name, labels, out / f"table{table}_{name}_curves.png")
        plot_bolt_diagnostics(study, name, out / f"diagnostics_{name}.png")
    if mechanism:
        for setting in dict.fromkeys(r["setting"] for r in mechanism):
            unit = "% of FedAvg's MSE" if setting.startswith("table1") else "accuracy points"
            section(
                f"Mechanism rows, {setting} (paired; no claim of the paper)",
                mechanism_table([r for r in mechanism if r["setting"] == setting], unit),
            )
    # a claim is read only where both of its methods ran (tests run subsets of the methods)
    claims = [c for c in claims if {(c.setting, c.label), (c.setting, c.baseline)} <= ran]
    # before the verdicts write per_seed.json, so that it holds these tables' metrics
    tables_out: dict[str, dict] = {}
    for setting, label in added:
        metrics = (
            ((FINAL_MSE, 1.0), (MSE_PCT, 1.0))
            if setting.startswith("table1")
            else (("final_client_test_accuracy_mean", 100.0),)
        )
        tables_out.setdefault(setting, {})[label] = {
            metric: study.per_seed_stat(setting, label, metric, factor)
            for metric, factor in metrics
        }
    results["tables"] = tables_out
    verdict_rows = verdicts_and_absent(study, claims, section, md, results["absent"])
    results.update(verdicts=verdict_rows, mechanism=mechanism, diagnostics=diagnostics)
    results["paper"] = {
        "table1": {f"{m} / {h}": v for (m, h), v in PAPER_TABLE1.items()},
        "table2": PAPER_TABLE2,
        "table4": PAPER_TABLE4,
    }
    write_atomic(out / "tables.md", "\n".join(md) + "\n")
    write_json(out / "results.json", results)
    print(f"\nwritten: {out}/results.json, tables.md, verdicts.json, plots")
    return results


# ----------------------------------------------------------------------------- plots
def plot_table1(study: Study, path: Path, warmup: int) -> Path:
    """Per Table 1 setting: each method's MSE as % of FedAvg's (mean and 95% CI over seeds)."""
    settings = table1_settings()
    labels = [m.label for m in table1_methods(warmup)]  # the labels do not depend on P
    fig, axes = subplots(1, len(settings), figsize=(4 * len(settings), 4), sharey=False)
    for ax, (setting, model, het, _, _) in zip(np.atleast_1d(axes), settings, strict=True):
        stats = [study.stat(setting, lab, MSE_PCT) for lab in labels]
        means = [np.nan if s["mean"] is None else s["mean"] for s in stats]
        err = [
            [0 if s["ci_low"] is None else s["mean"] - s["ci_low"] for s in stats],
            [0 if s["ci_high"] is None else s["ci_high"] - s["mean"] for s in stats],
        ]
        ax.bar(range(len(labels)), means, yerr=err, capsize=3)
        ax.axhline(100.0, color="k", lw=0.8)
        ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=7)
        ax.set_title(f"{model}, {het}", fontsize=9)
        ax.set_ylabel("MSE, % of FedAvg's")
        lo = np.nanmin(np.asarray(means) - np.asarray(err[0]))
        hi = np.nanmax(np.asarray(means) + np.asarray(err[1]))
        if np.isfinite(lo) and np.isfinite(hi):
            ax.set_ylim(lo - 0.1 * (hi - lo + 1e-9), hi + 0.1 * (hi - lo + 1e-9))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_image_table(study: Study, setting: str, labels: list[str], path: Path) -> Path:
    """Client-averaged test accuracy over rounds (mean over seeds, 95% CI bands)."""
    runs = [r for lab in dict.fromkeys(labels) for r in study.runs(setting, lab)]
    curves, bands = mean_curves(runs, "client_test_accuracy_mean")
    curves = {
        k: [dict(e, test_accuracy=e["client_test_accuracy_mean"]) for e in v]
        for k, v in curves.items()
    }
    return plot_curves(
        curves,
        path,
        bands=bands,
        title=f"Table 2, {setting}: client-averaged test accuracy, mean over seeds, 95% CI",
    )


def plot_bolt_diagnostics(study: Study, setting: str, path: Path) -> Path:
    """FedCVR-Bolt's mechanism over rounds (mean over seeds): the law's max over uniform, the
    largest within-coalition max over uniform, the ARI against the dominant label and the
    coalition sizes after the warm-up."""
    fig, axes = subplots(1, 4, figsize=(17, 3.6))
    for label in (BOLT, BETA0, SCALE_FREE):
        try:
            runs = study.runs(setting, label)
        except ConfigError:
            continue
        rounds = [e["round"] for e in runs[0].records]

        def series(key, reduce=lambda v: v):
            return np.nanmean(
                [
                    [
                        np.nan
                        if e.get("diagnostics", {}).get(key) is None
                        else reduce(np.asarray(e["diagnostics"][key], np.float64))
                        for e in r.records
                    ]
                    for r in runs
                ],
                axis=0,
            )

        axes[0].plot(rounds, series("law_max_over_uniform"), label=label)
        axes[1].plot(rounds, series("coalition_max_over_uniform", np.max), label=label)
        axes[2].plot(rounds, series("ari_dominant_label"), label=label)
        sizes = np.mean(
            [
                np.mean([e["diagnostics"]["coalition_sizes"] for e in r.records[-5:]], axis=0)
                for r in runs
            ],
            axis=0,
        )
        axes[3].plot(np.arange(1, len(sizes) + 1), sizes, marker="o", label=label)
    titles = (
        "law: max p / uniform",
        "largest within-coalition max / uniform",
        "ARI coalitions vs dominant label",
        "coalition sizes (last 5 chunks)",
    )
    for ax, t in zip(axes, titles, strict=True):
        ax.set_title(t, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[3].set_xlabel("coalition (largest first)")
    for ax in axes[:3]:
        ax.set_xlabel("round")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
