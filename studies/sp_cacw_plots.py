"""Figures of the personalized comparison: target curves, the weight heatmap, bound vs risk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedjax_sel.experiment.outputs import subplots
from fedjax_sel.metrics import nanmean
from fedjax_sel.personalized.results import MethodResult


def _finish(fig, axes, path: str | Path, title: str | None, xlabel: str) -> Path:
    """Labels, grids and legends every axis, titles the figure and saves it to ``path``."""
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_target_curves(
    runs: dict[str, list[MethodResult]], path: str | Path, title: str | None = None
) -> Path:
    """Test accuracy and test loss (mean over targets; band = min/max over seeds) against local
    SGD steps, one line per method; ``runs`` maps a label to its runs over seeds."""
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for label, results in runs.items():
        steps = results[0].steps
        for ax, metric in zip(axes, ("test_accuracy", "test_loss"), strict=True):
            curves = np.stack([r.mean(metric) for r in results])
            (line,) = ax.plot(steps, curves.mean(0), label=label)
            if len(results) > 1:
                ax.fill_between(
                    steps, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2
                )
    axes[0].set_ylabel("target test accuracy (mean over targets)")
    axes[1].set_ylabel("target test loss (mean over targets)")
    axes[1].set_yscale("log")
    return _finish(fig, axes, path, title, "local SGD steps per client")


def plot_weight_heatmap(
    weights: np.ndarray,
    target_ids: np.ndarray,
    clusters: Sequence[int] | None,
    path: str | Path,
    title: str | None = None,
) -> Path:
    """Heatmap of the learned weights ``weights[T, K]`` (rows: targets, columns: clients),
    both sorted by true cluster when ``clusters`` is given, with cluster boundaries drawn:
    mass inside the diagonal blocks is weight on same-cluster peers."""
    k = weights.shape[1]
    col = np.arange(k) if clusters is None else np.argsort(np.asarray(clusters), kind="stable")
    tgt = np.asarray(target_ids)
    row = (
        np.arange(len(tgt))
        if clusters is None
        else np.argsort(np.asarray(clusters)[tgt], kind="stable")
    )
    fig, ax = subplots(figsize=(6.5, 5.5))
    im = ax.imshow(weights[row][:, col], cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="weight alpha")
    if clusters is not None:
        c = np.asarray(clusters)
        for edge in np.flatnonzero(np.diff(c[col])) + 0.5:
            ax.axvline(edge, color="white", lw=0.8)
        for edge in np.flatnonzero(np.diff(c[tgt][row])) + 0.5:
            ax.axhline(edge, color="white", lw=0.8)
    ax.set_xlabel("peer client (sorted by true cluster)")
    ax.set_ylabel("target client (sorted by true cluster)")
    ax.set_title(title or "SP-CACW weights")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_bound(result: MethodResult, path: str | Path, title: str | None = None) -> Path:
    """Left: the gradient-error bound as the method estimates it (``bound``), the same formula
    with exact full-data quantities (``bound_true``) and the exact gradient error
    ``E||G - grad f_0||^2`` (``grad_error``), means over targets. Right: the running risk bound
    (mean over the targets whose premise ``L eta <= 1/2`` held; drawn only where some did)
    against the target's observed training risk (and test loss), means over targets."""
    m, steps = result.metrics, result.steps
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for name, label in (
        ("bound", "bound Phi (online estimates)"),
        ("bound_true", "bound Phi (exact B, v)"),
        ("grad_error", "exact E||G - grad f_0||^2"),
    ):
        if name in m:
            axes[0].plot(steps[1:], np.nanmean(m[name], 1)[1:], label=label, marker=".")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("gradient-error terms (mean over targets)")
    risk = nanmean(m["risk_bound"], axis=1)  # NaN where no target's premise held
    if np.any(np.isfinite(risk)):
        axes[1].plot(steps, risk, label="running risk bound U_t (premise held)")
    else:
        axes[1].set_title("no risk bound: L eta > 1/2, its premise failed", fontsize=9)
    axes[1].plot(steps, np.nanmean(m["train_loss"], 1), label="observed train risk f_0(w_t)")
    axes[1].plot(steps, np.nanmean(m["test_loss"], 1), label="test loss", ls="--")
    axes[1].set_ylabel("risk (mean over targets)")
    title = title or f"{result.label}: how tight is the bound?"
    return _finish(fig, axes, path, title, "local SGD steps")
