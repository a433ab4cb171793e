"""``fedjax-sel bench throughput``: one FedAvg round timed three ways in one process.

1. **engine**: the simulator's compiled round (``Simulation``: selection, local training of P
   clients in the chosen client-parallelism mode, aggregation, server step); ``auto`` is the
   measured choice (:mod:`fedjax_sel.training.autotune`);
2. **loop**: what a user writes without the engine, from the same flax/optax pieces: a Python
   loop over the clients. Two variants, the faster reported: ``loop_step`` calls one jitted SGD
   step per client and minibatch (FedJAX's jit backend); ``loop_client`` (fixed steps only)
   calls one jitted per-client trainer (``lax.scan`` over the steps). ``loop_step`` computes
   plain flax (``lax.conv`` convolutions, fast at a program's top level on XLA:CPU);
   ``loop_client`` computes a convolution model's convolutions as ``xla_nhwc`` (XLA's own
   convolution inside a scan takes ten times longer on a CPU, a loop nobody would keep);
3. **matmul**: a plain float32 matmul, the machine's practical peak.

Work per client: ``steps`` (``local_steps`` SGD steps of ``batch_size`` examples) or ``epochs``
(one local epoch over each client's own data, FedJAX's benchmark: batch 10, clients of
LogNormal sizes between 100 and 400; the engine's epoch modes pad, the fraction of padded steps
is reported). Models: ``logreg``, ``mlp``, ``cnn``, ``lstm``, or a user's flax linen module
(``--model-def FILE.py:NAME``, built with no arguments, ``__call__(x)`` returning logits, on
random data of ``--input-shape`` with ``--classes``). FLOPs per client update are analytic
(:mod:`fedjax_sel.models.flops`), the same count on every backend.

Every loop variant and engine mode is timed in turn, one round each, ``repeats`` times, so a
machine whose speed drifts slows them alike; ``speedup_vs_loop`` is the median over those turns
of the loop round's time over the engine round's, ``speedup_range`` the smallest and largest
such ratio. The loop is the variant with the smaller median round (``loop_variant``), the same
in every turn.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.common import (
    interleaved_times,
    matmul_gflops,
    print_table,
    time_call,
    write_json_rows,
)
from fedjax_sel.data.client_data import from_client_arrays
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.engine.fedbuff import from_spec as async_from_spec
from fedjax_sel.engine.simulation import Simulation, default_mesh
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.system import from_spec as system_from_spec
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.models import Model, from_linen, make_model, masked_mean
from fedjax_sel.models.base import with_conv_impl
from fedjax_sel.models.flops import train_step_flops
from fedjax_sel.registry import convert
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training.autotune import resolve_parallel
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import (
    LocalConfig,
    executed_steps,
    parse_parallel,
)

# model -> (input shape, classes, token inputs, default clients per round)
MODEL_SPECS = {
    "logreg": ((60,), 10, False, 1000),
    "mlp": ((784,), 10, False, 100),
    "cnn": ((28, 28, 1), 62, False, 10),
    "lstm": ((80,), 80, True, 10),
}
ALL_MODES = ("vmap", "map", "chunked:4", "chunked:16")
LR = 0.01  # the client learning rate of the loops and the engine alike
WORKS = ("steps", "epochs")


def load_model_def(spec: str, input_shape: tuple[int, ...], classes: int) -> Model:
    """A user's flax linen module ``FILE.py:NAME`` (built with no arguments) as a Model."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise ConfigError(f"--model-def expects FILE.py:NAME, got {spec!r}")
    if not Path(path).is_file():
        raise ConfigError(f"--model-def: file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"user_model_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    # registered first: dataclasses (flax modules) resolve string annotations through it
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    cls = getattr(module, name, None)
    if cls is None:
        raise ConfigError(f"--model-def: {path!r} defines no {name!r}")
    return from_linen(cls(), name=name, input_shape=input_shape)


def client_sizes(work: str, per_round: int, examples: int, seed: int = 0) -> np.ndarray:
    if work == "steps":
        return np.full(per_round, examples)
    rng = np.random.default_rng(seed)  # FedJAX's benchmark: LogNormal sizes in [100, 400]
    return np.clip(np.round(rng.lognormal(np.log(200), 0.4, per_round)), 100, 400).astype(int)


def random_clients(shape, classes: int, tokens: bool, sizes: np.ndarray, seed: int = 0):
    """Random examples of the model's input shape (throughput ignores the values)."""
    rng = np.random.default_rng(seed)
    high = classes if tokens else 256
    xs = [rng.integers(0, high, (n,) + tuple(shape)).astype(np.uint8) for n in sizes]
    ys = [rng.integers(0, classes, n).astype(np.int32) for n in sizes]
    return xs, ys, (None if tokens else 1.0 / 255.0)


def dataset_of(name: str, shape, classes, xs, ys, scale) -> FederatedDataset:
    train = from_client_arrays(
        xs, ys, layout="flat" if len({len(y) for y in ys}) > 1 else "padded", x_scale=scale
    )
    tx = jnp.asarray(xs[0][:8]) if scale is None else jnp.asarray(xs[0][:8], jnp.float32) * scale
    return FederatedDataset(
        name=f"random-{name}",
        train=train,
        test=None,
        test_x=tx,
        test_y=jnp.asarray(ys[0][:8]),
        task="classification",
        num_classes=classes,
        input_shape=tuple(shape),
        default_model=name,
        info={},
    )


def _engine(model, ds, per_round, parallel, local, rounds, system=None, asynchronous=None):
    """The engine's round as a call (``auto`` resolved now, by measurement) and its
    simulation; each call runs one round from the state the last one left."""
    strategy = "full" if asynchronous is None else "uniform"  # asynchronous needs a picker
    parallel, choice = resolve_parallel(parallel, model, local, ds.train, per_round)
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy(strategy, per_round),
        local=local,
        per_round=per_round,
        parallel=parallel,
        mesh=default_mesh(),
        system=None if system is None else system_from_spec(system),
        asynchronous=asynchronous,
    )
    sim = Simulation(
        spec, ds, num_rounds=rounds, chunk_size=1, mesh=default_mesh(), parallel_choice=choice
    )
    state = [sim.init(0, hparams=HParams.of(LR))]

    def one_round():
        s, _ = sim.run_chunk(state[0])
        state[0] = s
        return s.params

    return one_round, sim


def _engine_seconds(model, ds, per_round, parallel, local, repeats, **kw) -> float:
    """Median seconds of the engine's round alone (the system-model and FedBuff variants)."""
    one_round, _ = _engine(model, ds, per_round, parallel, local, repeats + 2, **kw)
    return time_call(one_round, repeats=repeats)["seconds"]


def loop_model(model: Model) -> Model:
    """The model the loops run: a convolution model with XLA's own convolution, which a
    jitted step at the program's top level runs through XLA:CPU's library convolution."""
    return with_conv_impl(model, "xla") if model.conv_impl else model


def scan_loop_model(model: Model) -> Model:
    """The model a per-client ``lax.scan`` loop runs: a convolution model with ``xla_nhwc``,
    whose gradients XLA:CPU runs well inside a scan (its own convolution there does not)."""
    return with_conv_impl(model, "xla_nhwc") if model.conv_impl else model


def _loop_pieces(model):
    tx = optax.sgd(LR)

    def loss_fn(p, xb, yb, mask):
        return masked_mean(model.loss(model.apply(p, xb), yb), mask)

    def step(p, s, xb, yb, mask):
        g = jax.grad(loss_fn)(p, xb, yb, mask)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return tx, step


def _positions(work: str, sizes: np.ndarray, local: LocalConfig, seed: int = 0):
    """Per client, its minibatches' example positions (int[steps, B]; ``>= n`` = padding)."""
    rng = np.random.default_rng(seed)
    bsz = local.batch_size
    out = []
    for n in sizes:
        if work == "steps":
            out.append(rng.integers(0, n, (local.local_steps, bsz)))
        else:
            perm = rng.permutation(n)
            rows = -(-n // bsz)
            out.append(np.pad(perm, (0, rows * bsz - n), constant_values=n).reshape(rows, bsz))
    return out


def _loop_step(model, data, sizes, local, work, params):
    """Python loop over clients and minibatches, one jitted SGD step (FedJAX's jit backend;
    a client's last partial batch is padded and masked, so the step never recompiles)."""
    xs, ys, scale = data
    tx, step = _loop_pieces(model)

    @jax.jit
    def jstep(p, s, xk, yk, idx, n):
        mask = idx < n
        idx = jnp.minimum(idx, n - 1)
        xb = xk[idx].astype(jnp.float32) * scale if scale is not None else xk[idx]
        return step(p, s, xb, yk[idx], mask)

    accumulate = jax.jit(lambda acc, p, w: jax.tree.map(lambda a, b: a + w * b, acc, p))
    dev_x = [jnp.asarray(x) for x in xs]
    dev_y = [jnp.asarray(y) for y in ys]
    idx = [[jnp.asarray(row) for row in rows] for rows in _positions(work, sizes, local)]
    zeros = jax.tree.map(jnp.zeros_like, params)
    init = tx.init(params)
    weights = sizes / sizes.sum()

    def one_round():
        acc = zeros
        for c in range(len(sizes)):
            p, s = params, init
            for row in idx[c]:
                p, s = jstep(p, s, dev_x[c], dev_y[c], row, int(sizes[c]))
            acc = accumulate(acc, p, float(weights[c]))
        return acc

    return one_round


def _loop_client(model, data, sizes, local, params):
    """Python loop over clients, one jitted per-client trainer (scan over the local steps)."""
    xs, ys, scale = data
    tx, step = _loop_pieces(model)
    bsz, steps = local.batch_size, local.local_steps

    @jax.jit
    def train_client(p, xk, yk, key):
        xk = xk.astype(jnp.float32) * scale if scale is not None else xk

        def body(c, k):
            idx = jax.random.randint(k, (bsz,), 0, xk.shape[0])
            return step(c[0], c[1], xk[idx], yk[idx], jnp.ones((bsz,), bool)), None

        (p, _), _ = jax.lax.scan(body, (p, tx.init(p)), jax.random.split(key, steps))
        return p

    accumulate = jax.jit(lambda acc, p, w: jax.tree.map(lambda a, b: a + w * b, acc, p))
    dev_x = [jnp.asarray(x) for x in xs]
    dev_y = [jnp.asarray(y) for y in ys]
    keys = jax.random.split(jax.random.key(1), len(sizes))
    zeros = jax.tree.map(jnp.zeros_like, params)

    def one_round():
        acc = zeros
        for c in range(len(sizes)):
            acc = accumulate(
                acc, train_client(params, dev_x[c], dev_y[c], keys[c]), 1.0 / len(sizes)
            )
        return acc

    return one_round


def faster_loop(times: dict[str, dict], loops: list[str]) -> str:
    """The loop variant with the smaller median round: the loop each engine round is compared
    with, turn by turn. Not the faster variant of each turn: the smaller of two noisy times is
    biased low, which would flatter the loop by the noise (several percent on a shared CPU)."""
    return min(loops, key=lambda k: times[k]["seconds"])


@dataclasses.dataclass(frozen=True)
class Settings:
    """How every timed round is set up, beside its model and P (the flags of
    ``fedjax-sel bench throughput``, by the same names)."""

    work: str = "steps"
    local_steps: int = 10
    batch_size: int | None = None
    repeats: int = 3
    model_def: str | None = None
    input_shape: tuple[int, ...] | None = None
    classes: int | None = None
    trace: str | None = None
    system: str | None = None
    asynchronous: str | None = None


def measure(
    model_name: str | None,
    per_round: int | None = None,
    modes: list[str] | None = None,
    settings: Settings | None = None,
    *,
    peak: float | None = None,
) -> list[dict]:
    """Times the engine (each mode in ``modes``) and the loop for one model and P; with
    ``settings.system``, also the engine's round with that system model (its overhead), and
    with ``settings.asynchronous`` (a FedBuff spec, concurrency P) FedBuff's client updates
    per second."""
    s = settings or Settings()
    work, local_steps, batch_size, repeats = s.work, s.local_steps, s.batch_size, s.repeats
    model_def, input_shape, classes = s.model_def, s.input_shape, s.classes
    trace, system, asynchronous = s.trace, s.system, s.asynchronous
    if work not in WORKS:
        raise ConfigError(f"--work must be one of {WORKS}, got {work!r}")
    if model_def is not None:
        if input_shape is None or classes is None:
            raise ConfigError("--model-def needs --input-shape and --classes")
        shape, tokens, default_p = tuple(input_shape), False, 10
        model = load_model_def(model_def, shape, classes)
        model_name = model.name
    else:
        if model_name not in MODEL_SPECS:
            raise ConfigError(f"unknown model {model_name!r}; choose {sorted(MODEL_SPECS)}")
        shape, classes, tokens, default_p = MODEL_SPECS[model_name]
        model = make_model(model_name, input_shape=shape, num_classes=classes)
    p = int(per_round or default_p)
    bsz = int(batch_size or (32 if work == "steps" else 10))
    examples = max(2 * bsz * local_steps, bsz)
    sizes = client_sizes(work, p, examples)
    xs, ys, scale = random_clients(shape, classes, tokens, sizes)
    ds = dataset_of(model_name, shape, classes, xs, ys, scale)
    if work == "steps":
        local = LocalConfig(batch_size=bsz, local_steps=local_steps)
        steps = np.full(p, local_steps)
    else:
        local = LocalConfig(batch_size=bsz, local_steps=None, local_epochs=1)
        steps = -(-sizes // bsz)
    params = model.init(jax.random.key(0))
    xb = jnp.zeros((bsz,) + tuple(shape), jnp.int32 if tokens else jnp.float32)
    step_flops = train_step_flops(model.module, xb)
    flops_per_update = float(step_flops * steps.mean())
    peak = peak if peak is not None else matmul_gflops()

    loop = loop_model(model)
    calls = {"loop_step": _loop_step(loop, (xs, ys, scale), sizes, local, work, params)}
    if work == "steps":
        calls["loop_client"] = _loop_client(
            scan_loop_model(model), (xs, ys, scale), sizes, local, params
        )
    loops = list(calls)
    engines = []
    for i, mode in enumerate(modes or ["auto"]):
        one_round, sim = _engine(model, ds, p, parse_parallel(mode), local, 2 * repeats + 4)
        calls[f"engine {i}"] = one_round
        engines.append((f"engine {i}", sim))
    # loop and engine rounds timed in turn, so a drifting machine slows both alike
    times = interleaved_times(calls, repeats)
    loop_name = faster_loop(times, loops)
    loop_rounds, loop_s = times[loop_name]["times"], times[loop_name]["seconds"]
    rows = []
    for name, sim in engines:
        t = times[name]
        if trace is not None:
            with jax.profiler.trace(str(trace)):
                for _ in range(3):
                    jax.block_until_ready(calls[name]())
        ratios = [lt / et for lt, et in zip(loop_rounds, t["times"], strict=True)]
        parallel = sim.spec.trainer.parallel  # the mode it ran: the variants below run it too
        choice = None if sim.parallel_choice is None else sim.parallel_choice.to_dict()
        eng_ups, loop_ups = p / t["seconds"], p / loop_s
        timed = {}
        if system is not None or asynchronous is not None:
            spec = system or "lognormal"
            sys_s = _engine_seconds(model, ds, p, parallel, local, repeats, system=spec)
            timed.update(
                system=spec,
                system_round_seconds=sys_s,
                system_overhead=sys_s / t["seconds"] - 1.0,
            )
        if asynchronous is not None:
            fb = async_from_spec(asynchronous, p)
            fb_s = _engine_seconds(
                model, ds, p, parallel, local, repeats, system=spec, asynchronous=fb
            )
            timed.update(
                asynchronous=f"fedbuff:concurrency={fb.concurrency},buffer={fb.buffer}",
                fedbuff_step_seconds=fb_s,
                fedbuff_client_updates_per_s=fb.buffer / fb_s,
                sync_system_client_updates_per_s=p / sys_s,
            )
        executed = executed_steps(steps, parallel.mode, parallel.chunk)
        rows.append(
            {
                "model": model_name,
                "work": work,
                "per_round": p,
                "mode": parallel.text(),
                "parallel_choice": choice,
                "local_steps": local_steps if work == "steps" else None,
                "local_epochs": 1 if work == "epochs" else None,
                "batch_size": bsz,
                "client_sizes": [int(sizes.min()), int(np.median(sizes)), int(sizes.max())],
                "padded_step_fraction": 1.0 - steps.sum() / max(executed, 1),
                "engine_round_seconds": t["seconds"],
                "engine_compile_seconds": t["first_seconds"] - t["seconds"],
                "engine_client_updates_per_s": eng_ups,
                "loop_client_updates_per_s": loop_ups,
                "loop_step_jit_updates_per_s": p / times["loop_step"]["seconds"],
                "loop_client_jit_updates_per_s": p / times["loop_client"]["seconds"]
                if "loop_client" in times
                else None,
                # the median of the ratios of loop and engine rounds timed next to each other
                "speedup_vs_loop": statistics.median(ratios),
                "speedup_range": [min(ratios), max(ratios)],
                "turns": len(ratios),
                "engine_round_times": t["times"],
                "loop_round_times": loop_rounds,
                "loop_variant": loop_name,
                "flops_per_client_update": flops_per_update,
                "engine_gflops": eng_ups * flops_per_update / 1e9,
                "loop_gflops": loop_ups * flops_per_update / 1e9,
                "matmul_gflops": peak,
                "engine_fraction_of_peak": eng_ups * flops_per_update / 1e9 / peak,
                "loop_fraction_of_peak": loop_ups * flops_per_update / 1e9 / peak,
                **timed,
            }
        )
    return rows


COLUMNS = [
    ("model", "model", "{}"),
    ("work", "work", "{}"),
    ("P", "per_round", "{}"),
    ("mode", "mode", "{}"),
    ("engine upd/s", "engine_client_updates_per_s", "{:.1f}"),
    ("loop upd/s", "loop_client_updates_per_s", "{:.1f}"),
    ("speedup", "speedup_vs_loop", "{:.2f}x"),
    ("padded", "padded_step_fraction", "{:.0%}"),
    ("engine GF/s", "engine_gflops", "{:.1f}"),
    ("matmul GF/s", "matmul_gflops", "{:.1f}"),
    ("engine %peak", "engine_fraction_of_peak", "{:.0%}"),
    ("compile s", "engine_compile_seconds", "{:.1f}"),
]


TIMED_COLUMNS = [
    ("model", "model", "{}"),
    ("P", "per_round", "{}"),
    ("round s", "engine_round_seconds", "{:.4f}"),
    ("+system s", "system_round_seconds", "{:.4f}"),
    ("overhead", "system_overhead", "{:+.1%}"),
    ("sync upd/s", "sync_system_client_updates_per_s", "{:.1f}"),
    ("fedbuff", "asynchronous", "{}"),
    ("fedbuff upd/s", "fedbuff_client_updates_per_s", "{:.1f}"),
]


def throughput_main(
    models: list[str],
    per_rounds: list[int | None],
    modes: list[str] | None = None,
    settings: Settings | None = None,
    *,
    out: str | None = None,
) -> list[dict]:
    """Runs :func:`measure` over models x P, prints the table, writes JSON to ``out``.

    The JSON object holds ``machine``, ``rows`` and, for convenience, the first row's fields at
    the top level (so a single ``--model --per-round`` run reads as one flat object).
    """
    if modes and "all" in modes:
        modes = ["auto", *ALL_MODES]
    for mode in modes or []:  # a typo fails now, not after minutes of timing the loop
        parse_parallel(mode)
    t0 = time.perf_counter()
    peak = matmul_gflops()
    settings = settings or Settings()
    rows = []
    for m in [None] if settings.model_def else models:
        for p in per_rounds:
            rows.extend(measure(m, p, modes, settings, peak=peak))
    info = machine_info()
    print(
        f"device: {info['device_kind']} ({info['backend']}, {info['cpu_count']} CPUs), "
        f"jax {info['jax_version']}; work: {settings.work}"
    )
    print_table(rows, COLUMNS)
    if any("system_overhead" in r for r in rows):
        print_table(rows, TIMED_COLUMNS)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if settings.trace:
        print(
            f"profiler trace of 3 engine rounds under {settings.trace}/ (open in "
            "Perfetto/TensorBoard)"
        )
    payload = {**rows[0], "machine": info, "rows": rows} if rows else {"machine": info, "rows": []}
    write_json_rows(out, payload)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench throughput``'s flags: the :class:`Settings` fields by their names,
    the models, P values, modes and the output file."""
    p.add_argument("--model", action="append", help="logreg, mlp, cnn, lstm (default logreg)")
    p.add_argument("--per-round", type=int, action="append", help="clients per round")
    p.add_argument(
        "--mode",
        action="append",
        help="engine modes to time (auto, vmap, map, chunked:C); default auto",
    )
    p.add_argument(
        "--work",
        choices=WORKS,
        default="steps",
        help="fixed local steps, or one local epoch over LogNormal-sized clients",
    )
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="default 32 (steps) or 10 (epochs)")
    p.add_argument(
        "--model-def", default=None, metavar="FILE.py:NAME", help="a flax module of yours"
    )
    p.add_argument("--input-shape", default=None, help="with --model-def, e.g. 28,28,1")
    p.add_argument("--classes", type=int, default=None, help="with --model-def")
    p.add_argument("--trace", default=None, metavar="DIR", help="a jax.profiler trace here")
    p.add_argument(
        "--system",
        default=None,
        metavar="SPEC",
        help="also time the round with this system model (its overhead)",
    )
    p.add_argument(
        "--async",
        dest="asynchronous",
        default=None,
        metavar="SPEC",
        help="also FedBuff's client updates/s at concurrency P (fedbuff:buffer=B)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="turns of one loop round and one round of each mode, the speedup being the "
        "median of the turns' ratios",
    )
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench throughput``: :func:`throughput_main` with the flags."""
    flags = {f.name: getattr(a, f.name) for f in dataclasses.fields(Settings)}
    if a.input_shape is not None:
        flags["input_shape"] = convert(
            a.input_shape.replace(",", "-"), tuple[int, ...], what="--input-shape", key="shape"
        )
    settings = Settings(**flags)
    return throughput_main(
        a.model or ["logreg"], a.per_round or [None], a.mode, settings, out=a.out
    )
