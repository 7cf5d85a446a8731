"""The studies' LSTM classifier: one LSTM layer and a linear head.

The model of `examples/mnist1d_lstm` (``chunk=4``) and `examples/mnist_lstm`
(``chunk=28``, one image row per step).
"""

from __future__ import annotations

import flax.linen as nn
import jax


class LSTMClassifier(nn.Module):
  """Reads a (batch, length) signal as length/chunk steps of chunk samples.

  The papers' MNIST LSTM reads 28 rows of 28 pixels the same way
  (``chunk=28`` on flattened digits).

  Attributes:
    hidden_size: LSTM units.
    chunk: signal samples per time step (must divide the signal length).
    num_classes: output classes.
  """

  hidden_size: int = 64
  chunk: int = 4
  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    del train  # no dropout or batch norm; the argument matches models with them
    x = x.reshape(x.shape[0], -1, self.chunk)
    h = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size), name="lstm")(x)
    return nn.Dense(self.num_classes, name="head")(h[:, -1])
