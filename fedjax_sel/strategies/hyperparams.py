"""Strategy hyperparameters traced through the round, the way ``optax.inject_hyperparams``
traces an optimizer's.

A strategy closes over its hyperparameters, so each value would be a constant of its own
compiled program. :func:`inject_hyperparams` keeps the numeric ones that change no shape (a
softmax temperature, a score weight) in the strategy's state instead and rebuilds the
strategy's functions from that state on every call: the members of a vmapped batch may then
differ in them and one program serves a whole grid of values
(:func:`fedjax_sel.experiment.loop.program_key` leaves them out). A strategy opts in by building
its functions in a ``build(**traced)`` closure, after checking the values it was given::

    @register_strategy("mine", description="...")
    def mine(*, per_round, temperature=1.0):
        if not temperature > 0:
            raise ConfigError(...)          # checks see the concrete values, once

        def build(temperature):             # a float here, a traced scalar inside the round
            def select(state, inputs, oracle, key): ...
            return Strategy(init, select, update)

        return inject_hyperparams(build, temperature=temperature)

The keywords of that call are the one declaration of what is traced: the strategy it returns
records them with their values (``Strategy.hyperparams``), which is where a grid, the run
loop and ``fedjax-sel list`` read them
(:func:`fedjax_sel.strategies.registry.traced_values`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PyTree, Strategy


class InjectedState(NamedTuple):
    """A strategy's state with its traced hyperparameters: ``hyperparams`` (float32 scalars,
    stacked per member in a vmapped batch) beside ``inner``, the state of the strategy built
    from them (what its own functions read: ``state.strategy_state.inner.table``)."""

    hyperparams: dict[str, Array]
    inner: PyTree


def inject_hyperparams(build: Callable[..., Strategy], **values: float) -> Strategy:
    """The strategy ``build(**values)`` with ``values`` traced (module docstring)."""
    template = build(**values)

    def rebuilt(state: InjectedState) -> Strategy:
        return build(**state.hyperparams)

    def injected(state) -> InjectedState:
        # a bare inner state (built by hand, as tests do) runs at the values it was built with
        if isinstance(state, InjectedState):
            return state
        return InjectedState({k: jnp.asarray(v, jnp.float32) for k, v in values.items()}, state)

    def init(key, spec, hyperparams: dict[str, float] | None = None) -> InjectedState:
        # a member of a grid starts from its own values: anything init derives from them
        # (a starting temperature, 1/T for beta = 0) is its own too
        chosen = {**values, **(hyperparams or {})}
        strategy = template if not hyperparams else build(**chosen)
        hyper = {k: jnp.asarray(v, jnp.float32) for k, v in chosen.items()}
        return InjectedState(hyper, strategy.init(key, spec))

    def select(state: InjectedState, inputs, oracle, key):
        state = injected(state)
        selection, inner = rebuilt(state).select(state.inner, inputs, oracle, key)
        return selection, state._replace(inner=inner)

    def update(state: InjectedState, selection, feedback) -> InjectedState:
        state = injected(state)
        return state._replace(inner=rebuilt(state).update(state.inner, selection, feedback))

    start_params = metrics = None
    if template.start_params is not None:

        def start_params(state: InjectedState, selection, params):
            state = injected(state)
            return rebuilt(state).start_params(state.inner, selection, params)

    if template.metrics is not None:

        def metrics(state: InjectedState, params, evaluator):
            state = injected(state)
            return rebuilt(state).metrics(state.inner, params, evaluator)

    return template._replace(
        init=init,
        select=select,
        update=update,
        start_params=start_params,
        metrics=metrics,
        hyperparams=tuple((k, float(v)) for k, v in values.items()),
    )


def init_with_hyperparams(strategy: Strategy, key: Any, spec: Any, values: dict[str, float]) -> Any:
    """The strategy's initial state with its traced hyperparameters at ``values`` (the others
    at the values it was built with; names the strategy does not trace are an error)."""
    if not values:
        return strategy.init(key, spec)
    traced = [name for name, _ in strategy.hyperparams]
    unknown = sorted(set(values) - set(traced))
    if unknown:
        raise ConfigError(f"strategy {strategy.name!r} traces {traced}, not {unknown}")
    return strategy.init(key, spec, hyperparams=values)
