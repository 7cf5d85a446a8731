"""Host-side checks of what a checkpoint saves and restores onto, before any I/O.

Every leaf to save is an array or a number, every restore-target leaf
describes an array, the directory is not a file, and a save may write
there; each failure names the leaf path (or the path) before anything is
written or read, and a restore that finds nothing says why. `leaf_specs` is
the `[path, shape, dtype]` record a checkpoint's metadata keeps.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src.checkpoint_fingerprints import fingerprints as _fingerprints


def dtype_name(x: Any) -> str:
  return np.dtype(x.dtype).name if hasattr(x, "dtype") else np.result_type(x).name


def check_saveable(encoded: Any) -> None:
  """Every leaf is an array or a number; otherwise name it before writing."""
  for path, x in jax.tree_util.tree_flatten_with_path(encoded)[0]:
    ok = isinstance(x, jax.Array) or (
        isinstance(x, (np.ndarray, np.generic, bool, int, float, complex))
        and (np.result_type(x).kind in "biufc" or hasattr(x, "dtype")
             and jnp.issubdtype(x.dtype, jnp.number))
    )
    if not ok:
      raise TypeError(
          f"state leaf {jax.tree_util.keystr(path)} cannot be saved: it is "
          f"{type(x).__name__} {x!r:.60}; every leaf must be an array or a number "
          "(typed PRNG keys allowed). Nothing was written."
      )


def check_target(target: Any) -> None:
  """Every restore-target leaf describes an array; otherwise name it."""
  for path, x in jax.tree_util.tree_flatten_with_path(target)[0]:
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
      continue
    ok = isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)) and (
        np.result_type(x).kind in "biufc")
    if not ok:
      raise TypeError(
          f"target leaf {jax.tree_util.keystr(path)} is {type(x).__name__} "
          f"{x!r:.60}; every leaf of a restore target must be an array, a number "
          "or a jax.ShapeDtypeStruct (e.g. from jax.eval_shape(step.init, ...)). "
          "Nothing was read."
      )


def leaf_specs(encoded: Any) -> list[list[Any]]:
  """`[path, shape, dtype]` of every leaf of an encoded state, as JSON."""
  return [
      [jax.tree_util.keystr(path), list(np.shape(x)), dtype_name(x)]
      for path, x in jax.tree_util.tree_flatten_with_path(encoded)[0]
  ]


def check_directory(path: str) -> None:
  """`path` is a directory or can be made one: no file on it or above it."""
  head = path
  while head and not os.path.exists(head):
    parent = os.path.dirname(head)
    if parent == head:
      break
    head = parent
  if os.path.exists(head) and not os.path.isdir(head):
    what = "is an existing file" if head == path else f"is under {head}, an existing file"
    raise ValueError(
        f"directory must be a directory for the checkpoints, but {path} {what}."
    )


def writable(path: str) -> bool:
  """Whether this process may create and remove entries in directory `path`."""
  return os.access(path, os.W_OK | os.X_OK)


def make_writable(path: str) -> None:
  """`path` made (with its parents) if missing, before a save writes into it;
  a PermissionError names it when this process may not write there."""
  try:
    os.makedirs(path, exist_ok=True)
  except PermissionError as e:
    raise PermissionError(
        f"cannot save: the checkpoint directory {path} cannot be made ({e.strerror}); "
        "nothing was written.") from None
  if not writable(path):
    raise PermissionError(
        f"cannot save: the checkpoint directory {path} is not writable by this "
        "process; nothing was written (a read-only directory still restores).")


def no_checkpoint(path: str, step: int | None = None, steps: tuple[int, ...] = ()) -> str:
  """Why `path` has no checkpoint (`step`) to read, in one sentence.

  Names a directory that does not exist or is a file, an empty one, one
  that holds no complete checkpoint (listing what it holds), and a step that
  is not there (a file of its name, or a directory that was never completed).
  """
  what = f"no checkpoint{'' if step is None else f' for step {step}'} in {path}"
  if not os.path.exists(path):
    return f"{what}: the directory does not exist"
  if not os.path.isdir(path):
    return f"{what}: it is a file, not a directory"
  if step is not None and steps:
    where = os.path.join(path, str(step))
    why = (f" ({where} is a file, not a checkpoint)" if os.path.isfile(where) else
           f" ({where} is not a complete checkpoint)" if os.path.isdir(where) else "")
    return f"{what}{why}; available: {list(steps)}"
  entries = sorted(os.listdir(path))
  if not entries:
    return f"{what}: the directory is empty"
  return (f"{what}: it holds no complete checkpoint, only "
          f"{', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}")


def verify(restored: Any, expected: list | None) -> None:
  """Every restored leaf matches the fingerprint recorded at save time."""
  if expected is None:
    return
  got = _fingerprints(restored)
  if len(got) != len(expected):
    raise ValueError(f"{len(got)} leaves restored, {len(expected)} saved")
  for (path, _), g, e in zip(jax.tree_util.tree_flatten_with_path(restored)[0], got,
                             expected, strict=True):
    if list(g) != list(e):
      raise ValueError(
          f"leaf {jax.tree_util.keystr(path)} does not match the data that was saved")
