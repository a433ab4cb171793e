"""Personalized mode: SP-CACW (selfish personalized learning with convergence-aware client
weighting) and its baselines, every client a target at once (``docs/sp_cacw.md``).

>>> from fedjax_sel.personalized import PersonalizedConfig, run_method
>>> res = run_method("sp_cacw", dataset, model, epochs=40, eval_every=5,
...                  config=PersonalizedConfig(lr=0.1), track_bound=True)
"""

from fedjax_sel.personalized.experiment import (
    ALL_METHODS,
    MethodResult,
    epoch_steps,
    own_cluster_mass,
    run_method,
    summary_row,
)
from fedjax_sel.personalized.simulator import (
    METHODS,
    EpochLog,
    PersonalizedConfig,
    PersonalizedSimulation,
    PersonalizedState,
    TargetState,
)

__all__ = [
    "ALL_METHODS",
    "METHODS",
    "EpochLog",
    "MethodResult",
    "PersonalizedConfig",
    "PersonalizedSimulation",
    "PersonalizedState",
    "TargetState",
    "epoch_steps",
    "own_cluster_mass",
    "run_method",
    "summary_row",
]
