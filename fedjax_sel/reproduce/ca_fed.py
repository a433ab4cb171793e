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
from fedjax_sel.experiment import Cell, load_data_for, plot_curves, run_cells, write_json
from fedjax_sel.experiment.compare import Run, mean_ci, mean_curves
from fedjax_sel.experiment.outputs import subplots, write_atomic
from fedjax_sel.experiment.sweep import _slug
from fedjax_sel.reproduce import output_dir, register_reproduction, select_parts
from fedjax_sel.reproduce.common import (
    Claim,
    Execution,
    Study,
    check_profile_size,
    markdown_table,
    register_derive,
    subsampled_npz,
    verdict_table,
)
from fedjax_sel.strategies._ca_fed_common import fit_local_optima

PARTS = ("fig1_synthetic", "fig1_mnist", "fig2a", "fig5", "control")
STRATEGIES = ("ca_fed", "unbiased", "more_available", "adafed", "f3ast")
LABELS = {
    "ca_fed": "CA-Fed",
    "unbiased": "Unbiased",
    "more_available": "More available",
    "adafed": "AdaFed",
    "f3ast": "F3AST",
}
KAPPAS = (0.01, 0.1, 1.0, 10.0, 100.0)  # Fig. 2a, in the paper's (figure) values
FIG5_PANELS = (("a", "iid"), ("b", "dirichlet:alpha=0.5,groups=10"), ("c", "dirichlet:0.5"))
NUM_CLUSTERS = 10
CODE_GRID_CLIENT = (0.1, 0.03, 0.01, 0.003, 0.001)
CODE_GRID_SERVER = (1.0, 0.3, 0.1, 0.03, 0.01)
TUNE_SEED0 = 1000  # tuning seeds are disjoint from the reported ones
CONTROL_CLIENTS = 24
# the learning rates (client, server) the reference code's scripts report (fidelity review)
CODE_LRS = {
    ("synthetic", "ca_fed"): (0.01, 0.3),
    ("synthetic", "adafed"): (0.001, 1.0),
    ("synthetic", "unbiased"): (0.03, 0.03),
    ("mnist", "ca_fed"): (0.001, 0.1),
}

# the paper's numbers (percentage points; section V-B a, b, e)
PAPER_FIG1_GAIN = {"synthetic": 1.56, "mnist": 0.94}  # CA-Fed - AdaFed
PAPER_FIG5D_GAIN = 0.6  # CA-Fed - AdaFed, clustered availability, MNIST
PAPER_FIG2A_T40 = 2.8  # CA-Fed (kappa2 = 0.1) - Unbiased at t = 40
PAPER_FIG2A_END = 3.8  # CA-Fed (kappa2 = 100) - More available at t = 500


# ----------------------------------------------------------------------------- profiles, sizes
@dataclasses.dataclass(frozen=True)
class Profile:
    """Everything the paper text and the reference code set differently (module docstring).

    ``kappa_scale``: the ``kappa2`` (eq. 20's units) a figure value ``x`` runs as (``x`` in the
    paper, ``x / 4`` in the code, whose ``bias_const`` lacks eq. 20's factor 4)."""

    name: str
    rounds: int
    kappa_scale: float
    loss_source: str
    lambda_order: str
    keep_all_when_flat: bool
    optimum: dict[str, str]  # data set -> ca_fed optimum
    mix: str
    id_seed: int | None
    f3ast_variant: str
    synthetic_args: dict[str, Any]
    synthetic_test_fraction: float
    momentum: float
    weight_decay: float
    server: str
    server_momentum: float
    server_weight_decay: float
    persistent_client_state: bool
    fixed_server_lr: dict[str, float]  # strategy -> server lr it always uses
    init: str  # the linear model's initialisation (flax's, or PyTorch's nn.Linear default)
    ridge: float  # L2 penalty in the objective, on top of the optimiser's weight decay
    # claims also read on the reference's plotted metric (reference_average): every round
    # evaluated
    reference_average: bool

    @property
    def kappa2(self) -> float:
        """CA-Fed's ``kappa2`` in Fig. 1 (the paper's ``kappa_bar^2 = 1``)."""
        return self.kappa_scale * 1.0

    @property
    def availability(self) -> str:
        spec = f"markov:mix={self.mix}"
        return spec if self.id_seed is None else f"{spec},id_seed={self.id_seed}"


PROFILES = {
    "paper": Profile(
        name="paper",
        rounds=200,
        kappa_scale=1.0,
        loss_source="batch",
        lambda_order="signed",
        keep_all_when_flat=True,
        optimum={"synthetic": "running_min", "mnist": "running_min"},
        mix="paper",
        id_seed=0,
        f3ast_variant="paper",
        synthetic_args={"alpha": 0.5, "beta": 0.5},
        synthetic_test_fraction=0.1,
        momentum=0.0,
        weight_decay=0.0,
        server="sgd",
        server_momentum=0.0,
        server_weight_decay=0.0,
        persistent_client_state=False,
        fixed_server_lr={},
        init="flax",
        ridge=0.01,  # section V-A: the linear classifier's regularisation 1e-2
        reference_average=False,
    ),
    "code": Profile(
        name="code",
        rounds=150,
        kappa_scale=0.25,
        loss_source="validation",
        lambda_order="abs",
        keep_all_when_flat=False,
        optimum={"synthetic": "given", "mnist": "zero"},
        mix="code",
        id_seed=0,
        f3ast_variant="reference",
        synthetic_args={"alpha": 0.5, "beta": 0.5, "examples_per_client": 200},
        synthetic_test_fraction=0.75,
        momentum=0.9,
        weight_decay=0.01,
        server="momentum",
        server_momentum=0.9,
        server_weight_decay=0.01,
        persistent_client_state=True,
        fixed_server_lr={"adafed": 1.0},
        init="torch",  # the reference's torch.nn.Linear
        ridge=0.0,  # the reference regularises through weight decay 1e-2 alone
        reference_average=True,
    ),
}


@dataclasses.dataclass(frozen=True)
class Scale:
    """Run sizes. ``rounds``/``rounds_fig2`` ``None``: the profile's T / the paper's 500."""

    name: str
    num_clients: int
    rounds: int | None
    rounds_fig2: int | None
    rounds_fig5: int
    rounds_control: int
    eval_every: int
    synthetic_max_examples: int | None  # cap on LEAF's LogNormal sizes (paper profile)
    mnist_fraction: float  # stratified share of MNIST's training images
    tune_rounds: int
    tune_seeds: int
    client_lrs: tuple[float, ...]
    server_lrs: tuple[float, ...]
    tune_all: bool  # tune More-available and F3AST too (else they reuse Unbiased's values)
    local_epochs: int = 2


SCALES = {
    "cpu": Scale(
        "cpu", 100, 60, 60, 40, 150, 10, 200, 0.1, 60, 2, (0.1, 0.01, 0.001), (1.0, 0.1), False
    ),
    "paper": Scale(
        "paper",
        100,
        None,
        None,
        100,
        150,
        10,
        None,
        1.0,
        100,  # the code's tune_learning_rates.sh runs 100 rounds
        2,
        CODE_GRID_CLIENT,
        CODE_GRID_SERVER,
        True,
    ),
}


def with_grid(
    scale: Scale,
    client_lrs: tuple[float, ...] | None = None,
    server_lrs: tuple[float, ...] | None = None,
) -> Scale:
    """``scale`` with its tuning grid replaced where given (the ``client_lrs``/``server_lrs``
    options); a :class:`ConfigError` names a grid that is empty or not positive."""
    for name, values in (("client_lrs", client_lrs), ("server_lrs", server_lrs)):
        if values is not None and (not values or not all(v > 0 for v in values)):
            raise ConfigError(f"ca-fed: {name} must be positive learning rates, got {values}")
    return dataclasses.replace(
        scale,
        client_lrs=tuple(client_lrs) if client_lrs is not None else scale.client_lrs,
        server_lrs=tuple(server_lrs) if server_lrs is not None else scale.server_lrs,
    )


def fig1_rounds(profile: Profile, scale: Scale) -> int:
    return scale.rounds or profile.rounds


def fig2_rounds(scale: Scale) -> int:
    return scale.rounds_fig2 or 500


def kappa_label(x: float) -> str:
    return f"CA-Fed (kappa2={x:g})"


# ----------------------------------------------------------------------------- configurations
def strategy_args(
    strategy: str,
    dataset: str,
    profile: Profile,
    num_clients: int,
    *,
    kappa: float = 1.0,
    trace: bool = False,
    optima: tuple[float, ...] = (),
) -> dict[str, Any]:
    """The strategy's options under ``profile`` (oracle ``pi``/``lambda``, section V-A c);
    ``kappa``: the paper's figure value of ``kappa_bar^2``."""
    args: dict[str, Any] = {"estimator": "oracle"}
    if strategy == "ca_fed":
        optimum = profile.optimum[dataset]
        args.update(
            kappa2=profile.kappa_scale * kappa,
            loss_source=profile.loss_source,
            lambda_order=profile.lambda_order,
            keep_all_when_flat=profile.keep_all_when_flat,
            optimum=optimum,
        )
        if optimum == "given":
            if len(optima) != num_clients:
                raise ConfigError(
                    f"ca-fed: {len(optima)} fitted optima for {num_clients} clients ({dataset})"
                )
            args["optimum_values"] = tuple(optima)
        if trace:
            args["trace"] = True
    elif strategy == "f3ast":
        args.update(budget=max(1, num_clients // 2), variant=profile.f3ast_variant)
    return args


def model_args(profile: Profile) -> dict[str, Any]:
    """The linear classifier's options (only those set away from the defaults, so the paper
    profile's configurations, and the results they key, stay as they were)."""
    args: dict[str, Any] = {"ridge": profile.ridge} if profile.ridge else {}
    return args if profile.init == "flax" else {**args, "init": profile.init}


def make_config(
    strategy: str,
    dataset: str,
    profile: Profile,
    scale: Scale,
    *,
    lr: tuple[float, float],
    rounds: int,
    kappa: float = 1.0,
    num_clients: int | None = None,
    availability: str | None = None,
    partition: str | None = None,
    eval_every: int | None = None,
    trace: bool = False,
    data_path: str | None = None,
    optima: tuple[float, ...] = (),
) -> RunConfig:
    """The run configuration of one method (``strategy``) on ``synthetic`` or ``mnist``;
    ``lr``: (client, server) learning rates. Every kept available client trains
    (``per_round = N``)."""
    k = num_clients or scale.num_clients
    client_lr, server_lr = lr
    server_lr = profile.fixed_server_lr.get(strategy, server_lr)
    common: dict[str, Any] = dict(
        strategy=strategy,
        strategy_args=strategy_args(
            strategy, dataset, profile, k, kappa=kappa, trace=trace, optima=optima
        ),
        model="logreg",
        model_args=model_args(profile),
        num_clients=k,
        per_round=k,
        rounds=rounds,
        local_epochs=scale.local_epochs,
        lr=client_lr,
        momentum=profile.momentum,
        weight_decay=profile.weight_decay,
        persistent_client_state=profile.persistent_client_state,
        server=profile.server,
        server_lr=server_lr,
        server_momentum=profile.server_momentum,
        server_weight_decay=profile.server_weight_decay,
        availability=availability or profile.availability,
        # the reference's time-average reads its logged rounds: every round is evaluated
        eval_every=eval_every or (1 if profile.reference_average else scale.eval_every),
        data_seed=0,  # one data set; seeds vary the chains, the model and the training noise
    )
    if dataset == "synthetic":
        args = dict(profile.synthetic_args)
        if scale.synthetic_max_examples and "examples_per_client" not in args:
            args["max_examples"] = scale.synthetic_max_examples
        return RunConfig(
            dataset="leaf_synthetic",
            dataset_args=args,
            partition="natural",
            batch_size=32,
            test_fraction=profile.synthetic_test_fraction,
            **common,
        )
    if dataset == "mnist":
        return RunConfig(
            dataset="mnist",
            data_path=data_path,
            partition=partition or "dirichlet:0.5",
            test_fraction=0.2,  # section V-A b: 20% of the training data for validation
            batch_size=64,
            **common,
        )
    raise ConfigError(f"ca-fed: unknown data set {dataset!r}")


def mnist_path(scale: Scale, out: Path, data_dir) -> str | None:
    """MNIST at this size: a stratified subsample under ``out`` when ``mnist_fraction < 1``."""
    if scale.mnist_fraction < 1.0:
        where = out / "data" / f"mnist-{scale.mnist_fraction:g}"
        return str(subsampled_npz("mnist", scale.mnist_fraction, where, data_dir))
    return None if data_dir is None else str(data_dir)


def fitted_optima(config: RunConfig) -> tuple[float, ...]:
    """The code's ``F_k^*`` of every client of ``config``'s data (its scikit-learn fit)."""
    return fit_local_optima(load_data_for(config.replace(strategy_args={}).validate()))


# ----------------------------------------------------------------------------- learning rates
def parse_lrs(text: str | None) -> dict[tuple[str, str], tuple[float, float]]:
    """``"synthetic.ca_fed=0.01/0.3;mnist.adafed=0.001/1"`` -> {(data set, strategy): (client,
    server)}; a :class:`ConfigError` names a malformed entry."""
    out = {}
    for item in filter(None, (s.strip() for s in (text or "").replace(" ", ";").split(";"))):
        key, eq, value = item.partition("=")
        dataset, dot, strategy = key.partition(".")
        parts = value.split("/")
        try:
            if not (eq and dot and strategy in STRATEGIES and len(parts) == 2):
                raise ValueError
            client, server = float(parts[0]), float(parts[1])
            if not (client > 0 and server > 0):
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"ca-fed lrs: {item!r} is not DATASET.STRATEGY=CLIENT/SERVER with a strategy "
                f"of {STRATEGIES} and positive rates"
            ) from None
        out[(dataset, strategy)] = (client, server)
    return out


def grid(strategy: str, profile: Profile, scale: Scale) -> list[tuple[float, float]]:
    servers = (
        (profile.fixed_server_lr[strategy],)
        if strategy in profile.fixed_server_lr
        else scale.server_lrs
    )
    return [(c, s) for c in scale.client_lrs for s in servers]


def reference_logged_rounds(end: int) -> list[int]:
    """The rounds after which ``arodio/CA-Fed``'s ``run_experiment.py`` logs the test accuracy,
    up to ``end``: iteration ``ii`` logs when ``ii < 40 and ii % 3 == 1`` or ``ii % 10 == 9``
    (its scripts' ``log_freq = 10``), i.e. after rounds 2, 5, ..., 38 and 10, 20, 30, ...; it
    also logs the untrained model (round 0), which our runs do not evaluate."""
    return [r for r in range(1, end + 1) if (r <= 40 and r % 3 == 2) or r % 10 == 0]


def reference_average(run: Run, arg: str) -> float | None:
    """``reference_average@R``: the reference's plotted "time-average test accuracy" at round
    ``R`` (``utils/plots.py``'s ``smooth_results`` with discount 1: the running mean of the
    logged accuracies), over its logged rounds :func:`reference_logged_rounds` ``(R)``. Needs
    every round evaluated. The reference's mean also holds round 0's accuracy, the same for
    every method on a seed (same initial model): it scales paired differences by ``n / (n +
    1)`` (27/28 at ``R = 150``) and moves no verdict's sign."""
    want = reference_logged_rounds(int(arg))
    by_round = {e["round"]: e.get("test_accuracy") for e in run.records}
    values = [by_round.get(r) for r in want]
    if not want or any(v is None for v in values):
        missing = [r for r, v in zip(want, values, strict=True) if v is None][:5]
        raise ConfigError(
            f"ca-fed: reference_average@{arg} needs the test accuracy after rounds {missing} "
            f"of run {run.label!r} (seed {run.seed}); evaluate every round (eval_every=1)"
        )
    return float(np.mean(values))


def tail_accuracy(records: list[dict], rounds: int) -> float:
    """Mean test accuracy over the evaluations in the last 40% of a run (-inf when a run
    diverged or has none): the tuning criterion."""
    tail = [r.get("test_accuracy") for r in records if r["round"] > 0.6 * rounds]
    tail = [a for a in tail if a is not None and math.isfinite(a)]
    return float(np.mean(tail)) if tail else -math.inf


def tune_lrs(
    datasets: dict[str, dict[str, Any]],
    strategies: tuple[str, ...],
    profile: Profile,
    scale: Scale,
    out: Path,
    echo=print,
    study: Study | None = None,
) -> dict[str, Any]:
    """Grid search of (client, server) learning rates per strategy and data set: every grid
    point runs ``scale.tune_rounds`` rounds on ``scale.tune_seeds`` seeds (from
    :data:`TUNE_SEED0`), scored by :func:`tail_accuracy` averaged over the seeds; the best
    point is chosen (ties: the first in grid order). ``datasets``: name -> extra
    :func:`make_config` arguments. Returns ``{"chosen": {(data set, strategy): lr}, "scores":
    ...}``; with ``study``, also ``"score_stats"``, each score recomputable from the per-seed
    tail accuracies it keeps in ``per_seed.json`` (:func:`tuning_score`)."""
    cells, where = [], []
    every = max(1, scale.tune_rounds // 6)
    for dataset, extra in datasets.items():
        for strategy in strategies:
            for lr in grid(strategy, profile, scale):
                config = make_config(
                    strategy,
                    dataset,
                    profile,
                    scale,
                    lr=lr,
                    rounds=scale.tune_rounds,
                    eval_every=every,
                    **extra,
                )
                label = f"{LABELS[strategy]} lr={lr[0]:g}/{lr[1]:g}"
                for i in range(scale.tune_seeds):
                    seed = TUNE_SEED0 + i
                    folder = out / "runs" / "tuning" / dataset / _slug(label) / f"seed{seed}"
                    cells.append(
                        Cell(config.replace(seed=seed, label=label).validate(), folder, label)
                    )
                    where.append((dataset, strategy, lr, label, seed))
    together = study.execution.seeds_together if study is not None else "auto"
    results = run_cells(cells, seeds_together=together, progress=False, echo=echo)
    # (data set, strategy, lr) -> its label and each tuning seed's tail accuracy
    tails: dict[tuple[str, str, tuple[float, float]], tuple[str, dict[int, float]]] = {}
    for (dataset, strategy, lr, label, seed), r in zip(where, results, strict=True):
        _, by_seed = tails.setdefault((dataset, strategy, lr), (label, {}))
        by_seed[seed] = tail_accuracy(r.evals, scale.tune_rounds)
    chosen, scores, stats = {}, {}, {}
    for (dataset, strategy, lr), (label, by_seed) in tails.items():
        score = float(np.mean(list(by_seed.values())))
        scores.setdefault(f"{dataset}.{strategy}", {})[f"{lr[0]:g}/{lr[1]:g}"] = score
        if study is not None:
            # a diverged seed (-inf, which JSON cannot hold) is counted, not averaged
            kept = {s: {"diverged": 0.0, "tail_accuracy": t} if math.isfinite(t)
                    else {"diverged": 1.0} for s, t in by_seed.items()}  # fmt: skip
            stats.setdefault(f"{dataset}.{strategy}", {})[f"{lr[0]:g}/{lr[1]:g}"] = (
                study.per_seed_means(
                    f"tuning {dataset}", label, kept,
                    derive="ca_fed.tuning_score",
                    arm=f"tuning/{dataset}/{_slug(label)}",
                )
            )  # fmt: skip
        best = chosen.get((dataset, strategy))
        if best is None or score > best[1]:
            chosen[(dataset, strategy)] = (lr, score)
    out = {"chosen": {k: v[0] for k, v in chosen.items()}, "scores": scores}
    return out | ({"score_stats": stats} if study is not None else {})


@register_derive("ca_fed.tuning_score")
def tuning_score(means: dict[str, Any]) -> dict[str, Any]:
    """A grid point's score from the means over its tuning seeds: the mean tail accuracy, or
    ``None`` (-inf in the search) when a seed diverged."""
    diverged = means.get("diverged", 0.0) > 0 or "tail_accuracy" not in means
    return {"score": None if diverged else means["tail_accuracy"]}


def learning_rates(
    datasets: dict[str, dict[str, Any]],
    strategies: tuple[str, ...],
    profile: Profile,
    scale: Scale,
    out: Path,
    *,
    tune: bool,
    given: dict[tuple[str, str], tuple[float, float]],
    echo=print,
    study: Study | None = None,
) -> tuple[dict[tuple[str, str], tuple[float, float]], dict[str, Any]]:
    """The (client, server) learning rates of every strategy on every data set, and the
    record of how they were chosen (for ``results.json``): ``given`` values win; the rest are
    tuned (``tune``), or, without tuning, the code's published values (code profile)."""
    record: dict[str, Any] = {
        "client_grid": list(scale.client_lrs),
        "server_grid": list(scale.server_lrs),
        "fixed_server_lr": dict(profile.fixed_server_lr),
        "tune_rounds": scale.tune_rounds,
        "tune_seeds": [TUNE_SEED0 + i for i in range(scale.tune_seeds)],
        "criterion": "mean test accuracy over the last 40% of the tuning rounds",
        "given": {f"{d}.{s}": list(v) for (d, s), v in given.items()},
    }
    lrs = dict(given)
    if tune:
        tuned = (
            set(strategies)
            if scale.tune_all
            else set(strategies) & {"ca_fed", "unbiased", "adafed"}
        )
        todo = tuple(s for s in STRATEGIES if s in tuned)
        wanted = {
            d: extra for d, extra in datasets.items() if any((d, s) not in given for s in todo)
        }
        if wanted and todo:
            result = tune_lrs(wanted, todo, profile, scale, out, echo, study)
            for key, lr in result["chosen"].items():
                lrs.setdefault(key, lr)
            record["scores"] = result["scores"]
            if "score_stats" in result:
                record["score_stats"] = result["score_stats"]
        record["tuned"] = list(todo)
    elif profile.name == "code":
        for key, lr in CODE_LRS.items():
            lrs.setdefault(key, lr)
    for dataset in datasets:
        for strategy in strategies:
            if (dataset, strategy) in lrs:
                continue
            # untuned baselines take Unbiased's values (same unnormalised weights), then
            # CA-Fed's
            for fallback in ("unbiased", "ca_fed"):
                if (dataset, fallback) in lrs:
                    lrs[(dataset, strategy)] = lrs[(dataset, fallback)]
                    break
            else:
                raise ConfigError(
                    f"ca-fed: no learning rates for {strategy} on {dataset}: tune (the default) "
                    f"or give lrs={dataset}.{strategy}=CLIENT/SERVER"
                )
    lrs = {(d, s): lrs[(d, s)] for d in datasets for s in strategies}
    record["chosen"] = {f"{d}.{s}": list(v) for (d, s), v in sorted(lrs.items())}
    return lrs, record


# ----------------------------------------------------------------------------- reading runs
def diagnostic_mean(run: Run, key: str) -> np.ndarray | None:
    """The run's mean over rounds of a logged diagnostic (records hold chunk means; weighted
    by the chunk lengths)."""
    rows = [(r["round"], r.get("diagnostics", {}).get(key)) for r in run.records]
    previous, total, weight = 0, None, 0
    for rnd, value in rows:
        if value is None:
            previous = rnd
            continue
        v = np.asarray(value, np.float64) * (rnd - previous)
        total = v if total is None else total + v
        weight += rnd - previous
        previous = rnd
    return None if total is None else total / weight


# diagnostics averaged over rounds (chunk means weighted by chunk length), per seed
MECHANISM_KEYS = (
    "excluded", "excluded_available", "q_sum", "q_max", "law_entropy_ratio", "gamma",
    "group_size", "kept_by_group", "trained_by_group",
)  # fmt: skip
# the rows' numbers, None where a run logs no such diagnostic
MECHANISM_NUMBERS = MECHANISM_KEYS[:6] + ("q_sum_std_across_rounds",)


def seed_diagnostics(run: Run) -> dict[str, Any]:
    """One run's diagnostics for the mechanism rows: each mean over rounds, and the standard
    deviation of the weight sum across rounds (from its running square)."""
    out: dict[str, Any] = {}
    for key in MECHANISM_KEYS:
        v = diagnostic_mean(run, key)
        if v is not None:
            out[key] = float(v) if v.ndim == 0 else v.tolist()
    sq, mean = diagnostic_mean(run, "q_sum_sq"), diagnostic_mean(run, "q_sum")
    if sq is not None and mean is not None:
        out["q_sum_std_across_rounds"] = float(np.sqrt(max(float(sq) - float(mean) ** 2, 0.0)))
    return out


@register_derive("ca_fed.class_shares")
def class_shares(means: dict[str, Any]) -> dict[str, Any]:
    """Per class, the kept and the trained share: the mean kept (trained) clients of the
    group over the mean group size (``None`` for an empty class)."""
    out: dict[str, Any] = {}
    size = means.get("group_size")
    for key in ("kept_by_group", "trained_by_group"):
        v = means.get(key)
        if v is not None and size is not None:
            share = [float(a / b) if b > 0 else None for a, b in zip(v, size, strict=True)]
            out[key.replace("_by_group", "_share_by_class")] = dict(
                zip(CLASS_NAMES, share, strict=True)
            )
    return out


def mechanism_row(study: Study, setting: str, label: str) -> dict[str, Any]:
    """The diagnostics of one method, means over rounds and seeds: excluded clients, the sum
    of weights (mean, standard deviation across rounds), the largest weight, the law's entropy
    ratio, and per class the kept share and the trained share; each seed's values go into
    ``per_seed.json``, which gives these back."""
    runs = study.runs(setting, label)
    row = study.per_seed_means(
        setting, label, {r.seed: seed_diagnostics(r) for r in runs},
        derive="ca_fed.class_shares",
    )  # fmt: skip
    for key in MECHANISM_NUMBERS:
        row.setdefault(key, None)
    return row


@register_derive("ca_fed.class_weights")
def class_weights(means: dict[str, Any], classes: list[int]) -> dict[str, Any]:
    """Fig. 1d: the mean over the clients of each class of ``(1/T) sum_t q_k`` (the engine's
    ``weight_sums``; ``means["weight_share"]``, averaged over seeds); ``None`` for an empty
    class."""
    w, c = np.asarray(means["weight_share"]), np.asarray(classes)
    return {
        "cumulative_weight": {
            name: (float(w[c == i].mean()) if np.any(c == i) else None)
            for i, name in enumerate(CLASS_NAMES)
        }
    }


def fig1d_weights(study: Study, setting: str, label: str, classes: np.ndarray) -> dict[str, Any]:
    """:func:`class_weights` of ``label``, from each seed's ``weight_sums / rounds`` kept in
    ``per_seed.json``."""
    by_seed = {
        r.seed: {"weight_share": (np.asarray(r.summary["weight_sums"], np.float64)
                                  / r.summary["rounds_completed"]).tolist()}
        for r in study.runs(setting, label)
    }  # fmt: skip
    return study.per_seed_means(
        setting, label, by_seed, derive="ca_fed.class_weights",
        derive_args={"classes": [int(x) for x in classes]},
    )  # fmt: skip


def alpha_by_class(counts: np.ndarray, classes: np.ndarray) -> dict[str, Any]:
    """The target importance ``alpha_k = n_k / n`` summed per class, and its largest value
    with the class holding it (how skewed the client sizes make the objective)."""
    alpha = np.asarray(counts, np.float64) / np.sum(counts)
    top = int(np.argmax(alpha))
    return {
        "per_class": {name: float(alpha[classes == c].sum()) for c, name in enumerate(CLASS_NAMES)},
        "max": float(alpha[top]),
        "max_class": CLASS_NAMES[int(classes[top])],
    }


def trace_maps(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """``(available, kept)`` bool[T, K] of a ``trace=True`` run evaluated every round."""
    rows = [r["diagnostics"] for r in run.records]
    return (
        np.array([d["available"] for d in rows]) > 0.5,
        np.array([d["kept"] for d in rows]) > 0.5,
    )


# ----------------------------------------------------------------------------- plots


def plot_weights(weights: dict[str, np.ndarray], classes: np.ndarray, path: Path) -> Path:
    """Fig. 1d: every client's cumulative weight (mean over seeds), clients grouped by class."""
    order = np.argsort(classes, kind="stable")
    colors = np.array(["tab:blue", "tab:cyan", "tab:red", "tab:orange"])[classes[order]]
    fig, axes = subplots(len(weights), 1, figsize=(8, 1.5 * len(weights) + 0.5), sharex=True)
    for ax, (name, w) in zip(np.atleast_1d(axes), weights.items(), strict=True):
        ax.bar(np.arange(len(order)), np.asarray(w)[order], color=colors, width=1.0)
        ax.set_ylabel(name, rotation=0, ha="right", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel(
        "clients by class (blue/cyan: more available, correlated/weak; red/orange: less "
        "available, correlated/weak)",
        fontsize=8,
    )
    fig.suptitle("Fig. 1d: cumulative aggregation weight (1/T) sum_t q_k, Synthetic")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_map(available: np.ndarray, kept: np.ndarray, path: Path, title: str) -> Path:
    """Fig. 5: client x round image; white inactive and excluded, grey active and excluded,
    light green kept while inactive, dark green active and kept (trained)."""
    from matplotlib.colors import ListedColormap

    code = np.where(available, np.where(kept, 3, 1), np.where(kept, 2, 0)).T
    fig, ax = subplots(figsize=(7, 4.5))
    cmap = ListedColormap(["white", "0.6", "#c7e9c0", "#238b45"])
    ax.imshow(code, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=3)
    ax.set_xlabel("round")
    ax.set_ylabel(f"client ({NUM_CLUSTERS} clusters in id blocks)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _curves(study: Study, setting: str, labels: list[str], path: Path, title: str) -> None:
    runs = [r for lab in labels for r in study.runs(setting, lab)]
    curves, bands = mean_curves(runs)
    plot_curves(curves, path, bands=bands, title=title)


# ----------------------------------------------------------------------------- claims
def claims(
    parts: tuple[str, ...],
    labels: set[str],
    fig2_end: int,
    scale: Scale,
    profile: Profile | None = None,
) -> list[Claim]:
    """The paper's numerical claims that the runs of ``parts`` can read; under a profile with
    ``reference_average``, each also read on the reference's plotted time-average accuracy
    (:func:`reference_average`; the same paper number, since the paper's figures plot it)."""
    out = []
    for part, dataset in (("fig1_synthetic", "synthetic"), ("fig1_mnist", "mnist")):
        if part in parts and {"CA-Fed", "AdaFed"} <= labels:
            out.append(
                Claim(
                    f"Fig. 1 {dataset}: CA-Fed beats AdaFed",
                    dataset,
                    "CA-Fed",
                    "AdaFed",
                    "final_accuracy",
                    PAPER_FIG1_GAIN[dataset],
                )
            )
    if "fig2a" in parts:
        setting = "synthetic fig2a"
        out.append(
            Claim(
                "Fig. 2a: kappa2 = 0.1 beats Unbiased at t = 40",
                setting,
                kappa_label(0.1),
                "Unbiased",
                "accuracy@40",
                PAPER_FIG2A_T40,
            )
        )
        note = "" if fig2_end == 500 else f"read at our horizon T = {fig2_end}, not t = 500"
        out.append(
            Claim(
                "Fig. 2a: kappa2 = 100 beats More available at t = 500",
                setting,
                kappa_label(100.0),
                "More available",
                "final_accuracy",
                PAPER_FIG2A_END,
                note=note,
            )
        )
    if "fig5" in parts and {"CA-Fed", "AdaFed"} <= labels:
        out.append(
            Claim(
                "Fig. 5d: CA-Fed beats AdaFed under clustered availability",
                "mnist clustered",
                "CA-Fed",
                "AdaFed",
                "final_accuracy",
                PAPER_FIG5D_GAIN,
            )
        )
    if "control" in parts:
        out.append(
            Claim(
                "Fig. 1 synthetic, the code's own setup (N = 24): CA-Fed beats AdaFed",
                "control N=24",
                "CA-Fed",
                "AdaFed",
                "final_accuracy",
                PAPER_FIG1_GAIN["synthetic"],
                note=f"control: N = {CONTROL_CLIENTS}, T = {scale.rounds_control}, the code's "
                "published learning rates",
            )
        )
    if profile is not None and profile.reference_average:
        end = {"synthetic": fig1_rounds(profile, scale), "mnist": fig1_rounds(profile, scale),
               "synthetic fig2a": fig2_end, "mnist clustered": scale.rounds_fig5,
               "control N=24": scale.rounds_control}  # fmt: skip
        out += [
            dataclasses.replace(
                c,
                claim=f"{c.claim} (the reference's time-average accuracy)",
                metric="reference_average@"
                + (c.metric.split("@")[1] if "@" in c.metric else str(end[c.setting])),
            )
            for c in out
        ]
    return out


def _fmt(v, digits: int = 3) -> str:
    return (
        "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"
    )


# ----------------------------------------------------------------------------- the study
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
