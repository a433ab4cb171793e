"""``fedjax-sel reproduce ca-fed``: CA-Fed's Figs. 1, 1d, 2a and 5 (``papers/ca_fed.txt``
section V) on LEAF Synthetic (gamma = delta = 0.5) and MNIST (Dirichlet 0.5, a 20% per-client
validation split), linear classifier with ridge 1e-2, N = 100 clients, the paper's Markov
population (``g = 0.4``, ``nu = 0.9``, ``eps = 1e-2``) and the oracle ``pi``/``lambda``.

* Fig. 1: test accuracy against rounds for CA-Fed (``kappa_bar^2 = 1``), Unbiased,
  More-available, AdaFed and F3AST (``m = N / 2``), mean and standard deviation over seeds;
* Fig. 1d: cumulative aggregation weight ``(1/T) sum_t q_k^(t)`` of every client on Synthetic,
  by class ("more available", "less available, weakly correlated", "less available, correlated");
* Fig. 2a: the ``kappa_bar^2`` sweep ``{1e-2, ..., 1e2}`` against Unbiased and More-available
  on Synthetic over a longer horizon;
* Fig. 5: spatially correlated availability (10 clusters, ``markov_clustered``): the maps of
  each client's activity and CA-Fed's inclusion per round (homogeneous data, Fig. 5a;
  homogeneous within clusters and Dirichlet across them, Fig. 5b; Dirichlet data, Fig. 5c;
  as images) and the methods' accuracy in the Fig. 5c setting (5d).

Every method trains all its kept available clients (``per_round = N``) and the server applies
``sum_k q_k Delta_k`` (eq. 3) with plain SGD at ``server_lr`` (no server momentum, as eq. 3).
The paper tunes the learning rates by grid search and does not report them; we use one
setting for every method (local SGD lr 0.05, server lr 1). CPU scale (default): 60 rounds of
10 local steps (Fig. 2a: 120 rounds; Fig. 5: 60); ``full``: the paper's horizons (T = 200,
500 for Fig. 2a, 100 for Fig. 5) of 2 local epochs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.availability.markov_population import CLASS_NAMES, population_classes
from fedjax_sel.config import RunConfig
from fedjax_sel.data import load_dataset, loaders
from fedjax_sel.experiment import build_simulation, write_json
from fedjax_sel.reproduce import output_dir, register_reproduction

NUM_CLIENTS = 100
KAPPAS = (0.01, 0.1, 1.0, 10.0, 100.0)
# the paper's reported differences (percentage points)
PAPER_FIG1_GAIN_OVER_ADAFED = {"synthetic": 1.56, "mnist": 0.94}
PAPER_FIG2A = (
    "kappa2 = 0.1 is +2.8 pp over Unbiased at t = 40; "
    "kappa2 = 100 is +3.8 pp over More-available at t = 500"
)
PAPER_FIG5D_GAIN_OVER_ADAFED = 0.6


@dataclasses.dataclass(frozen=True)
class Scale:
    """Sizes of one reproduction run (``CPU_SCALE``, ``FULL_SCALE``; tests use tiny ones)."""

    num_clients: int = NUM_CLIENTS
    rounds: int = 60
    rounds_fig2: int = 120
    rounds_fig5: int = 60
    local_steps: int | None = 10
    local_epochs: int | None = None
    eval_every: int = 5
    synthetic_max_examples: int | None = None
    mnist_subsample: int | None = None  # keep every n-th MNIST training image (tests)


CPU_SCALE = Scale()
FULL_SCALE = Scale(rounds=200, rounds_fig2=500, rounds_fig5=100, local_steps=None, local_epochs=2)


@dataclasses.dataclass(frozen=True)
class Method:
    label: str
    strategy: str
    args: dict


def fig1_methods(num_clients: int) -> list[Method]:
    """Section V-A c, with the oracle availability parameters (section V-A c, last line)."""
    oracle = {"estimator": "oracle"}
    return [
        Method("CA-Fed (kappa2=1)", "ca_fed", {"kappa2": 1.0, **oracle}),
        Method("Unbiased", "unbiased", oracle),
        Method("More available", "more_available", oracle),
        Method("AdaFed", "adafed", oracle),
        Method("F3AST", "f3ast", {"budget": max(1, num_clients // 2), **oracle}),
    ]


def kappa_method(kappa2: float) -> Method:
    return Method(
        f"CA-Fed (kappa2={kappa2:g})", "ca_fed", {"kappa2": kappa2, "estimator": "oracle"}
    )


def make_config(
    method: Method,
    dataset: str,
    scale: Scale,
    seed: int,
    *,
    rounds: int | None = None,
    availability: str = "markov",
    partition: str | None = None,
    eval_every: int | None = None,
) -> RunConfig:
    """The run configuration of one method on ``synthetic`` or ``mnist`` (section V-A b)."""
    common = dict(
        strategy=method.strategy,
        strategy_args=dict(method.args),
        model="logreg",
        model_args={"ridge": 0.01},
        num_clients=scale.num_clients,
        per_round=scale.num_clients,
        rounds=rounds or scale.rounds,
        local_steps=scale.local_steps,
        local_epochs=scale.local_epochs,
        lr=0.05,
        server="sgd",
        server_lr=1.0,
        server_momentum=0.0,
        availability=availability,
        eval_every=eval_every or scale.eval_every,
        seed=seed,
        data_seed=0,
        parallel="vmap",
    )
    if dataset == "synthetic":
        args: dict[str, Any] = {"alpha": 0.5, "beta": 0.5}
        if scale.synthetic_max_examples:
            args["max_examples"] = scale.synthetic_max_examples
        return RunConfig(
            dataset="leaf_synthetic",
            dataset_args=args,
            partition="natural",
            batch_size=32,
            test_fraction=0.1,
            **common,
        )
    if dataset == "mnist":
        return RunConfig(
            dataset="mnist",
            partition=partition or "dirichlet:0.5",
            test_fraction=0.2,  # the 20% validation split, per client
            batch_size=64,
            **common,
        )
    raise ValueError(f"unknown data set {dataset!r}")


def strided_mnist(every: int, out: Path, data_dir=None) -> Path:
    """A Keras-layout ``mnist.npz`` under ``out`` with every ``every``-th training and test
    image (tiny test runs)."""
    path = out / "mnist.npz"
    if not path.exists():
        d = loaders.load_image_dataset("mnist", data_dir)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            x_train=d.x_train[::every],
            y_train=d.y_train[::every],
            x_test=d.x_test[::every],
            y_test=d.y_test[::every],
        )
    return path


def load(config: RunConfig, scale: Scale, out: Path, data_dir=None):
    """Loads the data of ``config`` (a strided MNIST when the scale says so)."""
    path = data_dir
    if config.dataset == "mnist" and scale.mnist_subsample:
        path = strided_mnist(scale.mnist_subsample, out / "data", data_dir)
    return load_dataset(
        config.dataset,
        num_clients=config.num_clients,
        partition=config.partition,
        seed=config.data_seed,
        data_path=path,
        test_fraction=config.test_fraction,
        **config.dataset_args,
    )


def run_method(
    config: RunConfig, dataset, *, seeds: tuple[int, ...] | None = None, trace: bool = False
) -> list[dict[str, Any]]:
    """Runs one configuration for each seed (one compiled simulation, ``config.seed`` when
    ``seeds`` is None). Each run gives its accuracy curve, every client's cumulative weight
    ``(1/T) sum_t q_k^(t)`` and, with ``trace`` (CA-Fed, one round per chunk), the per-round
    availability and inclusion maps ``bool[T, K]``."""
    sim = build_simulation(config, dataset)
    return [_one_run(sim, config, seed, trace) for seed in (seeds or (config.seed,))]


def _one_run(sim, config: RunConfig, seed: int, trace: bool) -> dict[str, Any]:
    state = sim.init(seed)
    weight_sum = np.zeros(sim.dataset.num_clients)
    rounds, accuracy, available, included = [], [], [], []
    done = 0
    while done < config.rounds:
        n = min(config.eval_every, config.rounds - done)
        state, logs = sim.run_rounds(state, n)
        c, m, w = (np.asarray(a) for a in (logs.clients, logs.mask, logs.weights))
        np.add.at(weight_sum, c[m], w[m])
        if trace:  # chunks of one round: the strategy state is this round's
            s = state.strategy_state
            available.append(np.asarray(s.counts.previous))
            included.append(np.asarray(s.kept))
        done += n
        rounds.append(done)
        accuracy.append(sim.evaluate(state)["test_accuracy"])
    out = {
        "seed": seed,
        "rounds": rounds,
        "accuracy": accuracy,
        "final_accuracy": accuracy[-1],
        "cumulative_weight": (weight_sum / config.rounds).tolist(),
    }
    if trace:
        out["available"] = np.array(available)
        out["included"] = np.array(included)
    return out


def summarize(runs: list[dict]) -> dict[str, Any]:
    acc = np.array([r["accuracy"] for r in runs])
    return {
        "rounds": runs[0]["rounds"],
        "mean": acc.mean(0).tolist(),
        "std": acc.std(0).tolist(),
        "final_mean": float(acc[:, -1].mean()),
        "final_std": float(acc[:, -1].std()),
        "finals": acc[:, -1].tolist(),
    }


def class_weights(cumulative: np.ndarray) -> dict[str, float]:
    """Fig. 1d's groups: mean cumulative weight per client of each class."""
    classes = population_classes(cumulative.shape[-1])
    groups = {
        "more available": np.isin(classes, (0, 1)),
        CLASS_NAMES[3]: classes == 3,
        CLASS_NAMES[2]: classes == 2,
    }
    return {name: float(cumulative[..., mask].mean()) for name, mask in groups.items()}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(curves: dict[str, dict], path: Path, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, s in curves.items():
        r, mu, sd = np.array(s["rounds"]), np.array(s["mean"]), np.array(s["std"])
        (line,) = ax.plot(r, mu, label=label)
        ax.fill_between(r, mu - sd, mu + sd, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_weights(weights: dict[str, np.ndarray], path: Path) -> Path:
    """Fig. 1d: every client's cumulative weight (mean over seeds), clients in class order."""
    plt = _plt()
    names = list(weights)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.6 * len(names)), sharex=True)
    classes = population_classes(len(next(iter(weights.values()))))
    colors = np.array(["tab:blue", "tab:cyan", "tab:red", "tab:orange"])[classes]
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        ax.bar(np.arange(len(classes)), weights[name], color=colors, width=1.0)
        ax.set_ylabel(name, rotation=0, ha="right", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel(
        "client (blue: more available; red: less available, correlated; orange: less, weak)"
    )
    fig.suptitle("Fig. 1d: cumulative aggregation weight (1/T) sum_t q_k")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_map(available: np.ndarray, included: np.ndarray, path: Path, title: str) -> Path:
    """Fig. 5: client x round image; white inactive, grey active and excluded, green active
    and included (light green: included while inactive)."""
    plt = _plt()
    code = np.where(available, np.where(included, 3, 1), np.where(included, 2, 0)).T
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["white", "0.6", "#c7e9c0", "#238b45"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.imshow(code, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=3)
    ax.set_xlabel("round")
    ax.set_ylabel("client (10 per cluster)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pp(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f} pp"


@register_reproduction(
    "ca-fed",
    "CA-Fed Figs. 1, 1d, 2a, 5: Synthetic and MNIST, Markov availability, kappa sweep, clusters",
)
def run(*, seeds: int, out, full: bool = False, data_dir=None, scale: Scale | None = None) -> dict:
    """Runs the reproduction (see the module docstring); returns and writes ``results.json``."""
    scale = scale or (FULL_SCALE if full else CPU_SCALE)
    out = output_dir(Path(out))
    k = scale.num_clients
    results: dict[str, Any] = {"scale": dataclasses.asdict(scale), "seeds": seeds}
    data_cache: dict[tuple, Any] = {}

    def data_for(config):
        key = (config.dataset, config.partition)
        if key not in data_cache:
            data_cache[key] = load(config, scale, out, data_dir)
        return data_cache[key]

    def runs_of(method, dataset, **kw):
        config = make_config(method, dataset, scale, 0, **kw)
        return run_method(config, data_for(config), seeds=tuple(range(seeds)))

    # Fig. 1 and 1d
    fig1: dict[str, Any] = {}
    weights_1d: dict[str, np.ndarray] = {}
    for dataset in ("synthetic", "mnist"):
        curves = {}
        for method in fig1_methods(k):
            runs = runs_of(method, dataset)
            curves[method.label] = summarize(runs)
            s = curves[method.label]
            print(
                f"  fig1 {dataset:9s} {method.label:20s} final acc "
                f"{s['final_mean']:.4f} +- {s['final_std']:.4f}",
                flush=True,
            )
            if dataset == "synthetic":
                cum = np.mean([r["cumulative_weight"] for r in runs], axis=0)
                weights_1d[method.label] = cum
                curves[method.label]["class_weights"] = class_weights(cum)
        gain = curves["CA-Fed (kappa2=1)"]["final_mean"] - curves["AdaFed"]["final_mean"]
        fig1[dataset] = {
            "curves": curves,
            "ca_fed_minus_adafed": gain,
            "paper_ca_fed_minus_adafed_pp": PAPER_FIG1_GAIN_OVER_ADAFED[dataset],
        }
        plot_accuracy(curves, out / f"fig1_{dataset}.png", f"Fig. 1: {dataset}, N = {k}")
    plot_weights(weights_1d, out / "fig1d_weights.png")
    results["fig1"] = fig1

    # Fig. 2a: the kappa_bar^2 sweep on Synthetic
    fig2: dict[str, Any] = {}
    methods = [kappa_method(x) for x in KAPPAS] + fig1_methods(k)[1:3]
    for method in methods:
        fig2[method.label] = summarize(runs_of(method, "synthetic", rounds=scale.rounds_fig2))
        print(f"  fig2a {method.label:20s} final acc {fig2[method.label]['final_mean']:.4f}")
    plot_accuracy(fig2, out / "fig2a_kappa.png", "Fig. 2a: kappa_bar^2 sweep, Synthetic")
    results["fig2a"] = fig2

    # Fig. 5: spatial correlation (one chain per cluster of 10 clients)
    fig5: dict[str, Any] = {}
    ca = fig1_methods(k)[0]
    panels = (("a", "iid"), ("b", "dirichlet:alpha=0.5,groups=10"), ("c", "dirichlet:0.5"))
    for panel, partition in panels:  # b: one label mix per availability cluster
        config = make_config(
            ca,
            "mnist",
            scale,
            0,
            rounds=scale.rounds_fig5,
            availability="markov_clustered",
            partition=partition,
            eval_every=1,
        )
        (r,) = run_method(config, data_for(config), trace=True)
        plot_map(
            r["available"],
            r["included"],
            out / f"fig5{panel}_map.png",
            f"Fig. 5{panel}: MNIST {partition}, clustered availability\n"
            "dark green: active, included; grey: active, excluded; light: inactive, included",
        )
        per_cluster = r["included"].reshape(len(r["included"]), -1, k // 10).mean((0, 2))
        fig5[panel] = {
            "partition": partition,
            "inclusion_rate_per_cluster": per_cluster.tolist(),
            "final_accuracy": r["final_accuracy"],
        }
    curves5 = {}
    for method in fig1_methods(k):
        runs = runs_of(method, "mnist", rounds=scale.rounds_fig5, availability="markov_clustered")
        curves5[method.label] = summarize(runs)
    fig5["d"] = {
        "curves": curves5,
        "ca_fed_minus_adafed": curves5["CA-Fed (kappa2=1)"]["final_mean"]
        - curves5["AdaFed"]["final_mean"],
        "paper_ca_fed_minus_adafed_pp": PAPER_FIG5D_GAIN_OVER_ADAFED,
    }
    plot_accuracy(curves5, out / "fig5d_accuracy.png", "Fig. 5d: MNIST, clustered availability")
    results["fig5"] = fig5

    _print_report(results)
    write_json(out / "results.json", results)
    return results


def _print_report(results: dict) -> None:
    print("\nCA-Fed reproduction (ours beside the paper's)")
    for dataset, f in results["fig1"].items():
        print(f"Fig. 1 {dataset}: final test accuracy (mean +- std over seeds)")
        for label, s in f["curves"].items():
            print(f"  {label:20s} {100 * s['final_mean']:6.2f} +- {100 * s['final_std']:.2f} %")
        print(
            f"  CA-Fed - AdaFed: ours {_pp(f['ca_fed_minus_adafed'])}, paper "
            f"+{f['paper_ca_fed_minus_adafed_pp']:.2f} pp"
        )
    syn = results["fig1"]["synthetic"]["curves"]
    print("Fig. 1d (Synthetic): mean cumulative weight per client of each class")
    for label, s in syn.items():
        cells = ", ".join(f"{n}: {v:.4f}" for n, v in s["class_weights"].items())
        print(f"  {label:20s} {cells}")
    print("Fig. 2a (Synthetic): final test accuracy")
    for label, s in results["fig2a"].items():
        print(f"  {label:20s} {100 * s['final_mean']:6.2f} %")
    print(f"  paper: {PAPER_FIG2A}")
    f5 = results["fig5"]
    for panel in ("a", "b", "c"):
        rates = ", ".join(f"{x:.2f}" for x in f5[panel]["inclusion_rate_per_cluster"])
        print(
            f"Fig. 5{panel} ({f5[panel]['partition']}): CA-Fed inclusion rate per cluster: {rates}"
        )
    print(
        f"Fig. 5d: CA-Fed - AdaFed: ours {_pp(f5['d']['ca_fed_minus_adafed'])}, paper "
        f"+{f5['d']['paper_ca_fed_minus_adafed_pp']:.1f} pp"
    )
