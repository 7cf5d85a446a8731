"""The hand-written epoch order that `data_loader` replaced (deprecated).

`epoch_permutation` and `epoch_batches` shuffle with NumPy, one seed per
epoch, and give each process a contiguous share of every batch. They stay
for code written against them and warn once per call; `data_loader`
(grain) has the same global order per epoch and an iterator state that a
checkpoint keeps.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.data.input_pipeline import num_examples, process_of


def epoch_permutation(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
  """The example order of one epoch, a function of `(seed, epoch)` only.

  Args:
    num_examples: dataset size, >= 1.
    seed: non-negative integer seed.
    epoch: non-negative epoch index.

  Returns:
    A permutation of `range(num_examples)` (int64).

  Examples:
    >>> import date_optax.parallel as dp
    >>> p = dp.epoch_permutation(5, seed=0, epoch=1)
    >>> sorted(p.tolist())
    [0, 1, 2, 3, 4]
    >>> bool((p == dp.epoch_permutation(5, seed=0, epoch=1)).all())
    True

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017 (one random
    permutation per epoch, shared by all workers).

  Deprecated: use `data_loader` (grain's global shuffle, checkpointable).
  """
  _deprecated("epoch_permutation")
  num_examples = validation.check_int("num_examples", num_examples, low=1)
  seed = validation.check_int("seed", seed, low=0)
  epoch = validation.check_int("epoch", epoch, low=0)
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def epoch_batches(
    data: Any,
    global_batch_size: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[Any]:
  """Yields this host's rows of every global batch of one epoch.

  The epoch's order is `epoch_permutation(n, seed=seed, epoch=epoch)`;
  global batch j is rows `[j·B, (j+1)·B)` of it and process p of P takes the
  p-th contiguous `B/P` of them, which is exactly the part of the batch that
  its devices hold under a batch-sharded mesh. The global batches are thus the
  same whatever the number of hosts, and a host only reads its own rows (so
  `data` may be a `np.memmap`). The last incomplete batch is dropped.

  Args:
    data: a pytree of arrays with the examples along the leading axis.
    global_batch_size: `B`, divisible by the number of processes.
    seed: shuffling seed, >= 0.
    epoch: epoch index, >= 0.
    shuffle: False keeps the dataset order.
    process_index: this process (default `jax.process_index()`).
    process_count: number of processes (default `jax.process_count()`).

  Returns:
    An iterator of pytrees with leading dimension `B / process_count`.

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> data = {"x": np.arange(10)}
    >>> batches = list(dp.epoch_batches(data, 4, seed=0, epoch=0,
    ...                                 process_index=1, process_count=2))
    >>> len(batches), batches[0]["x"].shape
    (2, (2,))

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018 (input
    pipeline sharded by host).

  Deprecated: use `data_loader`, whose iterator state goes into checkpoints.
  """
  _deprecated("epoch_batches")
  n = num_examples(data)
  index, count = process_of(process_index, process_count)
  b = validation.check_int("global_batch_size", global_batch_size, low=1)
  if b % count:
    raise ValueError(
        f"global_batch_size={b} must be divisible by the {count} processes."
    )
  if n < b:
    raise ValueError(
        f"epoch_batches: the data has {n} rows, fewer than one global batch of "
        f"global_batch_size={b}; an epoch would yield no batch."
    )
  validation.check_bool("shuffle", shuffle)
  if shuffle:
    seed = validation.check_int("seed", seed, low=0)
    epoch = validation.check_int("epoch", epoch, low=0)
    order = np.random.default_rng([seed, epoch]).permutation(n)
  else:
    order = np.arange(n)
  local = b // count
  for j in range(n // b):
    rows = order[j * b + index * local : j * b + (index + 1) * local]
    yield jax.tree.map(lambda x, rows=rows: np.asarray(x[rows]), data)


def _deprecated(name: str) -> None:
  warnings.warn(
      f"date_optax.parallel.{name} is deprecated: use date_optax.parallel.data_loader "
      "(grain: a seeded global shuffle per epoch, one shard per process, and an "
      "iterator state saved with the checkpoint).", DeprecationWarning, stacklevel=3)
