"""``fedjax-sel run``: one simulation, its flags generated from
:class:`fedjax_sel.config.RunConfig` (one per field); ``--resume DIR`` continues a killed run."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.options import add_overwrite_flag, echo, quiet
from fedjax_sel.config import RunConfig, add_config_flags


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``run`` and its flags."""
    p = sub.add_parser(
        "run",
        help="run one simulation and write its outputs",
        description="Every setting below is a field of fedjax_sel.config.RunConfig; --config "
        "FILE gives them from a TOML/JSON file (a run's config.json reruns it exactly) and "
        "flags override the file.",
    )
    p.add_argument("--config", default=None, metavar="FILE", help="TOML or JSON configuration")
    p.add_argument(
        "--resume", default=None, metavar="DIR", help="continue the run in DIR from its checkpoint"
    )
    p.add_argument("--out", default=None, help="output folder (default runs/<strategy>-<dataset>)")
    add_overwrite_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="write a jax.profiler trace of the second chunk of rounds (Perfetto, TensorBoard)",
    )
    dist = p.add_argument_group(
        "several processes (hosts)",
        "one process per host runs the same command; jax.distributed joins them, clients are "
        "sharded over every device of every host, process 0 writes the outputs",
    )
    dist.add_argument(
        "--distributed",
        action="store_true",
        help="join the other processes (without the three flags below JAX reads the cluster "
        "from the environment: SLURM, Open MPI, ...)",
    )
    dist.add_argument(
        "--coordinator", default=None, metavar="HOST:PORT", help="process 0's address"
    )
    dist.add_argument("--num-processes", type=int, default=None, help="number of processes")
    dist.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1")
    add_config_flags(p)
    p.set_defaults(func=cmd_run)


def cmd_run(a: argparse.Namespace) -> int:
    """Runs one configuration into its folder; exit 1 when it diverged."""
    from fedjax_sel.config import config_from_flags, read_config_file
    from fedjax_sel.experiment import run_experiment
    from fedjax_sel.experiment.outputs import print_summary_table
    from fedjax_sel.experiment.resolve import resolve

    primary = True
    if a.distributed:
        from fedjax_sel import distributed

        distributed.initialize(a.coordinator, a.num_processes, a.process_id)
        primary = distributed.is_primary()
    elif a.coordinator or a.num_processes is not None or a.process_id is not None:
        raise ConfigError("--coordinator, --num-processes and --process-id need --distributed")
    base = {}
    if a.resume is not None:
        resume = Path(a.resume)
        given = [k for k in vars(a) if k in _config_fields()]
        if given or a.config is not None:
            raise ConfigError(
                f"--resume takes the configuration from {resume / 'config.json'}; do not give "
                f"settings with it (got {sorted(given) or ['--config']})"
            )
        base = read_config_file(resume / "config.json")
        out = resume
    elif a.config is not None:
        base = read_config_file(a.config)
    resolved = resolve(config_from_flags(a, base))  # once: the run reads what it parsed
    config = resolved.config
    if a.distributed and config.mode != "global":
        raise ConfigError("--distributed runs global-model strategies (mode=global) only")
    if a.resume is None:
        out = Path(a.out or f"runs/{config.strategy}-{config.dataset}")
    result = run_experiment(
        resolved,
        out,
        progress=not a.no_progress and primary,
        resume=a.resume is not None,
        echo=echo if primary else quiet,
        trace_dir=a.trace,
        overwrite=a.overwrite,
    )
    if not primary:  # process 0 reports and writes
        return 1 if result.summary.get("diverged") else 0
    print_summary_table([{**result.summary, **result.timings}])
    print(
        f"outputs written to {out}/ (config.json, metrics.jsonl, summary.json, timings.json, "
        "curves.png)"
    )
    return 1 if result.summary.get("diverged") else 0


def _config_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(RunConfig)}
