"""``fedjax-sel reproduce ca-fed``: CA-Fed's Figs. 1, 1d, 2a and 5 (Rodio et al., *Federated
Learning under Heterogeneous and Correlated Client Availability*, IEEE/ACM ToN 2024,
arXiv:2301.04632, section V) with paired seeds, tuned learning rates, verdicts and the
mechanism's diagnostics.

Parts (``parts=...``; all by default):

* ``fig1_synthetic``, ``fig1_mnist``: test accuracy of CA-Fed against Unbiased,
  More-available, AdaFed and F3AST (``m = N / 2``) on LEAF Synthetic (gamma = delta = 0.5) and
  MNIST (Dirichlet 0.5, a 20% per-client validation split), linear classifier (paper
  profile: ridge 1e-2),
  N = 100 Markov clients with oracle ``pi``/``lambda`` (section V-A c); Fig. 1d's cumulative
  weight ``(1/T) sum_t q_k`` per class (the engine's ``weight_sums``) and the kept share per
  class (the strategies' ``kept_by_group`` diagnostics);
* ``fig2a``: the ``kappa_bar^2`` sweep ``{1e-2, ..., 1e2}`` against Unbiased and More-available
  on Synthetic (T = 500 at the paper size);
* ``fig5``: clustered availability (10 clusters, ``markov_clustered``): maps of each client's
  availability and CA-Fed's inclusion per round (a: iid data, b: Dirichlet across clusters
  and iid within, c: Dirichlet) from CA-Fed's ``trace`` diagnostics, the inclusion rate per
  cluster, and the methods' accuracy in the Fig. 5c setting (Fig. 5d);
* ``control`` (``code`` profile only): the reference code's own setup, N = 24, T = 150, with
  the learning rates its scripts report (no tuning).

Profiles (``docs/ca_fed.md`` lists every difference):

* ``paper``: the text. ``kappa_bar^2`` in eq. 20's units (1 for Fig. 1); the loss signal of
  line 3 (one training minibatch) with ``F_hat^* = min_s F_hat^(s)``; Algorithm 1's orders
  (descending ``lambda``); the four classes of section V-A a; plain SGD at client and server
  (eqs. 2-3); T = 200 (Fig. 5: 100). Client ids are shuffled (the text does not say; the
  greedy breaks ties by id).
* ``code``: how ``arodio/CA-Fed`` ran it: ``bias_const = 1``, which is ``kappa2 = 0.25`` in
  eq. 20's units (the code omits the factor 4; the Fig. 2a sweep runs ``kappa2 = c / 4`` for
  the paper's values ``c``); the validation-split loss of the current model with a fixed
  ``F_k^*`` (each client's fitted optimum on Synthetic, 0 on MNIST); ``|lambda|`` order;
  Algorithm 1 literally on a flat proxy; the 50/25/25 population without "more available,
  correlated" clients; SGD with momentum 0.9 and weight decay 1e-2 at client and server,
  persistent client momentum; T = 150; equal client sizes on Synthetic (50 training and 150
  validation examples, the code's proportions); F3AST as the code has it; AdaFed with server
  learning rate 1; PyTorch's ``nn.Linear`` initialisation and weight decay as the only
  regularisation (no ridge term); every claim also read on the reference's plotted metric,
  the running mean of the accuracies it logs (``reference_average@T``; every round is
  evaluated for it).

Both profiles: 2 local epochs (the code's; the paper does not say), batch 32 (Synthetic) / 64
(MNIST), ``alpha_k = n_k / n``, data seed 0, learning rates tuned per method and data set on
the code's grid (client ``{0.1, 0.03, 0.01, 0.003, 0.001}`` x server ``{1, 0.3, 0.1, 0.03,
0.01}``) by the mean test accuracy over the last 40% of a tuning run on seeds 1000+ (the
reported seeds are 0..S-1); ``tune=false`` with ``lrs=...`` skips tuning; ``client_lrs=...`` and
``server_lrs=...`` tune on another grid.

Sizes: ``paper``: the paper's N, T and data; the full grid for every method.
``cpu`` (minutes on a CPU): N = 100, T = 60 (Fig. 2a: 60, so Fig. 2a's "t = 500" claim is read
at T = 60; Fig. 5: 40), MNIST a stratified 10% of its training images, LEAF's LogNormal sizes
capped at 200 (paper profile), tuning on a 3 x 2 subgrid (client ``{0.1, 0.01,
0.001}`` x server ``{1, 0.1}``, 60 rounds) for CA-Fed, Unbiased and AdaFed, whose Unbiased values
More-available and F3AST reuse.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.availability.clustered import cluster_of_clients
from fedjax_sel.availability.markov_population import CLASS_NAMES, population_classes
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import load_data_for, plot_curves, write_json
from fedjax_sel.experiment.compare import mean_curves
from fedjax_sel.experiment.execution import Execution
from fedjax_sel.experiment.outputs import write_atomic
from fedjax_sel.experiment.reproductions import output_dir, register_reproduction, select_parts
from fedjax_sel.experiment.stats import mean_ci
from fedjax_sel.experiment.study import Study, check_profile_size, markdown_table
from fedjax_sel.experiment.verdicts import verdict_table
from studies.ca_fed_readout import (
    alpha_by_class,
    claims,
    fig1d_weights,
    mechanism_row,
    plot_map,
    plot_weights,
    trace_maps,
)
from studies.ca_fed_setup import (
    CODE_LRS,
    CONTROL_CLIENTS,
    FIG5_PANELS,
    KAPPAS,
    LABELS,
    NUM_CLUSTERS,
    PAPER_FIG1_GAIN,
    PAPER_FIG5D_GAIN,
    PARTS,
    PROFILES,
    SCALES,
    STRATEGIES,
    Profile,
    Scale,
    fig1_rounds,
    fig2_rounds,
    fitted_optima,
    kappa_label,
    learning_rates,
    make_config,
    mnist_path,
    parse_lrs,
    reference_average,
    with_grid,
)


# ----------------------------------------------------------------------------- the study
def _curves(study: Study, setting: str, labels: list[str], path: Path, title: str) -> None:
    runs = [r for lab in labels for r in study.runs(setting, lab)]
    curves, bands = mean_curves(runs)
    plot_curves(curves, path, bands=bands, title=title)


def _fmt(v, digits: int = 3) -> str:
    return (
        "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"
    )


@dataclasses.dataclass
class Reproduction:
    """One run of the reproduction: its profile, size, study, data, learning rates and the
    Markdown and JSON it writes."""

    profile: Profile
    scale: Scale
    study: Study
    methods: tuple[str, ...]
    datasets: dict[str, dict[str, Any]]  # data set -> extra make_config arguments
    lrs: dict[tuple[str, str], tuple[float, float]] = dataclasses.field(default_factory=dict)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    md: list[str] = dataclasses.field(default_factory=list)
    kappas: tuple[float, ...] = KAPPAS  # Fig. 2a's kappa_bar^2 values run

    @property
    def labels(self) -> list[str]:
        return [LABELS[s] for s in self.methods]

    @property
    def baseline(self) -> str | None:
        return "AdaFed" if "adafed" in self.methods else None

    def config(self, strategy: str, dataset: str, *, rounds: int, **kw) -> RunConfig:
        extra = {**self.datasets.get(dataset, {}), **kw}
        lr = self.lrs[(dataset, strategy)]
        return make_config(
            strategy, dataset, self.profile, self.scale, lr=lr, rounds=rounds, **extra
        )

    def section(self, title: str, body: str) -> None:
        self.md.extend(["", f"## {title}", "", body])
        print(f"\n{title}\n{body}")

    def method_table(self, setting: str, labels: list[str], baseline: str | None) -> str:
        """Accuracy, the paired difference against ``baseline`` and the mechanism's
        diagnostics of each method in ``setting`` (recorded in ``results["mechanism"]``)."""
        rows = []
        for lab in labels:
            m = mechanism_row(self.study, setting, lab)
            self.results.setdefault("mechanism", {})[f"{setting} / {lab}"] = m
            rows.append(
                [
                    lab,
                    self.study.cell_text(setting, lab, "final_accuracy"),
                    self.paired_text(setting, lab, baseline),
                    _fmt(m.get("excluded"), 1),
                    f"{_fmt(m.get('q_sum'), 2)} ({_fmt(m.get('q_sum_std_across_rounds'), 2)})",
                    _fmt(m.get("q_max"), 3),
                    _fmt(m.get("law_entropy_ratio"), 3),
                ]
            )
        header = [
            "method",
            "final accuracy",
            f"minus {baseline} (pp)" if baseline else "-",
            "excluded / round",
            "sum q (std across rounds)",
            "max q",
            "law entropy ratio",
        ]
        return markdown_table(header, rows)

    def paired_text(self, setting: str, label: str, baseline: str | None) -> str:
        if not baseline or label == baseline:
            return "-"
        x = self.study.values(setting, label, "final_accuracy")
        b = self.study.values(setting, baseline, "final_accuracy")
        common = sorted(set(x) & set(b))
        if len(common) < 2:
            return "-"
        d = 100 * (np.array([x[s] for s in common]) - np.array([b[s] for s in common]))
        dm, lo, hi = mean_ci(d)
        return f"{dm:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def add_fig1(rep: Reproduction, dataset: str) -> None:
    for s in rep.methods:
        rounds = fig1_rounds(rep.profile, rep.scale)
        rep.study.add(dataset, LABELS[s], rep.config(s, dataset, rounds=rounds))


def add_fig2a(rep: Reproduction) -> None:
    rounds = fig2_rounds(rep.scale)
    for x in rep.kappas:
        config = rep.config("ca_fed", "synthetic", rounds=rounds, kappa=x)
        rep.study.add("synthetic fig2a", kappa_label(x), config)
    for s in ("unbiased", "more_available"):
        rep.study.add("synthetic fig2a", LABELS[s], rep.config(s, "synthetic", rounds=rounds))


def add_fig5(rep: Reproduction) -> None:
    rounds = rep.scale.rounds_fig5
    for panel, partition in FIG5_PANELS:  # one traced seed, evaluated (logged) every round
        config = rep.config(
            "ca_fed",
            "mnist",
            rounds=rounds,
            availability="markov_clustered",
            partition=partition,
            eval_every=1,
            trace=True,
        )
        rep.study.add("fig5 maps", f"CA-Fed Fig. 5{panel}", config, seeds=1)
    for s in rep.methods:
        config = rep.config(s, "mnist", rounds=rounds, availability="markov_clustered")
        rep.study.add("mnist clustered", LABELS[s], config)


def add_control(rep: Reproduction, optima: tuple[float, ...]) -> None:
    for s in ("ca_fed", "adafed", "unbiased"):
        config = make_config(
            s,
            "synthetic",
            rep.profile,
            rep.scale,
            lr=CODE_LRS[("synthetic", s)],
            rounds=rep.scale.rounds_control,
            num_clients=CONTROL_CLIENTS,
            optima=optima,
        )
        rep.study.add("control N=24", LABELS[s], config)


def report_fig1(rep: Reproduction, dataset: str, out: Path) -> None:
    t1 = fig1_rounds(rep.profile, rep.scale)
    rep.section(
        f"Fig. 1, {dataset} (T = {t1}; paper: CA-Fed - AdaFed = "
        f"+{PAPER_FIG1_GAIN[dataset]:.2f} pp at T = 200)",
        rep.method_table(dataset, rep.labels, rep.baseline),
    )
    if {"CA-Fed", "Unbiased"} <= set(rep.labels):
        # not a claim of the paper: Unbiased has CA-Fed's weights alpha / pi without the
        # exclusions, so the paired difference isolates what the exclusions do
        effect = rep.study.per_seed_stat(dataset, "CA-Fed", "final_accuracy", baseline="Unbiased")
        rep.results.setdefault("exclusion_effect", {})[dataset] = effect
        rep.md += [
            "",
            f"CA-Fed - Unbiased (the exclusions alone), final accuracy, paired: "
            f"{effect['mean']:+.2f} [{effect['ci_low']:+.2f}, {effect['ci_high']:+.2f}] pp.",
        ]
    _curves(rep.study, dataset, rep.labels, out / f"fig1_{dataset}.png", f"Fig. 1, {dataset}")


def report_fig1d(rep: Reproduction, out: Path) -> None:
    classes = population_classes(rep.scale.num_clients, rep.profile.mix, rep.profile.id_seed)
    weights, rows = {}, []
    for lab in rep.labels:
        fig1d = fig1d_weights(rep.study, "synthetic", lab, classes)
        cw = fig1d["cumulative_weight"]
        kept = mechanism_row(rep.study, "synthetic", lab).get("kept_share_by_class", {})
        rep.results.setdefault("fig1d", {})[lab] = {**fig1d, "kept_share": kept}
        weights[lab] = np.asarray(fig1d["weight_share"])
        rows.append([lab] + [f"{_fmt(cw[n], 4)} / {_fmt(kept.get(n), 2)}" for n in CLASS_NAMES])
    probe = make_config("unbiased", "synthetic", rep.profile, rep.scale, lr=(1, 1), rounds=1)
    counts = np.asarray(load_data_for(probe).train.counts)
    alpha = alpha_by_class(counts, classes)
    rep.results["alpha_synthetic"] = alpha
    rows.append(
        ["alpha (sum over the class)"] + [_fmt(alpha["per_class"][n], 3) for n in CLASS_NAMES]
    )
    rep.section(
        "Fig. 1d, Synthetic: per class, the mean cumulative weight (1/T) sum_t q_k of a client "
        "/ the share of its clients kept (q_k > 0) per round",
        markdown_table(["method", *CLASS_NAMES], rows)
        + f"\n\nLargest alpha_k: {alpha['max']:.3f} ({alpha['max_class']}).",
    )
    plot_weights(weights, classes, out / "fig1d_weights.png")


def report_fig2a(rep: Reproduction, out: Path) -> None:
    t2 = fig2_rounds(rep.scale)
    labels = [kappa_label(x) for x in rep.kappas] + ["Unbiased", "More available"]
    rows = []
    for lab in labels:
        m = mechanism_row(rep.study, "synthetic fig2a", lab)
        rep.results.setdefault("mechanism", {})[f"synthetic fig2a / {lab}"] = m
        rows.append(
            [
                lab,
                rep.study.cell_text("synthetic fig2a", lab, "accuracy@40"),
                rep.study.cell_text("synthetic fig2a", lab, "final_accuracy"),
                _fmt(m.get("excluded"), 1),
            ]
        )
    rep.section(
        f"Fig. 2a, Synthetic (T = {t2}; each label's kappa2 runs as {rep.profile.kappa_scale:g} "
        "x the label, in eq. 20's units)",
        markdown_table(
            ["method", "accuracy at t = 40", f"final (t = {t2})", "excluded / round"], rows
        ),
    )
    _curves(rep.study, "synthetic fig2a", labels, out / "fig2a_kappa.png", "Fig. 2a")


def report_fig5(rep: Reproduction, out: Path) -> None:
    cluster = cluster_of_clients(rep.scale.num_clients, NUM_CLUSTERS)
    rows = []
    for panel, partition in FIG5_PANELS:
        (r,) = rep.study.runs("fig5 maps", f"CA-Fed Fig. 5{panel}")
        available, kept = trace_maps(r)
        rate = [float(kept[:, cluster == c].mean()) for c in range(NUM_CLUSTERS)]
        seed_values: dict[str, Any] = {"inclusion_rate_per_cluster": rate}
        if r.summary.get("final_accuracy") is not None:
            seed_values["final_accuracy"] = float(r.summary["final_accuracy"])
        # one seed: its values, kept in per_seed.json
        values = rep.study.per_seed_means("fig5 maps", r.label, {r.seed: seed_values})
        rep.results.setdefault("fig5", {})[panel] = {"partition": partition, **values}
        rows.append([f"5{panel} ({partition})"] + [f"{x:.2f}" for x in rate])
        plot_map(
            available,
            kept,
            out / f"fig5{panel}_map.png",
            f"Fig. 5{panel}: MNIST {partition}, clustered availability, seed 0\n"
            "dark green: active, kept; grey: active, excluded; light: inactive, kept",
        )
    rep.section(
        "Fig. 5a-c: CA-Fed's inclusion rate (q_k > 0) per cluster, one seed (clusters 0-4: "
        "pi 0.9, lambda 0; 5-9: pi 0.1, lambda 0.5 ... 0.9)",
        markdown_table(["panel"] + [str(c) for c in range(NUM_CLUSTERS)], rows),
    )
    rep.section(
        f"Fig. 5d, MNIST Dirichlet 0.5, clustered availability (T = {rep.scale.rounds_fig5}; "
        f"paper: CA-Fed - AdaFed = +{PAPER_FIG5D_GAIN} pp at T = 100)",
        rep.method_table("mnist clustered", rep.labels, rep.baseline),
    )
    _curves(rep.study, "mnist clustered", rep.labels, out / "fig5d_accuracy.png", "Fig. 5d")


def report_control(rep: Reproduction) -> None:
    rep.section(
        f"Control: the code's own setup, N = {CONTROL_CLIENTS}, T = {rep.scale.rounds_control}, "
        "its published learning rates",
        rep.method_table("control N=24", ["CA-Fed", "AdaFed", "Unbiased"], "AdaFed"),
    )


def report_lrs(rep: Reproduction, tune: bool) -> None:
    record = rep.results["learning_rates"]
    rows = [[key, f"{c:g} / {s:g}"] for key, (c, s) in record["chosen"].items()]
    how = (
        f"tuned {record.get('tuned')} on {rep.scale.tune_rounds} rounds, seeds "
        f"{record['tune_seeds']} (criterion: {record['criterion']})"
        + ("" if rep.scale.tune_all else "; the others reuse Unbiased's values")
        if tune
        else "not tuned (given values, else the code's published ones)"
    )
    rep.section(
        "Learning rates (client / server)",
        markdown_table(["data set . strategy", "chosen"], rows)
        + f"\n\nGrid: client {list(rep.scale.client_lrs)} x server {list(rep.scale.server_lrs)} "
        f"(fixed server lr: {rep.profile.fixed_server_lr or 'none'}); {how}.",
    )


@register_reproduction(
    "ca-fed",
    "CA-Fed Figs. 1, 1d, 2a, 5: Synthetic and MNIST, Markov availability, kappa sweep, clusters",
)
def run(
    *,
    seeds: int = 10,
    out,
    size: str = "cpu",
    profile: str = "paper",
    data_dir=None,
    parts: tuple[str, ...] | None = None,
    methods: tuple[str, ...] = STRATEGIES,
    tune: bool = True,
    lrs: str | None = None,
    client_lrs: tuple[float, ...] | None = None,
    server_lrs: tuple[float, ...] | None = None,
    kappas: tuple[float, ...] = KAPPAS,
    execution: Execution | None = None,
) -> dict:
    """Runs the parts (see the module docstring) at ``size`` under ``profile`` and writes
    ``results.json``, ``tables.md``, ``verdicts.json`` and plots under ``out``.

    Options: ``parts`` (default all; ``$FEDJAX_SEL_CA_FED_PARTS``; ``control`` runs under the
    code profile only), ``methods`` (the strategies of Figs. 1 and 5d), ``tune`` (grid-search
    the learning rates; ``false``: ``lrs`` and, under the code profile, the code's published
    values), ``lrs`` (``DATASET.STRATEGY=CLIENT/SERVER`` entries separated by ``;``, used as
    given; e.g. ``synthetic.ca_fed=0.01/0.3;mnist.ca_fed=0.001/0.1``), ``client_lrs`` and
    ``server_lrs`` (the tuning grid in place of the size's, e.g. ``client_lrs=0.1/0.03``),
    ``kappas`` (Fig. 2a's ``kappa_bar^2`` values, default ``0.01/0.1/1/10/100``; its two claims
    read 0.1 and 100, so both must be among them)."""
    check_profile_size("ca-fed", profile, size, seeds, 10)
    parts = select_parts("ca-fed", parts, "FEDJAX_SEL_CA_FED_PARTS", PARTS, PARTS)
    if not methods or set(methods) - set(STRATEGIES):
        raise ConfigError(f"ca-fed: methods must be among {STRATEGIES}, got {methods}")
    if not {0.1, 100.0} <= set(kappas) or not all(x > 0 for x in kappas):
        raise ConfigError(
            f"ca-fed: kappas must be positive and hold 0.1 and 100 (Fig. 2a's claims read "
            f"them), got {kappas}"
        )
    prof, scale = PROFILES[profile], with_grid(SCALES[size], client_lrs, server_lrs)
    if profile == "paper":
        parts = tuple(p for p in parts if p != "control")
    out = output_dir(out)
    k = scale.num_clients
    rep = Reproduction(
        prof,
        scale,
        Study(
            "ca_fed",
            profile=profile,
            size=size,
            seeds=seeds,
            out=out,
            readers={"reference_average": reference_average},
            execution=execution,
        ),
        tuple(s for s in STRATEGIES if s in methods),
        {},
        kappas=tuple(sorted(set(kappas))),
    )
    rep.results.update(
        profile=dataclasses.asdict(prof),
        scale=dataclasses.asdict(scale),
        size=size,
        seeds=seeds,
        parts=list(parts),
        methods=list(rep.methods),
        kappas=list(rep.kappas),
    )

    def optima_for(clients: int) -> tuple[float, ...]:
        """The code's fitted F_k^* of the Synthetic clients (code profile only)."""
        if prof.optimum["synthetic"] != "given":
            return ()
        probe = make_config("unbiased", "synthetic", prof, scale, lr=(1, 1), rounds=1)
        values = fitted_optima(probe.replace(num_clients=clients, per_round=clients))
        o = np.asarray(values)
        rep.results.setdefault("fitted_optima", {})[f"synthetic, N = {clients}"] = {
            "mean": float(o.mean()),
            "min": float(o.min()),
            "max": float(o.max()),
        }
        return values

    if any(p in parts for p in ("fig1_synthetic", "fig2a")):
        rep.datasets["synthetic"] = {"optima": optima_for(k)}
    if any(p in parts for p in ("fig1_mnist", "fig5")):
        rep.datasets["mnist"] = {"data_path": mnist_path(scale, out, data_dir)}
    needed = set(rep.methods) | (
        {"ca_fed", "unbiased", "more_available"} if "fig2a" in parts else set()
    )
    rep.lrs, rep.results["learning_rates"] = learning_rates(
        rep.datasets,
        tuple(s for s in STRATEGIES if s in needed),
        prof,
        scale,
        out,
        tune=tune,
        given=parse_lrs(lrs),
        study=rep.study,
    )
    for part, dataset in (("fig1_synthetic", "synthetic"), ("fig1_mnist", "mnist")):
        if part in parts:
            add_fig1(rep, dataset)
    if "fig2a" in parts:
        add_fig2a(rep)
    if "fig5" in parts:
        add_fig5(rep)
    if "control" in parts:
        add_control(rep, optima_for(CONTROL_CLIENTS))
    rep.study.run()

    rep.md += [
        f"# CA-Fed reproduction (profile {profile}, size {size}, {seeds} paired seeds)",
        "",
        f"N = {k} clients ({prof.mix} population, ids shuffled with seed {prof.id_seed}), "
        f"oracle pi/lambda, linear classifier ({prof.init} initialisation, ridge {prof.ridge:g}, "
        f"weight decay {prof.weight_decay:g}), {scale.local_epochs} local "
        "epochs, every kept available client trains. Cells: mean [95% CI] over seeds (final "
        "test accuracy, %); paired differences in percentage points; diagnostics are means "
        "over rounds and seeds.",
    ]
    report_lrs(rep, tune)
    for part, dataset in (("fig1_synthetic", "synthetic"), ("fig1_mnist", "mnist")):
        if part in parts:
            report_fig1(rep, dataset, out)
    if "fig1_synthetic" in parts:
        report_fig1d(rep, out)
    if "fig2a" in parts:
        report_fig2a(rep, out)
    if "fig5" in parts:
        report_fig5(rep, out)
    if "control" in parts:
        report_control(rep)
    rows = rep.study.verdicts(claims(parts, set(rep.labels), fig2_rounds(scale), scale, prof))
    if rows:
        rep.section("Verdicts (paired differences, 95% CI)", verdict_table(rows))
    rep.results["verdicts"] = rows
    write_atomic(out / "tables.md", "\n".join(rep.md) + "\n")
    write_json(out / "results.json", rep.results)
    print(f"\nwritten: {out}/results.json, tables.md, verdicts.json, plots")
    return rep.results
