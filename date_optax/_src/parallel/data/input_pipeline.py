"""Input pipeline: grain loaders sharded per process, their checkpointable
state, and device prefetch.

The loaders are grain's (`grain.DataLoader` with an `IndexSampler`: a
deterministic global shuffle per epoch, one shard per JAX process, per-record
random generators for augmentation). `iterator_state` / `restore_iterator`
put the iterator's position into a `date_optax.checkpoint.CheckpointManager`
checkpoint (its JSON metadata, saved atomically with the train state), so a
resumed run reads exactly the batches an uninterrupted run reads.
The earlier hand-written order (`epoch_batches`, `epoch_permutation`,
deprecated) is in `epoch_order.py`; device prefetch in `prefetch.py`.
"""

from __future__ import annotations

import hashlib
import json
import typing
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.data.prefetch import DevicePrefetch


def num_examples(data: Any, name: str = "data") -> int:
  """The number of rows every leaf of `data` has on axis 0 (named if not one)."""
  flat = jax.tree_util.tree_flatten_with_path(data)[0]
  if not flat:
    raise ValueError(
        f"{name} must be a pytree with at least one array leaf (the examples "
        f"along axis 0), got {data!r}."[:300])
  rows: dict[int, list[str]] = {}
  for path, x in flat:
    where = f"{name}{jax.tree_util.keystr(path)}"
    if not np.ndim(x):
      in_list = isinstance(data, (list, tuple)) or any(
          isinstance(k, jax.tree_util.SequenceKey) for k in path)
      raise ValueError(
          f"every leaf of {name} needs the examples along a leading axis, got "
          f"{where} = {x!r}, a scalar"
          + ("; lists and tuples are pytree nodes to JAX, so a list of numbers "
             "is read as that many scalar leaves: pass np.asarray(...) instead"
             if in_list else "")
          + ".")
    rows.setdefault(int(np.shape(x)[0]), []).append(where)
  if len(rows) != 1:
    listed = "; ".join(f"{r} rows: {', '.join(w[:3])}{', ...' if len(w) > 3 else ''}"
                       for r, w in sorted(rows.items()))
    raise ValueError(
        f"every leaf of {name} needs the same leading (example) dimension, got "
        f"{listed}."
    )
  return rows.popitem()[0]


def process_of(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  count = jax.process_count() if process_count is None else process_count
  count = validation.check_int("process_count", count, low=1)
  index = jax.process_index() if process_index is None else process_index
  index = validation.check_int("process_index", index, low=0, high=count - 1)
  return index, count


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

  #: Records are rows of arrays in memory: `data_loader` reads them in the
  #: iterating thread.
  in_memory = True

  def __init__(self, data: Any):
    self._n = num_examples(data)
    self._data = jax.tree.map(np.asarray, data)
    self._digest: str | None = None
    leaves = jax.tree.leaves(self._data)
    self._repr = "ArraySource(rows={}, leaves=[{}])".format(
        self._n, ", ".join(f"{x.dtype}{list(x.shape[1:])}" for x in leaves))

  def __len__(self) -> int:
    return self._n

  def digest(self) -> str:
    """A hash of every leaf's dtype, shape and bytes (computed once, on the
    first call: `iterator_state` records it, `restore_iterator` compares
    it, so that another dataset of the same shapes is refused)."""
    if self._digest is None:
      h = hashlib.blake2b(digest_size=16)
      for x in jax.tree.leaves(self._data):
        h.update(f"{x.dtype.str}{x.shape}".encode())
        if x.dtype.kind == "O":
          h.update(repr(x.tolist()).encode())
        else:
          h.update(np.ascontiguousarray(x).view(np.uint8).data)
      self._digest = h.hexdigest()
    return self._digest

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
    read_options: Any = None,
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
    read_options: a `grain.ReadOptions` (threads that read records ahead of
      the loop, records prefetched). None: a source whose records are in
      memory (`in_memory = True`, as `ArraySource` has) is read in the
      thread that iterates, `ReadOptions(num_threads=0)`: a read is an
      index into an array, and reader threads would only poll for it; any
      other source (files, e.g. ArrayRecord) gets grain's default threads,
      which overlap the reads with the step.

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
  if isinstance(source, (Mapping, str, bytes)) or not (
      hasattr(source, "__len__") and hasattr(source, "__getitem__")):
    raise TypeError(
        "source must be a grain random-access data source (len(source) "
        "records, source[i] one record), e.g. dp.ArraySource(arrays) or "
        f"grain.sources.ArrayRecordDataSource; got {type(source).__name__}"
        + (": wrap a dict of arrays as dp.ArraySource(...)." if isinstance(source, Mapping)
           else "."))
  ops = _check_operations(grain, operations)
  if read_options is None:
    read_options = (grain.ReadOptions(num_threads=0)
                    if getattr(source, "in_memory", False) is True else grain.ReadOptions())
  elif not isinstance(read_options, grain.ReadOptions):
    raise TypeError("read_options must be a grain.ReadOptions or None, got "
                    f"{type(read_options).__name__}.")
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
  ops = [*ops, grain.transforms.Batch(local, drop_remainder=True)]
  loader = grain.DataLoader(data_source=source, sampler=sampler, operations=ops,
                            worker_count=worker_count, shard_options=shard,
                            read_options=read_options)
  _PIPELINES[loader] = _Pipeline(b, tuple(operations), source)
  return loader


def _check_operations(grain: Any, operations: Any) -> list[Any]:
  """`operations` as a list: grain transforms (or grain's older callable
  operations); anything else is named."""
  if isinstance(operations, (str, bytes, Mapping)) or not isinstance(
      operations, (list, tuple)):
    raise TypeError(
        "operations must be a list or tuple of grain transforms "
        f"(grain.transforms.Map, RandomMap, Filter, ...), got {operations!r}."[:300])
  kinds = typing.get_args(getattr(grain.transforms, "Transformation", None)) or ()
  for i, op in enumerate(operations):
    if not (isinstance(op, kinds) or callable(op)):
      raise TypeError(
          f"operations[{i}] must be a grain transform (grain.transforms.Map, "
          f"RandomMap, Filter, ...), got {type(op).__name__} {op!r}."[:300])
  return list(operations)


class _Pipeline:
  """What a `data_loader` reads that grain's own iterator state does not
  record: the global batch size, the operations and the source's content
  (for an `ArraySource`), compared by `restore_iterator`."""

  def __init__(self, global_batch_size: int, operations: tuple[Any, ...], source: Any):
    self.global_batch_size = global_batch_size
    self.operations = operations
    self.source = source

  def describe(self) -> dict[str, Any]:
    def name(op):
      text = repr(op)  # a default repr holds an address that changes per run
      return f"{type(op).__module__}.{type(op).__qualname__}" if " at 0x" in text else text

    out: dict[str, Any] = {"global_batch_size": self.global_batch_size,
                           "operations": [name(op) for op in self.operations]}
    if isinstance(self.source, ArraySource):
      out["source_digest"] = self.source.digest()
    return out


#: The pipeline of every loader `data_loader` built (weakly: a loader that
#: is gone takes its entry with it).
_PIPELINES: weakref.WeakKeyDictionary[Any, _Pipeline] = weakref.WeakKeyDictionary()


def _pipeline_of(iterator: Any) -> _Pipeline | None:
  """The `data_loader` pipeline an iterator reads, when known."""
  while isinstance(iterator, DevicePrefetch):
    iterator = iterator._source  # noqa: SLF001 - our own wrapper
  loader = getattr(iterator, "_data_loader", None)  # grain's DataLoaderIterator
  try:
    return _PIPELINES.get(loader) if loader is not None else None
  except TypeError:  # not weakly referenceable
    return None


def _check_iterator(iterator: Any, who: str, methods: tuple[str, ...]) -> None:
  """`iterator` has `methods`; a grain DataLoader itself is named as such."""
  if all(callable(getattr(iterator, m, None)) for m in methods):
    return
  try:
    is_loader = iterator in _PIPELINES
  except TypeError:  # not weakly referenceable
    is_loader = False
  if is_loader or type(iterator).__name__ == "DataLoader":
    raise TypeError(
        f"{who}: iterator must be the loader's iterator, it = iter(loader) (the "
        "one the training loop reads), not the grain DataLoader itself.")
  raise TypeError(
      f"{who}: iterator must be a checkpointable data iterator with "
      f"{' and '.join(m + '()' for m in methods)} (iter(dp.data_loader(...)), or "
      f"dp.prefetch_to_device of one), got {type(iterator).__name__}.")


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

  Chunks already on the devices (`prefetch_to_device(iter(loader),
  step.batch_sharding)`, so the copy of the next chunks overlaps the step)
  are joined on the devices, without a copy between them: each device
  concatenates its own rows of the chunks, in turn, and the result is a
  global array with the chunks' sharding, which the step takes as laid out.
  It holds the same examples as the host-joined batch; replica r's rows
  are its rows of each chunk instead of a contiguous run of them (the same
  mean gradient; per-replica statistics and keys see other rows). Chunks
  sharded along more than the batch axis are joined with
  `jnp.concatenate` (XLA moves the rows).

  Args:
    iterator: an iterator of host-local chunks (e.g. `iter(data_loader(...))`),
      or of global arrays sharded along the batch (`prefetch_to_device`).
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
    return jax.tree.map(_join_rows, *chunks)

  def get_state(self) -> Any:
    """The source's position after the last chunk taken."""
    return self._source.get_state()

  def set_state(self, state: Any) -> None:
    """Moves the source to `state` (from `get_state`)."""
    self._source.set_state(state)


def _join_rows(*xs: Any) -> Any:
  """Concatenates chunks along the batch: on the host, or on each device."""
  first = xs[0]
  if not isinstance(first, jax.Array):
    return np.concatenate(xs, axis=0)
  sharding = first.sharding
  shards = [sorted(x.addressable_shards, key=lambda s: s.device.id) for x in xs]
  if any(idx != slice(None) for s in shards[0] for idx in s.index[1:]):
    return jnp.concatenate(xs, axis=0)  # split along more than the batch
  local = [jnp.concatenate([per_chunk[i].data for per_chunk in shards], axis=0)
           for i in range(len(shards[0]))]
  shape = (sum(x.shape[0] for x in xs), *first.shape[1:])
  return jax.make_array_from_single_device_arrays(shape, sharding, local)


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
    `{"process_count": P, "states": [state of process 0, ...]}`, and for an
    iterator of `data_loader` `"pipeline"`: its global batch size, its
    operations and (for an `ArraySource`) a hash of the source's arrays,
    which grain's own state does not record.

  Raises:
    TypeError: `iterator` has no `get_state()` (e.g. the `DataLoader`
      itself instead of `iter(loader)`).

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
  _check_iterator(iterator, "iterator_state", ("get_state",))
  local = iterator.get_state()
  if isinstance(local, bytes):
    local = local.decode()
  if not isinstance(local, str):
    local = json.dumps(local)
  count = jax.process_count()
  pipeline = _pipeline_of(iterator)
  extra = {} if pipeline is None else {"pipeline": pipeline.describe()}
  if count == 1:
    return {"process_count": 1, "states": [local], **extra}
  from jax.experimental import multihost_utils  # noqa: PLC0415

  raw = np.frombuffer(local.encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray([raw.size], np.int64))
  width = int(np.max(sizes))
  padded = np.zeros(width, np.uint8)
  padded[: raw.size] = raw
  every = np.asarray(multihost_utils.process_allgather(padded)).reshape(count, width)
  sizes = np.asarray(sizes).reshape(count)
  return {"process_count": count,
          "states": [bytes(every[p, : sizes[p]]).decode() for p in range(count)], **extra}


def restore_iterator(iterator: Any, saved: Any) -> None:
  """Moves a data iterator to the position `iterator_state` recorded.

  Refuses, rather than silently restarting the data, a saved state that
  does not belong to this pipeline: one saved by a different number of
  processes (shards), or whose sampler (seed, shard, dataset size, epochs),
  source, global batch size, operations or (for an `ArraySource`) data
  differ from the iterator's. States saved before the batch size,
  operations and data were recorded are checked for the rest only.

  Args:
    iterator: this process's fresh iterator of the same pipeline.
    saved: the mapping returned by `iterator_state` (from the checkpoint's
      metadata).

  Returns:
    None; `iterator` continues after the batch the saved run returned last.

  Raises:
    TypeError: `iterator` has no `get_state()`/`set_state()` (e.g. the
      `DataLoader` itself instead of `iter(loader)`).
    ValueError: if `saved` is malformed (not JSON, or not a state of this
      kind of iterator) or does not match the pipeline: another seed, shard
      count, worker count or source, and for a `data_loader` saved by this
      version another global batch size, other operations or, for an
      `ArraySource`, other data of the same shapes; the message names what
      differs.

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
  _check_iterator(iterator, "restore_iterator", ("get_state", "set_state"))
  if not isinstance(saved, dict) or "states" not in saved or "process_count" not in saved:
    raise ValueError(
        "the checkpoint's data-iterator state is missing or malformed (expected "
        f"the output of iterator_state, got {str(saved)[:200]!r}).")
  states = saved["states"]
  if (isinstance(saved["process_count"], bool)
      or not isinstance(saved["process_count"], int)
      or not isinstance(states, list)
      or not all(isinstance(x, str) for x in states)):
    raise ValueError(
        "the checkpoint's data-iterator state is malformed: saved['process_count'] "
        "must be an int and saved['states'] a list of JSON strings (the output of "
        f"iterator_state), got {str(saved)[:200]!r}.")
  count, index = jax.process_count(), jax.process_index()
  if saved["process_count"] != count or len(states) != count:
    raise ValueError(
        f"the checkpoint's data iterator was saved by {saved['process_count']} "
        f"processes (shards) but this run has {count}; the per-process positions "
        "cannot be carried over. Resume with the same number of processes, or "
        "start from a fresh workdir.")
  state = states[index]
  try:
    want = json.loads(state)
  except json.JSONDecodeError as e:
    raise ValueError(
        f"saved['states'][{index}] is not a data-iterator state (not JSON: {e}; "
        f"got {state[:100]!r}): expected the output of iterator_state.") from None
  fresh = iterator.get_state()
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
  elif isinstance(have, dict) and not isinstance(want, dict):
    raise ValueError(
        f"saved['states'][{index}] is not a state of this iterator (a JSON "
        f"{type(want).__name__}, the iterator's is an object): expected the "
        "output of iterator_state.")
  pipeline = _pipeline_of(iterator)
  if isinstance(saved.get("pipeline"), dict) and pipeline is not None:
    mine = pipeline.describe()
    for key, value in saved["pipeline"].items():
      if key in mine and mine[key] != value:
        what = {"global_batch_size": "another global batch size",
                "operations": "other operations",
                "source_digest": "other data of the same row count and shapes"}
        raise ValueError(
            f"the checkpoint's data iterator does not match this input pipeline: "
            f"its {key} is {value!r}, the pipeline's is {mine[key]!r} "
            f"({what.get(key, 'another ' + key)}). Resuming would silently read other batches: "
            "use the checkpoint's settings or a fresh workdir.")
  try:
    iterator.set_state(state.encode() if isinstance(fresh, bytes) else state)
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise ValueError(
        f"saved['states'][{index}] could not be applied to this iterator "
        f"({type(e).__name__}: {e}): expected the output of iterator_state for "
        "the same pipeline.") from e
