"""Device prefetch: host batches placed on the devices ahead of the step.

`prefetch_to_device` wraps any iterator of host-local batches and keeps a few
of them queued as global arrays on a sharding (`host_local_to_global`); JAX
transfers them asynchronously, so the copy overlaps the step. The iterator it
returns keeps the wrapped one reachable, so `iterator_state` and
`restore_iterator` work through it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.layout.distributed import host_local_to_global


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
    if not isinstance(sharding, jax.sharding.Sharding):
      raise TypeError(
          "sharding must be a jax.sharding.Sharding (the step's batch_sharding, "
          f"e.g. NamedSharding(mesh, P('data'))), got {sharding!r}."[:300])
    if isinstance(batches, (str, bytes, Mapping)) or not isinstance(batches, Iterable):
      raise TypeError(
          "batches must be an iterable of host-local batches (e.g. "
          f"iter(dp.data_loader(...))), got {type(batches).__name__}; a single "
          "batch goes in a list: [batch].")
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
      _check_rows(batch, self._sharding)
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


def _row_shards(sharding: jax.sharding.Sharding) -> int | None:
  """How many pieces `sharding` cuts axis 0 into (None: not a NamedSharding)."""
  if not isinstance(sharding, jax.sharding.NamedSharding):
    return None
  first = sharding.spec[0] if len(sharding.spec) else None
  axes = first if isinstance(first, tuple) else (first,)
  return int(np.prod([sharding.mesh.shape[a] for a in axes if a is not None]))


def _check_rows(batch: Any, sharding: jax.sharding.Sharding) -> None:
  """A host-local batch fits `sharding`: one row count, split evenly over
  this process's share of the devices (host-side, shapes only)."""
  where = lambda path: f"batch{jax.tree_util.keystr(path)}"
  flat = jax.tree_util.tree_flatten_with_path(batch)[0]
  if not flat:
    raise ValueError(f"prefetch_to_device: a batch has no array leaf, got {batch!r}."[:300])
  rows: dict[int, list[str]] = {}
  for path, x in flat:
    if not np.ndim(x):
      raise ValueError(
          f"prefetch_to_device: {where(path)} is a scalar ({x!r}); every leaf of "
          "a batch needs its rows along axis 0."[:300])
    rows.setdefault(int(np.shape(x)[0]), []).append(where(path))
  if len(rows) > 1:
    listed = "; ".join(f"{r} rows: {', '.join(w[:3])}" for r, w in sorted(rows.items()))
    raise ValueError(
        f"prefetch_to_device: every leaf of a batch needs the same number of "
        f"rows, got {listed}.")
  (n, names), = rows.items()
  shards = _row_shards(sharding)
  local = None if shards is None else max(1, shards // jax.process_count())
  if n == 0 or (local is not None and n % local):
    raise ValueError(
        f"prefetch_to_device: {names[0]} has {n} rows on this process; sharding "
        f"splits axis 0 over {shards} devices ({local} of them on this process), "
        f"so each process needs a positive multiple of {local} rows (the step "
        "refuses the same batch).")
