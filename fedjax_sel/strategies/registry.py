"""The strategy registry: names -> factories ``factory(*, per_round, **hyperparameters)``.

A strategy's hyperparameters are its factory's keyword parameters (their defaults and type
hints); :class:`fedjax_sel.registry.Registry` converts ``--strategy-arg key=value`` text to them.
"""

from __future__ import annotations

from collections.abc import Callable

from fedjax_sel.base import ConfigError, Strategy
from fedjax_sel.registry import Entry, Registry, convert

STRATEGIES = Registry("strategy", fixed=("per_round",), package="fedjax_sel.strategies")

StrategyEntry = Entry


def register_strategy(
    name: str,
    *,
    description: str,
    reference: str = "",
    replace: bool = False,
    traced: tuple[str, ...] = (),
    traced_defaults: Callable[[dict], dict] | None = None,
) -> Callable:
    """Decorator registering a strategy factory under ``name`` (see :class:`Registry`).
    ``traced``: the hyperparameters the factory traces through its state
    (:func:`fedjax_sel.strategies.hyperparams.inject_hyperparams`). ``traced_defaults``: for
    traced options whose default is ``None`` (filled in by the factory from another option,
    e.g. Oort's ``preset``), ``strategy_args -> {name: value}`` gives the values they take."""
    info: dict = {"traced": tuple(traced)}
    if traced_defaults is not None:
        info["traced_defaults"] = traced_defaults
    return STRATEGIES.register(
        name, description=description, reference=reference, replace=replace, **info
    )


def traced_hyperparams(name: str) -> tuple[str, ...]:
    """The hyperparameters strategy ``name`` traces (a grid of them shares one program)."""
    return tuple(STRATEGIES[name].info.get("traced", ()))


def traced_values(name: str, strategy_args: dict) -> dict[str, float]:
    """The values of strategy ``name``'s traced hyperparameters given its arguments (the
    factory's defaults for those not given, or ``None``: its ``traced_defaults``)."""
    entry = STRATEGIES[name]
    filled = None
    out = {}
    for key in traced_hyperparams(name):
        option = entry.options[key]
        value = strategy_args.get(key, option.default)
        value = convert(value, option.annotation, what=f"strategy {name!r}", key=key)
        if value is None:
            if filled is None:
                filled = entry.info["traced_defaults"](dict(strategy_args))
            value = filled[key]
        out[key] = float(value)
    return out


def make_strategy(name: str, per_round: int, **hyperparameters) -> Strategy:
    """Builds the registered strategy ``name``; text values (CLI ``key=value``) are converted
    to the factory's parameter types."""
    if isinstance(per_round, bool) or int(per_round) != per_round or per_round < 1:
        raise ConfigError(f"per_round must be a positive integer, got {per_round!r}")
    strategy = STRATEGIES.build(name, per_round=int(per_round), **hyperparameters)
    return strategy._replace(name=name)
