"""The measured ``--parallel auto`` choice, its cache, the grouping of epoch-mode clients by
step count, and results that do not depend on which mode wins."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.cli.main import main
from fedjax_sel.data import from_client_arrays, load_dataset
from fedjax_sel.experiment import read_metrics, strip_timings
from fedjax_sel.models import make_model
from fedjax_sel.training import HParams, LocalConfig, make_trainer, parse_parallel
from fedjax_sel.training.autotune import can_win, candidates, choose_parallel
from fedjax_sel.training.local import executed_steps


@pytest.fixture
def autotune_on(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDJAX_SEL_AUTOTUNE", "1")
    monkeypatch.setenv("FEDJAX_SEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "parallel.json"


def test_choice_is_measured_then_cached(autotune_on):
    ds = load_dataset("digits", num_clients=12, partition="dirichlet:0.5", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    cfg = LocalConfig(batch_size=8, local_steps=None, local_epochs=1)
    first = choose_parallel(model, cfg, ds.train, 8)
    assert first.source == "measured" and len(first.timings) >= 3
    assert min(first.timings, key=first.timings.get) == first.parallel
    # epoch mode on unequal clients: vmap pads every slot to the largest, map pads nothing
    assert first.padded_step_fraction["map"] == 0.0
    assert first.padded_step_fraction["vmap"] > 0.0
    assert first.padded_step_fraction["chunked:4"] < first.padded_step_fraction["vmap"]
    again = choose_parallel(model, cfg, ds.train, 8)
    assert again.source == "cache" and again.parallel == first.parallel
    assert autotune_on.exists()
    other = choose_parallel(model, cfg, ds.train, 6)  # another round shape: measured anew
    assert other.source == "measured"


def test_conv_models_also_time_the_convolution(monkeypatch):
    model = make_model("cnn", input_shape=(12, 12, 1), num_classes=5)
    names = {f"{m}/{c}" for m, c in candidates(model, 8, "cpu")}
    assert {f"{m}/{c}" for m in ("map", "vmap") for c in ("patches", "xla", "xla_nhwc")} <= names
    # the rule first, then the rule's mode with the other convolutions, XLA's as written last
    # (slow in compiled loops on a CPU): a budget spent on the first never skips the others
    assert candidates(model, 8, "cpu")[:3] == [
        ("map", "patches"),
        ("map", "xla_nhwc"),
        ("map", "xla"),
    ]


def test_slow_rounds_are_measured_on_fewer_clients_and_never_skip_two(autotune_on):
    ds = load_dataset("digits", num_clients=30, partition="iid", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    cfg = LocalConfig(batch_size=8, local_steps=2)
    # a budget no call fits in: 16 of the 24 clients, and still the first two candidates
    tight = choose_parallel(model, cfg, ds.train, 24, budget_s=1e-6, use_cache=False)
    assert tight.measured_clients == 16 and len(tight.timings) == 2
    roomy = choose_parallel(model, cfg, ds.train, 24, budget_s=60.0, use_cache=False)
    assert roomy.measured_clients == 24 and len(roomy.timings) == len(candidates(model, 24, "cpu"))


def test_small_slow_rounds_shrink_to_two_clients_and_hopeless_candidates_get_one_call(
    autotune_on,
):
    ds = load_dataset("digits", num_clients=12, partition="iid", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    cfg = LocalConfig(batch_size=8, local_steps=2)
    # 10 clients a round and no call fits the budget: timed on 2 of them (a ResNet round of
    # 10 clients once spent minutes per candidate call)
    tight = choose_parallel(model, cfg, ds.train, 10, budget_s=1e-6, use_cache=False)
    assert tight.measured_clients == 2 and len(tight.timings) == 2
    assert can_win(1.9, {"map/patches": 1.0}) and can_win(5.0, {})
    assert not can_win(13.0, {"map/patches": 1.9})  # the CNN's XLA convolution in lax.map


def test_executed_steps_against_a_count():
    steps = np.array([3, 9, 1, 4, 4, 12, 2])
    assert executed_steps(steps, "map", None) == steps.sum()
    assert executed_steps(steps, "vmap", None) == 7 * 12
    # sorted [1, 2, 3, 4, 4, 9, 12] in chunks of 3: 3*3 + 3*9 + 1*12
    assert executed_steps(steps, "chunked", 3) == 9 + 27 + 12


def test_grouped_epoch_chunks_equal_the_ungrouped_round():
    """Chunked epoch-mode training sorts the slots by size: the same per-client results as
    vmap (every slot padded to the largest client) and as map, in the original slot order."""
    rng = np.random.default_rng(0)
    sizes = [3, 40, 7, 22, 5, 31, 12, 9]
    xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, 3, n).astype(np.int32) for n in sizes]
    data = from_client_arrays(xs, ys)
    model = make_model("mlp", input_shape=(5,), num_classes=3, hidden=(6,))
    params = model.init(jax.random.key(0))
    cfg = LocalConfig(batch_size=4, local_steps=None, local_epochs=2)
    clients = jnp.array([5, 0, 3, 7, 1, 2])
    out = {
        mode: make_trainer(model, cfg, data.n_max, parallel=parse_parallel(mode)).train(
            params, data, clients, jnp.ones(6, bool), jax.random.key(1), hparams=HParams.of(0.1)
        )
        for mode in ("vmap", "map", "chunked:2")
    }
    for mode in ("map", "chunked:2"):
        np.testing.assert_array_equal(out[mode].num_steps, out["vmap"].num_steps)
        for a, b in zip(
            jax.tree.leaves(out[mode].params), jax.tree.leaves(out["vmap"].params), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    want = [2 * -(-sizes[c] // 4) for c in clients.tolist()]
    assert out["chunked:2"].num_steps.tolist() == want


def test_auto_run_records_its_mode_and_its_config_reruns_exactly(autotune_on, tmp_path, capsys):
    args = [
        "run",
        "--clients",
        "10",
        "--per-round",
        "4",
        "--rounds",
        "4",
        "--eval-every",
        "2",
        "--local-epochs",
        "1",
        "--batch-size",
        "8",
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    info = json.loads((tmp_path / "a" / "config.json").read_text())
    choice = info["parallel_choice"]
    assert choice["source"] == "measured" and choice["parallel"] in choice["timings"]
    assert info["config"]["parallel"].startswith(choice["parallel"])
    # rerun from config.json after the cache is gone: the recorded mode, not a new measurement
    autotune_on.unlink()
    assert (
        main(
            [
                "run",
                "--config",
                str(tmp_path / "a" / "config.json"),
                "--out",
                str(tmp_path / "b"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert not autotune_on.exists()
    a = [strip_timings(r) for r in read_metrics(tmp_path / "a" / "metrics.jsonl")]
    b = [strip_timings(r) for r in read_metrics(tmp_path / "b" / "metrics.jsonl")]
    assert a == b
    capsys.readouterr()
