"""Weight-update sharding: which axis of each array is split over replicas.

With `shard_update=True` the optimizer state and the update computation are
split over the data-parallel replicas (Xu et al. 2020, used by the MLPerf TPU
submissions): each replica keeps and updates 1/N of every large array. The
split axis of an array is chosen from its shape alone, so a parameter, its
gradient and every optimizer-state array of the same shape (momentum, Adam
moments) are split the same way and never need resharding.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def shard_axis(shape: Sequence[int], num_shards: int) -> int | None:
  """The axis to split `num_shards` ways, or None to keep the array whole.

  The largest axis that `num_shards` divides (the first one on ties). Arrays
  with no such axis (biases of odd width, scalars such as step counts) stay
  replicated: they are small, and padding them would change the shapes the
  optimizer sees (masks such as `exclude_bias_and_norm` look at shapes).
  """
  if num_shards <= 1:
    return None
  best = None
  for i, size in enumerate(shape):
    if size >= num_shards and size % num_shards == 0:
      if best is None or size > shape[best]:
        best = i
  return best


def axes_entry(axes: Sequence[Hashable]) -> Any:
  axes = tuple(axes)
  return axes[0] if len(axes) == 1 else axes


def sharded_spec(shape: Sequence[int], axes: Sequence[Hashable], num_shards: int) -> P:
  d = shard_axis(shape, num_shards)
  if d is None:
    return P()
  return P(*([None] * d), axes_entry(axes))


def bytes_per_device(tree: Any) -> int:
  """Bytes that the largest per-device share of a pytree of arrays occupies.

  Args:
    tree: a pytree of `jax.Array` (other leaves count in full on every
      device).

  Returns:
    The maximum over devices of the bytes of the shards that device holds.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import date_optax.parallel as dp
    >>> dp.bytes_per_device({"w": jnp.zeros((4, 4), jnp.float32)})
    64

  References:
    Xu et al., "Automatic Cross-Replica Sharding of Weight Update in
    Data-Parallel Training", 2020.
  """
  per_device: dict[Any, int] = collections.Counter()
  plain = 0
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array):
      for shard in leaf.addressable_shards:
        per_device[shard.device] += shard.data.nbytes
    else:
      plain += np.asarray(leaf).nbytes
  return (max(per_device.values()) if per_device else 0) + plain
