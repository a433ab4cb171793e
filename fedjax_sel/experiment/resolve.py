"""A configuration resolved once: :func:`resolve` checks a :class:`~fedjax_sel.config.RunConfig`
against the registries and parses every spec it holds, into one frozen :class:`Resolved`.

Each entry point (``fedjax-sel run``, :func:`~fedjax_sel.experiment.run.run_experiment`,
:func:`~fedjax_sel.experiment.run.run_group`, a sweep's or a suite's cells, the benchmarks)
resolves its configurations once; everything after it reads the :class:`Resolved` (or its
canonical ``config``) and parses nothing again.

>>> r = resolve(RunConfig(strategy="power_of_choice", strategy_args={"d": "20"}))
>>> r.config.strategy_args
{'d': 20}
>>> resolve(r.config) == r
True
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from fedjax_sel.availability import AVAILABILITY
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig, check_per_round, personalized_ignored
from fedjax_sel.data.datasets import DATASETS
from fedjax_sel.engine.fedbuff import FedBuff
from fedjax_sel.engine.fedbuff import from_spec as fedbuff_from_spec
from fedjax_sel.engine.system import SYSTEMS
from fedjax_sel.models import MODELS
from fedjax_sel.personalized.methods import PERSONALIZED_METHODS
from fedjax_sel.registry import Registry, parse_spec
from fedjax_sel.strategies import STRATEGIES
from fedjax_sel.training.local import Parallel, parse_parallel


class Spec(NamedTuple):
    """A registry entry's name and its typed options: what a ``name:key=value`` text means
    (``markov:pi=0.5`` -> ``Spec("markov", {"pi": 0.5})``)."""

    name: str
    options: dict[str, Any]

    def build(self, registry: Registry) -> Any:
        """The object ``registry`` builds from this entry and options."""
        return registry.build(self.name, **self.options)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A resolved configuration (:func:`resolve`).

    Attributes:
      config: the canonical configuration: validated, option dictionaries typed through their
        registries, ``per_round`` set to ``--async``'s concurrency (what ``config.json``
        records and :meth:`RunConfig.results_key` hashes).
      availability: the availability model's entry and options.
      system: the system model's (``None``: no device profiles, no virtual clock).
      asynchronous: FedBuff's settings (``None``: synchronous rounds).
      parallel: the client parallelism (``auto`` is measured when the simulation is built).
    """

    config: RunConfig
    availability: Spec
    system: Spec | None
    asynchronous: FedBuff | None
    parallel: Parallel

    @property
    def strategy_args(self) -> dict[str, Any]:
        """The strategy's (or personalized method's) options, typed."""
        return self.config.strategy_args


def resolve(config: RunConfig | Resolved) -> Resolved:
    """``config`` validated and resolved: unknown or malformed options (strategy, data set,
    model, availability, system, ``--async``, ``--parallel``) are a :class:`ConfigError`
    naming them. A :class:`Resolved` is returned as it is; resolving a resolved
    configuration (``resolve(r.config)``) gives an equal one."""
    if isinstance(config, Resolved):
        return config
    canonical = config.validate()
    changes: dict[str, Any] = {}
    if canonical.mode == "personalized":
        # what the personalized engine never reads: refused rather than silently ignored
        ignored = personalized_ignored(config)
        if ignored:
            raise ConfigError(
                f"mode=personalized trains every client against every target each round "
                f"and ignores {', '.join(ignored)}: leave them out"
            )
        methods = PERSONALIZED_METHODS
    else:
        methods = STRATEGIES
    changes["strategy_args"] = methods.resolve(canonical.strategy, canonical.strategy_args)
    parallel = parse_parallel(canonical.parallel)
    changes["dataset_args"] = DATASETS.resolve(canonical.dataset, canonical.dataset_args)
    model = canonical.model or DATASETS[canonical.dataset].info["default_model"]
    changes["model_args"] = MODELS.resolve(model, canonical.model_args)
    availability = _spec(AVAILABILITY, canonical.availability, "availability")
    system = None
    if canonical.system is not None:
        system = _spec(SYSTEMS, canonical.system, "system model")
    elif canonical.deadline is not None or canonical.overcommit != 1.0:
        raise ConfigError(
            "--deadline and --overcommit need device profiles: give --system (e.g. "
            "--system lognormal)"
        )
    asynchronous = None
    if canonical.asynchronous is not None:
        if canonical.mode != "global":
            raise ConfigError("--async runs global-model strategies (mode=global) only")
        if canonical.system is None:
            raise ConfigError(
                "--async needs device profiles for its clock: give --system (e.g. "
                "--system lognormal)"
            )
        asynchronous = fedbuff_from_spec(canonical.asynchronous, canonical.per_round)
        changes["per_round"] = asynchronous.concurrency
        check_per_round(changes["per_round"], canonical.num_clients, " (--async's concurrency)")
    return Resolved(
        dataclasses.replace(canonical, **changes), availability, system, asynchronous, parallel
    )


def _spec(registry: Registry, text: str, what: str) -> Spec:
    """``name:key=value,...`` -> its entry's name and typed options."""
    name, positional, pairs = parse_spec(text, what=what)
    return Spec(name, registry.resolve(name, pairs, positional))
