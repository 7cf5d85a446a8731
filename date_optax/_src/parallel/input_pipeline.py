"""Input pipeline: per-host shards of each global batch, and device prefetch."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.distributed import host_local_to_global


def num_examples(data: Any) -> int:
  leaves = jax.tree.leaves(data)
  if not leaves:
    raise ValueError("data must have at least one array leaf.")
  sizes = {int(np.shape(x)[0]) if np.ndim(x) else -1 for x in leaves}
  if len(sizes) != 1 or -1 in sizes:
    raise ValueError(
        "every leaf of data needs the same leading (example) dimension, got "
        f"{sorted(sizes)}."
    )
  return sizes.pop()


def process_of(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  count = jax.process_count() if process_count is None else process_count
  count = validation.check_int("process_count", count, low=1)
  index = jax.process_index() if process_index is None else process_index
  index = validation.check_int("process_index", index, low=0, high=count - 1)
  return index, count


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
  """
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
  """
  n = num_examples(data)
  index, count = process_of(process_index, process_count)
  b = validation.check_int("global_batch_size", global_batch_size, low=1)
  if b % count:
    raise ValueError(
        f"global_batch_size={b} must be divisible by the {count} processes."
    )
  validation.check_bool("shuffle", shuffle)
  order = epoch_permutation(n, seed=seed, epoch=epoch) if shuffle else np.arange(n)
  local = b // count
  for j in range(n // b):
    rows = order[j * b + index * local : j * b + (index + 1) * local]
    yield jax.tree.map(lambda x, rows=rows: np.asarray(x[rows]), data)


def prefetch_to_device(
    batches: Iterable[Any], sharding: jax.sharding.Sharding, *, size: int = 2
) -> Iterator[Any]:
  """Keeps the next `size` batches on their way to the devices.

  Each host-local batch is turned into a global array with `sharding` (the
  train step's `batch_sharding`) as soon as it is queued; JAX transfers
  asynchronously, so the copy of batch j+1 overlaps the step on batch j.

  Args:
    batches: an iterable of host-local batches (e.g. `epoch_batches`).
    sharding: the global batch sharding, e.g. `NamedSharding(mesh, P("data"))`.
    size: how many batches to keep in flight, >= 1.

  Returns:
    An iterator of global batches, in the same order.

  Examples:
    >>> import numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> host = ({"x": np.ones((mesh.size, 2))} for _ in range(3))
    >>> out = list(dp.prefetch_to_device(host, NamedSharding(mesh, P("data"))))
    >>> len(out), out[0]["x"].sharding.spec == P("data")
    (3, True)

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018;
    flax.jax_utils.prefetch_to_device.
  """
  size = validation.check_int("size", size, low=1)
  queue: collections.deque[Any] = collections.deque()
  it = iter(batches)

  def enqueue(k: int) -> None:
    for _ in range(k):
      try:
        batch = next(it)
      except StopIteration:
        return
      queue.append(host_local_to_global(batch, sharding))

  enqueue(size)
  while queue:
    yield queue.popleft()
    enqueue(1)
