"""``fedjax-sel bench kernels``: latency of one call of each selection kernel against K.

A kernel benchmark is a builder ``build(num_clients) -> (fn, args)``; the harness jits ``fn``,
calls it once to compile, then reports the median of ``repeats`` calls as a row
``{"kernel": NAME, "clients": K, "seconds": S}`` (plus ``compile_seconds``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable

import jax

from fedjax_sel.bench.common import machine_info, print_table, time_call, write_json_rows


@dataclasses.dataclass(frozen=True)
class KernelBenchmark:
    name: str
    build: Callable[[int], tuple[Callable, tuple]]
    default_clients: tuple[int, ...]
    description: str
    max_clients: int | None = None  # larger K cannot fit (e.g. a dense K x K matrix)


KERNEL_BENCHMARKS: dict[str, KernelBenchmark] = {}


def register_kernel(
    name: str,
    *,
    default_clients: tuple[int, ...] = (10**3, 10**4, 10**5, 10**6),
    description: str = "",
    max_clients: int | None = None,
) -> Callable:
    def wrap(build):
        KERNEL_BENCHMARKS[name] = KernelBenchmark(
            name, build, tuple(default_clients), description, max_clients
        )
        return build

    return wrap


def _load_all() -> None:
    import fedjax_sel.bench as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name.startswith("kernels_"):
            importlib.import_module(f"fedjax_sel.bench.{m.name}")


def kernels_main(
    kernels: list[str] | None = None,
    clients: list[int] | None = None,
    *,
    repeats: int = 5,
    out: str | None = None,
) -> list[dict]:
    """Times the named kernels (all when ``None``) at each K in ``clients`` (each kernel's
    defaults when ``None``); prints a table and writes the rows as a JSON list to ``out``."""
    _load_all()
    names = kernels or sorted(KERNEL_BENCHMARKS)
    unknown = [n for n in names if n not in KERNEL_BENCHMARKS]
    if unknown:
        from fedjax_sel.base import ConfigError

        raise ConfigError(f"unknown kernel(s) {unknown}; known: {sorted(KERNEL_BENCHMARKS)}")
    rows = []
    for name in names:
        bench = KERNEL_BENCHMARKS[name]
        for k in clients or bench.default_clients:
            if bench.max_clients is not None and k > bench.max_clients:
                print(f"  {name} K={k}: skipped, above its limit of {bench.max_clients} clients")
                continue
            fn, args = bench.build(int(k))
            jfn = jax.jit(fn)
            try:
                t = time_call(lambda jfn=jfn, args=args: jfn(*args), repeats=repeats)
            except jax.errors.JaxRuntimeError as err:
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                print(f"  {name} K={k}: skipped, out of device memory ({str(err)[:120]})")
                continue
            rows.append(
                {
                    "kernel": name,
                    "clients": int(k),
                    "seconds": t["seconds"],
                    "milliseconds": t["seconds"] * 1e3,
                    "min_seconds": t["min_seconds"],
                    "compile_seconds": t["first_seconds"] - t["seconds"],
                }
            )
            print(f"  {name} K={k}: {t['seconds'] * 1e3:.3f} ms", flush=True)
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}), jax {info['jax_version']}")
    print_table(
        rows,
        [
            ("kernel", "kernel", "{}"),
            ("K", "clients", "{}"),
            ("median ms", "milliseconds", "{:.3f}"),
            ("compile s", "compile_seconds", "{:.2f}"),
        ],
    )
    write_json_rows(out, [dict(r, device=info["device_kind"]) for r in rows])
    return rows
