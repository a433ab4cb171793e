"""The personalized methods by name: SP-CACW, its peer-weighting baselines and the
model-averaging baselines, each a factory returning a :class:`PersonalizedProgram`.

``fedjax-sel run --mode personalized --strategy sp_cacw --strategy-arg solver=pgd ...`` and
sweeps reach them through :data:`PERSONALIZED_METHODS`; ``fedjax_sel.run_method``
is the Python entry point. Every method counts time in local SGD steps per client: one step of
a target, one local step of FedAvg/IFCA; a round (``rounds`` in the configuration) is one
lazy-update period of ``update_every`` steps (default: one local epoch of the median client).

* Peer weightings (:class:`~fedjax_sel.personalized.simulator.PersonalizedSimulation`):
  ``sp_cacw``, ``local``, ``uniform``, ``oracle`` (uniform over the target's true cluster),
  ``similarity`` (gradient cosine).
* Model averaging, on the engine's :class:`~fedjax_sel.engine.simulation.Simulation` with every
  client every round: ``fedavg`` (strategy ``full``: one global model, each target evaluated
  on its own test split) and ``ifca`` (the engine's ``ifca`` strategy with ``per_round = K``:
  each target evaluated under the cluster model with its lowest training loss).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.models import Model
from fedjax_sel.personalized.simulator import PersonalizedSimulation, check_targets, initial_key
from fedjax_sel.personalized.state import EpochLog, PersonalizedConfig
from fedjax_sel.registry import Registry

FIXED = ("dataset", "model", "lr", "batch_size", "update_every", "seed", "clusters")

PERSONALIZED_METHODS = Registry("personalized method", fixed=FIXED)
_D = PersonalizedConfig()  # the options' defaults live in PersonalizedConfig


class PersonalizedProgram(NamedTuple):
    """One personalized method on one data set, as pure-ish host functions.

    Attributes:
      init: ``seed -> state``.
      advance: ``(state, rounds) -> (state, log)``; ``log`` an :class:`EpochLog` (peer
        methods) or ``None``.
      evaluate: ``state -> {metric: float[T]}`` per target (``test_accuracy``, ``test_loss``,
        ``train_loss``, ``train_accuracy``, ...).
      weights: ``state -> float[T, K]`` the targets' peer weights, or ``None``.
      target_ids: int[T].
      update_every: local SGD steps per round.
      state_template: ``seed -> state`` with the checkpoint's structure (``init``).
    """

    init: Callable[[int], Any]
    advance: Callable[[Any, int], tuple[Any, EpochLog | None]]
    evaluate: Callable[[Any], dict[str, np.ndarray]]
    weights: Callable[[Any], np.ndarray] | None
    target_ids: np.ndarray
    update_every: int


def epoch_steps(dataset: FederatedDataset, batch_size: int, update_every: int | None) -> int:
    """Steps per lazy-update period: ``update_every``, or one epoch of the median client."""
    if update_every is not None:
        return int(update_every)
    median = float(np.median(np.asarray(dataset.train.counts)))
    return max(1, math.ceil(median / batch_size))


def _peer_program(
    method: str,
    *,
    dataset: FederatedDataset,
    model: Model,
    lr: float,
    batch_size: int,
    update_every: int | None,
    seed: int = 0,
    clusters: Sequence[int] | None = None,
    targets: tuple[int, ...] | None = None,
    lr_rule: Literal["fixed", "smoothness"] = _D.lr_rule,
    ema: float = _D.ema,
    participation: float = _D.participation,
    bound: Literal["appendix_d", "descent"] = _D.bound,
    reg_gamma: float = _D.reg_gamma,
    solver: Literal["ftal", "pgd"] = _D.solver,
    pgd_steps: int = _D.pgd_steps,
    power_iters: int = _D.power_iters,
    init_weights: Literal["uniform", "self"] = _D.init_weights,
    debias: bool = _D.debias,
    observed_only: bool = _D.observed_only,
    target_chunk: int | None = _D.target_chunk,
    track_bound: bool = False,
) -> PersonalizedProgram:
    del seed
    config = PersonalizedConfig(
        method=method,
        lr=lr,
        lr_rule=lr_rule,
        batch_size=batch_size,
        update_every=update_every,
        ema=ema,
        participation=participation,
        bound=bound,
        reg_gamma=reg_gamma,
        solver=solver,
        pgd_steps=pgd_steps,
        power_iters=power_iters,
        init_weights=init_weights,
        debias=debias,
        observed_only=observed_only,
        target_chunk=target_chunk,
    )
    sim = PersonalizedSimulation(dataset, model, config, targets=targets, clusters=clusters)
    return PersonalizedProgram(
        init=sim.init,
        advance=sim.run_epochs,
        evaluate=lambda state: sim.evaluate(state, track_bound),
        weights=sim.weights,
        target_ids=np.asarray(sim.target_ids),
        update_every=sim.update_every,
    )


_PEER_METHODS = {
    "sp_cacw": "SP-CACW: peer weights minimising the convergence bound (Algorithm 1)",
    "local": "local training only (the target's own gradient)",
    "uniform": "uniform peer weights 1/K",
    "oracle": "uniform weights over the target's true cluster (needs the data's clusters)",
    "similarity": "peer weights proportional to the positive gradient cosine (lazy updates)",
}
for _name, _desc in _PEER_METHODS.items():
    PERSONALIZED_METHODS.add(
        _name,
        functools.update_wrapper(functools.partial(_peer_program, _name), _peer_program),
        description=_desc,
    )


def _engine_program(
    strategy: str,
    *,
    dataset: FederatedDataset,
    model: Model,
    lr: float,
    batch_size: int,
    update_every: int | None,
    seed: int = 0,
    clusters: Sequence[int] | None = None,
    targets: tuple[int, ...] | None = None,
    num_clusters: int | None = None,
) -> PersonalizedProgram:
    """FedAvg (``full``) or IFCA (``ifca``) on the engine, every client every round."""
    del clusters
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.oracle import evaluator as engine_evaluator
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.strategies.cluster_models import assigned_client_metrics
    from fedjax_sel.strategies.ifca import assign_by_loss
    from fedjax_sel.training.evaluate import evaluate_all_clients
    from fedjax_sel.training.hparams import HParams
    from fedjax_sel.training.local import LocalConfig

    del seed
    ids = check_targets(dataset, targets)
    k = dataset.num_clients
    steps = epoch_steps(dataset, batch_size, update_every)
    args: dict[str, Any] = {}
    if strategy == "ifca":
        args = {
            "num_clusters": int(num_clusters or dataset.info.get("num_clusters", 2)),
            "cluster_weighting": "uniform",
        }
    elif num_clusters is not None:
        raise ConfigError("num_clusters is an option of ifca, not of fedavg")
    spec = RoundSpec.create(
        dataset,
        model,
        make_strategy(strategy, k, **args),
        local=LocalConfig(batch_size=batch_size, local_steps=steps),
        per_round=k,
    )
    sim = Simulation(spec, dataset, num_rounds=1, chunk_size=1)

    def init(seed: int):
        # every method of a comparison starts from the same model
        return sim.init(seed, params=model.init(initial_key(seed)), hparams=HParams.of(lr))

    def advance(state, n: int):
        return sim.run_rounds(state, n)[0], None

    @jax.jit
    def _evaluate(state, data):
        evaluator = engine_evaluator(spec, data)
        if strategy == "ifca":
            models = state.strategy_state.models
            train_loss = jax.lax.map(lambda m: evaluator.client_train(m)[0], models)
            assign = assign_by_loss(train_loss)
            out = assigned_client_metrics(models, assign, evaluator)
            out["cluster"] = assign.astype(np.float32)
            return out
        test_loss, test_acc, _ = evaluate_all_clients(model, state.params, data.test)
        train_loss, train_acc, _ = evaluate_all_clients(model, state.params, data.train)
        return {
            "test_loss": test_loss,
            "test_accuracy": test_acc,
            "train_loss": train_loss,
            "train_accuracy": train_acc,
        }

    def evaluate(state):
        return {name: np.asarray(v)[ids] for name, v in _evaluate(state, sim.data).items()}

    return PersonalizedProgram(init, advance, evaluate, None, ids, steps)


PERSONALIZED_METHODS.add(
    "fedavg",
    functools.update_wrapper(functools.partial(_engine_program, "full"), _engine_program),
    description="FedAvg, every client every round: one global model",
)
PERSONALIZED_METHODS.add(
    "ifca",
    functools.update_wrapper(functools.partial(_engine_program, "ifca"), _engine_program),
    description="IFCA (the engine's ifca strategy, every client every round): each target "
    "under the cluster model with its lowest training loss",
)


def build_program(
    method: str,
    dataset: FederatedDataset,
    model: Model,
    *,
    lr: float,
    batch_size: int,
    update_every: int | None,
    clusters: Sequence[int] | None = None,
    **options,
) -> PersonalizedProgram:
    """The :class:`PersonalizedProgram` of ``method`` (``options`` typed by the registry)."""
    if clusters is None:
        clusters = dataset.info.get("cluster")
    return PERSONALIZED_METHODS.build(
        method,
        dataset=dataset,
        model=model,
        lr=lr,
        batch_size=batch_size,
        update_every=update_every,
        clusters=clusters,
        **options,
    )
