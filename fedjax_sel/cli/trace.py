"""``fedjax-sel trace convert``: FedScale's client behaviour trace as the T x K availability
trace that ``--availability trace:path=FILE`` reads."""

from __future__ import annotations

import argparse

from fedjax_sel.cli.options import check_counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``trace`` and its one subcommand, ``convert``."""
    p = sub.add_parser("trace", help="availability traces: convert FedScale's behaviour trace")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    t = tsub.add_parser(
        "convert",
        help="FedScale client_behave_trace (pickle or JSON) -> T x K trace for "
        "--availability trace:path=OUT",
    )
    t.add_argument("input", help="FedScale behaviour trace (pickle, or JSON of the same shape)")
    t.add_argument("output", help="the T x K trace to write (.npy, .npz, .csv or .txt)")
    t.add_argument("--round-seconds", type=float, required=True, help="seconds per round")
    t.add_argument("--rounds", type=int, required=True, help="T, rows of the trace")
    t.add_argument(
        "--clients", type=int, default=None, help="K (default: the number of trace entries)"
    )
    t.add_argument("--start", type=float, default=0.0, help="time of round 0 in seconds")
    t.add_argument(
        "--rule",
        choices=("interval", "fedscale"),
        default="interval",
        help="interval: online inside [active_i, inactive_i]; fedscale: FedScale's stateful "
        "is_active cursor",
    )
    t.set_defaults(func=cmd_trace)


def cmd_trace(a: argparse.Namespace) -> int:
    """Converts a FedScale behaviour trace into an availability trace file."""
    from fedjax_sel.availability.fedscale_trace import convert_behaviour_trace, save_trace

    check_counts(a, "rounds", "clients")

    trace = convert_behaviour_trace(
        a.input,
        round_seconds=a.round_seconds,
        rounds=a.rounds,
        clients=a.clients,
        start=a.start,
        rule=a.rule,
    )
    path = save_trace(trace, a.output)
    per_client = trace.mean(0)
    print(
        f"wrote {path}: {trace.shape[0]} rounds x {trace.shape[1]} clients, online "
        f"{trace.mean():.1%} of client-rounds (per client {per_client.min():.0%} .. "
        f"{per_client.max():.0%}); use --availability trace:path={path}"
    )
    return 0
