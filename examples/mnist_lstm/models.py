"""The papers' MNIST-LSTM: an LSTM reads the image one row (28 pixels) per step.

It is the MNIST-1D example's classifier reading 28 samples per step
(`examples.mnist1d_lstm.models.LSTMClassifier` with ``chunk=28``).
"""

from __future__ import annotations

from examples.mnist1d_lstm.models import LSTMClassifier


def row_lstm(hidden_size: int = 64, num_classes: int = 10) -> LSTMClassifier:
  """One LSTM layer over the 28 rows of a 28x28 image, then a linear head."""
  return LSTMClassifier(hidden_size=hidden_size, chunk=28, num_classes=num_classes)
