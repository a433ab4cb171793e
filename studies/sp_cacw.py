"""``fedjax-sel reproduce sp-cacw``: SP-CACW against the personalized baselines, every client a
target at once, with paired seeds and verdicts (*SP-CACW: Convergence-Aware Client Weighting for
Selfish Personalized Learning*, arXiv 2606.29322).

Every run goes through the experiment layer: a :class:`~fedjax_sel.experiment.study.Study` of
``RunConfig(mode="personalized", strategy=<method>, strategy_args={...})`` cells, one per
method, setting and seed (finished cells of the same configuration are reused, interrupted
ones resume).

Parts (``--option parts=a,b``; default: the size's parts):

* ``mnist_permute``: clustered MNIST, 4 clusters whose labels are permuted (a concept shift no
  single model fits), Dirichlet(1) label skew inside each cluster;
* ``mnist_rotate``: clustered MNIST, 4 clusters rotated by 0/90/180/270 degrees (IFCA's task);
* ``shakespeare``: LEAF-style Shakespeare, one client per role (no true clusters: no oracle);
* ``cifar100``: CIFAR-100 in 5 latent clusters (the paper's Algorithm 3), needs
  ``cifar100.npz`` (absent here: the part is skipped and named in the results);
* ``ablation``: SP-CACW variants on ``mnist_permute``: PGD on the latest bound instead of FTAL,
  partial participation p = 0.5 with and without the observed-peer mask (the bug fixed in this
  version), and the step ``eta = min(lr, 1/(2L))`` under which the risk bound's premise holds.

Methods: SP-CACW (FTAL over the history of bounds, the paper's rule), local training only,
FedAvg (the global model on each target), uniform peer weights, oracle same-cluster weights,
cosine-similarity weights and IFCA (the engine's ``ifca`` strategy). The claims are the paper's
headline comparisons (its abstract: "competitive with or improves over strong personalized and
clustering baselines"; our copy of the paper has no result tables, so no numbers): SP-CACW
beats local training and FedAvg, and is at least level with the similarity baseline and IFCA,
on ``target_accuracy`` (the mean over targets of each target's final test accuracy).

SP-CACW has no public code: profile ``code`` = ``paper``. Sizes: ``cpu`` (minutes on this CPU:
clustered MNIST with 20 clients and logistic regression, a small Shakespeare) and ``paper``
(our copy gives no sizes: 100 clients, the 784-200-200-10 MLP, LEAF's 2 x 256 LSTM, CIFAR-100
with the CNN; for a GPU). The partition is fixed across seeds (``data_seed = 0``); a seed varies
the initial model, every minibatch, the participation draws and the power iterations.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data import loaders
from fedjax_sel.experiment.compare import mean_curves
from fedjax_sel.experiment.execution import Execution
from fedjax_sel.experiment.outputs import CONFIG, plot_curves, read_json, write_atomic, write_json
from fedjax_sel.experiment.reproductions import output_dir, register_reproduction
from fedjax_sel.experiment.stats import mean_ci
from fedjax_sel.experiment.study import Study, check_profile_size, markdown_table
from fedjax_sel.experiment.verdicts import Claim
from fedjax_sel.personalized.results import result_from_records
from studies import sp_cacw_plots as plots

PARTS = ("mnist_permute", "mnist_rotate", "shakespeare", "cifar100", "ablation")
METHODS = ("sp_cacw", "local", "fedavg", "uniform", "oracle", "similarity", "ifca")
LABELS = {
    "sp_cacw": "SP-CACW",
    "local": "Local only",
    "fedavg": "FedAvg",
    "uniform": "Uniform weights",
    "oracle": "Oracle (same cluster)",
    "similarity": "Cosine similarity",
    "ifca": "IFCA",
}
PEER_METHODS = ("sp_cacw", "local", "uniform", "oracle", "similarity")
SP = LABELS["sp_cacw"]
NOTE = "SP-CACW has no public code: profile 'code' = 'paper'"
PAPER = (
    "SP-CACW is competitive with or improves over strong personalized and clustering baselines "
    "on MNIST, CIFAR-100 and LEAF Shakespeare (abstract; our copy of the paper has no numbers)"
)


# ----------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class Setting:
    """A data set, model and run length for one comparison.

    ``update_every``: steps per lazy weight update (one round); ``None`` = one local epoch of
    the median client, the paper's rule. ``method_args``: options every peer method gets
    (``pgd_steps``, ``power_iters``). ``track_bound``: SP-CACW evaluates the bound's exact
    terms (the tightness table)."""

    dataset: str
    num_clients: int
    model: str
    rounds: int
    eval_every: int
    lr: float
    batch_size: int
    update_every: int | None = None
    dataset_args: tuple[tuple[str, Any], ...] = ()
    model_args: tuple[tuple[str, Any], ...] = ()
    methods: tuple[str, ...] = METHODS
    method_args: tuple[tuple[str, Any], ...] = ()
    track_bound: bool = False


def _mnist(transform: str, **kw) -> Setting:
    args = {"num_clusters": 4, "transform": transform, "examples_per_client": 150}
    args.update(kw.pop("dataset_args", {}))
    return Setting("clustered_mnist", dataset_args=tuple(args.items()), track_bound=True, **kw)


CPU_MNIST = {"num_clients": 20, "model": "logreg", "rounds": 30, "eval_every": 5, "lr": 0.1,
             "batch_size": 32}  # fmt: skip
PAPER_MNIST = {"num_clients": 100, "model": "mlp", "rounds": 100, "eval_every": 10, "lr": 0.05,
               "batch_size": 32, "dataset_args": {"examples_per_client": 300}}  # fmt: skip
NO_ORACLE = tuple(m for m in METHODS if m != "oracle")

SCALES: dict[str, dict[str, Setting]] = {
    "cpu": {
        "mnist_permute": _mnist("permute", **CPU_MNIST),
        "mnist_rotate": _mnist("rotate", **CPU_MNIST),
        # 100 windows of 20 characters per role, 80 for training: one epoch = 10 steps of 8
        "shakespeare": Setting(
            "shakespeare",
            8,
            "lstm",
            rounds=12,
            eval_every=4,
            lr=1.0,
            batch_size=8,
            dataset_args=(("max_examples", 100), ("seq_len", 20)),
            model_args=(("lstm_hidden", 32), ("lstm_layers", 1)),
            methods=NO_ORACLE,
        ),  # fmt: skip
        "cifar100": Setting(
            "clustered_cifar100",
            20,
            "cnn",
            rounds=20,
            eval_every=5,
            lr=0.05,
            batch_size=32,
            dataset_args=(("examples_per_client", 200),),
        ),  # fmt: skip
    },
    "paper": {
        "mnist_permute": _mnist("permute", **PAPER_MNIST),
        "mnist_rotate": _mnist("rotate", **PAPER_MNIST),
        "shakespeare": Setting(
            "shakespeare",
            50,
            "lstm",
            rounds=50,
            eval_every=5,
            lr=0.8,
            batch_size=32,
            dataset_args=(("max_examples", 2000),),
            methods=NO_ORACLE,
        ),  # fmt: skip
        "cifar100": Setting(
            "clustered_cifar100", 50, "cnn", rounds=60, eval_every=10, lr=0.05, batch_size=32
        ),
    },
}
DEFAULT_PARTS = {
    "cpu": ("mnist_permute", "shakespeare", "ablation"),
    "paper": ("mnist_permute", "mnist_rotate", "shakespeare", "cifar100", "ablation"),
}
DEFAULT_LABEL = "SP-CACW (FTAL, default)"
# (label, SP-CACW options) on mnist_permute; the first is the main SP-CACW run itself
ABLATIONS = (
    (DEFAULT_LABEL, {}),
    ("SP-CACW PGD on the latest bound", {"solver": "pgd"}),
    ("SP-CACW p = 0.5", {"participation": 0.5}),
    ("SP-CACW p = 0.5, unobserved peers not masked (the bug)",
     {"participation": 0.5, "observed_only": False}),
    ("SP-CACW eta = min(lr, 1/(2L)) (premise holds)", {"lr_rule": "smoothness"}),
)  # fmt: skip


def make_config(
    setting: Setting, method: str, data_dir=None, overrides: dict | None = None
) -> RunConfig:
    """The run configuration of ``method`` in ``setting`` (``overrides``: SP-CACW options)."""
    args: dict[str, Any] = {}
    if method in PEER_METHODS:
        args.update(dict(setting.method_args))
        if method == "sp_cacw" and setting.track_bound:
            args["track_bound"] = True
    args.update(overrides or {})
    return RunConfig(
        mode="personalized",
        strategy=method,
        strategy_args=args,
        dataset=setting.dataset,
        dataset_args=dict(setting.dataset_args),
        data_path=None if data_dir is None else str(data_dir),
        num_clients=setting.num_clients,
        model=setting.model,
        model_args=dict(setting.model_args),
        rounds=setting.rounds,
        local_steps=setting.update_every,
        batch_size=setting.batch_size,
        lr=setting.lr,
        eval_every=setting.eval_every,
        data_seed=0,  # one partition; seeds vary the model, minibatches and draws
    )


def claims(part: str, methods: tuple[str, ...]) -> list[Claim]:
    """The paper's headline comparisons that ``part`` can read (its baselines present)."""
    no_number = "no number in our copy of the paper (abstract only)"
    level = (
        "paper: 'competitive with or improves over'; a CI containing 0 (inconclusive) is "
        "consistent with 'competitive', not_reproduced means significantly worse; " + no_number
    )
    wanted = (
        ("local", "SP-CACW improves over local training (collaboration helps)", no_number),
        ("fedavg", "SP-CACW improves over FedAvg (avoids negative transfer)", no_number),
        ("similarity", "SP-CACW at least level with the similarity baseline", level),
        ("ifca", "SP-CACW at least level with IFCA (clustering)", level),
    )
    return [
        Claim(text, part, SP, LABELS[m], "target_accuracy", 0.0, None, note=note)
        for m, text, note in wanted
        if m in methods and "sp_cacw" in methods
    ]


# ----------------------------------------------------------------------------- reading runs
def paired(study: Study, part: str, a: str, b: str, metric: str, scale: float = 100.0):
    """Mean and 95% CI of the paired difference ``a - b`` over the seeds both have."""
    x, y = study.values(part, a, metric), study.values(part, b, metric)
    common = sorted(set(x) & set(y))
    if not common:
        return None, None, None
    return mean_ci([scale * (x[s] - y[s]) for s in common])


def _ci_text(m, lo, hi, digits=2, sign=False) -> str:
    if m is None:
        return "-"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f.format(m) if lo is None else f"{f.format(m)} [{f.format(lo)}, {f.format(hi)}]"


# summary keys each run reports, averaged over seeds in the diagnostics rows
SUMMARY_DIAGNOSTICS = (
    "target_accuracy", "worst_target_accuracy", "self_weight", "own_cluster_mass",
    "peers_with_weight", "unobserved_weight", "bound_premise_fraction",
    "lr_times_smoothness_max", "risk_bound", "risk_bound_train_loss",
)  # fmt: skip
# (diagnostic, row key): its mean over the first evaluated chunk, averaged over seeds
FIRST_CHUNK_DIAGNOSTICS = (
    ("unobserved_weight", "unobserved_weight_first_chunk"),
    ("lr_times_smoothness", "lr_times_smoothness_first_chunk"),
)


def _seed_diagnostics(run) -> dict[str, float]:
    """One run's values of the diagnostics rows: its summary keys and its first chunk's."""
    out = {}
    for key in SUMMARY_DIAGNOSTICS:
        v = run.summary.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[key] = float(v)
    chunk = next((e for e in run.records if e.get("diagnostics")), None)
    for key, name in FIRST_CHUNK_DIAGNOSTICS:
        if chunk is not None and chunk["diagnostics"].get(key) is not None:
            out[name] = float(chunk["diagnostics"][key])
    return out


def tightness(study: Study, part: str, label: str) -> dict[str, Any] | None:
    """How tight is the bound (the referee's question), pooling targets, evaluations after the
    first and seeds: the median ratio of the online ``Phi(alpha)`` to the same formula with
    exact full-data quantities, and the Spearman correlation of the online ``Phi`` with the
    exact gradient error ``E||G - grad f_0||^2``."""
    online, exact, error = [], [], []
    for r in study.runs(part, label):
        for e in r.records[1:]:
            pt = e.get("per_target", {})
            if "grad_error" not in pt:
                return None
            online += pt["bound"]
            exact += pt["bound_true"]
            error += pt["grad_error"]
    a, b, c = (np.asarray(v, np.float64) for v in (online, exact, error))
    ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & (b > 0)
    if ok.sum() < 3:
        return None
    ra, rc = np.argsort(np.argsort(a[ok])), np.argsort(np.argsort(c[ok]))
    return {
        "phi_online_over_exact": float(np.median(a[ok] / b[ok])),
        "spearman_phi_vs_error": float(np.corrcoef(ra, rc)[0, 1]),
        "exact_error_median": float(np.median(c[ok])),
    }


def diagnostics_row(study: Study, part: str, label: str) -> dict[str, Any]:
    """The method's own quantities, means over seeds: weights (self, own cluster, unobserved
    peers in the first chunk and at the end, peers with weight), ``L eta`` and the risk bound's
    premise (the bound itself only where the premise held), the update period in epochs."""
    runs = study.runs(part, label)
    # each seed's values go into per_seed.json, which gives these means back
    means = study.per_seed_means(part, label, {r.seed: _seed_diagnostics(r) for r in runs})
    row: dict[str, Any] = {"method": label, **means}
    for key in (*SUMMARY_DIAGNOSTICS, *(name for _, name in FIRST_CHUNK_DIAGNOSTICS)):
        row.setdefault(key, None)
    if runs and runs[0].path is not None and (runs[0].path / CONFIG).exists():
        row["update_period_epochs"] = read_json(runs[0].path / CONFIG).get("update_period_epochs")
    row["tightness"] = tightness(study, part, label)
    return row


def _f(v, digits=2, scale=1.0) -> str:
    return "-" if v is None else f"{scale * v:.{digits}f}"


def method_table(study: Study, part: str, labels: list[str]) -> str:
    """Per method: target accuracy (mean [95% CI] over seeds, %), the paper's number (none),
    the paired difference SP-CACW - method with its CI, the worst target and the weights."""
    rows = []
    for label in labels:
        diff = "-" if label == SP else _ci_text(
            *paired(study, part, SP, label, "target_accuracy"), sign=True
        )  # fmt: skip
        d = diagnostics_row(study, part, label)
        rows.append([
            label, study.cell_text(part, label, "target_accuracy"), "-", diff,
            _f(d["worst_target_accuracy"], scale=100), _f(d["own_cluster_mass"]),
            _f(d["self_weight"]), _f(d["peers_with_weight"], 1),
        ])  # fmt: skip
    header = [
        "Method", "target acc. % [95% CI]", "paper", "SP-CACW - method, pts [95% CI]",
        "worst target %", "own-cluster weight", "self weight", "peers with weight",
    ]  # fmt: skip
    return markdown_table(header, rows)


def mechanism_table(study: Study, part: str, labels: list[str]) -> str:
    """Per peer-weighting method: weight on never-observed peers (first chunk, end), ``L eta``,
    the premise, the risk bound (only where its premise held) and the bound's tightness."""
    rows = []
    for label in labels:
        d = diagnostics_row(study, part, label)
        if d["bound_premise_fraction"] is None:
            continue
        t = d["tightness"] or {}
        risk = (
            f"{_f(d['risk_bound'], 3)} vs {_f(d['risk_bound_train_loss'], 3)}"
            if d["risk_bound"] is not None
            else "not a bound (premise failed)"
        )
        rows.append([
            label, _f(d["unobserved_weight_first_chunk"], 3), _f(d["unobserved_weight"], 3),
            _f(d["lr_times_smoothness_first_chunk"]), _f(d["lr_times_smoothness_max"]),
            _f(d["bound_premise_fraction"], 0, 100), risk,
            _f(t.get("phi_online_over_exact")), _f(t.get("spearman_phi_vs_error")),
        ])  # fmt: skip
    header = ["Method", "unobserved weight, 1st chunk", "unobserved weight, end",
              "L eta, 1st chunk", "L eta max, end", "premise L eta <= 1/2 held (% targets)",
              "risk bound vs train risk", "Phi online / exact", "Spearman(Phi, error)"]  # fmt: skip
    return markdown_table(header, rows)


def ablation_table(study: Study, part: str) -> str:
    rows = []
    for label, _ in ABLATIONS:
        diff = "-" if label == DEFAULT_LABEL else _ci_text(
            *paired(study, part, label, DEFAULT_LABEL, "target_accuracy"), sign=True
        )  # fmt: skip
        d = diagnostics_row(study, part, label)
        risk = "-" if d["risk_bound"] is None else (
            f"{_f(d['risk_bound'], 3)} vs {_f(d['risk_bound_train_loss'], 3)}"
        )  # fmt: skip
        rows.append([
            label, study.cell_text(part, label, "target_accuracy"), diff,
            _f(d["own_cluster_mass"]), _f(d["peers_with_weight"], 1),
            _f(d["unobserved_weight_first_chunk"], 3), _f(d["lr_times_smoothness_max"]),
            _f(d["bound_premise_fraction"], 0, 100), risk,
        ])  # fmt: skip
    header = ["Variant", "target acc. % [95% CI]", "variant - default, pts [95% CI]",
              "own-cluster weight", "peers with weight", "unobserved weight, 1st chunk",
              "L eta max", "premise held (% targets)", "risk bound vs train risk"]  # fmt: skip
    return markdown_table(header, rows)


def verdict_rows_table(rows: list[dict[str, Any]]) -> str:
    """Markdown of the verdicts (the paper's claims carry no numbers: its column says so)."""
    out = []
    for r in rows:
        v = r["verdict"].replace("_", " ")
        if r.get("seeds_to_settle"):
            v += f" (~{r['seeds_to_settle']} seeds would settle it)"
        out.append([
            r["claim"], r["setting"], f"{r['method']} vs {r['baseline']}", str(r["seeds"]),
            _ci_text(r["ours_mean"], r["ours_ci_low"], r["ours_ci_high"]),
            _ci_text(r["diff_mean"], r["diff_ci_low"], r["diff_ci_high"], sign=True),
            "> 0" if "improves" in r["claim"] else ">= 0", v, r["note"],
        ])  # fmt: skip
    header = ["claim", "setting", "method vs baseline", "seeds", "ours % [95% CI]",
              "diff, pts [95% CI]", "paper", "verdict", "note"]  # fmt: skip
    return markdown_table(header, out)


# ----------------------------------------------------------------------------- data
def absent_reason(setting: Setting, data_dir) -> str | None:
    """Why ``setting``'s data cannot be read here (``None`` when it can)."""
    try:
        if setting.dataset == "clustered_cifar100":
            loaders.load_image_dataset("cifar100", data_dir)
        elif setting.dataset == "clustered_mnist":
            loaders.load_image_dataset("mnist", data_dir)
    except ConfigError as e:
        return str(e).splitlines()[0]
    return None


def _plots(study: Study, part: str, labels: list[str], out: Path) -> dict[str, str]:
    """The part's plots, by file name in ``out`` (a name, not a path: the folder moves)."""
    files = {}
    curves, bands = mean_curves([r for lab in labels for r in study.runs(part, lab)])
    files["curves"] = Path(
        plot_curves(
            curves,
            out / f"{part}_curves.png",
            bands=bands,
            title=f"{part}: target accuracy (mean over targets), 95% CI over seeds",
        )
    ).name
    if SP not in labels:
        return files
    first = study.runs(part, SP)[0]
    config = read_json(first.path / CONFIG)
    clusters = config["dataset"].get("cluster")
    targets = np.asarray(first.summary["targets"])
    files["heatmap"] = Path(
        plots.plot_weight_heatmap(
            np.asarray(first.records[-1]["weights"]),
            targets,
            clusters,
            out / f"{part}_weights.png",
            title=f"SP-CACW weights, {part}, seed 0",
        )
    ).name
    if "grad_error" in first.records[-1].get("per_target", {}):
        result = result_from_records(
            "sp_cacw", SP, first.records, targets, int(config["update_every"]), [], 0.0, clusters
        )
        files["bound"] = Path(plots.plot_bound(result, out / f"{part}_bound.png")).name
    return files


# ----------------------------------------------------------------------------- the study
@register_reproduction(
    "sp-cacw",
    "SP-CACW (selfish personalized learning): every client a target; vs local, FedAvg, uniform, "
    "oracle, cosine-similarity and IFCA on clustered MNIST and Shakespeare (CIFAR-100 with its "
    "data); ablations (FTAL vs PGD, the unobserved-peer fix, the bound's premise)",
)
def run(
    *,
    seeds: int = 5,
    out,
    size: str = "cpu",
    profile: str = "paper",
    data_dir=None,
    execution: Execution | None = None,
    parts: tuple[str, ...] = (),
) -> dict:
    """Runs the parts at ``size`` (module docstring), prints our numbers (mean and 95% CI over
    paired seeds) and writes ``results.json``, ``tables.md``, ``verdicts.json`` and the plots
    under ``out``."""
    check_profile_size("sp-cacw", profile, size, seeds, 5)
    parts = tuple(parts) or DEFAULT_PARTS[size]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ConfigError(f"sp-cacw: unknown part(s) {unknown}; known: {PARTS}")
    out = output_dir(out)
    scale = SCALES[size]
    study = Study("sp_cacw", profile=profile, size=size, seeds=seeds, out=out, execution=execution)
    results: dict[str, Any] = {
        "profile": profile,
        "size": size,
        "seeds": seeds,
        "parts": list(parts),
        "note": NOTE,
        "paper": PAPER,
        "settings": {},
        "absent": {},
    }
    ran: list[str] = []
    for part in parts:
        setting = scale["mnist_permute" if part == "ablation" else part]
        results["settings"][part] = dataclasses.asdict(setting)
        reason = absent_reason(setting, data_dir)
        if reason is not None:
            results["absent"][part] = reason
            print(f"[sp-cacw] {part} skipped: {reason}")
            continue
        ran.append(part)
        if part == "ablation":
            for label, overrides in ABLATIONS:
                study.add(part, label, make_config(setting, "sp_cacw", data_dir, overrides))
        else:
            for m in setting.methods:
                study.add(part, LABELS[m], make_config(setting, m, data_dir))
    study.run()

    md = [
        f"# SP-CACW reproduction (profile {profile}, size {size}, {seeds} paired seeds)",
        "",
        f"{NOTE}. Paper: {PAPER}.",
        "Every client is a target; `target accuracy` is the mean over targets of each target's "
        "test accuracy (averaged over the last 20% of the run). Cells: mean [95% CI] over seeds.",
    ]

    def section(title: str, body: str) -> None:
        md.extend(["", f"## {title}", "", body])
        print(f"\n{title}\n{body}")

    claim_list: list[Claim] = []
    results["tables"], results["plots"] = {}, {}
    for part in ran:
        setting = scale["mnist_permute" if part == "ablation" else part]
        if part == "ablation":
            labels = [label for label, _ in ABLATIONS]
            section(
                f"Ablation of SP-CACW on mnist_permute ({size} size)", ablation_table(study, part)
            )
        else:
            labels = [LABELS[m] for m in setting.methods]
            period = diagnostics_row(study, part, labels[0]).get("update_period_epochs")
            head = (
                f"{setting.dataset}, K = {setting.num_clients}, {setting.model}, "
                f"{setting.rounds} rounds of one lazy weight update each "
                f"(update period {_f(period)} local epochs of the median client), "
                f"lr {setting.lr}, batch {setting.batch_size}"
            )
            section(f"{part}: {head}", method_table(study, part, labels))
            section(
                f"{part}: the methods' own quantities",
                mechanism_table(study, part, [LABELS[m] for m in setting.methods
                                              if m in PEER_METHODS]),
            )  # fmt: skip
            claim_list += claims(part, setting.methods)
        results["tables"][part] = [diagnostics_row(study, part, lab) for lab in labels]
        for lab, row in zip(labels, results["tables"][part], strict=True):
            row["target_accuracy_stat"] = study.per_seed_stat(part, lab, "target_accuracy")
        results["plots"][part] = _plots(study, part, labels, out)
    verdict_rows = study.verdicts(claim_list)
    if verdict_rows:
        section("Verdicts (paired differences, 95% CI)", verdict_rows_table(verdict_rows))
    if results["absent"]:
        md.extend(["", "## Not run here", ""])
        md.extend(f"- {k}: {v}" for k, v in results["absent"].items())
    results["verdicts"] = verdict_rows
    write_atomic(out / "tables.md", "\n".join(md) + "\n")
    write_json(out / "results.json", results)
    print(f"\nwritten: {out}/results.json, tables.md, verdicts.json, plots")
    return results
