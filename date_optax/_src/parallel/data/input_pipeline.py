"""Input pipeline: grain loaders sharded per process, their checkpointable
state, and device prefetch.

The loaders are grain's (`grain.DataLoader` with an `IndexSampler`: a
deterministic global shuffle per epoch, one shard per JAX process, per-record
random generators for augmentation). `iterator_state` / `restore_iterator`
put the iterator's position into a `date_optax.checkpoint.CheckpointManager`
checkpoint (its JSON metadata, saved atomically with the train state), so a
resumed run reads exactly the batches an uninterrupted run reads.
`epoch_batches` / `epoch_permutation` are the earlier hand-written order;
they are deprecated in favour of `data_loader`.
"""

from __future__ import annotations

import collections
import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.layout.distributed import host_local_to_global


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


def prefetch_to_device(
    batches: Iterable[Any], sharding: jax.sharding.Sharding, *, size: int = 2
) -> DevicePrefetch:
  """Keeps the next `size` batches on their way to the devices.

  Each host-local batch is turned into a global array with `sharding` (the
  train step's `batch_sharding`) as soon as it is queued; JAX transfers
  asynchronously, so the copy of batch j+1 overlaps the step on batch j.
  When `batches` is checkpointable (a grain iterator: `get_state` and
  `set_state`), so is the result: its state is the source's state right
  after the last batch it *returned*, not after the ones still in flight.

  Args:
    batches: an iterable of host-local batches (e.g. an iterator of
      `data_loader`).
    sharding: the global batch sharding, e.g. `NamedSharding(mesh, P("data"))`.
    size: how many batches to keep in flight, >= 1.

  Returns:
    A `DevicePrefetch` iterator of global batches, in the same order.

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
  return DevicePrefetch(batches, sharding, size=size)


class DevicePrefetch(Iterator):
  """The iterator of `prefetch_to_device` (see there); checkpointable.

  Args:
    batches: host-local batches; a grain iterator makes this one
      checkpointable.
    sharding: the global batch sharding.
    size: batches in flight, >= 1.

  Examples:
    >>> import numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> it = dp.DevicePrefetch(iter([{"x": np.ones((mesh.size,))}]),
    ...                        NamedSharding(mesh, P("data")))
    >>> next(it)["x"].shape == (mesh.size,)
    True

  References:
    flax.jax_utils.prefetch_to_device; grain's `DataLoaderIterator`
    (`get_state` / `set_state`).
  """

  def __init__(self, batches: Iterable[Any], sharding: jax.sharding.Sharding, *,
               size: int = 2):
    self._size = validation.check_int("size", size, low=1)
    self._source = iter(batches)
    self._sharding = sharding
    self._stateful = hasattr(self._source, "get_state") and hasattr(
        self._source, "set_state")
    self._queue: collections.deque[tuple[Any, Any]] = collections.deque()
    self._state = self._source.get_state() if self._stateful else None
    self._primed = False

  def _enqueue(self, k: int) -> None:
    for _ in range(k):
      try:
        batch = next(self._source)
      except StopIteration:
        return
      state = self._source.get_state() if self._stateful else None
      self._queue.append((host_local_to_global(batch, self._sharding), state))

  def __next__(self) -> Any:
    if not self._primed:
      self._enqueue(self._size)
      self._primed = True
    else:
      self._enqueue(1)  # replaces the batch returned by the previous call
    if not self._queue:
      raise StopIteration
    batch, self._state = self._queue.popleft()
    return batch

  def get_state(self) -> Any:
    """The source's state after the last returned batch."""
    if not self._stateful:
      raise TypeError("prefetch_to_device: the source iterator has no get_state.")
    return self._state

  def set_state(self, state: Any) -> None:
    """Drops the batches in flight and moves the source to `state`."""
    if not self._stateful:
      raise TypeError("prefetch_to_device: the source iterator has no set_state.")
    self._source.set_state(state)
    self._state = state
    self._queue.clear()
    self._primed = False


def _deprecated(name: str) -> None:
  warnings.warn(
      f"date_optax.parallel.{name} is deprecated: use date_optax.parallel.data_loader "
      "(grain: a seeded global shuffle per epoch, one shard per process, and an "
      "iterator state saved with the checkpoint).", DeprecationWarning, stacklevel=3)


def _grain():
  try:
    import grain  # noqa: PLC0415 - optional dependency
  except ImportError as e:
    raise ImportError(
        "date_optax.parallel.data_loader needs grain: pip install "
        "'date-optax[examples]' (or pip install grain)."
    ) from e
  return grain


class ArraySource:
  """A grain data source over a pytree of in-memory arrays (rows on axis 0).

  Its `repr` (which grain stores in the iterator state and checks on
  restore) names the number of rows and each leaf's row shape and dtype.

  Args:
    data: a pytree of arrays with the examples along the leading axis.

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> src = dp.ArraySource({"x": np.arange(6).reshape(3, 2), "y": np.arange(3)})
    >>> len(src), src[1]["x"].tolist(), int(src[1]["y"])
    (3, [2, 3], 1)

  References:
    grain's `RandomAccessDataSource` protocol (`__len__`, `__getitem__`).
  """

  def __init__(self, data: Any):
    self._n = num_examples(data)
    self._data = jax.tree.map(np.asarray, data)
    leaves = jax.tree.leaves(self._data)
    self._repr = "ArraySource(rows={}, leaves=[{}])".format(
        self._n, ", ".join(f"{x.dtype}{list(x.shape[1:])}" for x in leaves))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, index: int) -> Any:
    return jax.tree.map(lambda x: x[index], self._data)

  def __repr__(self) -> str:
    return self._repr


def data_loader(
    source: Any,
    global_batch_size: int,
    *,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    operations: Sequence[Any] = (),
    worker_count: int = 0,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Any:
  """A grain `DataLoader` of this process's share of every global batch.

  Process p of P reads shard p (the p-th contiguous `len(source) // P`
  records, grain's `ShardByJaxProcess` with `drop_remainder=True`), which
  grain's `IndexSampler` shuffles afresh every epoch from `seed`; the
  `operations` run on each record (a `grain.transforms.RandomMap` gets a
  generator seeded by `(seed, record position)`, so augmentation replays
  exactly after a restore), and batches of `global_batch_size / P` end the
  pipeline. The shards are disjoint and their union is the epoch.

  Args:
    source: a grain random-access data source (`__len__`, `__getitem__`),
      e.g. `ArraySource(arrays)` or `grain.sources.ArrayRecordDataSource`.
    global_batch_size: `B`, divisible by the number of processes.
    seed: shuffle and augmentation seed, an integer in [0, 2**31).
    shuffle: False reads each shard in order.
    num_epochs: passes over the data, or None to repeat forever.
    operations: grain transforms applied to each record before batching.
    worker_count: grain worker processes (0: read in this process).
    process_index: this process (default `jax.process_index()`).
    process_count: number of processes (default `jax.process_count()`).

  Returns:
    A `grain.DataLoader`; `iter()` of it is a checkpointable iterator (see
    `iterator_state`).

  Raises:
    ValueError: if `B` does not divide over the processes, or a shard has
      fewer records than one local batch (both numbers are named).

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> src = dp.ArraySource({"x": np.arange(12)})
    >>> it = iter(dp.data_loader(src, 4, seed=0, process_index=1, process_count=2))
    >>> b = next(it)["x"]
    >>> b.shape, bool(np.all(b >= 6))
    ((2,), True)

  References:
    grain (Google), `DataLoader`, `IndexSampler` and `ShardByJaxProcess`:
    https://google-grain.readthedocs.io; Ying et al., "Image Classification
    at Supercomputer Scale", 2018 (input pipeline sharded by host).
  """
  grain = _grain()
  index, count = process_of(process_index, process_count)
  b = validation.check_int("global_batch_size", global_batch_size, low=1)
  if b % count:
    raise ValueError(
        f"global_batch_size={b} does not divide over the {count} processes; use "
        f"a multiple of {count}."
    )
  seed = validation.check_int("seed", seed, low=0, high=2**31 - 1)
  validation.check_bool("shuffle", shuffle)
  if num_epochs is not None:
    num_epochs = validation.check_int("num_epochs", num_epochs, low=1)
  worker_count = validation.check_int("worker_count", worker_count, low=0)
  n = len(source)
  local = b // count
  if n // count < local:
    raise ValueError(
        f"the data source has {n} records, {n // count} per process over {count} "
        f"processes: fewer than one local batch of {local} "
        f"(global_batch_size={b})."
    )
  shard = grain.sharding.ShardOptions(shard_index=index, shard_count=count,
                                      drop_remainder=True)
  sampler = grain.samplers.IndexSampler(
      num_records=n, shard_options=shard, shuffle=shuffle, num_epochs=num_epochs,
      seed=seed)
  ops = [*operations, grain.transforms.Batch(local, drop_remainder=True)]
  return grain.DataLoader(data_source=source, sampler=sampler, operations=ops,
                          worker_count=worker_count, shard_options=shard)


class GrowingBatches:
  """Host-local batches of whatever global size each step asks for.

  A growing batch (`date_optax.BatchSchedule`) needs a different number of
  examples at different steps. This reads them from an iterator of fixed
  chunks — a `data_loader` built with `global_batch_size=chunk_size`
  (`BatchSchedule.chunk_size`, which divides every batch of the schedule)
  — and concatenates ``B / chunk_size`` consecutive chunks for a step of
  global batch ``B``. The examples are therefore read in the loader's order
  whatever the batch sizes, and the position is the loader's: `get_state`
  / `set_state` (so `iterator_state` / `restore_iterator`) save and
  restore it between steps, and a resumed run reads exactly the batches
  an uninterrupted one reads.

  Args:
    iterator: an iterator of host-local chunks (e.g. `iter(data_loader(...))`).
    chunk_size: the chunks' *global* batch (`global_batch_size` of the
      loader), >= 1.

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> src = dp.ArraySource({"x": np.arange(64)})
    >>> batches = dp.GrowingBatches(iter(dp.data_loader(src, 4, seed=0)), 4)
    >>> [batches.take(b)["x"].shape[0] for b in (4, 8, 16)]
    [4, 8, 16]

  References:
    Shoeybi et al., `Megatron-LM <https://arxiv.org/abs/1909.08053>`_, 2019
    (the batch ramp-up: a fixed microbatch, more of them per step).
  """

  def __init__(self, iterator: Any, chunk_size: int):
    self._source = iterator
    self.chunk_size = validation.check_int("chunk_size", chunk_size, low=1)

  def take(self, global_batch_size: int) -> Any:
    """This host's rows of the next global batch of `global_batch_size`."""
    b = validation.check_int("global_batch_size", global_batch_size, low=1)
    if b % self.chunk_size:
      raise ValueError(
          f"global_batch_size={b} is not a whole number of the loader's chunks of "
          f"{self.chunk_size}; build the loader with the schedule's chunk_size."
      )
    chunks = [next(self._source) for _ in range(b // self.chunk_size)]
    if len(chunks) == 1:
      return chunks[0]
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *chunks)

  def get_state(self) -> Any:
    """The source's position after the last chunk taken."""
    return self._source.get_state()

  def set_state(self, state: Any) -> None:
    """Moves the source to `state` (from `get_state`)."""
    self._source.set_state(state)


def iterator_state(iterator: Any) -> dict[str, Any]:
  """Every process's position of a checkpointable data iterator, as JSON.

  Gathers the `get_state()` of each process's iterator (a grain
  `DataLoaderIterator`, or `prefetch_to_device` of one), so that the
  primary process can save all of them in the checkpoint's metadata:
  `ckpt.save(step, state, metadata={"data": dp.iterator_state(it)})`. Call it
  on every process (it is a collective when there are several).

  Args:
    iterator: an iterator with `get_state()` returning bytes, str or a
      JSON-serialisable value.

  Returns:
    `{"process_count": P, "states": [state of process 0, ...]}`.

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> it = iter(dp.data_loader(dp.ArraySource({"x": np.arange(8)}), 2, seed=0))
    >>> _ = next(it)
    >>> saved = dp.iterator_state(it)
    >>> want = next(it)["x"]
    >>> it2 = iter(dp.data_loader(dp.ArraySource({"x": np.arange(8)}), 2, seed=0))
    >>> dp.restore_iterator(it2, saved)
    >>> bool((next(it2)["x"] == want).all())
    True

  References:
    grain's checkpointing of `DataLoaderIterator` state (one state per
    process, saved beside the model's checkpoint).
  """
  local = iterator.get_state()
  if isinstance(local, bytes):
    local = local.decode()
  if not isinstance(local, str):
    local = json.dumps(local)
  count = jax.process_count()
  if count == 1:
    return {"process_count": 1, "states": [local]}
  from jax.experimental import multihost_utils  # noqa: PLC0415

  raw = np.frombuffer(local.encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([raw.size], np.int64))
  width = int(np.max(sizes))
  padded = np.zeros(width, np.uint8)
  padded[: raw.size] = raw
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(count, width)
  sizes = np.asarray(sizes).reshape(count)
  return {"process_count": count,
          "states": [bytes(every[p, : sizes[p]]).decode() for p in range(count)]}


def restore_iterator(iterator: Any, saved: Any) -> None:
  """Moves a data iterator to the position `iterator_state` recorded.

  Refuses, rather than silently restarting the data, a saved state that
  does not belong to this pipeline: one saved by a different number of
  processes (shards), or whose sampler (seed, shard, dataset size, epochs)
  or source differs from the iterator's.

  Args:
    iterator: this process's fresh iterator of the same pipeline.
    saved: the mapping returned by `iterator_state` (from the checkpoint's
      metadata).

  Returns:
    None; `iterator` continues after the batch the saved run returned last.

  Raises:
    ValueError: if `saved` is malformed or does not match the pipeline; the
      message names what differs.

  Examples:
    >>> import numpy as np
    >>> import date_optax.parallel as dp
    >>> src = dp.ArraySource({"x": np.arange(8)})
    >>> saved = dp.iterator_state(iter(dp.data_loader(src, 2, seed=0)))
    >>> try:
    ...   dp.restore_iterator(iter(dp.data_loader(src, 2, seed=1)), saved)
    ... except ValueError as e:
    ...   print("refused")
    refused

  References:
    grain's `DataLoader` state validation (sampler and source must match).
  """
  if not isinstance(saved, dict) or "states" not in saved or "process_count" not in saved:
    raise ValueError(
        "the checkpoint's data-iterator state is missing or malformed (expected "
        f"the output of iterator_state, got {str(saved)[:200]!r}).")
  count, index = jax.process_count(), jax.process_index()
  if saved["process_count"] != count or len(saved["states"]) != count:
    raise ValueError(
        f"the checkpoint's data iterator was saved by {saved['process_count']} "
        f"processes (shards) but this run has {count}; the per-process positions "
        "cannot be carried over. Resume with the same number of processes, or "
        "start from a fresh workdir.")
  state = saved["states"][index]
  fresh = iterator.get_state()
  want = json.loads(state)
  have = json.loads(fresh.decode() if isinstance(fresh, bytes) else fresh) if isinstance(
      fresh, (bytes, str)) else fresh
  if isinstance(want, dict) and isinstance(have, dict):
    for key in ("sampler", "data_source", "worker_count"):
      if key in want and want.get(key) != have.get(key):
        raise ValueError(
            f"the checkpoint's data iterator does not match this input pipeline: "
            f"its {key} is {want.get(key)!r}, the pipeline's is {have.get(key)!r} "
            "(a different seed, shard count, dataset or worker count). Refusing to "
            "restart the data silently: use the checkpoint's settings or a fresh "
            "workdir.")
  iterator.set_state(state.encode() if isinstance(fresh, bytes) else state)
