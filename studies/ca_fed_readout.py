"""CA-Fed's study (:mod:`studies.ca_fed`): what its runs are read for (the mechanism's
diagnostics, Fig. 1d's weights, Fig. 5's maps), their plots, and the paper's claims."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.availability.markov_population import CLASS_NAMES
from fedjax_sel.experiment.compare import Run
from fedjax_sel.experiment.outputs import subplots
from fedjax_sel.experiment.per_seed import register_derive
from fedjax_sel.experiment.study import Study
from fedjax_sel.experiment.verdicts import Claim
from studies.ca_fed_setup import (
    CONTROL_CLIENTS,
    NUM_CLUSTERS,
    PAPER_FIG1_GAIN,
    PAPER_FIG2A_END,
    PAPER_FIG2A_T40,
    PAPER_FIG5D_GAIN,
    Profile,
    Scale,
    fig1_rounds,
    kappa_label,
)


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
