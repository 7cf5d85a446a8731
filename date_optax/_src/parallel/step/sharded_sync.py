"""The explicit gradient reduction of the sharded (GSPMD) step: a `shard_map` island.

With a `GradSync` other than the compiler's float32 `psum`, the sharded step
keeps one gradient per replica (stacked on a leading axis laid out over the
data axes, every other axis laid out as its parameter) and reduces the stack
here, inside a `shard_map` over the whole mesh: each device holds its replica's
gradient *of its own model shard* and calls `grad_sync.sync_gradients` over
the data axes only, so every device sends its shard, not the layer, in the
payload format (the FSDP/TP reduce-scatter quantised, as ZeRO++'s qgZ does
in CUDA). The rest of the step (forward, backward, optimizer and the exact
cross-shard norms of trust ratios) stays in GSPMD.

The scales of a low-bit payload (block scales, the measured shift, APS) are
then measured on each device's shard: a layer sharded over the model axes
rounds like the same layer replicated up to which elements share a block,
hence within the format's error bound of it, not bit for bit.

With weight-update sharding the island reduce-scatters: the leaf's split axis
is chosen on the model shard (`update_sharding.update_shard_axis` of the
local shape), and replica k keeps the k-th block of it, which is the layout
`param_sharding.with_data_axes` declares (model axes major, data axes minor),
so the optimizer state needs no resharding.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.comm.grad_sync import sync_gradients
from date_optax._src.parallel.comm.sync_config import GradSync
from date_optax._src.types import PyTree


def stacked_spec(spec: P, data_axes: tuple[Hashable, ...]) -> P:
  """The spec of a per-replica stack of a leaf laid out as `spec` (the stack
  split over the data axes `spec` does not already split, FSDP's)."""
  named = {a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))}
  free = tuple(a for a in data_axes if a not in named)
  return P(us.axes_entry(free) if free else None, *spec)


def residual_sizes(
    grad_sync: GradSync, mesh: jax.sharding.Mesh, data_axes: tuple[Hashable, ...]
) -> tuple[Callable[[int], int] | None, Callable[[int], int] | None]:
  """How many residual elements a device keeps of a model shard of `local` ones.

  `(worker, hop)`, each a function of `local`, or None where the residual is
  shaped like the parameter: "two_shot"'s server residual is 1/N of the
  shard, `ceil(local / N)`; "hierarchical" keeps its worker residual on the
  shard of its slice's sum, `ceil(local / M)` (M the devices of a slice, the
  second data axis), and the hop residual of its cross-slice algorithm over
  the S slices, `ceil(ceil(local / M) / S)` ("two_shot") or the same
  `ceil(local / M)` ("ring").
  """
  n = compat.mesh_axis_sizes(mesh, data_axes)
  ceil = lambda a, b: -(-a // b)
  if grad_sync.algorithm == "two_shot":
    return None, lambda local: ceil(local, n)
  if grad_sync.algorithm == "hierarchical":
    s = compat.mesh_axis_sizes(mesh, data_axes[:1])
    shard = lambda local: ceil(local, n // s)
    if grad_sync.dcn_algorithm == "ring":
      return shard, shard
    return shard, lambda local: ceil(shard(local), s)
  return None, None


def chunked_residual(
    shape: tuple[int, ...], spec: P, mesh: jax.sharding.Mesh,
    data_axes: tuple[Hashable, ...], size: Callable[[int], int],
) -> tuple[tuple[int, int], P]:
  """The stacked flat residual of a leaf laid out as `spec`, `size(local)` per device.

  Each device keeps `size(local)` elements of its model shard (`local`
  elements): stacked, `(n, m · size(local))` laid out as `P(data_axes,
  model_axes)`, `m` the model shards of the leaf, `n` the replicas.
  Returns `(shape, spec)`.
  """
  model = tuple(a for e in spec if e is not None for a in compat.as_tuple(e))
  shards = compat.mesh_axis_sizes(mesh, model) if model else 1
  n = compat.mesh_axis_sizes(mesh, data_axes)
  local = int(np.prod(shape)) // shards
  return (n, shards * size(local)), P(us.axes_entry(data_axes), *([model] if model else []))


def reduce_stacked(
    grads: PyTree,
    residual: PyTree | None,
    *,
    mesh: jax.sharding.Mesh,
    data_axes: tuple[Hashable, ...],
    param_specs: PyTree,
    update_specs: PyTree,
    grad_sync: GradSync,
    key: Any,
    scatter: bool,
) -> tuple[PyTree, PyTree | None]:
  """The mean over replicas of per-replica gradients, reduced by `grad_sync`.

  Args:
    grads: per-replica gradients, each leaf `(n, *shape)` laid out as
      `stacked_spec(param_spec)`.
    residual: with `grad_sync.error_feedback`, the residuals (float32, laid
      out as `grads`); None otherwise.
    mesh: the step's mesh (every axis becomes manual inside the island).
    data_axes: the axes that carry replicas; the reduction runs over them.
    param_specs: the parameters' `PartitionSpec`s (a pytree like `grads`).
    update_specs: the specs of the reduced gradient (the parameters', or
      with `scatter` those with the data axes added).
    grad_sync: the `GradSync`.
    key: the step's stochastic-rounding key (the same on every device), or
      None.
    scatter: reduce-scatter the leaves that split over the replicas.

  Returns:
    `(mean, new_residual)`: the mean gradient laid out by `update_specs`, and
    the new residuals laid out as `residual` (None without error feedback).
  """
  is_spec = lambda x: isinstance(x, P)
  stacked = jax.tree.map(lambda s: stacked_spec(s, data_axes), param_specs,
                         is_leaf=is_spec)
  feedback = grad_sync.error_feedback

  def body(g, e):
    own = lambda tree: jax.tree.map(lambda x: x[0], tree)
    out = sync_gradients(own(g), data_axes, grad_sync, key=key, scatter=scatter,
                         residual=own(e) if feedback else None)
    if not feedback:
      return out, None
    mean, new = out
    return mean, jax.tree.map(lambda x: x[None], new)

  if not feedback:
    res_spec = None
  elif isinstance(residual, ErrorFeedbackState):  # worker and hop residuals
    # Flat chunks of each model shard where the algorithm keeps them so
    # ("two_shot"'s server residual, "hierarchical"'s shards).
    chunked = lambda size: jax.tree.map(
        lambda g, s: chunked_residual(g.shape[1:], s, mesh, data_axes, size)[1], grads,
        param_specs)
    worker_size, hop_size = residual_sizes(grad_sync, mesh, data_axes)
    worker = stacked if worker_size is None else chunked(worker_size)
    hop = None if residual.hop is None else stacked if hop_size is None else chunked(hop_size)
    res_spec = ErrorFeedbackState(worker=worker, hop=hop)
  else:  # a bare pytree: the worker residual alone
    res_spec = stacked
  fn = compat.shard_map(
      body, mesh=mesh, in_specs=(stacked, res_spec),
      out_specs=(update_specs, res_spec),
  )
  return fn(grads, residual if feedback else None)
