"""One registry shape for everything a user picks by name.

Strategies, data sets, partitions, models, availability models, reproductions and kernel
benchmarks are all a :class:`Registry` of factories. A factory's keyword parameters *are* its
options: their names, defaults and type hints are read from its signature, so an option is
written once, and the same code parses ``key=value`` text from the command line, values from a
TOML/JSON configuration file and keyword arguments from Python.

>>> reg = Registry("model", fixed=("input_shape",))
>>> @reg.register("toy", description="a toy")
... def toy(*, input_shape, width: int = 8, act: Literal["relu", "tanh"] = "relu"):
...     return (input_shape, width, act)
>>> reg.build("toy", input_shape=(3,), width="16")
((3,), 16, 'relu')

Spec strings (``--availability markov:pi=0.5,lam=0.9``, ``--partition dirichlet:0.1``,
``--parallel chunked:8``) share one grammar, read by :func:`parse_spec`: ``name``, then
optionally ``:`` and comma-separated ``key=value`` pairs; bare values fill the entry's
``positional`` options in order. Sequence values are written ``200-200`` or ``0.9/-0.5``
(``/`` when an item is negative).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import math
import pkgutil
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from fedjax_sel.base import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


# ---------------------------------------------------------------------------------- parsing
def parse_pairs(
    items: str | Iterable[str] | Mapping[str, Any] | None, *, what: str, sep: str = ","
) -> dict:
    """``"k=v,k2=v2"`` (or a list of such strings, or a mapping) -> ``{k: v}``.

    Values stay as given (strings from the command line); :meth:`Registry.resolve` converts
    them. ``what`` names the source in error messages (e.g. ``--strategy-arg``); ``sep``
    separates pairs inside one string.
    """
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {str(k).strip(): v for k, v in items.items()}
    if isinstance(items, str):
        items = [items]
    out: dict[str, Any] = {}
    for item in items:
        for pair in filter(None, (s.strip() for s in str(item).split(sep))):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"{what} expects key=value, got {pair!r}")
            out[key.strip()] = value.strip()
    return out


def parse_spec(spec: str, *, what: str) -> tuple[str, list[str], dict[str, str]]:
    """``name[:item,item,...]`` -> ``(name, positional values, {key: value})``.

    An item is ``key=value`` or a bare value; bare values must come first.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"{what} must be a non-empty string such as 'name:key=value', got {spec!r}"
        )
    name, _, rest = spec.partition(":")
    positional: list[str] = []
    pairs: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            if pairs:
                raise ConfigError(
                    f"cannot read {item!r} in {what} {spec!r}: bare values come before key=value"
                )
            positional.append(item)
        elif not key.strip():
            raise ConfigError(f"cannot read {item!r} in {what} {spec!r}: expected key=value")
        else:
            pairs[key.strip()] = value.strip()
    return name.strip().lower(), positional, pairs


# ---------------------------------------------------------------------------------- typing
def _type_name(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return "value"
    if typing.get_origin(annotation) is Literal:
        return "choice (one of " + ", ".join(repr(a) for a in typing.get_args(annotation)) + ")"
    alternatives, none_ok = _alternatives(annotation)
    if len(alternatives) > 1 or (none_ok and alternatives[0] is not type(None)):
        names = [_type_name(a) for a in alternatives] + (["none"] if none_ok else [])
        return " or ".join(names)
    item = _sequence_items(annotation)
    if item is not None:
        return f"sequence of {_type_name(item)}s (e.g. 200-200, or 0.5/-1 with a negative item)"
    if isinstance(annotation, type):
        return {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _alternatives(annotation: Any) -> tuple[list[Any], bool]:
    """The non-None members of a union annotation, and whether ``None`` is allowed."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(annotation)
        return [a for a in args if a is not type(None)], type(None) in args
    return [annotation], annotation is None or annotation is type(None)


def _sequence_items(annotation: Any) -> Any | None:
    """The item type of ``tuple[T, ...]`` / ``Sequence[T]`` / ``list[T]`` annotations."""
    origin = typing.get_origin(annotation)
    if origin in (tuple, list, Sequence, typing.Sequence) or (
        origin is not None
        and isinstance(origin, type)
        and issubclass(origin, Sequence)
        and origin is not str
    ):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return args[0] if args else Any
    return None


def _convert_one(value: Any, annotation: Any) -> Any:
    """Converts ``value`` to ``annotation`` or raises ``ValueError``."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return _guess(value)
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        for c in choices:
            if value == c or (
                isinstance(value, str) and not isinstance(c, str) and _guess(value) == c
            ):
                return c
        raise ValueError
    if annotation is dict or typing.get_origin(annotation) in (dict, Mapping, typing.Mapping):
        if isinstance(value, str):
            return parse_pairs(value, what="a key=value list")
        if not isinstance(value, Mapping):
            raise ValueError
        return dict(value)
    item = _sequence_items(annotation)
    if item is not None:
        if isinstance(value, str):
            text = value.strip()
            parts = [] if not text else text.split("/" if "/" in text else "-")
            value = parts
        if not isinstance(value, (list, tuple)):
            raise ValueError
        return tuple(_convert_one(v.strip() if isinstance(v, str) else v, item) for v in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError
    if annotation is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value.strip())  # exactly: 10**20 + 1 is no float's
        f = float(value.strip()) if isinstance(value, str) else float(value)
        if not math.isfinite(f) or f != int(f):
            raise ValueError
        return int(f)
    if annotation is float:
        if isinstance(value, bool):
            raise ValueError
        return float(value.strip()) if isinstance(value, str) else float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError
        return value.strip()
    # another type (arrays, callables): Python API values pass through, text is guessed;
    # text that is no number or bool is only valid for an untyped option
    if not isinstance(value, str):
        return value
    guess = _guess(value)
    if isinstance(guess, str) and annotation not in (Any, inspect.Parameter.empty):
        raise ValueError
    return guess


def _guess(value: Any) -> Any:
    """Untyped text: int, then float, then bool, else the string."""
    if not isinstance(value, str):
        return value
    v = value.strip()
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def convert(value: Any, annotation: Any, *, what: str, key: str) -> Any:
    """The one typed conversion: ``value`` (text or Python) to the option's ``annotation``.

    Raises a :class:`ConfigError` naming ``what``, ``key`` and the value when it cannot.
    """
    options, none_ok = _alternatives(annotation)
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        if none_ok or annotation is inspect.Parameter.empty or annotation is Any:
            return None
    for a in options:
        try:
            return _convert_one(value, a)
        except (ValueError, TypeError):
            continue
    raise ConfigError(f"{what}: {key}={value!r} is not a valid {_type_name(annotation)}")


# ---------------------------------------------------------------------------------- entries
@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a registered factory: its name, default and type annotation."""

    name: str
    default: Any
    annotation: Any


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered factory.

    Attributes:
      name: the registry name.
      factory: the callable; its keyword parameters other than the registry's ``fixed`` ones
        are the entry's options.
      description: one line for ``fedjax-sel list``.
      reference: the paper or source.
      info: kind-specific metadata (a data set's default model, a model's CPU parallelism, a
        kernel benchmark's default sizes ...).
      options: name -> :class:`Option`, in signature order.
    """

    name: str
    factory: Callable[..., Any]
    description: str
    reference: str
    info: Mapping[str, Any]
    options: Mapping[str, Option]

    def defaults(self) -> dict[str, Any]:
        return {k: o.default for k, o in self.options.items()}


def factory_options(factory: Callable, fixed: Iterable[str]) -> dict[str, Option]:
    """The options of ``factory``: its parameters with defaults, minus ``fixed`` ones."""
    try:
        sig = inspect.signature(factory, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        sig = inspect.signature(factory)
    skip = set(fixed)
    out: dict[str, Option] = {}
    for p in sig.parameters.values():
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty and p.kind != p.KEYWORD_ONLY:
            continue
        annotation = p.annotation
        if isinstance(annotation, str) or annotation is p.empty:
            annotation = type(p.default) if p.default not in (None, p.empty) else p.empty
        out[p.name] = Option(p.name, None if p.default is p.empty else p.default, annotation)
    return out


class Registry(Mapping[str, Entry]):
    """Names -> factories of one kind (see the module docstring).

    Args:
      kind: what the entries are, for messages (``"strategy"``, ``"data set"``).
      fixed: factory parameters supplied by the code, not by the user (``per_round``).
      package: a package whose modules register entries on import; they are imported the
        first time the registry is read (``prefix`` restricts them by module name).
      entry_points: an entry-point group (``[project.entry-points."GROUP"]`` of an installed
        distribution's ``pyproject.toml``): the modules it names register entries on import,
        and are imported then too (plugins outside this package).
      common: options every entry takes (``{"ridge": Option(...)}`` for models); they are
        passed to ``finish(obj, **common)`` after the factory ran.
      finish: see ``common``.
    """

    def __init__(
        self,
        kind: str,
        *,
        fixed: Iterable[str] = (),
        package: str | None = None,
        prefix: str = "",
        entry_points: str | None = None,
        common: Mapping[str, Option] | None = None,
        finish: Callable[..., Any] | None = None,
    ):
        self.kind = kind
        self.fixed = tuple(fixed)
        self._package, self._prefix, self._group = package, prefix, entry_points
        self._entries: dict[str, Entry] = {}
        self._loaded = package is None and entry_points is None
        self.common = dict(common or {})
        self._finish = finish

    # -- mapping
    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self._package is not None:
            pkg = importlib.import_module(self._package)
            for m in pkgutil.iter_modules(pkg.__path__):
                if not m.name.startswith("_") and m.name.startswith(self._prefix):
                    importlib.import_module(f"{self._package}.{m.name}")
        for point in importlib.metadata.entry_points(group=self._group) if self._group else ():
            try:
                point.load()
            except ModuleNotFoundError as e:
                if e.name != point.module:  # an error inside the plugin: its own traceback
                    raise
                raise ConfigError(  # a stale install: say which plugin, not a traceback
                    f"{self.kind} plugin {point.value!r} (entry point {point.name!r} of "
                    f"{self._group!r}) cannot be imported: {e}"
                ) from None

    def __getitem__(self, name: str) -> Entry:
        self._load()
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._entries)) or 'none'}"
            )
        return entry

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(self._entries)

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    # -- registration
    def register(
        self,
        name: str,
        *,
        description: str,
        reference: str = "",
        replace: bool = False,
        **info: Any,
    ) -> Callable:
        """Decorator registering ``factory`` under ``name``.

        Registering the same name again is allowed for the same function (a notebook cell run
        twice) or with ``replace=True``; another function under a taken name is an error.
        """

        def wrap(factory: Callable) -> Callable:
            old = self._entries.get(name)
            if old is not None and not replace and not _same_function(old.factory, factory):
                raise ConfigError(
                    f"{self.kind} {name!r} is already registered by {_where(old.factory)}; "
                    "pass replace=True to replace it"
                )
            options = factory_options(factory, self.fixed)
            self._entries[name] = Entry(
                name, factory, description, reference, dict(info), {**options, **self.common}
            )
            return factory

        return wrap

    def unregister(self, name: str) -> None:
        """Removes entry ``name`` (tests, notebooks)."""
        self._load()
        self._entries.pop(name, None)

    def add(self, name: str, factory: Callable, *, description: str, **kw: Any) -> None:
        """Non-decorator form of :meth:`register`."""
        self.register(name, description=description, **kw)(factory)

    # -- options
    def resolve(
        self, name: str, raw: Mapping[str, Any] | None = None, positional: Sequence[Any] = ()
    ) -> dict[str, Any]:
        """Typed options of entry ``name`` from ``raw`` values (text or Python): unknown names
        and values that do not convert are a :class:`ConfigError` naming them."""
        entry = self[name]
        raw = dict(raw or {})
        slots = list(entry.info.get("positional", ()))
        if len(positional) > len(slots):
            names = ", ".join(slots) or "none"
            raise ConfigError(
                f"{self.kind} {name!r} takes {len(slots)} bare value(s) ({names}), got "
                f"{list(positional)}"
            )
        for slot, value in zip(slots, positional, strict=False):
            if slot in raw:
                raise ConfigError(f"{self.kind} {name!r}: {slot} given twice")
            raw[slot] = value
        unknown = sorted(set(raw) - set(entry.options))
        if unknown:
            raise ConfigError(
                f"{self.kind} {name!r} has no option(s) {unknown}; it takes "
                f"{sorted(entry.options) or 'none'}"
            )
        what = f"{self.kind} {name!r}"
        missing = [r for r in entry.info.get("required", ()) if raw.get(r) is None]
        if missing:
            raise ConfigError(f"{what} needs {', '.join(missing)}")
        return {
            k: convert(v, entry.options[k].annotation, what=what, key=k) for k, v in raw.items()
        }

    def build(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Calls entry ``name``'s factory: ``fixed`` keyword arguments as given, options
        converted by :meth:`resolve`; registry-wide ``common`` options go to ``finish``."""
        fixed = {k: kwargs.pop(k) for k in list(kwargs) if k in self.fixed}
        options = self.resolve(name, kwargs)
        common = {k: options.pop(k) for k in list(options) if k in self.common}
        obj = self[name].factory(*args, **fixed, **options)
        if self._finish is not None:
            obj = self._finish(obj, **{k: common.get(k, o.default) for k, o in self.common.items()})
        return obj

    def from_spec(self, spec: str, /, **fixed: Any) -> Any:
        """Builds from a spec string ``name:key=value,...`` (see :func:`parse_spec`)."""
        name, positional, pairs = parse_spec(spec, what=self.kind)
        options = self.resolve(name, pairs, positional)
        return self.build(name, **fixed, **options)

    def describe(self, name: str) -> str:
        """``key=default`` for each option of ``name`` (for ``fedjax-sel list``)."""
        return ", ".join(f"{k}={o.default!r}" for k, o in self[name].options.items())


def _same_function(a: Callable, b: Callable) -> bool:
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def _where(f: Callable) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', '?')}"
