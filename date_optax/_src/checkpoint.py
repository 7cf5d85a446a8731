"""Exact checkpoint/resume of a whole train state with orbax-checkpoint.

A checkpoint holds up to three items:
  * `state`: the train-state pytree (params, optimizer state with its counts
    and trust-ratio telemetry, step, PRNG keys...), saved with orbax's
    `StandardSave`. New-style typed PRNG keys are stored as their raw
    `jax.random.key_data` and wrapped back on restore.
  * `residuals`: the error-feedback residuals split off the state, unless
    left out (checkpoint_residuals.py).
  * `meta`: JSON with the user's metadata (e.g. the input-pipeline position
    `{"epoch": 3, "index": 17}`), the PRNG implementation of every key and
    the sizes.

Atomicity comes from orbax: a step is written into
`<step>.orbax-checkpoint-tmp-<timestamp>/` and renamed to `<step>/` only when
complete, so a process killed while saving leaves a temporary directory that
is never listed as a step (a manager opening the directory removes it in the
background); the previous checkpoint stays the latest one.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from date_optax._src import batch_schedule as bs_lib
from date_optax._src import checkpoint_checks as checks
from date_optax._src import checkpoint_residuals as ckres
from date_optax._src import checkpoint_target as target_lib
from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax._src import validation
from date_optax._src.checkpoint_errors import (  # noqa: F401 - re-exported
    CheckpointMismatchError,
    CorruptCheckpointError,
)
from date_optax._src.checkpoint_fingerprints import fingerprints as _fingerprints

# Format 2 adds per-leaf fingerprints to the metadata; format-1 checkpoints
# (no fingerprints) still restore, unverified. Format 3 adds every leaf's
# path, shape and dtype, so a target that does not fit is named before orbax
# reads anything; older checkpoints skip that check. Format 4 writes the
# error-feedback residuals as an item of their own (checkpoint_residuals.py)
# and records the sizes; older ones hold them in the state.
_FORMAT = 4


def _ocp():
  try:
    import orbax.checkpoint as ocp  # noqa: PLC0415 - optional dependency
  except ImportError as e:
    raise ImportError(
        "date_optax.checkpoint needs orbax-checkpoint, which a plain install "
        "leaves out: pip install 'date-optax[checkpoint]' (the 'examples' "
        "extra has it too)."
    ) from e
  return ocp


def tree_checksum(tree: Any) -> str:
  """A hex digest of every bit of a pytree of arrays (multi-host safe).

  Two trees get the same checksum when their leaves have the same shapes,
  dtypes and bits (in tree order); any changed bit changes it. Each leaf's
  words are summed with position weights on the devices that hold it, so a
  sharded or multi-host array is never gathered; the per-leaf sums are then
  hashed with SHA-256 on the host. Use it to compare a resumed run's final
  parameters with an uninterrupted run's.

  Args:
    tree: a pytree of arrays (JAX or NumPy; typed PRNG keys allowed).

  Returns:
    A 64-character hex string.

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.checkpoint import tree_checksum
    >>> a = {'w': jnp.ones((2, 3)), 'b': jnp.zeros(3)}
    >>> tree_checksum(a) == tree_checksum({'w': jnp.ones((2, 3)), 'b': jnp.zeros(3)})
    True
    >>> tree_checksum(a) == tree_checksum({'w': jnp.ones((2, 3)), 'b': jnp.full(3, 1e-30)})
    False

  References:
    NIST FIPS 180-4, "Secure Hash Standard" (SHA-256).
  """
  encoded, _ = target_lib.encode(tree)
  leaves = jax.tree.leaves(encoded)
  h = hashlib.sha256()
  for leaf, (s1, s2) in zip(leaves, _fingerprints(encoded), strict=True):
    h.update(f"{np.dtype(leaf.dtype).name}{tuple(np.shape(leaf))}{s1},{s2};".encode())
  return h.hexdigest()


def _all_processes_agree(ok: bool) -> bool:
  """Whether every process succeeded (each must take the same fallback)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # noqa: PLC0415

  flags = multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))
  return bool(np.all(flags))


@contextlib.contextmanager
def _quiet_failed_reads():
  """Collects, instead of printing, errors of reads orbax abandoned.

  When one read of a restore fails, orbax leaves the others' coroutines to
  fail when they are garbage collected, and Python prints each one's
  TensorStore traceback to stderr ("Exception ignored in: <coroutine ...>").
  The restore's own error already names the cause.
  """
  previous = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  try:
    yield
  finally:
    gc.collect()
    sys.unraisablehook = previous


class CheckpointManager:
  """Saves and restores a whole train state, atomically, with orbax.

  Saves the train-state pytree together with JSON metadata such as the
  input-pipeline position, keeps the last `max_to_keep` checkpoints, and
  restores onto the shardings of a target state — the same mesh for an exact
  resume, or a different device count (orbax reshards on read; error-feedback
  residuals, one per replica, restart from zeros there).

  Resuming is exact: restoring step `s` gives back the saved arrays bit for
  bit (typed PRNG keys included), so a run killed after step `s` and resumed
  from it computes the same parameters as an uninterrupted run on the same
  device count, provided the data for each step is a function of the restored
  position (e.g. a `(seed, epoch)` shuffle and the index within the epoch, or
  `jax.random.fold_in(seed, step)`).

  A save that is interrupted (the process is killed, the disk fills) leaves
  only orbax's temporary directory, which is never listed as a step and is
  removed (in the background) when a manager next opens the directory, so
  `latest_step()` and `restore()` keep returning the previous complete
  checkpoint, and saving that step again later works.

  Args:
    directory: where checkpoints live (one sub-directory per step); created,
      with its parents, by the first `save` (never by the constructor, a
      restore or a query). A path that is an existing file, or under one, is
      refused; a directory this process may not write still restores, and
      `save` into it raises a `PermissionError` before writing anything.
    max_to_keep: how many of the most recent checkpoints to keep (>= 1), or
      None to keep all.
    save_interval_steps: `save(step, ...)` only writes when `step` is a
      multiple of this (>= 1), unless `force=True`.
    async_save: write in a background thread after copying the state to host
      memory (orbax's asynchronous checkpointing); `save` then returns before
      the files are complete. Call `wait_until_finished()` or `close()` (or use
      the manager as a context manager) before exiting.

  Examples:
    >>> import tempfile
    >>> import jax, jax.numpy as jnp
    >>> from date_optax.checkpoint import CheckpointManager
    >>> state = {'params': jnp.ones(3), 'step': jnp.int32(7),
    ...          'rng': jax.random.key(0)}
    >>> with CheckpointManager(tempfile.mkdtemp()) as mngr:
    ...   _ = mngr.save(7, state, metadata={'epoch': 1, 'index': 12})
    ...   mngr.wait_until_finished()
    ...   restored, meta = mngr.restore(state)
    >>> int(restored['step']), meta
    (7, {'epoch': 1, 'index': 12})
    >>> bool((jax.random.key_data(restored['rng'])
    ...       == jax.random.key_data(state['rng'])).all())
    True

  References:
    orbax-checkpoint, `CheckpointManager` (Google); the preemption-safe
    training loops of big_vision and flax examples follow the same pattern.
  """

  def __init__(
      self,
      directory: str | os.PathLike,
      *,
      max_to_keep: int | None = 3,
      save_interval_steps: int = 1,
      async_save: bool = True,
  ):
    if max_to_keep is not None:
      validation.check_int("max_to_keep", max_to_keep, low=1)
    validation.check_int("save_interval_steps", save_interval_steps, low=1)
    validation.check_bool("async_save", async_save)
    if not isinstance(directory, (str, os.PathLike)):
      raise TypeError(f"directory must be a path, got {directory!r}.")
    checks.check_directory(os.path.abspath(os.fspath(directory)))
    ocp = _ocp()
    self._ocp = ocp
    self._directory = os.path.abspath(os.fspath(directory))
    self._interval = save_interval_steps
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        # The interval is applied in `save` (orbax would also always write the
        # first step it sees, which makes the interval hard to predict).
        save_interval_steps=1,
        enable_async_checkpointing=async_save,
        # Left-over temporary directories are saves that never completed
        # (where this process may remove them).
        cleanup_tmp_directories=checks.writable(self._directory),
        # Made by the first save: a manager opened to restore creates nothing.
        create=False,
    )
    self._manager = ocp.CheckpointManager(
        self._directory, options=options, item_names=("state", "residuals", "meta")
    )

  @property
  def directory(self) -> str:
    """The absolute checkpoint directory."""
    return self._directory

  def save(
      self,
      step: int,
      state: Any,
      *,
      metadata: Mapping[str, Any] | None = None,
      force: bool = False,
      include_residuals: bool = True,
  ) -> bool:
    """Saves `state` (and JSON `metadata`) as checkpoint `step`.

    Error-feedback residuals (every `date_optax.parallel.ErrorFeedbackState`
    in `state`, such as `TrainState.grad_residual`) are written as an item
    of their own, each process writing its own replicas' shards (nothing is
    gathered). The sizes are recorded: `info(step)`.

    Args:
      step: the step number that names the checkpoint, an integer >= 0.
      state: the train-state pytree of arrays (typed PRNG keys allowed).
      metadata: a JSON-serialisable mapping saved alongside, e.g. the
        input-pipeline position `{"epoch": e, "index": i}`.
      force: save even if `step` is not a multiple of `save_interval_steps`.
      include_residuals: False leaves the error-feedback residuals out (the
        checkpoint then does not grow with the replica count); a restore
        gives zeros in their place, which drops one step's rounding.

    Raises:
      PermissionError: the directory cannot be made, or this process may not
        write into it (checked before anything is written).

    Returns:
      Whether a checkpoint was started: False when the interval skips it,
      and, with a warning, when checkpoint `step` exists already (it is
      never overwritten) or, without `force`, when `step` is older than the
      latest checkpoint. Nothing is written then.
    """
    if isinstance(step, jax.Array) and step.ndim == 0:
      step = np.asarray(step)[()]
    step = validation.check_int("step", step, low=0)
    validation.check_bool("force", force)
    validation.check_bool("include_residuals", include_residuals)
    if metadata is not None and not isinstance(metadata, Mapping):
      raise TypeError(f"metadata must be a mapping or None, got {metadata!r}.")
    if not force and step % self._interval:
      return False
    steps = self._manager.all_steps()
    if step in steps:
      validation.warn_at_caller(
          f"CheckpointManager.save: checkpoint step {step} already exists in "
          f"{self._directory}; it is never overwritten, so nothing was saved "
          "(save returns False). Save under another step number.")
      return False
    if not force and steps and step < max(steps):
      validation.warn_at_caller(
          f"CheckpointManager.save: step {step} is older than the latest "
          f"checkpoint, step {max(steps)}, in {self._directory}; nothing was "
          "saved (save returns False). Pass force=True to save it anyway.")
      return False
    encoded, impls = target_lib.encode(state)
    checks.check_saveable(encoded)
    rest, residuals = ckres.split(encoded)
    keep = bool(residuals) and include_residuals
    meta = {
        "format": _FORMAT,
        "step": step,
        "prng_keys": impls,
        "leaves": checks.leaf_specs(rest),
        "fingerprints": _fingerprints(rest),
        "residuals": {"saved": keep, "replicas": ckres.replicas(residuals),
                      "layout": ckres.layout(residuals),
                      "leaves": checks.leaf_specs(residuals) if keep else [],
                      "fingerprints": _fingerprints(residuals) if keep else []},
        "bytes": ckres.sizes(rest, residuals, keep),
        "metadata": dict(metadata or {}),
    }
    try:
      json.dumps(meta)
    except (TypeError, ValueError) as e:
      raise TypeError(f"metadata must be JSON-serialisable: {e}") from e
    checks.make_writable(self._directory)
    ocp = self._ocp
    items = {"state": ocp.args.StandardSave(rest), "meta": ocp.args.JsonSave(meta)}
    if keep:
      items["residuals"] = ocp.args.StandardSave(residuals)
    return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(
      self, target: Any, *, step: int | None = None, include_residuals: bool = True
  ) -> tuple[Any, dict]:
    """Restores checkpoint `step` (default: the latest complete one) onto `target`.

    Every leaf is checked against the fingerprint recorded when it was saved,
    so a checkpoint whose files were truncated, half deleted or overwritten
    is never loaded. With the default `step=None`, such a checkpoint is
    skipped with a warning naming its step and the newest older one that
    restores is returned (on every process alike: multi-host runs agree on
    the outcome of each attempt). A checkpoint that holds one trust-ratio
    array per parameter leaf (written before the ratios were recorded as one
    `date_optax.LayerRatios` vector) restores onto a current target, and so
    does one whose `date_optax.BatchScheduleState` counts its examples in
    one int32 (written before the exact two-word count).

    Error-feedback residuals (each `date_optax.parallel.ErrorFeedbackState`
    in `target`) are read when the checkpoint holds them for the target's
    replica count. They are zeros, shaped and sharded as `target`'s (what
    the step's init builds), when the checkpoint was saved with
    `include_residuals=False`, when this restore passes it, or when the
    checkpoint was saved with another replica count N than the target's M
    (a `UserWarning` names both): the state then resumes on M replicas,
    having dropped one step's rounding. They are zeros too, with a
    `RuntimeWarning`, when their item fails its fingerprint or cannot be
    read: the rest of the state restores from this step (no fall back to an
    older one). Checkpoints written before format 4 hold the residuals
    inside the state and restore onto N replicas only.

    Args:
      target: a pytree with the structure of the saved state whose leaves are
        arrays or `jax.ShapeDtypeStruct` values; their shapes, dtypes and shardings
        are those of the restored arrays (orbax reshards when the mesh
        differs from the one that saved). A leaf without a sharding is
        restored with the sharding it was saved with, which needs the
        devices that saved it: on another device count such a target
        raises `CheckpointMismatchError` naming the leaves. Typed PRNG keys
        in `target` get typed keys back. A train step's
        `step.abstract_state(params)` builds a target with shapes, dtypes
        and shardings without allocating (`jax.eval_shape(step.init,
        params)` has no shardings).
      step: which checkpoint; defaults to the newest one that is complete.
      include_residuals: False leaves the saved residuals unread and gives
        zeros in their place (one step's rounding dropped).

    Returns:
      `(state, metadata)`: the restored pytree (structure of `target`) and
      the metadata mapping given to `save`.

    Raises:
      FileNotFoundError: if there is no checkpoint (or no checkpoint `step`),
        saying why: the directory does not exist, is a file, is empty or
        holds no complete checkpoint, or the step is not there. A restore
        creates, changes and deletes nothing.
      CheckpointMismatchError: (a `ValueError`) if `target` has another
        structure, or a leaf of another shape or dtype, than the saved state
        (checked before reading; no older step is tried); the message names
        the leaf and the saved and requested shape and dtype. Also when leaves
        without a sharding were saved on devices this process does not have
        (the message says what the target needs).
      CorruptCheckpointError: (a `ValueError`) if the requested `step`, or
        with `step=None` every checkpoint, is damaged; the message names the
        step and the cause.
      TypeError: a `target` leaf that is neither an array, a number nor a
        `jax.ShapeDtypeStruct` (a string, an object), named by its path
        before anything is read.
    """
    checks.check_target(target)
    validation.check_bool("include_residuals", include_residuals)
    if step is not None:
      step = validation.check_int("step", step, low=0)
      if step not in self.all_steps():
        raise FileNotFoundError(
            checks.no_checkpoint(self._directory, step, self.all_steps()) + ".")
      return self._restore_verified(target, step, include_residuals)
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(checks.no_checkpoint(self._directory) + ".")
    bad: list[tuple[int, Exception]] = []
    for s in reversed(steps):
      try:
        # A CheckpointMismatchError is raised at once: an older checkpoint of
        # the same run would not fit the target either.
        result = self._restore_verified(target, s, include_residuals)
      except CorruptCheckpointError as e:
        bad.append((s, e))
        continue
      for b, e in bad:
        warnings.warn(
            f"checkpoint step {b} in {self._directory} is damaged and was "
            f"skipped; restored step {s} instead. Cause: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
      return result
    # Nothing restored: more likely a target that fits no checkpoint than
    # every checkpoint broken, so report the newest one's failure.
    raise bad[0][1]

  def _restore_verified(
      self, target: Any, step: int, include_residuals: bool = True
  ) -> tuple[Any, dict]:
    ocp = self._ocp
    error: tuple[str, str] | None = None
    mismatch: CheckpointMismatchError | None = None
    misfit = f"checkpoint step {step} in {self._directory} does not fit the target"
    reset = plan = damaged = whole = None
    with _quiet_failed_reads():
      try:
        meta = self._manager.restore(
            step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
        ).meta
        if not isinstance(meta, Mapping):
          raise ValueError("its metadata is unreadable")
        impls = meta.get("prng_keys", {})
        whole = target_lib.abstract_target(target, impls)
        saved_res = meta.get("residuals")  # None: residuals in the state (format < 4)
        packed, res_target = ckres.split(whole) if saved_res else (whole, [])
        plan, reset = ckres.plan(saved_res, res_target, include_residuals)
        try:
          abstract, unpacked, legacy = packed, False, False
          if plan == "missing":
            raise CheckpointMismatchError(ckres.MISSING)
          if meta.get("leaves") is not None:
            # Before orbax reads anything: a misfit target is named here, and
            # no read is left failing in orbax's background threads.
            abstract, unpacked, legacy = target_lib.fitting_layout(
                abstract, lambda a: target_lib.check_fits(a, meta["leaves"]))
          if plan == "read":
            target_lib.check_fits(res_target, saved_res["leaves"])
        except CheckpointMismatchError as e:
          mismatch = CheckpointMismatchError(f"{misfit}: {e}")
        if mismatch is None:
          restored = self._manager.restore(
              step,
              args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)),
          ).state
          checks.verify(restored, meta.get("fingerprints"))
          if unpacked:
            restored = layer_ratios_lib.repacked_records(restored, packed)
          if legacy:
            restored = bs_lib.upgraded_layout(restored, packed)
          if plan == "read":
            try:
              residuals = self._manager.restore(step, args=ocp.args.Composite(
                  residuals=ocp.args.StandardRestore(res_target))).residuals
              checks.verify(residuals, saved_res["fingerprints"])
            except Exception as e:  # noqa: BLE001 - damaged residuals: zeros below
              if target_lib.is_topology_error(e):
                raise
              damaged = f"{type(e).__name__}: {e}"
          elif saved_res:
            residuals = ckres.zeros(res_target)
      except Exception as e:  # noqa: BLE001 - orbax/tensorstore raise many types
        # Keep the cause's text only: its traceback holds orbax's pending
        # reads, which would print their own tracebacks when collected later.
        error = (type(e).__name__, str(e))
        if target_lib.is_topology_error(e):
          # The target's fault (a leaf without a sharding), not the files'.
          bare = target_lib.unsharded(whole)
          mismatch = CheckpointMismatchError(f"{misfit}: {target_lib.topology_message(bare)}")
    if not _all_processes_agree(error is None and mismatch is None):
      if mismatch is not None:
        raise mismatch
      name, text = error or ("RuntimeError", "another process could not read it")
      raise CorruptCheckpointError(
          f"checkpoint step {step} in {self._directory} cannot be restored: "
          f"{name}: {text}"
      )
    if plan == "read" and not _all_processes_agree(damaged is None):
      # Residuals are what a restore otherwise drops freely (another replica
      # count, include_residuals=False): damaged ones cost the same one step's
      # rounding, not a fall back to an older step.
      residuals = ckres.zeros(res_target)
      validation.warn_at_caller(
          f"CheckpointManager.restore: {ckres.damaged_message(step, self._directory, damaged)}",
          RuntimeWarning)
    if saved_res and res_target:
      restored = ckres.merge(whole, restored, residuals)
    if reset is not None:
      validation.warn_at_caller(f"CheckpointManager.restore: {ckres.reset_message(*reset)}")
    try:
      return target_lib.decode(restored, target, impls), dict(meta.get("metadata", {}))
    except CheckpointMismatchError as e:
      raise CheckpointMismatchError(f"{misfit}: {e}") from None

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> tuple[int, ...]:
    """Steps of all complete checkpoints, ascending."""
    return tuple(sorted(self._manager.all_steps()))

  def info(self, step: int | None = None) -> ckres.CheckpointInfo:
    """What checkpoint `step` (default: the latest) holds, and its size.

    Read from the metadata `save` wrote, without restoring the state: the
    array bytes in all and of the error-feedback residuals, per device too,
    whether the residuals were saved and their replica count
    (`date_optax.checkpoint.CheckpointInfo`).
    """
    steps = self.all_steps()
    step = steps[-1] if step is None and steps else step
    if step is None or validation.check_int("step", step, low=0) not in steps:
      raise FileNotFoundError(checks.no_checkpoint(self._directory, step, steps) + ".")
    ocp = self._ocp
    meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    return ckres.info(step, meta)

  def reached_preemption(self, step: int) -> bool:
    """Whether the job got a preemption notice (multi-host, synchronised).

    Save and exit when this returns True (orbax's preemption sync point).
    """
    return self._manager.reached_preemption(step)

  def wait_until_finished(self) -> None:
    """Blocks until pending asynchronous saves are complete on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager's resources."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> CheckpointManager:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()
