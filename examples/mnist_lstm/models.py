"""The papers' MNIST-LSTM: an LSTM reads the image one row (28 pixels) per step."""

from __future__ import annotations

import flax.linen as nn
import jax


class RowLSTM(nn.Module):
  """One LSTM layer over the 28 rows of a 28x28 image, then a linear head.

  Attributes:
    hidden_size: LSTM units.
    num_classes: output classes.
  """

  hidden_size: int = 64
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], 28, 28)
    h = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size), name="lstm")(x)
    return nn.Dense(self.num_classes, name="head")(h[:, -1])
