"""The ``fedjax-sel`` command line.

::

    fedjax-sel demo                 # paired comparison on the embedded digits data, < 1 min on CPU
    fedjax-sel list                 # strategies, data sets, models, availability models, ...
    fedjax-sel run [--config FILE] [--strategy NAME --dataset NAME ...] --out DIR
    fedjax-sel run --resume DIR     # continue a killed run from its checkpoint
    fedjax-sel sweep FILE.toml --out DIR            # strategies x settings x seeds, compared
    fedjax-sel compare DIR... --baseline NAME --out DIR
    fedjax-sel suite FILE.toml --out DIR            # the selection benchmark: leaderboard
    fedjax-sel bench throughput|kernels|sweep|grid|scale|workloads ...   # JSON + table
    fedjax-sel reproduce NAME --profile paper|code --size cpu|paper --seeds N --out DIR

``run``'s flags are generated from :class:`fedjax_sel.config.RunConfig` (one flag per field);
a ``--config`` file (TOML or JSON, e.g. a run's own ``config.json``) gives the same fields, and
flags on the command line override it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.cli import bench, cells, demo, listing, reproduce, run, trace


def build_parser() -> argparse.ArgumentParser:
    """The ``fedjax-sel`` parser: the global flags, then each command's own parser."""
    parser = argparse.ArgumentParser(
        prog="fedjax-sel",
        description="Vectorized simulator for client selection in federated learning (JAX).",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="split the host CPU into N XLA devices and shard clients over them (default: "
        "$FEDJAX_SEL_CPU_DEVICES, else 1); must come before the command",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="import MODULE first (a module of yours that registers strategies, models, data "
        "sets ...); repeatable; must come before the command",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo.add_parser(sub)
    listing.add_parser(sub)
    run.add_parser(sub)
    cells.add_parsers(sub)  # sweep, suite, compare
    bench.add_parser(sub)
    reproduce.add_parser(sub)
    trace.add_parser(sub)
    return parser


def set_cpu_devices(n: int | None) -> None:
    """Asks XLA for ``n`` host (CPU) devices; must run before JAX initialises its backends.

    The simulator then shards the slots of a round over them (``Simulation(mesh=...)``), which
    puts every core to work on models whose per-client matmuls are too small to be threaded.
    """
    import os

    if n is None:
        env = os.environ.get("FEDJAX_SEL_CPU_DEVICES")
        n = int(env) if env else None
    if n is None or n == 1:
        return
    if n < 1:
        raise ConfigError(f"--cpu-devices must be >= 1, got {n}")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def load_plugins(modules: list[str] | None) -> None:
    """Imports the user's modules (they register strategies, models, ... on import); the
    working directory is searched too, last (appended to the import path), so a folder there
    named like an installed package (``tqdm/``) does not shadow it."""
    if modules and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    for name in modules or []:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"--plugin {name!r} cannot be imported: {e}") from None


def main(argv: list[str] | None = None) -> int:
    """Runs the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        set_cpu_devices(args.cpu_devices)
        load_plugins(args.plugin)
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"fedjax-sel: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # a size no check foresaw: still one line, not a traceback
        print(f"fedjax-sel: error: out of memory ({e or 'MemoryError'}): the settings ask "
              "for more memory than this machine has", file=sys.stderr)  # fmt: skip
        return 2
    except Exception as e:  # noqa: BLE001 - only XLA's out-of-memory is turned into a line
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        print(f"fedjax-sel: error: out of device memory ({str(e).splitlines()[0][:200]}): the "
              "settings ask for more memory than this device has", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("fedjax-sel: interrupted", file=sys.stderr)
        return 130
