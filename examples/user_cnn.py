"""A plain flax CNN, as a user would write it (``nn.Conv``, no fedjax_sel imports): the FedAvg
EMNIST CNN with a different layout (two 3x3 convolutions of 32 and 64 filters, max-pooling, a
dense layer of 128), for ``fedjax-sel bench throughput --model-def examples/user_cnn.py:UserCNN
--input-shape 28,28,1 --classes 62``."""

from __future__ import annotations

import flax.linen as nn


class UserCNN(nn.Module):
    features: int = 62

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = nn.max_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(self.features)(x)
