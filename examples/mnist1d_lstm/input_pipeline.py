"""MNIST-1D, generated locally by the `mnist1d` package, as NumPy batches."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import numpy as np


def get_datasets(num_train: int, num_test: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Generates `num_train + num_test` examples: signals (N, 40) and labels.

  `mnist1d` draws from NumPy's and Python's global generators; their states
  are restored afterwards so the caller's random streams are unchanged.
  """
  from mnist1d.data import get_dataset_args, make_dataset

  total = num_train + num_test
  args = get_dataset_args()
  args.num_samples = int(math.ceil(total / 10) * 10)  # per-class balanced
  args.train_split = 1.0
  args.seed = seed
  np_state, py_state = np.random.get_state(), random.getstate()
  try:
    raw = make_dataset(args)
  finally:
    np.random.set_state(np_state)
    random.setstate(py_state)
  x = np.asarray(raw["x"], np.float32)
  y = np.asarray(raw["y"], np.int32)
  return dict(x_train=x[:num_train], y_train=y[:num_train],
              x_test=x[num_train:total], y_test=y[num_train:total])


def train_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator
) -> Iterator[dict[str, np.ndarray]]:
  """One epoch of shuffled batches; the last partial batch is dropped."""
  order = rng.permutation(len(x))
  for i in range(len(x) // batch_size):
    idx = order[i * batch_size : (i + 1) * batch_size]
    yield {"x": x[idx], "y": y[idx]}
