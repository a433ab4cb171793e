"""Analytic FLOP counts against hand counts of each layer's multiply-adds."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from fedjax_sel.models import make_model
from fedjax_sel.models.flops import forward_flops, train_step_flops


def test_mlp_and_logreg():
    mlp = make_model("mlp", input_shape=(784,), num_classes=10)
    x = jnp.zeros((32, 784))
    want = 2 * 32 * (784 * 200 + 200 * 200 + 200 * 10)
    assert forward_flops(mlp.module, x) == want
    assert train_step_flops(mlp.module, x) == 3 * want
    logreg = make_model("logreg", input_shape=(60,), num_classes=10)
    assert forward_flops(logreg.module, jnp.zeros((5, 60))) == 2 * 5 * 60 * 10


def test_fedavg_cnn_on_emnist():
    """The CNN of the throughput table: 28x28x1 inputs, 62 classes, SAME 5x5 convolutions
    (32 then 64 filters) each followed by 2x2 pooling, dense 512. Per example:
    conv1 28*28*25*1*32, conv2 14*14*25*32*64, dense 3136*512 and 512*62 multiply-adds."""
    cnn = make_model("cnn", input_shape=(28, 28, 1), num_classes=62)
    per_example = 2 * (28 * 28 * 25 * 1 * 32 + 14 * 14 * 25 * 32 * 64 + 3136 * 512 + 512 * 62)
    assert forward_flops(cnn.module, jnp.zeros((1, 28, 28, 1))) == per_example
    # one client update of the table: 10 SGD steps of batch 32, about 23.6 GFLOP
    update = 10 * train_step_flops(cnn.module, jnp.zeros((32, 28, 28, 1)))
    assert update == pytest.approx(23.6e9, rel=0.01)


def test_char_lstm_counts_every_time_step():
    """XLA's cost analysis counts a loop body once; the analytic count has every step."""
    lstm = make_model("lstm", input_shape=(80,), num_classes=80)
    per_example = 2 * 80 * ((8 + 256) * 4 * 256 + (256 + 256) * 4 * 256) + 2 * 256 * 80
    assert forward_flops(lstm.module, jnp.zeros((1, 80), jnp.int32)) == per_example


def test_stackoverflow_word_lstm():
    """TFF's Stack Overflow model at every one of 20 positions: embedding 96 (a lookup, no
    FLOPs), LSTM 670 over 96 inputs, dense 670 -> 96, dense 96 -> 10,004 logits; 4,050,748
    parameters (Reddi et al. 2021)."""
    import jax

    model = make_model("lstm_words", input_shape=(20,), num_classes=10004)
    per_example = 2 * 20 * ((96 + 670) * 4 * 670 + 670 * 96 + 96 * 10004)
    assert forward_flops(model.module, jnp.zeros((1, 20), jnp.int32)) == per_example
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert sum(p.size for p in jax.tree.leaves(params)) == 4_050_748
