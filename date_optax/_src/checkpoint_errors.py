"""The two errors of a checkpoint restore: damaged files, or a target that
does not fit what was saved.

They are kept apart because they call for opposite actions: a damaged
checkpoint is skipped for an older one (`restore(step=None)`), a misfit
target is the caller's to fix and no other checkpoint is tried.
"""

from __future__ import annotations


class CorruptCheckpointError(ValueError):
  """A checkpoint that cannot be restored: damaged files or a misfit target.

  Raised by :meth:`CheckpointManager.restore` when the files of a step are
  missing, truncated or unreadable, when a leaf read back differs from the
  fingerprint recorded at save time, or when the target does not fit the
  saved state. The message names the step and the cause. It is a
  `ValueError`, so code that caught orbax's errors keeps working.

  Args:
    message: what failed, naming the step and the cause.

  Examples:
    >>> from date_optax.checkpoint import CorruptCheckpointError
    >>> issubclass(CorruptCheckpointError, ValueError)
    True

  References:
    Preemption-safe checkpointing as in orbax-checkpoint's
    `CheckpointManager` (Google) and the big_vision training loops.
  """

  def __init__(self, message: str):
    super().__init__(message)


class CheckpointMismatchError(ValueError):
  """A restore target whose structure, shapes or dtypes differ from the saved state.

  Raised by :meth:`CheckpointManager.restore` before any array is read, when
  the target has a leaf the checkpoint lacks (or lacks one it has), or a
  leaf of another shape or dtype. Nothing is wrong with the files, so no
  other checkpoint is tried: the same target would not fit them either. The
  message names the step, the leaf path and the saved and requested shape
  and dtype. It is a `ValueError` but not a :class:`CorruptCheckpointError`.
  Checkpoints written before this check (format 2 or older) report a misfit
  target as :class:`CorruptCheckpointError`.

  Args:
    message: what differs, naming the step and the leaf.

  Examples:
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> from date_optax.checkpoint import CheckpointManager, CheckpointMismatchError
    >>> with CheckpointManager(tempfile.mkdtemp(), async_save=False) as mngr:
    ...   _ = mngr.save(1, {'w': jnp.ones((2, 3))})
    ...   try:
    ...     mngr.restore({'w': jnp.ones((3, 3))})
    ...   except CheckpointMismatchError as e:
    ...     print(str(e).split(': ', 1)[1].replace('; ', ';\\n'))
    leaf ['w'] was saved with shape (2, 3) and dtype float32;
    the target asks for shape (3, 3) and dtype float32.

  References:
    orbax-checkpoint, `StandardRestore` (Google), which restores onto the
    shapes, dtypes and shardings of a target tree.
  """

  def __init__(self, message: str):
    super().__init__(message)
