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
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from date_optax._src.parallel.comm import collectives


def update_shard_axis(shape: Sequence[int], num_shards: int) -> int | None:
  """The axis along which ``shard_update=True`` splits an array of `shape`.

  The largest axis that `num_shards` divides (the first one on ties). Arrays
  with no such axis (biases of odd width, scalars such as step counts) stay
  replicated: they are small, and padding them would change the shapes the
  optimizer sees (masks such as `exclude_bias_and_norm` look at shapes).
  With it, the optimizer-state bytes per device of a model on a pod can be
  planned from its parameter shapes alone, without the devices.

  Args:
    shape: the parameter's (or optimizer-state leaf's) shape.
    num_shards: the number of data-parallel replicas the update is split over.

  Returns:
    The axis index, or None when the array stays whole on every replica.

  Examples:
    >>> import date_optax.parallel as dp
    >>> dp.update_shard_axis((1000, 4096), 256)
    1
    >>> dp.update_shard_axis((1000,), 256) is None
    True

  References:
    Xu et al., "Automatic Cross-Replica Sharding of Weight Update in
    Data-Parallel Training", 2020, https://arxiv.org/abs/2004.13336.
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
  d = update_shard_axis(shape, num_shards)
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


# ---------------------------------------------------------------------------
# The layout of split arrays in the explicit reduce-scatter / all-gather of the
# shard_map step (`grad_sync.sync_gradients(..., scatter=True)` and
# `all_gather_params`): a leaf split along axis d is moved to (n, rest) blocks
# whose row k is replica k's shard, the row-major order in which
# PartitionSpec(axes) places shards.
# ---------------------------------------------------------------------------


def to_blocks(x: jax.Array, d: int, n: int) -> jax.Array:
  """A whole array as (n, rest) blocks, row k the part replica k keeps."""
  return jnp.moveaxis(x, d, 0).reshape(n, -1)


def from_blocks(blocks: jax.Array, shape: Sequence[int], d: int) -> jax.Array:
  """Inverse of `to_blocks`: (n, rest) blocks back as the whole array of `shape`."""
  moved = (shape[d],) + tuple(s for i, s in enumerate(shape) if i != d)
  return jnp.moveaxis(blocks.reshape(moved), 0, d)


def shard_from_chunk(
    chunk: jax.Array, shape: Sequence[int], d: int, n: int
) -> jax.Array:
  """One row of `to_blocks` back as the shard of an array of `shape`."""
  moved = (shape[d] // n,) + tuple(s for i, s in enumerate(shape) if i != d)
  return jnp.moveaxis(chunk.reshape(moved), 0, d)


def all_gather_params(
    params: Any, shape_list: list[tuple[int, ...]], axes: Any, algorithm: str, n: int,
    grid: tuple[int, int] | None = None,
) -> Any:
  """Inverse of the split: every replica gets every parameter in full.

  "hierarchical" gathers with XLA's all-gather over both data axes: the
  parameters are float32 and exact, there is no payload to compress.
  """
  algorithm = "psum" if algorithm == "hierarchical" else algorithm
  leaves, treedef = jax.tree.flatten(params)
  dims = [update_shard_axis(s, n) for s in shape_list]
  out = list(leaves)
  groups: dict[Any, list[int]] = {}
  for i, d in enumerate(dims):
    if d is not None:
      groups.setdefault(leaves[i].dtype, []).append(i)
  for idxs in groups.values():
    chunks = [jnp.moveaxis(leaves[i], dims[i], 0).reshape(-1) for i in idxs]
    full = collectives.all_gather_blocks(jnp.concatenate(chunks), axes, algorithm, grid=grid)
    offset = 0
    for i, c in zip(idxs, chunks, strict=True):
      shape, d = shape_list[i], dims[i]
      moved = (shape[d],) + tuple(s for j, s in enumerate(shape) if j != d)
      piece = full[:, offset : offset + c.size].reshape(moved)
      out[i] = jnp.moveaxis(piece, 0, d)
      offset += c.size
  return jax.tree.unflatten(treedef, out)
