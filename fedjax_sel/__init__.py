"""fedjax_sel: a JAX-accelerated, vectorized simulator for client selection in federated
learning.

The public API is flat: everything below is importable from ``fedjax_sel`` itself (resolved on
first use, so ``import fedjax_sel`` stays cheap)::

    from fedjax_sel import RunConfig, run_experiment, run_sweep, compare
    result = run_experiment(RunConfig(strategy="power_of_choice", rounds=50), "runs/poc")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # configuration and runs
    "RunConfig": "fedjax_sel.config",
    "load_config": "fedjax_sel.config",
    "resolve": "fedjax_sel.experiment.resolve",
    "Resolved": "fedjax_sel.experiment.resolve",
    "run_experiment": "fedjax_sel.experiment",
    "run_group": "fedjax_sel.experiment",
    "run_sweep": "fedjax_sel.experiment",
    "load_sweep": "fedjax_sel.experiment",
    "compare": "fedjax_sel.experiment",
    "build_simulation": "fedjax_sel.experiment",
    "RunResult": "fedjax_sel.experiment",
    # the engine
    "Simulation": "fedjax_sel.engine.simulation",
    "RoundSpec": "fedjax_sel.engine",
    "init_state": "fedjax_sel.engine",
    "round_fn": "fedjax_sel.engine",
    "SimState": "fedjax_sel.engine.state",
    "LocalConfig": "fedjax_sel.training",
    "HParams": "fedjax_sel.training",
    "server_optimizer": "fedjax_sel.training",
    # the protocol
    "Strategy": "fedjax_sel.base",
    "Selection": "fedjax_sel.base",
    "RoundInputs": "fedjax_sel.base",
    "RoundFeedback": "fedjax_sel.base",
    "ClientOracle": "fedjax_sel.base",
    "SimSpec": "fedjax_sel.base",
    "AvailabilityModel": "fedjax_sel.base",
    "ConfigError": "fedjax_sel.base",
    "init_empty_state": "fedjax_sel.base",
    "update_identity": "fedjax_sel.base",
    # registries
    "STRATEGIES": "fedjax_sel.strategies",
    "make_strategy": "fedjax_sel.strategies",
    "register_strategy": "fedjax_sel.strategies",
    "MODELS": "fedjax_sel.models",
    "Model": "fedjax_sel.models",
    "make_model": "fedjax_sel.models",
    "register_model": "fedjax_sel.models",
    "from_linen": "fedjax_sel.models",
    "DATASETS": "fedjax_sel.data",
    "FederatedDataset": "fedjax_sel.data",
    "load_dataset": "fedjax_sel.data",
    "register_dataset": "fedjax_sel.data",
    "AVAILABILITY": "fedjax_sel.availability",
    "register_availability": "fedjax_sel.availability",
    "availability_from_spec": ("fedjax_sel.availability", "from_spec"),
    "REPRODUCTIONS": "fedjax_sel.experiment.reproductions",
    "run_reproduction": "fedjax_sel.experiment.reproductions",
    "PERSONALIZED_METHODS": "fedjax_sel.personalized.methods",
    "run_method": "fedjax_sel.experiment.personalized",
    "PersonalizedConfig": "fedjax_sel.personalized",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'fedjax_sel' has no attribute {name!r}")
    module, attr = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
