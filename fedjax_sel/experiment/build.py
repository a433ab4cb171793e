"""From a configuration to the objects a run needs: its data set, model, local-training
settings and, from a :class:`~fedjax_sel.experiment.resolve.Resolved` configuration, its
:class:`~fedjax_sel.engine.simulation.Simulation`."""

from __future__ import annotations

import collections
import json
import math
from collections.abc import MutableMapping
from typing import Any

import jax

from fedjax_sel.availability import AVAILABILITY
from fedjax_sel.config import RunConfig, check_per_round
from fedjax_sel.data.datasets import FederatedDataset, load_dataset
from fedjax_sel.engine import system as system_lib
from fedjax_sel.engine.simulation import Simulation, default_mesh
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.experiment.resolve import Resolved
from fedjax_sel.input_checks import check_claimed_bytes
from fedjax_sel.models import Model, make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training.autotune import resolve_parallel
from fedjax_sel.training.local import LocalConfig
from fedjax_sel.training.server import server_spec
from fedjax_sel.tree import nbytes


def _data_args(config: RunConfig) -> dict[str, Any]:
    return dict(
        num_clients=config.num_clients,
        partition=config.partition,
        seed=config.seed if config.data_seed is None else config.data_seed,
        data_path=config.data_path,
        test_fraction=config.test_fraction,
        layout=config.layout,
        server_fraction=config.server_fraction,
        **config.dataset_args,
    )


class DataMemo(collections.OrderedDict):
    """Loaded data sets for :func:`load_data_for`, at most ``capacity`` of them: the least
    recently used one is dropped to make room (a suite's task keeps one data configuration's
    seeds, its tuning and evaluation seeds, without holding every configuration's)."""

    def __init__(self, capacity: int):
        super().__init__()
        if capacity < 1:
            raise ValueError(f"DataMemo capacity must be at least 1, got {capacity}")
        self.capacity = capacity

    def __getitem__(self, key: str) -> FederatedDataset:
        self.move_to_end(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: FederatedDataset) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


def load_data_for(
    config: RunConfig, memo: MutableMapping[str, FederatedDataset] | None = None
) -> FederatedDataset:
    """The data set of ``config`` (partitioned with its data seed). ``memo``: data sets
    already loaded, by everything the load reads (a suite's programs on one task share their
    seeds' data sets; a loaded data set is never changed, so sharing it changes no bit)."""
    if memo is None:
        return load_dataset(config.dataset, **_data_args(config))
    key = json.dumps([config.dataset, _data_args(config)], sort_keys=True, default=str)
    if key not in memo:
        memo[key] = load_dataset(config.dataset, **_data_args(config))
    return memo[key]


def local_config(config: RunConfig) -> LocalConfig:
    return LocalConfig(
        batch_size=config.batch_size,
        local_steps=config.local_steps,
        local_epochs=config.local_epochs,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        prox=config.prox_mu > 0,
    )


def model_for(config: RunConfig, dataset: FederatedDataset) -> Model:
    return make_model(
        config.model or dataset.default_model,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        **config.model_args,
    )


def build_simulation(
    resolved: Resolved,
    dataset: FederatedDataset | None = None,
    *,
    model: Model | None = None,
    n_max: int | None = None,
) -> Simulation:
    """The :class:`Simulation` of a resolved configuration (loading the data unless given;
    ``model`` replaces the configured one, e.g. a user's own flax model). Parses nothing: every
    spec was parsed by :func:`~fedjax_sel.experiment.resolve.resolve`."""
    config = resolved.config
    dataset = dataset if dataset is not None else load_data_for(config)
    # before anything is sized by it (the parallelism measurement samples per_round clients)
    check_per_round(config.per_round, dataset.num_clients, of=f" of data set {dataset.name!r}")
    check_claimed_bytes(  # one client's minibatch of float32 inputs, the least any mode holds
        4 * config.batch_size * math.prod(dataset.input_shape),
        f"a minibatch of batch_size={config.batch_size} examples of shape {dataset.input_shape}",
    )
    slots = system_lib.overcommitted(config.per_round, config.overcommit, dataset.num_clients)
    model = model if model is not None else model_for(config, dataset)
    check_claimed_bytes(  # sizes only (eval_shape): nothing allocated
        nbytes(jax.eval_shape(model.init, jax.random.key(0))),
        f"the parameters of model {model.name!r} (model_args {config.model_args})",
    )
    local = local_config(config)
    parallel, choice = resolve_parallel(
        resolved.parallel,
        model,
        local,
        dataset.train,
        config.per_round,
        persistent_state=config.persistent_client_state,
    )
    mesh = default_mesh()
    spec = RoundSpec.create(
        dataset,
        model,
        make_strategy(config.strategy, slots, **config.strategy_args),
        local=local,
        per_round=config.per_round,
        availability=resolved.availability.build(AVAILABILITY),
        server_tx=server_spec(  # its learning rate: the members' HParams.server_lr
            config.server,
            momentum=config.server_momentum,
            weight_decay=config.server_weight_decay,
        ),
        parallel=parallel,
        persistent_client_state=config.persistent_client_state,
        mesh=mesh,
        n_max=n_max,
        system=None if resolved.system is None else resolved.system.build(system_lib.SYSTEMS),
        deadline=config.deadline,
        overcommit=config.overcommit,
        dropout=config.dropout,
        asynchronous=resolved.asynchronous,
        aggregation=config.aggregation,
    )
    return Simulation(
        spec,
        dataset,
        num_rounds=config.rounds,
        chunk_size=config.eval_every,
        mesh=mesh,
        parallel_choice=choice,
    )
