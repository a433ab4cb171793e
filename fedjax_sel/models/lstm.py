"""LEAF's Shakespeare model: a character LSTM."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fedjax_sel.base import ConfigError
from fedjax_sel.models.base import Model, check_positive, from_linen, register_model


class CharLSTM(nn.Module):
    """Embedding, stacked LSTMs, logits for the next character."""

    vocab_size: int
    embed_dim: int = 8
    hidden: int = 256
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab_size, self.embed_dim)(tokens.astype(jnp.int32))
        for _ in range(self.layers):
            x = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x)
        return nn.Dense(self.vocab_size)(x[:, -1, :])


@register_model(
    "lstm", description="character LSTM: 8-dim embedding, two 256-unit LSTM layers (LEAF)"
)
def lstm(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    embed_dim: int = 8,
    lstm_hidden: int = 256,
    lstm_layers: int = 2,
) -> Model:
    if len(input_shape) != 1:
        raise ConfigError(f"lstm needs token-id sequences [T], got input shape {input_shape}")
    check_positive("lstm", embed_dim=embed_dim, lstm_hidden=lstm_hidden, lstm_layers=lstm_layers)
    module = CharLSTM(
        vocab_size=num_classes, embed_dim=embed_dim, hidden=lstm_hidden, layers=lstm_layers
    )
    return from_linen(module, name="lstm", input_shape=input_shape, input_dtype=jnp.int32)
