"""The studies' LSTM classifier: the MNIST-1D example's model.

One LSTM layer and a linear head, `examples/mnist1d_lstm/models.py` (its
home: examples own their models, benchmarks import them). ``chunk=4`` reads
MNIST-1D, ``chunk=28`` one image row per step as `examples/mnist_lstm` does.
"""

from __future__ import annotations

from examples.mnist1d_lstm.models import LSTMClassifier

__all__ = ["LSTMClassifier"]
