"""The strategy registry: names -> factories ``factory(*, per_round, **hyperparameters)``.

A strategy's hyperparameters are its factory's keyword parameters (their defaults and type
hints); :class:`fedjax_sel.registry.Registry` converts ``--strategy-arg key=value`` text to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedjax_sel.base import ConfigError, Strategy
from fedjax_sel.registry import Registry

STRATEGIES = Registry("strategy", fixed=("per_round",), package="fedjax_sel.strategies")


def register_strategy(
    name: str, *, description: str, reference: str = "", replace: bool = False
) -> Callable:
    """Decorator registering a strategy factory under ``name`` (see :class:`Registry`). What
    the factory traces through its state is what it passes to
    :func:`~fedjax_sel.strategies.hyperparams.inject_hyperparams` (:func:`traced_values`)."""
    return STRATEGIES.register(name, description=description, reference=reference, replace=replace)


def traced_values(name: str, per_round: int, strategy_args: Mapping[str, Any]) -> dict[str, float]:
    """Strategy ``name``'s traced hyperparameters and the values they take with these
    arguments: those of the strategy they build (``Strategy.hyperparams``; a build is cheap
    and on the host). ``per_round``: the slots it fills (its checks may read them)."""
    return dict(make_strategy(name, per_round, **strategy_args).hyperparams)


def make_strategy(name: str, per_round: int, **hyperparameters) -> Strategy:
    """Builds the registered strategy ``name``; text values (CLI ``key=value``) are converted
    to the factory's parameter types."""
    if isinstance(per_round, bool) or int(per_round) != per_round or per_round < 1:
        raise ConfigError(f"per_round must be a positive integer, got {per_round!r}")
    strategy = STRATEGIES.build(name, per_round=int(per_round), **hyperparameters)
    return strategy._replace(name=name)
