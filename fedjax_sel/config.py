"""A run's whole configuration: one :class:`RunConfig`, the single owner of every setting.

Each field is declared once, with its default, type and help text; the ``fedjax-sel run``
flags are generated from the fields (:func:`add_config_flags`), a TOML or JSON file gives the
same fields by name (:func:`load_config`), and ``config.json`` written by a run reloads into
the identical configuration. Option dictionaries (``strategy_args``, ``dataset_args``,
``model_args``) are typed by the registries when the configuration is resolved
(:func:`fedjax_sel.experiment.resolve.resolve`, which also parses its specs); this module
declares, checks and (de)serialises, and imports no registry.

>>> cfg = RunConfig(strategy="power_of_choice", strategy_args={"d": "20"}, rounds="5").validate()
>>> cfg.rounds, cfg.strategy_args
(5, {'d': '20'})
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from fedjax_sel.base import ConfigError
from fedjax_sel.input_checks import check_seed
from fedjax_sel.registry import convert, parse_pairs


def setting(
    default: Any,
    help: str,  # noqa: A002 (argparse's name)
    *,
    group: str,
    flag: str | None = None,
    metavar: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    positive: bool = False,
    exclusive: str | None = None,
    results: bool = True,
) -> Any:
    """A :class:`RunConfig` field with its command-line metadata.

    Args:
      default: the default value (a dict default is copied per instance).
      help: the flag's help text.
      group: the ``--help`` section.
      flag: the flag's name when it is not the field's (``--clients`` for ``num_clients``).
      minimum, maximum: inclusive numeric bounds; ``below``: an exclusive upper bound;
        ``positive``: strictly above zero.
      exclusive: another field that may not be set together with this one.
      results: ``False`` for settings that cannot change the results (progress bar, profile
        timing, checkpoint frequency): they are ignored when a finished run is matched.
    """
    meta = dict(
        help=help,
        group=group,
        flag=flag,
        metavar=metavar,
        minimum=minimum,
        maximum=maximum,
        below=below,
        positive=positive,
        exclusive=exclusive,
        results=results,
    )
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_S, _D, _T, _R = "selection", "data and model", "training", "run"

# the largest whole number a setting may hold: the engine counts rounds, clients and steps in
# int32 (seeds have their own range, :data:`fedjax_sel.input_checks.SEED_MAX`)
INT_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything ``fedjax-sel run`` takes (``fedjax-sel run --help`` documents each field).

    Frozen: :meth:`validate` and :meth:`replace` return new configurations (and
    :func:`fedjax_sel.experiment.resolve.resolve` a resolved one).

    ``local_steps`` and ``local_epochs`` are exclusive; when neither is given, 10 local steps.
    ``None`` for ``num_clients``, ``partition`` and ``model`` means the data set's default.
    In ``mode="personalized"`` (SP-CACW and its baselines), ``strategy`` names the
    personalized method and ``strategy_args`` its options, ``rounds`` counts lazy-update
    periods and ``local_steps`` sets their length (default: one epoch of the median client).
    """

    mode: Literal["global", "personalized"] = setting(
        "global",
        "global: one model, a selection strategy; personalized: SP-CACW and its "
        "baselines (every client a target)",
        group=_S,
    )
    strategy: str = setting("uniform", "selection strategy (`fedjax-sel list`)", group=_S)
    strategy_args: dict[str, Any] = setting(
        {},
        "strategy hyperparameter; repeatable, or comma-separated (d=20,variant=cpow)",
        group=_S,
        flag="strategy-arg",
        metavar="KEY=VALUE",
    )
    label: str | None = setting(
        None,
        "display name of this run in tables and plots (default: the strategy)",
        group=_S,
        results=False,
    )
    per_round: int = setting(10, "clients selected per round (slots)", group=_S, minimum=1)
    availability: str = setting(
        "always",
        "always | bernoulli:p=P | markov[:pi=PI,lam=L] | markov_clustered | "
        "subset:n=N,every=E | trace:path=FILE (`fedjax-sel list`)",
        group=_S,
    )
    system: str | None = setting(
        None,
        "device profiles and a virtual clock: lognormal[:compute_ms=150,sigma=0.8,"
        "bandwidth_kbps=2200,bandwidth_sigma=0.8,noise=0] | pareto | normal | fedscale:path=FILE",
        group=_S,
    )
    deadline: float | None = setting(
        None,
        "seconds a round waits (stragglers send the steps they finished; needs --system)",
        group=_S,
        positive=True,
    )
    overcommit: float = setting(
        1.0,
        "select ceil(P x this) clients, keep the first P finishers (needs --system)",
        group=_S,
        minimum=1,
    )
    dropout: float = setting(
        0.0,
        "probability that a selected client fails and sends nothing",
        group=_S,
        minimum=0,
        below=1,
    )
    aggregation: Literal["strategy", "fedavg"] = setting(
        "strategy",
        "aggregation weights: strategy (each strategy's own) | fedavg (size-weighted FedAvg over "
        "the kept slots whatever the strategy: only the choice of clients differs, the "
        "benchmark's selection track)",
        group=_S,
    )
    asynchronous: str | None = setting(
        None,
        "asynchronous FL instead of rounds: fedbuff[:concurrency=C,buffer=B,alpha=0.5] "
        "(C clients in flight, default --per-round, which it then sets; a server update every "
        "B arrivals; needs --system)",
        group=_S,
        flag="async",
    )
    accuracy_targets: tuple[float, ...] = setting(
        (),
        "test accuracies whose first rounds and simulated seconds the summary reports (0.8-0.9)",
        group=_R,
        positive=True,
        maximum=1.0,
        results=False,
    )
    dataset: str = setting("digits", "data set (`fedjax-sel list`)", group=_D)
    dataset_args: dict[str, Any] = setting(
        {}, "data-set option; repeatable", group=_D, flag="dataset-arg", metavar="KEY=VALUE"
    )
    partition: str | None = setting(
        None,
        "iid | dirichlet:ALPHA | dirichlet:alpha=A,groups=G | shards:S | natural "
        "(default: the data set's)",
        group=_D,
    )
    num_clients: int | None = setting(
        None,
        "number of clients K (default: the data set's)",
        group=_D,
        flag="clients",
        minimum=1,
    )
    data_path: str | None = setting(
        None,
        "local data file or folder (else $FEDJAX_SEL_DATA_DIR, else tensorflow-datasets)",
        group=_D,
        flag="data-dir",
    )
    test_fraction: float | None = setting(
        None,
        "per-client test split fraction (default: the data set's)",
        group=_D,
        minimum=0,
        below=1,
    )
    server_fraction: float = setting(
        0.0,
        "fraction of every client's data held out as a server-held set (FilFL)",
        group=_D,
        minimum=0,
        below=1,
    )
    layout: Literal["auto", "padded", "flat"] = setting(
        "auto",
        "client storage: padded [K, n_max] or flat [N] (auto: padded unless it costs "
        "more than 1.5x)",
        group=_D,
    )
    model: str | None = setting(None, "model (default: the data set's)", group=_D)
    model_args: dict[str, Any] = setting(
        {},
        "model option; repeatable (hidden=200-200, ridge=0.01, conv_impl=xla, width=32)",
        group=_D,
        flag="model-arg",
        metavar="KEY=VALUE",
    )
    rounds: int = setting(100, "communication rounds T", group=_T, minimum=1)
    local_steps: int | None = setting(
        None,
        "local SGD steps per round (default 10)",
        group=_T,
        minimum=1,
        exclusive="local_epochs",
    )
    local_epochs: int | None = setting(
        None,
        "local epochs per round (instead of steps)",
        group=_T,
        minimum=1,
        exclusive="local_steps",
    )
    batch_size: int = setting(32, "local minibatch size", group=_T, minimum=1)
    lr: float = setting(0.05, "client learning rate", group=_T, positive=True)
    momentum: float = setting(0.0, "client SGD momentum", group=_T, minimum=0, below=1)
    weight_decay: float = setting(
        0.0, "client weight decay (PyTorch semantics)", group=_T, minimum=0
    )
    prox_mu: float = setting(0.0, "FedProx proximal mu (0 = FedAvg)", group=_T, minimum=0)
    persistent_client_state: bool = setting(
        False, "keep each client's optimizer state (momentum) across rounds", group=_T
    )
    server: Literal["sgd", "momentum", "adam"] = setting(
        "sgd", "server optimizer on the pseudo-gradient (FedAvg: sgd with lr 1)", group=_T
    )
    server_lr: float = setting(1.0, "server learning rate", group=_T, positive=True)
    server_momentum: float = setting(
        0.9, "server momentum (server=momentum)", group=_T, minimum=0, below=1
    )
    server_weight_decay: float = setting(0.0, "server weight decay", group=_T, minimum=0)
    matmul_precision: Literal["default", "bfloat16", "tensorfloat32", "float32"] = setting(
        "default",
        "precision of float32 matrix products and convolutions (jax.default_matmul_precision): "
        "default keeps the process's own setting (unset: XLA's, TensorFloat-32 on recent "
        "NVIDIA GPUs); bfloat16 and tensorfloat32 trade accuracy for speed on GPUs and TPUs, "
        "float32 is full precision there; CPUs compute float32 whatever it says",
        group=_T,
    )
    parallel: str = setting(
        "auto",
        "client parallelism: auto | vmap | map | chunked:C; a convolution model also takes "
        "conv=patches|xla|xla_nhwc (map:conv=xla_nhwc, chunked:4,conv=patches), the form a "
        "run reports its choice in",
        group=_T,
        results=False,
    )
    eval_every: int = setting(
        10, "rounds per compiled chunk and between evaluations", group=_R, minimum=1
    )
    eval_tail: int = setting(
        0,
        "the last N rounds are each evaluated, and stable_accuracy is their mean (0: the mean "
        "of the last 10 evaluations)",
        group=_R,
        minimum=0,
    )
    seed: int = setting(0, "run seed: initial model, availability, selection, training", group=_R)
    data_seed: int | None = setting(
        None, "partition / generator seed (default: the run seed)", group=_R
    )
    checkpoint_every: int = setting(
        5,
        "chunks between checkpoints of the whole simulation state (0: none)",
        group=_R,
        minimum=0,
        results=False,
    )
    profile: bool = setting(
        False,
        "time select / train / aggregate / eval separately (slower)",
        group=_R,
        results=False,
    )

    # ------------------------------------------------------------------------- checks
    def validate(self) -> RunConfig:
        """Checks every value that can be checked without the registries; returns the
        configuration with its values converted to their fields' types."""
        hints = typing.get_type_hints(RunConfig)
        values = {}
        for f in dataclasses.fields(self):
            value = convert(getattr(self, f.name), hints[f.name], what="configuration", key=f.name)
            values[f.name] = dict(value) if isinstance(value, dict) else value
        for f in dataclasses.fields(self):
            value, meta = values[f.name], f.metadata
            # a tuple's bounds hold for each of its numbers (accuracy targets in (0, 1])
            numbers = value if isinstance(value, tuple) else (value,)
            for number in numbers:
                if not isinstance(number, (int, float)) or isinstance(number, bool):
                    continue
                if isinstance(number, float) and not math.isfinite(number):
                    raise ConfigError(f"{f.name} must be finite numbers, got {value!r}")
                if isinstance(number, int) and abs(number) > INT_MAX and "seed" not in f.name:
                    raise ConfigError(f"{f.name} must be at most {INT_MAX}, got {value!r}")
                if not _in_range(number, meta):
                    raise ConfigError(f"{f.name} must be {_range_text(meta)}, got {value!r}")
            other = meta["exclusive"]
            if other and value is not None and values[other] is not None:
                raise ConfigError(
                    f"give {_flag(f)} or {_flag(_field(other))}, not both (got {f.name}={value} "
                    f"and {other}={values[other]})"
                )
        values["seed"] = check_seed(values["seed"], "seed")
        if values["data_seed"] is not None:
            values["data_seed"] = check_seed(values["data_seed"], "data_seed")
        if values["mode"] == "global" and values["asynchronous"] is None:
            check_per_round(values["per_round"], values["num_clients"])
        if values["eval_every"] > max(values["rounds"], 1000):  # a chunk holds eval_every rounds
            raise ConfigError(
                f"eval_every={values['eval_every']} is more than the {values['rounds']} rounds: "
                "a compiled chunk (and its log) holds eval_every rounds; give at most the rounds"
            )
        if values["local_steps"] is None and values["local_epochs"] is None:
            if values["mode"] == "global":
                values["local_steps"] = 10
        return dataclasses.replace(self, **values)

    # ------------------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "configuration") -> RunConfig:
        """A configuration from a mapping of field names (``config.json``'s ``config``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{source}: unknown configuration key(s) {unknown}")
        hints = typing.get_type_hints(cls)
        for name, value in d.items():  # a file's numbers are numbers: "12" is no seed count
            if isinstance(value, str) and _flag_type(hints[name]) in (int, float):
                if value.strip().lower() not in ("none", "null") or not _optional(hints[name]):
                    raise ConfigError(
                        f"{source}: {name}={value!r} is text where a number is expected; "
                        "write the number without quotes"
                    )
        return cls(**dict(d))

    def results_key(self) -> str:
        """A hash of every setting that can change the results (see :func:`setting`), to match
        a finished run or a checkpoint with the configuration that asks for it."""
        d = self.to_dict()
        for f in dataclasses.fields(self):
            if not f.metadata.get("results", True):
                d.pop(f.name)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def display_name(self) -> str:
        return self.label or self.strategy


# settings of the global engine that mode=personalized does not read (every client trains
# against every target each round; its server is the weighting, not an optimizer)
PERSONALIZED_IGNORES = frozenset(
    {
        "per_round",
        "availability",
        "system",
        "deadline",
        "overcommit",
        "dropout",
        "aggregation",
        "local_epochs",
        "momentum",
        "weight_decay",
        "prox_mu",
        "persistent_client_state",
        "server",
        "server_lr",
        "server_momentum",
        "server_weight_decay",
        "parallel",
    }
)


def personalized_ignored(config: RunConfig) -> list[str]:
    """The flags of the settings ``config`` gives (away from their defaults) that
    ``mode=personalized`` does not read."""
    return [
        _flag(f)
        for f in dataclasses.fields(config)
        if f.name in PERSONALIZED_IGNORES and getattr(config, f.name) != f.default
    ]


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    return not (
        (meta["positive"] and not value > 0)
        or (meta["minimum"] is not None and value < meta["minimum"])
        or (meta["maximum"] is not None and value > meta["maximum"])
        or (meta["below"] is not None and value >= meta["below"])
    )


def _range_text(meta: Mapping[str, Any]) -> str:
    bounds = [
        f"{op} {meta[key]:g}"
        for key, op in (("minimum", ">="), ("maximum", "<="), ("below", "<"))
        if meta[key] is not None
    ]
    if meta["positive"]:
        return "a positive number" if not bounds else " and ".join(["> 0", *bounds])
    return " and ".join(bounds)


def check_per_round(
    per_round: int, num_clients: int | None, detail: str = "", *, of: str = ""
) -> None:
    """Refuses more clients a round than the federation has (every strategy samples without
    replacement); ``num_clients`` ``None``: not known yet (the data set's default). ``detail``
    follows the per-round number, ``of`` the number of clients, in the message."""
    if num_clients is not None and per_round > num_clients:
        raise ConfigError(
            f"per_round={per_round}{detail} exceeds the number of clients ({num_clients}{of}): "
            f"select at most {num_clients} a round, or give more clients"
        )


def _optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _field(name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(RunConfig)}[name]


def _flag(f: dataclasses.Field) -> str:
    return "--" + (f.metadata.get("flag") or f.name.replace("_", "-"))


# ----------------------------------------------------------------------------- files
def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a TOML or JSON configuration file; a run's ``config.json`` (which keeps
    the configuration under ``"config"``) is accepted as it is."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {str(path)!r} does not exist")
    try:
        text = path.read_text()
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"configuration file {str(path)!r} is malformed: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {str(path)!r} must hold a table/object")
    if "config" in data and isinstance(data["config"], dict):
        data = data["config"]
    return data


def load_config(path: str | Path, **overrides: Any) -> RunConfig:
    """A :class:`RunConfig` from a TOML/JSON file, with ``overrides`` on top."""
    data = read_config_file(path)
    data.update(overrides)
    return RunConfig.from_dict(data, source=str(path)).validate()


# ----------------------------------------------------------------------------- CLI flags
def _flag_type(annotation: Any):
    alternatives = (
        [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else [annotation]
    )
    return alternatives[0]


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per :class:`RunConfig` field. Defaults are suppressed: the namespace holds
    only the flags given, which override a ``--config`` file (:func:`config_from_flags`)."""
    hints = typing.get_type_hints(RunConfig)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        meta = f.metadata
        group = groups.get(meta["group"]) or parser.add_argument_group(meta["group"])
        groups[meta["group"]] = group
        t = _flag_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = (
            f"{meta['help']} (default: {default!r})" if default not in (None, {}) else meta["help"]
        )
        kw: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if meta["metavar"]:
            kw["metavar"] = meta["metavar"]
        if t is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(t) is dict or t is dict:
            kw["action"] = "append"
        elif typing.get_origin(t) is Literal:
            kw["choices"] = typing.get_args(t)
        elif t in (int, float):
            kw["type"] = t
        group.add_argument(_flag(f), **kw)


def config_from_flags(
    namespace: argparse.Namespace, base: Mapping[str, Any] | None = None
) -> RunConfig:
    """The :class:`RunConfig` of parsed flags over ``base`` (a configuration file's mapping):
    a flag given on the command line wins; a flag that sets one of an exclusive pair clears
    the other from ``base``."""
    data = dict(base or {})
    hints = typing.get_type_hints(RunConfig)
    given = {f.name: f for f in dataclasses.fields(RunConfig) if hasattr(namespace, f.name)}
    for name, f in given.items():
        value = getattr(namespace, name)
        if typing.get_origin(hints[name]) is dict:  # pairs add to (and override) the file's
            value = {**dict(data.get(name) or {}), **parse_pairs(value, what=_flag(f))}
        data[name] = value
        if f.metadata["exclusive"] and f.metadata["exclusive"] not in given:
            data.pop(f.metadata["exclusive"], None)
    return RunConfig.from_dict(data).validate()


def typed_settings(pairs: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """``key=value`` text from the command line (``--set``) with each number-typed field's
    value converted to its number, as a file would hold it (files must not quote numbers:
    :meth:`RunConfig.from_dict`); other keys and values are left to the file's parser."""
    hints = typing.get_type_hints(RunConfig)
    out = dict(pairs)
    for key, value in pairs.items():
        if key in hints and isinstance(value, str) and _flag_type(hints[key]) in (int, float):
            out[key] = convert(value, hints[key], what=what, key=key)
    return out
