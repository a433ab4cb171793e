"""HeteRo-Select's study (:mod:`studies.hetero_select`): the paper's numbers, the ablations,
the sizes and methods, the configuration of every run, and the data."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data import loaders
from fedjax_sel.kernels.oort import PRESET_OVERCOMMIT
from studies.data import subsampled_npz

NUM_CLIENTS = 12
PARTITION = "dirichlet:0.1"
ACC_KEYS = ("peak_accuracy", "final_accuracy", "stable_accuracy", "stability_drop")

# ----------------------------------------------------------------------------- the paper's numbers
# Table I (CIFAR-10, ResNet-18, 50%): peak, final, stable, drop (%)
PAPER_TABLE1 = {
    "Oort": (73.98, 71.25, 71.77, 2.73),
    "Power-of-Choice": (74.42, 67.46, 67.62, 6.96),
    "HeteRo-Select (Additive)": (74.75, 72.76, 70.97, 1.99),
    "HeteRo-Select (Multiplicative)": (74.56, 71.80, 69.41, 2.76),
    "Random Selection": (74.05, 66.05, 67.86, 8.00),
}
# Table II (CIFAR-10): peak, final, stable, drop (%)
PAPER_TABLE2 = {
    "FedAvg (100%)": (66.00, 63.81, 64.07, 2.19),
    "FedProx mu=0.1 (100%)": (70.31, 68.95, 69.19, 1.36),
    "HeteRo-Select (FedProx, 50%)": (74.75, 72.76, 70.97, 1.99),
}
# Table IV: {data set: {method: (peak, last-10 average)}} (%)
PAPER_TABLE4 = {
    "fashion_mnist": {
        "FedAvg (100%)": (83.55, 81.07),
        "FedProx mu=0.1 (100%)": (83.01, 81.52),
        "HeteRo-Select (FedProx, 50%)": (83.39, 77.57),
        "HeteRo-Select (FedProx, 80%)": (85.05, 80.05),
    },
    "mnist": {
        "FedAvg (100%)": (98.62, 97.56),
        "FedProx mu=0.1 (100%)": (98.94, 98.56),
        "HeteRo-Select (FedProx, 50%)": (98.66, 97.93),
        "HeteRo-Select (FedProx, 80%)": (98.63, 98.13),
    },
}
# Fig. 6: standard deviation of the selection counts over 100 rounds (12 clients)
PAPER_FIG6 = {"HeteRo-Select (Additive)": 6.94, "Power-of-Choice": 29.80}
PAPER_ROUNDS = 100
PAPER_ABLATION_ROUNDS = 50


@dataclasses.dataclass(frozen=True)
class Ablation:
    """One row of Table III (the paper reports no final accuracy for the mu block)."""

    block: str
    label: str
    gamma: float
    eta: float
    mu: float
    tau0: float
    participation: float
    paper_peak: float
    paper_final: float | None


_G = "Fairness (gamma); T=1, eta=0.3, mu=0.01"
_E = "Exploration (eta); T=1, gamma=0.7, mu=0.01"
_T = "Temperature (T); gamma=0.7, eta=0.3, mu=0.01"
_P = "Participation; gamma=0.7, eta=0.3, mu=0.01, T=1"
_M = "Regularisation (mu); T=2"
ABLATIONS = [
    Ablation(_G, "gamma=0.0", 0.0, 0.3, 0.01, 1.0, 0.5, 65.35, 56.21),
    Ablation(_G, "gamma=0.3", 0.3, 0.3, 0.01, 1.0, 0.5, 62.19, 44.77),
    Ablation(_G, "gamma=0.7", 0.7, 0.3, 0.01, 1.0, 0.5, 66.90, 66.90),
    Ablation(_G, "gamma=1.0", 1.0, 0.3, 0.01, 1.0, 0.5, 64.87, 54.97),
    Ablation(_E, "eta=0.0", 0.7, 0.0, 0.01, 1.0, 0.5, 64.07, 61.37),
    Ablation(_E, "eta=0.3", 0.7, 0.3, 0.01, 1.0, 0.5, 64.19, 63.76),
    Ablation(_E, "eta=0.7", 0.7, 0.7, 0.01, 1.0, 0.5, 66.20, 66.20),
    Ablation(_E, "eta=1.0", 0.7, 1.0, 0.01, 1.0, 0.5, 65.82, 57.42),
    Ablation(_T, "T=0.1", 0.7, 0.3, 0.01, 0.1, 0.5, 57.48, 41.54),
    Ablation(_T, "T=0.5", 0.7, 0.3, 0.01, 0.5, 0.5, 66.28, 66.28),
    Ablation(_T, "T=1.0", 0.7, 0.3, 0.01, 1.0, 0.5, 65.49, 49.25),
    Ablation(_T, "T=2.0", 0.7, 0.3, 0.01, 2.0, 0.5, 68.91, 62.01),
    Ablation(_T, "T=5.0", 0.7, 0.3, 0.01, 5.0, 0.5, 66.92, 58.05),
    Ablation(_P, "25%", 0.7, 0.3, 0.01, 1.0, 0.25, 58.13, 49.93),
    Ablation(_P, "50%", 0.7, 0.3, 0.01, 1.0, 0.5, 65.49, 49.25),
    Ablation(_P, "80%", 0.7, 0.3, 0.01, 1.0, 0.8, 66.64, 61.00),
    Ablation(_M, "Explorative mu=0.01", 0.7, 0.3, 0.01, 2.0, 0.5, 64.78, None),
    Ablation(_M, "Explorative mu=0.1", 0.7, 0.3, 0.1, 2.0, 0.5, 70.01, None),
    Ablation(_M, "Exploitative mu=0.01", 0.05, 0.1, 0.01, 2.0, 0.5, 68.77, None),
    Ablation(_M, "Exploitative mu=0.1", 0.05, 0.1, 0.1, 2.0, 0.5, 69.80, None),
]


# ----------------------------------------------------------------------------- sizes
@dataclasses.dataclass(frozen=True)
class Scale:
    """Run sizes: rounds and local epochs of the main and the ablation runs; ``fraction`` of
    the training images kept (stratified); ``model`` on the MNIST stand-in."""

    name: str
    rounds: int
    ablation_rounds: int
    local_epochs: int
    ablation_epochs: int
    batch_size: int
    lr: float
    model: str
    fraction: float


SCALES = {
    "cpu": Scale("cpu", 50, 25, 1, 1, 32, 0.05, "mlp", 0.25),
    "paper": Scale("paper", 100, 50, 5, 2, 32, 0.01, "mlp", 1.0),
}


@dataclasses.dataclass(frozen=True)
class Method:
    label: str
    strategy: str
    args: tuple[tuple[str, Any], ...] = ()
    participation: float = 0.5
    prox_mu: float = 0.1


RANDOM = "Random Selection"
ADDITIVE = "HeteRo-Select (Additive)"
TABLE1_METHODS = (
    Method(ADDITIVE, "hetero_select"),
    Method("HeteRo-Select (Multiplicative)", "hetero_select", (("scoring", "multiplicative"),)),
    Method("Oort", "oort", (("preset", "original"),)),
    Method("Oort (FedScale preset)", "oort", (("preset", "fedscale"),)),
    Method("Power-of-Choice", "power_of_choice"),
    Method(RANDOM, "uniform", (("weighting", "uniform"),)),
    Method(
        "HeteRo-Select (staleness only)",
        "hetero_select",
        tuple((w, 0.0) for w in ("w_v", "w_d", "w_m", "w_f", "w_n")),
    ),
)
# Table I's claims: HeteRo-Select (additive) against these; the other rows (multiplicative
# scoring, Oort's FedScale preset, the staleness-only ablation) are context that
# ``table1_extras=False`` leaves out
TABLE1_BASELINES = (RANDOM, "Oort", "Power-of-Choice")
TABLE1_CLAIMED = (ADDITIVE, *TABLE1_BASELINES)
FULL_FEDAVG = Method("FedAvg (100%)", "full", participation=1.0, prox_mu=0.0)
FULL_FEDPROX = Method("FedProx mu=0.1 (100%)", "full", participation=1.0)
HETERO_50 = Method("HeteRo-Select (FedProx, 50%)", "hetero_select")
TABLE2_METHODS = (FULL_FEDAVG, FULL_FEDPROX, HETERO_50)
TABLE4_METHODS = TABLE2_METHODS + (
    Method("HeteRo-Select (FedProx, 80%)", "hetero_select", participation=0.8),
)


def ablation_method(a: Ablation) -> Method:
    args = (("gamma", a.gamma), ("eta", a.eta), ("tau0", a.tau0))
    return Method(f"{a.block}: {a.label}", "hetero_select", args, a.participation, a.mu)


def per_round_of(participation: float, num_clients: int = NUM_CLIENTS) -> int:
    return max(1, int(num_clients * participation + 1e-9))


def make_config(
    method: Method,
    dataset: str,
    scale: Scale,
    *,
    ablation: bool = False,
    data_path: str | None = None,
    model: str | None = None,
) -> RunConfig:
    """The run configuration of one method (FedProx via ``prox_mu``; every round evaluated:
    peak and "last 10 rounds" need them)."""
    rounds = scale.ablation_rounds if ablation else scale.rounds
    args = dict(method.args)
    overcommit = 1.0
    if method.strategy == "oort":  # epochs: |B_i| = n_i, Oort's default when 0
        args["samples_per_round"] = 0
        overcommit = PRESET_OVERCOMMIT[args.get("preset", "original")]
    if method.strategy == "hetero_select":  # the schedules end with the run (tau, diversity)
        args["schedule_rounds"] = rounds
    return RunConfig(
        strategy=method.strategy,
        strategy_args=args,
        dataset=dataset,
        data_path=data_path,
        num_clients=NUM_CLIENTS,
        partition=PARTITION,
        model=model or scale.model,
        per_round=per_round_of(method.participation),
        rounds=rounds,
        local_epochs=scale.ablation_epochs if ablation else scale.local_epochs,
        batch_size=scale.batch_size,
        lr=scale.lr,
        prox_mu=method.prox_mu,
        # every method under the same device profiles: simulated time is comparable, and
        # Oort's system utility and over-commitment act (the engine's, for every strategy)
        system="lognormal",
        overcommit=overcommit,
        eval_every=1,  # peak and "last 10 rounds" need every round
        data_seed=0,  # one partition; seeds vary the model, the draws and the training noise
    )


# ----------------------------------------------------------------------------- data
def data_path_for(name: str, scale: Scale, out: Path, data_dir=None) -> str | None:
    """The data file of ``name`` at this scale (a stratified subsample when ``fraction < 1``);
    a :class:`ConfigError` says what is missing."""
    if scale.fraction < 1.0:
        return str(subsampled_npz(name, scale.fraction, out / "data", data_dir))
    loaders.load_image_dataset(name, data_dir)  # fails early, naming the file
    return None if data_dir is None else str(data_dir)


def cifar_status(data_dir) -> tuple[bool, str]:
    """Whether the paper's own setting (CIFAR-10, ResNet-18) can run here, and why not."""
    if jax.default_backend() != "gpu":
        return False, (
            f"CIFAR-10 with ResNet-18 runs on a GPU (backend here: {jax.default_backend()}); "
            "MNIST with the MLP stands in for it"
        )
    try:
        loaders.load_image_dataset("cifar10", data_dir)
    except ConfigError as e:
        return False, f"CIFAR-10 data absent ({e}); MNIST with the MLP stands in for it"
    return True, "CIFAR-10 with ResNet-18 on the GPU"
