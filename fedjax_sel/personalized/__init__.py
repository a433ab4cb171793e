"""Personalized mode: SP-CACW (selfish personalized learning with convergence-aware client
weighting) and its baselines, every client a target at once (``docs/sp_cacw.md``). The runs go
through the experiment layer (``mode="personalized"``, or the Python shortcut
:func:`fedjax_sel.experiment.personalized.run_method`, also ``fedjax_sel.run_method``).

>>> from fedjax_sel import run_method
>>> from fedjax_sel.personalized import PersonalizedConfig
>>> res = run_method("sp_cacw", dataset, model, epochs=40, eval_every=5,
...                  config=PersonalizedConfig(lr=0.1), track_bound=True)
"""

from fedjax_sel.personalized.methods import epoch_steps
from fedjax_sel.personalized.results import (
    ALL_METHODS,
    MethodResult,
    own_cluster_mass,
    self_weight,
    summarize,
    summary_row,
)
from fedjax_sel.personalized.simulator import PersonalizedSimulation
from fedjax_sel.personalized.state import (
    METHODS,
    EpochLog,
    PersonalizedConfig,
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
    "self_weight",
    "summarize",
    "summary_row",
]
