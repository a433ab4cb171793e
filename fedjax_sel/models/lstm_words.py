"""TensorFlow Federated's Stack Overflow next-word model: a word LSTM with a prediction at
every position (Reddi et al. 2021, "Adaptive Federated Optimization";
``tff.simulation.baselines.stackoverflow.word_prediction_models.create_recurrent_model``).

Embedding of 96, one LSTM of 670 units, a dense layer of 96, a dense layer to the extended
vocabulary (``num_classes`` = words + OOV buckets + 3: pad, beginning and end of sentence)
at every position: 4,050,748 parameters at TFF's 10,000 words and one OOV bucket.

Token ids follow TFF's layout (:mod:`fedjax_sel.data.dataset_stackoverflow`): 0 pad,
``1..V`` the words, ``V+1..V+B`` the OOV buckets, ``V+B+1`` BOS, ``V+B+2`` EOS, with
``V = num_classes - B - 3``.

* ``loss``: per sequence, the mean cross-entropy over its non-pad targets
  (:func:`~fedjax_sel.models.base.sequence_cross_entropy`); the simulator then averages
  sequences, each with the same weight. TFF's Keras loss averages over the *tokens* of a batch,
  so there a long sentence weighs more than a short one; here a batch of sequences of equal
  length gives the same number, unequal lengths give a per-sequence mean.
* ``correct``: per sequence, the fraction of its word targets predicted right, counting
  neither pad, OOV, BOS nor EOS (TFF's ``accuracy_without_out_of_vocab_or_end_of_sentence``,
  the accuracy Reddi et al. report; BOS never is a target). TFF divides the right
  predictions of a whole test set by its counted tokens; the test accuracy here is the mean
  of per-sequence fractions, and a sequence with no counted target (only OOV words) counts 0.

Departures from TFF's Keras model: flax's initialisers (LeCun-normal kernels, orthogonal
recurrent kernels, N(0, 1) embeddings, zero LSTM biases; Keras: Glorot-uniform, orthogonal,
U(-0.05, 0.05) embeddings, forget-gate bias 1), and no input mask: Keras's ``mask_zero``
skips pad steps, which here still run, but pads only follow a sentence's end, so the outputs
at every counted position are the same.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fedjax_sel.base import ConfigError
from fedjax_sel.models.base import (
    Model,
    check_positive,
    from_linen,
    register_model,
    sequence_accuracy,
    sequence_cross_entropy,
)

PAD = 0


class WordLSTM(nn.Module):
    """Embedding, LSTMs each followed by a dense projection, logits at every position."""

    vocab_size: int
    embed_dim: int = 96
    hidden: int = 670
    layers: int = 1

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens.astype(jnp.int32))
        for _ in range(self.layers):
            x = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x)
            x = nn.Dense(self.embed_dim)(x)
        return nn.Dense(self.vocab_size)(x)


def word_targets(num_classes: int, oov_buckets: int):
    """``counted(y) -> bool[..]``: the targets that are words of the vocabulary (TFF's
    layout: ids ``1..num_classes - oov_buckets - 3``)."""
    last_word = num_classes - oov_buckets - 3

    def counted(y):
        y = y.astype(jnp.int32)
        return (y >= 1) & (y <= last_word)

    return counted


@register_model(
    "lstm_words",
    description="word LSTM, next word at every position: embedding 96, LSTM 670, dense 96 (TFF "
    "Stack Overflow)",
    reference="Reddi et al. 2021; tff.simulation.baselines.stackoverflow",
)
def lstm_words(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    embed_dim: int = 96,
    lstm_hidden: int = 670,
    lstm_layers: int = 1,
    oov_buckets: int = 1,
) -> Model:
    if len(input_shape) != 1:
        raise ConfigError(f"lstm_words needs token-id sequences [T], got input shape {input_shape}")
    check_positive(
        "lstm_words",
        embed_dim=embed_dim,
        lstm_hidden=lstm_hidden,
        lstm_layers=lstm_layers,
        oov_buckets=oov_buckets,
    )
    if num_classes < oov_buckets + 4:
        raise ConfigError(
            f"lstm_words: {num_classes} classes leave no word beside pad, BOS, EOS and "
            f"{oov_buckets} OOV bucket(s)"
        )
    module = WordLSTM(
        vocab_size=num_classes, embed_dim=embed_dim, hidden=lstm_hidden, layers=lstm_layers
    )
    model = from_linen(module, name="lstm_words", input_shape=input_shape, input_dtype=jnp.int32)
    counted = word_targets(num_classes, oov_buckets)
    return model._replace(
        loss=lambda logits, y: sequence_cross_entropy(logits, y, PAD),
        correct=lambda logits, y: sequence_accuracy(logits, y, counted(y)),
        target_ndim=1,
    )
