"""The personalized mode's settings (:class:`PersonalizedConfig`), the state of its targets
(:class:`TargetState`, :class:`PersonalizedState`) and its per-epoch log (:class:`EpochLog`),
which :class:`~fedjax_sel.personalized.simulator.PersonalizedSimulation` runs on."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from flax import struct

from fedjax_sel.base import Array, ConfigError
from fedjax_sel.personalized import weighting

METHODS = ("sp_cacw", "local", "uniform", "oracle", "similarity")
LR_RULES = ("fixed", "smoothness")
INIT_WEIGHTS = ("uniform", "self")


@dataclasses.dataclass(frozen=True)
class PersonalizedConfig:
    """Hyperparameters of the personalized mode.

    Attributes:
      method: ``sp_cacw``, ``local``, ``uniform``, ``oracle`` or ``similarity``.
      lr: the step ``eta`` (``lr_rule="fixed"``) or its upper limit (``"smoothness"``).
      lr_rule: ``fixed``, or ``smoothness``: ``eta = min(lr, 1 / (c L))`` with the estimated
        smoothness ``L`` (``c = 1`` for the ``descent`` bound, 2 for ``appendix_d``), which
        makes the bound a valid descent guarantee.
      batch_size: even minibatch size (two independent halves estimate the variance).
      update_every: steps between weight updates (lazy updates; the paper: one local epoch).
        ``None``: one epoch of the median client, ``ceil(median n_k / batch_size)``; a number
        is that many steps, whatever fraction of an epoch it is (the summaries report the
        fraction as ``update_period_epochs``).
      ema: the bias EMA rate ``beta`` (also used for the variance and norm EMAs).
      participation: ``p``, each peer's Bernoulli participation probability (1/p scaling);
        the target always computes its own gradient.
      bound: ``appendix_d`` (the paper's) or ``descent`` (see :mod:`.weighting`).
      reg_gamma: ``gamma`` in ``lambda_reg = gamma * sigma_0^2`` (paper: 1).
      solver: ``ftal`` (the paper's rule: follow-the-approximate-leader over the history of
        bounds) or ``pgd`` (argmin of the latest bound only).
      pgd_steps: projected-gradient iterations per weight update.
      power_iters: power iterations (Hessian-vector products) per smoothness estimate.
      init_weights: ``uniform`` or ``self`` (all weight on the target) before the first update.
      debias: subtract the EMA's own noise from ``B^T B`` (:func:`.weighting.ema_noise_gram`);
        the paper's plug-in estimate is ``False``.
      observed_only: only peers observed at least once may get weight (``sp_cacw``,
        ``similarity``): the fix of the partial-participation bug. ``False`` restores the
        behaviour before the fix (never-observed peers look ideal), for the ablation only.
      target_chunk: simulate targets in chunks of this many (``lax.map``), ``None`` = all at
        once (``vmap``); same results either way.
    """

    method: str = "sp_cacw"
    lr: float = 0.05
    lr_rule: str = "fixed"
    batch_size: int = 32
    update_every: int | None = None
    ema: float = 0.1
    participation: float = 1.0
    bound: str = "appendix_d"
    reg_gamma: float = 1.0
    solver: str = "ftal"
    pgd_steps: int = 200
    power_iters: int = 20
    init_weights: str = "uniform"
    debias: bool = False
    observed_only: bool = True
    target_chunk: int | None = None

    def validate(self) -> PersonalizedConfig:
        """Raises :class:`ConfigError` naming the first bad value; returns ``self``."""
        for name, allowed in (
            ("method", METHODS),
            ("lr_rule", LR_RULES),
            ("bound", weighting.BOUNDS),
            ("solver", weighting.SOLVERS),
            ("init_weights", INIT_WEIGHTS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive number, got {self.lr!r}")
        if not (
            isinstance(self.batch_size, int) and self.batch_size >= 2 and self.batch_size % 2 == 0
        ):
            raise ConfigError(f"batch_size must be an even integer >= 2, got {self.batch_size!r}")
        if not 0 < self.ema <= 1:
            raise ConfigError(f"ema must lie in (0, 1], got {self.ema!r}")
        if not 0 < self.participation <= 1:
            raise ConfigError(f"participation must lie in (0, 1], got {self.participation!r}")
        if not self.reg_gamma >= 0:
            raise ConfigError(f"reg_gamma must be >= 0, got {self.reg_gamma!r}")
        for name in ("pgd_steps", "power_iters"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        for name in ("update_every", "target_chunk"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"{name} must be a positive integer or None, got {v!r}")
        return self


@struct.dataclass
class TargetState:
    """One target's state (stacked over targets on a leading axis in the simulation).

    Attributes:
      params: float32[d] the target's flattened model ``w``.
      alpha: float32[P] its weights over its P peers (P = K, or 1 for ``local``).
      bias: float32[P, d] EMA of ``g_i - g_0`` (the bias estimates ``b_i``; row 0 of the target
        stays 0).
      own_grad: float32[d] EMA of the target's own gradient ``g_0`` (``bias + own_grad``
        approximates each peer's EMA gradient for the ``similarity`` baseline).
      var: float32[P] EMA of each peer's minibatch-gradient variance ``sigma_i^2``.
      sq_norm: float32[P] EMA of ``||g_i||^2`` (the partial-participation variance term).
      num_obs: int32[P] observations of each peer so far (an EMA starts at its first value).
      smoothness: the last estimate of ``L``.
      lr: the step ``eta`` in use.
      lam: the last ``lambda_reg``.
      bound: ``Phi(alpha)`` at the last weight update (estimated bias and variances).
      risk_bound: the running upper bound of the target's risk,
        ``f_0(w_0) + sum_s eta/2 (Phi_s(alpha_s) - a ||grad f_0(w_s)||^2)`` with every quantity
        estimated online (plug-in, so an estimate of a bound, not a certificate).
      premise: bool, whether ``L eta <= 1/2`` (``a >= 0``; ``<= 1`` for ``bound="descent"``)
        held, with the estimated ``L``, at every step so far: where it failed the running
        risk bound is no descent guarantee and is not reported.
      ftal_quad, ftal_lin: FTAL's accumulated surrogate (``solver="ftal"``).
    """

    params: Array
    alpha: Array
    bias: Array
    own_grad: Array
    var: Array
    sq_norm: Array
    num_obs: Array
    smoothness: Array
    lr: Array
    lam: Array
    bound: Array
    risk_bound: Array
    premise: Array
    ftal_quad: Array
    ftal_lin: Array


@struct.dataclass
class PersonalizedState:
    """``epoch``: lazy-update periods done; ``key``: the run's base key; ``targets``: the
    :class:`TargetState` of every target, stacked."""

    epoch: Array
    key: Array
    targets: TargetState


class EpochLog(NamedTuple):
    """Per epoch and target (arrays ``[epochs, T, ...]`` on the host).

    ``alpha [.., P]`` after the epoch's weight update; ``bound``, ``lam``, ``smoothness``,
    ``lr``, ``premise`` as in :class:`TargetState`; ``risk_bound`` likewise, NaN where the
    premise has failed; ``train_loss`` the mean minibatch loss of the target's own gradients
    over the epoch; ``grad_norm_sq`` the mean unbiased estimate of ``||grad f_0(w_t)||^2``;
    ``unobserved_weight`` the weight on peers not observed yet (0 by construction: the check
    of the partial-participation fix).
    """

    alpha: Array
    bound: Array
    risk_bound: Array
    lam: Array
    smoothness: Array
    lr: Array
    train_loss: Array
    grad_norm_sq: Array
    premise: Array
    unobserved_weight: Array
