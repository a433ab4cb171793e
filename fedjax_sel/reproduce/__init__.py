"""Paper reproductions for ``fedjax-sel reproduce NAME``.

Each module in this package registers one reproduction with :func:`register_reproduction`; the
modules are imported when the registry is first read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.registry import Registry

SIZES = ("cpu", "paper")
PROFILES = ("paper", "code")

REPRODUCTIONS = Registry(
    "reproduction",
    fixed=("seeds", "out", "size", "profile", "data_dir"),
    package="fedjax_sel.reproduce",
)


def register_reproduction(name: str, description: str, **info) -> Callable:
    """Decorator registering ``run(*, seeds, out, size, profile, data_dir, **options) -> dict``:
    runs the paper's settings, prints our numbers beside the paper's and writes JSON and plots
    under ``out``."""
    return REPRODUCTIONS.register(name, description=description, **info)


def select_parts(
    name: str,
    parts: tuple[str, ...] | str | None,
    env_var: str,
    default: tuple[str, ...],
    known: tuple[str, ...],
) -> tuple[str, ...]:
    """The parts of reproduction ``name`` to run: ``parts`` (a tuple or a comma-separated
    string), else ``$env_var``, else ``default``; a :class:`ConfigError` names unknown ones."""
    if parts is None:
        parts = os.environ.get(env_var) or default
    if isinstance(parts, str):
        parts = tuple(p.strip() for p in parts.split(",") if p.strip())
    unknown = set(parts) - set(known)
    if unknown:
        raise ConfigError(f"unknown {name} reproduction part(s) {sorted(unknown)}; known: {known}")
    return tuple(parts)


def output_dir(out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out
