"""Error-feedback residuals in a checkpoint: their own item, their own size.

The residuals (`date_optax.parallel.ErrorFeedbackState`, every leaf with a
leading replica axis) are split off the state and written as a checkpoint
item of their own, each process writing the shards its devices hold (orbax
never gathers a sharded array). So they can be left out on save, left
unread on restore, and reset to zeros when the state is restored onto
another replica count, the rest of the state restoring as usual. Each
checkpoint records its size (`CheckpointInfo`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState


class CheckpointInfo(NamedTuple):
  """What one checkpoint holds, and its size, read without restoring it.

  `CheckpointManager.info(step)` returns it from the metadata written by
  `save`. Sizes are array bytes (orbax may compress them on disk), counting
  every leaf once: a replicated parameter is one copy, the residuals one
  copy per replica. Per device is what the device holding the most holds
  (its shards of every leaf, a replicated leaf whole). With error feedback
  over N replicas the residuals add, per device, 1 gradient for "psum" and 2
  for "ring" and "torus" whatever N; `1 + 1/N` for "two_shot" (a worker
  residual and a server residual of `ceil(size / N)` elements per leaf);
  `(1 + 1/S) / M` for "hierarchical" over S slices of M devices. The
  checkpoint holds N times what one device holds (N + 1 gradients for
  "two_shot"). Checkpoints written before sizes were recorded give None for
  them.

  Attributes:
    step: the checkpoint's step.
    total_bytes: array bytes of everything saved, residuals included.
    residual_bytes: those of the error-feedback residuals (0 when the state
      has none or they were left out).
    per_device_bytes: the most bytes one device holds of the saved state.
    residual_per_device_bytes: the most bytes of residuals one device holds.
    residuals_saved: whether the residuals were written
      (`save(..., include_residuals=False)` leaves them out); True for a
      checkpoint older than format 4 whose state holds them.
    replicas: the replica count N of the saved residuals (their leading
      axis), or None for a state without residuals.
    metadata: the mapping given to `save`.

  Examples:
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> from date_optax.checkpoint import CheckpointManager
    >>> with CheckpointManager(tempfile.mkdtemp(), async_save=False) as mngr:
    ...   _ = mngr.save(3, {'w': jnp.ones((4, 2))}, metadata={'epoch': 1})
    ...   info = mngr.info()
    >>> info.step, info.total_bytes, info.residual_bytes, info.metadata
    (3, 32, 0, {'epoch': 1})

  References:
    Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML 2019 (the residuals); orbax-checkpoint's
    per-process array writes (Google).
  """

  step: int
  total_bytes: int | None
  residual_bytes: int | None
  per_device_bytes: int | None
  residual_per_device_bytes: int | None
  residuals_saved: bool
  replicas: int | None
  metadata: Mapping[str, Any]


def _is_residual(x: Any) -> bool:
  return isinstance(x, ErrorFeedbackState)


def _is_node(x: Any) -> bool:
  return x is None or _is_residual(x)


def split(tree: Any) -> tuple[Any, list[ErrorFeedbackState]]:
  """`tree` with every `ErrorFeedbackState` replaced by None, and those states."""
  nodes, treedef = jax.tree.flatten(tree, is_leaf=_is_node)
  residuals = [x for x in nodes if _is_residual(x)]
  rest = treedef.unflatten([None if _is_residual(x) else x for x in nodes])
  return rest, residuals


def merge(template: Any, rest: Any, residuals: list[Any]) -> Any:
  """Puts `residuals` back into `rest` where `template` holds its states."""
  nodes, treedef = jax.tree.flatten(template, is_leaf=_is_node)
  got = iter(jax.tree.flatten(rest, is_leaf=_is_node)[0])
  given = iter(residuals)
  out = []
  for x in nodes:
    kept = next(got)
    out.append(next(given) if _is_residual(x) else kept)
  return treedef.unflatten(out)


def replicas(residuals: list[Any]) -> int | None:
  """The leading (replica) axis of the residuals, or None without any."""
  leaves = jax.tree.leaves(residuals)
  return int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else None


def _bytes(tree: Any) -> tuple[int, int]:
  """`(total, per_device)` array bytes of `tree`, never reading an array.

  Per device: for each device, the bytes of the shards of every leaf it
  holds (`sharding.shard_shape`, the same on every device of a named
  sharding); a leaf that is not a `jax.Array` counts whole on every device.
  """
  total = host = 0
  by_sharding: dict[Any, int] = {}
  for x in jax.tree.leaves(tree):
    itemsize = np.dtype(x.dtype).itemsize if hasattr(x, "dtype") else np.result_type(x).itemsize
    size = int(np.prod(np.shape(x), dtype=np.int64)) * itemsize
    total += size
    if isinstance(x, jax.Array):
      shard = int(np.prod(x.sharding.shard_shape(x.shape), dtype=np.int64)) * itemsize
      by_sharding[x.sharding] = by_sharding.get(x.sharding, 0) + shard
    else:
      host += size
  per_device: dict[Any, int] = {}
  for sharding, size in by_sharding.items():
    for d in sharding.device_set:
      per_device[d] = per_device.get(d, 0) + size
  return total, host + max(per_device.values(), default=0)


def sizes(rest: Any, residuals: list[Any], saved: bool) -> dict[str, int]:
  """The `bytes` entry of a checkpoint's metadata."""
  rest_total, rest_device = _bytes(rest)
  res_total, res_device = _bytes(residuals) if saved else (0, 0)
  both_device = _bytes((rest, residuals))[1] if saved else rest_device
  return {"total": rest_total + res_total, "residual": res_total,
          "per_device": both_device, "residual_per_device": res_device}


def _in_state(meta: Mapping[str, Any]) -> dict[str, Any]:
  """The residuals entry of a checkpoint older than format 4, which holds
  them inside the state: `TrainState.grad_residual`'s leaves (error feedback
  came after format 3, whose metadata lists every leaf's path and shape)."""
  leaves = [shape for path, shape, _ in meta.get("leaves") or []
            if ".grad_residual" in path]
  return {"saved": bool(leaves), "replicas": int(leaves[0][0]) if leaves and leaves[0] else None}


def info(step: int, meta: Mapping[str, Any]) -> CheckpointInfo:
  """A `CheckpointInfo` from a checkpoint's metadata (any format)."""
  size = meta.get("bytes") or {}
  res = meta["residuals"] if "residuals" in meta else _in_state(meta)
  return CheckpointInfo(
      step=step, total_bytes=size.get("total"), residual_bytes=size.get("residual"),
      per_device_bytes=size.get("per_device"),
      residual_per_device_bytes=size.get("residual_per_device"),
      residuals_saved=bool(res.get("saved", False)), replicas=res.get("replicas"),
      metadata=dict(meta.get("metadata", {})))


#: The error of a target without residuals for a checkpoint that holds some.
MISSING = (
    "the checkpoint holds error-feedback residuals and the target has none (a step "
    "built without error_feedback?); pass include_residuals=False to restore the rest "
    "without them.")


def layout(residuals: Any) -> dict[str, int] | None:
  """The mesh axes (name: size) the residuals are laid out over, or None.

  Read from the first leaf's sharding (a `NamedSharding`'s mesh; every
  residual of a step shares one mesh): with it a reset names the slices and
  devices of both layouts, e.g. `dcn=2 × ici=4` against `dcn=1 × ici=4`.
  """
  for x in jax.tree.leaves(residuals):
    mesh = getattr(getattr(x, "sharding", None), "mesh", None)
    if mesh is not None and hasattr(mesh, "shape"):
      return {str(name): int(size) for name, size in mesh.shape.items()}
  return None


def plan(saved: Mapping[str, Any] | None, target: list[Any],
         include: bool) -> tuple[str, tuple[Any, ...] | None]:
  """What a restore does with the residuals, and why it resets them.

  "read" them, "zeros" in their place, "none" to do (no residuals in the
  target, or a checkpoint older than format 4 that holds them in the
  state), or "missing" (a target without them for a checkpoint that
  holds them, unless `include` is False). A reset comes with `(N, M,
  saved layout, target layout)`: the replica counts, and the mesh axes of
  each (None where unknown). Residuals are reset when the replica count
  differs, or when their shapes do ("hierarchical" keeps shards of 1/M of
  each gradient, M the devices of one slice: the same N over other slices
  gives other shapes).
  """
  if not saved:
    return "none", None
  if not target:
    return ("missing" if saved.get("saved") and include else "none"), None
  if not include or not saved.get("saved"):
    return "zeros", None
  n, m = saved.get("replicas"), replicas(target)
  shapes = [list(np.shape(x)) for x in jax.tree.leaves(target)]
  same = n == m and [list(leaf[1]) for leaf in saved.get("leaves", [])] in ([], shapes)
  return ("read", None) if same else ("zeros", (n, m, saved.get("layout"), layout(target)))


def reset_message(saved: int, target: int, saved_layout: Mapping[str, int] | None = None,
                  target_layout: Mapping[str, int] | None = None) -> str:
  """The warning of a restore onto another replica count or layout."""
  where = lambda axes: " × ".join(f"{k}={v}" for k, v in axes.items())
  text = (
      f"the checkpoint's error-feedback residuals were saved with {saved} replicas and "
      f"the target has {target}: they are reset to zeros, shaped for the {target} "
      "replicas (ErrorFeedbackState.zeros, as the step's init builds them). What they "
      "held, at most one step's rounding, is dropped; the other leaves restore as saved.")
  if saved_layout and target_layout and saved_layout != target_layout:
    text += (f" They were laid out over the mesh axes {where(saved_layout)} when saved, "
             f"the target over {where(target_layout)}.")
  return text


def damaged_message(step: int, directory: str, cause: str) -> str:
  """The warning of a restore whose residuals item cannot be read or verified."""
  return (
      f"the error-feedback residuals of checkpoint step {step} in {directory} are "
      f"damaged ({cause}); the rest of the state restores as saved, with zero residuals "
      "(ErrorFeedbackState.zeros, as the step's init builds them) in their place. What "
      "they held, at most one step's rounding, is dropped.")


def zeros(abstract: list[Any]) -> list[Any]:
  """Zero residuals with the shapes, dtypes and shardings of `abstract`.

  One program places every leaf on its sharding (its devices may span
  processes: each process allocates its own shards); a leaf without one
  goes to the default device.
  """
  leaves, treedef = jax.tree.flatten(abstract)
  if not leaves:
    return abstract
  shardings = [getattr(x, "sharding", None) for x in leaves]
  made = jax.jit(lambda: [jnp.zeros(x.shape, x.dtype) for x in leaves],
                 out_shardings=shardings)()
  return treedef.unflatten(made)
