"""CA-Fed's study (:mod:`studies.ca_fed`): its profiles and sizes, the configuration of every
run, and the learning rates, tuned on the reference code's grid or given."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import Cell, load_data_for, run_cells
from fedjax_sel.experiment.compare import Run
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.per_seed import register_derive
from fedjax_sel.experiment.study import Study
from fedjax_sel.strategies._ca_fed_common import fit_local_optima
from studies.data import subsampled_npz

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
                    folder = out / "runs" / "tuning" / dataset / folder_name(label) / f"seed{seed}"
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
                    arm=f"tuning/{dataset}/{folder_name(label)}",
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
