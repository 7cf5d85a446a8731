"""The restore target: what orbax is asked to read, and whether it fits.

A target's leaves become `jax.ShapeDtypeStruct` values with their shardings (typed
PRNG keys as their raw key data, wrapped back after the read); they are
checked against the `[path, shape, dtype]` of every saved leaf (format 3 on)
before orbax reads anything, trying the older layouts a checkpoint may hold
(one trust-ratio array per leaf, an older batch-schedule state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from date_optax._src import batch_schedule as bs_lib
from date_optax._src import checkpoint_checks as checks
from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax._src.checkpoint_errors import CheckpointMismatchError


def is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def encode(state: Any) -> tuple[Any, dict[str, str]]:
  """Replaces typed keys by their raw data; returns the key impl by path."""
  impls: dict[str, str] = {}

  def enc(path, x):
    if is_key(x):
      impls[jax.tree_util.keystr(path)] = str(jax.random.key_impl(x))
      return jax.random.key_data(x)
    return x

  return jax.tree_util.tree_map_with_path(enc, state), impls


def check_fits(abstract: Any, saved: list[list[Any]]) -> None:
  """Raises CheckpointMismatchError when `abstract` differs from `saved` leaves."""
  flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
  got = {jax.tree_util.keystr(p): x for p, x in flat}
  want = {path: (tuple(shape), dtype) for path, shape, dtype in saved}
  missing = [p for p in want if p not in got]
  extra = [p for p in got if p not in want]
  if missing or extra:
    parts = []
    if missing:
      parts.append(f"the checkpoint has leaves the target lacks: {', '.join(missing[:5])}"
                   + (", ..." if len(missing) > 5 else ""))
    if extra:
      parts.append(f"the target has leaves the checkpoint lacks: {', '.join(extra[:5])}"
                   + (", ..." if len(extra) > 5 else ""))
    raise CheckpointMismatchError(f"{'; '.join(parts)}.")
  for path, x in got.items():
    shape, dtype = want[path]
    t_shape, t_dtype = tuple(np.shape(x)), checks.dtype_name(x)
    if (shape, dtype) != (t_shape, t_dtype):
      raise CheckpointMismatchError(
          f"leaf {path} was saved with shape {shape} and dtype {dtype}; "
          f"the target asks for shape {t_shape} and dtype {t_dtype}."
      )


def fitting_layout(abstract: Any, check: Any) -> tuple[Any, bool, int]:
  """`abstract`, or the first older layout of it that passes `check`.

  Older checkpoints hold one trust-ratio array per parameter leaf where a
  `LayerRatios` record now holds one vector (`unpacked_records`), or a
  batch schedule's examples as an int32 scalar before the two-word count
  or without the adaptive rule's stretch and guard
  (`batch_schedule.legacy_layout`, by generation), or both. `check(target)`
  raises when a target does not fit; when no layout fits, the error for
  `abstract` itself is raised. Returns the target, whether records are unpacked and the batch
  schedules' older generation (0: today's).
  """
  try:
    check(abstract)
    return abstract, False, 0
  except ValueError as first:
    error = first
  gens = bs_lib.LEGACY_GENERATIONS if bs_lib.has_state(abstract) else ()
  for unpacked, legacy in [(True, 0)] + [(u, g) for g in gens for u in (False, True)]:
    target = layer_ratios_lib.unpacked_records(abstract) if unpacked else abstract
    target = bs_lib.legacy_layout(target, legacy) if legacy else target
    try:
      check(target)
    except ValueError:
      continue
    return target, unpacked, legacy
  raise error


def abstract_target(target: Any, impls: Mapping[str, str]) -> Any:
  """The restore target orbax sees: shapes, dtypes and shardings, keys raw."""

  def abstract(path, x):
    name = jax.tree_util.keystr(path)
    if is_key(x):
      if name not in impls:
        raise CheckpointMismatchError(
            f"target leaf {name} is a typed PRNG key but the checkpoint stored "
            "a plain array there."
        )
      # Key data has the key's shape plus a trailing implementation axis; the
      # key's sharding (replicated or a NamedSharding spec) applies unchanged.
      raw = jax.eval_shape(
          jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype)
      )
      return jax.ShapeDtypeStruct(
          raw.shape, raw.dtype, sharding=getattr(x, "sharding", None)
      )
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
      return jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=getattr(x, "sharding", None)
      )
    if isinstance(x, np.ndarray):
      return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x

  return jax.tree_util.tree_map_with_path(abstract, target)


def decode(restored: Any, target: Any, impls: Mapping[str, str]) -> Any:
  def dec(path, x, t):
    if is_key(t):
      name = jax.tree_util.keystr(path)
      impl = impls[name]
      expected = str(jax.random.key_impl(t)) if isinstance(t, jax.Array) else impl
      if impl != expected:
        raise CheckpointMismatchError(
            f"PRNG key {name} was saved with implementation {impl!r}, the "
            f"target uses {expected!r}."
        )
      return jax.random.wrap_key_data(x, impl=impl)
    return x

  return jax.tree_util.tree_map_with_path(dec, restored, target)


def unsharded(abstract: Any) -> list[str]:
  """The paths of the target's array leaves that carry no sharding."""
  return [jax.tree_util.keystr(path) for path, x in
          jax.tree_util.tree_flatten_with_path(abstract)[0]
          if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None]


def is_topology_error(error: BaseException | None) -> bool:
  """Whether orbax refused to rebuild a saved sharding here.

  A target leaf without a sharding is read with the sharding it was saved
  with; when that names devices this process does not have (a state saved
  on 8 devices, restored on 4), orbax raises "Topology mismatch detected".
  The target, not the checkpoint, is at fault.
  """
  seen = 0
  while error is not None and seen < 16:
    if "Topology mismatch" in str(error):
      return True
    error, seen = error.__cause__ or error.__context__, seen + 1
  return False


def topology_message(paths: list[str]) -> str:
  """What a target needs when its leaves `paths` have no sharding to restore onto."""
  named = ", ".join(paths[:3]) + (f", ... ({len(paths)} in all)" if len(paths) > 3 else "")
  where = f"the target leaves {named} carry" if paths else "the target carries"
  return (
      "it was saved on devices this process does not have (another device count or "
      f"topology), and {where} no sharding to restore onto. Give every array leaf of "
      "the target a sharding: for a train step, step.abstract_state(params) builds "
      "such a target without allocating (jax.eval_shape(step.init, params) has none), "
      "or use jax.ShapeDtypeStruct(shape, dtype, sharding=...) leaves. The checkpoint "
      "itself is sound.")
