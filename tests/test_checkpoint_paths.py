"""The checkpoint manager given a directory that is not what it expects, and
a checkpoint whose residuals are damaged or older than their own item
(issue 58, items 7 and 8).

Each case says what is wrong in one error, and no call creates, changes or
deletes anything it was not asked to write: a snapshot of the whole tree
(every path, its size and modification time) is the same before and after
every constructor, restore, info and query.
"""

from __future__ import annotations

import os
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager

STATE = {"w": jnp.arange(4.0), "step": jnp.int32(3)}


def snapshot(root):
  """Every path under `root` (itself included) with its kind, size and mtime."""
  out = {}
  for here, dirs, files in os.walk(root):
    for name in [".", *dirs, *files]:
      path = os.path.join(here, name)
      st = os.lstat(path)
      out[os.path.relpath(path, root)] = (os.path.isdir(path), st.st_size, st.st_mtime_ns)
  return out


def _queries(mngr, step=1):
  """The calls that only read: each must raise FileNotFoundError here."""
  return {"restore()": lambda: mngr.restore(STATE),
          f"restore(step={step})": lambda: mngr.restore(STATE, step=step),
          "info()": mngr.info, f"info({step})": lambda: mngr.info(step)}


def test_a_directory_that_does_not_exist_is_made_by_the_first_save_only(tmp_path):
  path = tmp_path / "runs" / "ckpt"
  with CheckpointManager(path, async_save=False) as mngr:
    assert mngr.latest_step() is None and mngr.all_steps() == ()
    for what, call in _queries(mngr).items():
      with pytest.raises(FileNotFoundError, match=f"no checkpoint (for step 1 )?in {path}: "
                                                  "the directory does not exist"):
        call()
      assert list(tmp_path.iterdir()) == [], what  # nothing created
    assert mngr.save(1, STATE)  # asked to write: the directory is made now
    restored, _ = mngr.restore(STATE)
  assert (path / "1").is_dir()
  np.testing.assert_array_equal(restored["w"], np.arange(4.0))


def test_a_file_where_a_directory_belongs(tmp_path):
  path = tmp_path / "ckpt"
  path.write_text("not a directory")
  before = snapshot(tmp_path)
  with pytest.raises(ValueError, match=f"{path} is an existing file"):
    CheckpointManager(path)
  with pytest.raises(ValueError, match=f"{path}/sub is under {path}, an existing file"):
    CheckpointManager(path / "sub")
  assert snapshot(tmp_path) == before
  # A file where a step's directory belongs is no checkpoint, and is left as is.
  good = tmp_path / "good"
  with CheckpointManager(good, async_save=False) as mngr:
    mngr.save(1, STATE)
  (good / "5").write_text("not a checkpoint")
  before = snapshot(tmp_path)
  with CheckpointManager(good, async_save=False) as mngr:
    assert mngr.all_steps() == (1,)
    for call in (lambda: mngr.restore(STATE, step=5), lambda: mngr.info(5)):
      with pytest.raises(FileNotFoundError, match=rf"no checkpoint for step 5 in {good} "
                                                  rf"\({good}/5 is a file, not a checkpoint\); "
                                                  r"available: \[1\]"):
        call()
    restored, _ = mngr.restore(STATE)
  np.testing.assert_array_equal(restored["w"], np.arange(4.0))
  assert snapshot(tmp_path) == before


@pytest.mark.parametrize("how", ["chmod", "simulated"])
def test_a_directory_without_write_permission_restores_and_refuses_a_save(
    tmp_path, monkeypatch, how):
  """Read-only checkpoints restore; a save says the directory is not
  writable and writes nothing; the temporary directory of an interrupted
  save is left where it is (this process could not remove it)."""
  path = tmp_path / "ckpt"
  with CheckpointManager(path, async_save=False) as mngr:
    mngr.save(1, STATE)
  (path / "2.orbax-checkpoint-tmp-123").mkdir()
  if how == "chmod":
    if os.geteuid() == 0:
      pytest.skip("running as root, whom chmod does not stop from writing; the "
                  "'simulated' case takes os.access's answer away instead")
    path.chmod(0o555)
  else:
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **kw: (
        False if os.fspath(p) == str(path) and mode & os.W_OK else real(p, mode, *a, **kw)))
  try:
    before = snapshot(tmp_path)
    with CheckpointManager(path, async_save=False) as mngr:
      restored, _ = mngr.restore(STATE)
      assert mngr.info().step == 1
      with pytest.raises(PermissionError, match=rf"cannot save: the checkpoint directory {path} "
                                                r"is not writable.*nothing was written"):
        mngr.save(2, STATE)
      assert mngr.all_steps() == (1,)
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))
    assert snapshot(tmp_path) == before
  finally:
    path.chmod(0o755)


def test_an_empty_directory(tmp_path):
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    for what, call in _queries(mngr, step=0).items():
      with pytest.raises(FileNotFoundError, match=f"no checkpoint (for step 0 )?in {tmp_path}: "
                                                  "the directory is empty"):
        call()
      assert list(tmp_path.iterdir()) == [], what
  (tmp_path / "notes.txt").write_text("mine")
  before = snapshot(tmp_path)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    for call in _queries(mngr, step=0).values():
      with pytest.raises(FileNotFoundError, match=f"no checkpoint (for step 0 )?in {tmp_path}: "
                                                  "it holds no complete checkpoint, only "
                                                  "notes.txt"):
        call()
  assert snapshot(tmp_path) == before


def test_a_step_that_is_not_there(tmp_path):
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, STATE)
    mngr.save(2, STATE)
  before = snapshot(tmp_path)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    for call in (lambda: mngr.restore(STATE, step=3), lambda: mngr.info(3)):
      with pytest.raises(FileNotFoundError, match=rf"no checkpoint for step 3 in {tmp_path}; "
                                                  r"available: \[1, 2\]"):
        call()
    assert mngr.latest_step() == 2
  assert snapshot(tmp_path) == before


def test_leaves_on_different_devices_restore_where_they_were_saved(tmp_path):
  """A target leaf without a sharding is read onto the sharding it was saved
  with; leaves committed to different devices are verified each on its own
  (a sound checkpoint was reported damaged when one program could not take
  them all)."""
  state = {"a": jnp.arange(4.0), "b": jax.device_put(jnp.ones(3), jax.devices()[3])}
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state)
    restored, _ = mngr.restore({"a": jax.ShapeDtypeStruct((4,), jnp.float32),
                                "b": np.zeros(3, np.float32)})
  assert restored["b"].devices() == {jax.devices()[3]}
  np.testing.assert_array_equal(restored["a"], np.arange(4.0))
  np.testing.assert_array_equal(restored["b"], np.ones(3))


# -- Residuals: damaged ones, and older checkpoints that hold them in the state.


def _ef_state(value):
  """A train state with error-feedback residuals over 8 replicas (no step is
  compiled: the residuals are what a step would hold)."""
  state = dp.TrainState.create({"w": jnp.full((3,), value)}, optax.sgd(0.1))
  residual = dp.ErrorFeedbackState(worker={"w": jnp.arange(24.0).reshape(8, 3) * value},
                                   hop=None)
  return state.replace(step=jnp.int32(value), grad_residual=residual)


@pytest.mark.parametrize("damage", ["truncated", "another step's"])
def test_damaged_residuals_restore_their_step_with_zeros_and_a_warning(tmp_path, damage):
  """Residuals that fail their fingerprint, or cannot be read, cost one
  step's rounding (zeros, a RuntimeWarning), never a fall back to an older
  step and its lost training."""
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, _ef_state(1.0))
    mngr.save(2, _ef_state(2.0))
  if damage == "truncated":
    data = [p for p in (tmp_path / "2" / "residuals").rglob("*") if p.is_file()
            and p.parent.name == "d"]
    assert data
    for p in data:
      p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
  else:
    shutil.rmtree(tmp_path / "2" / "residuals")
    shutil.copytree(tmp_path / "1" / "residuals", tmp_path / "2" / "residuals")
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    for step in (None, 2):
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored, _ = mngr.restore(_ef_state(0.0), step=step)
      messages = [str(w.message) for w in caught]
      assert len(messages) == 1 and caught[0].category is RuntimeWarning, messages
      assert ("error-feedback residuals of checkpoint step 2" in messages[0]
              and "damaged" in messages[0] and "zero residuals" in messages[0]), messages
      assert int(restored.step) == 2
      np.testing.assert_array_equal(restored.params["w"], np.full(3, 2.0))
      np.testing.assert_array_equal(restored.grad_residual.worker["w"], np.zeros((8, 3)))
    # Step 1 is untouched: its residuals come back as saved.
    one, _ = mngr.restore(_ef_state(0.0), step=1)
  np.testing.assert_array_equal(one.grad_residual.worker["w"], np.arange(24.0).reshape(8, 3))


def test_info_of_a_checkpoint_with_residuals_inside_the_state(tmp_path):
  """Format 3 (before the residuals' own item) kept them in the state:
  `info` says they were saved, and over how many replicas."""
  import orbax.checkpoint as ocp  # noqa: PLC0415

  from date_optax._src import checkpoint_checks as checks  # noqa: PLC0415
  from date_optax._src.checkpoint import _fingerprints  # noqa: PLC0415

  state = jax.device_get(_ef_state(1.0))
  meta = {"format": 3, "step": 4, "prng_keys": {}, "leaves": checks.leaf_specs(state),
          "fingerprints": _fingerprints(state), "metadata": {"epoch": 1}}
  old = ocp.CheckpointManager(tmp_path, item_names=("state", "residuals", "meta"))
  old.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      meta=ocp.args.JsonSave(meta)))
  old.wait_until_finished()
  old.close()
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    info = mngr.info()
    restored, _ = mngr.restore(_ef_state(0.0))
  assert (info.step, info.residuals_saved, info.replicas) == (4, True, 8)
  assert info.total_bytes is None and info.metadata == {"epoch": 1}
  np.testing.assert_array_equal(restored.grad_residual.worker["w"],
                                np.arange(24.0).reshape(8, 3))
  # A format-3 checkpoint without residuals says so.
  plain = dict(meta, leaves=checks.leaf_specs(state.replace(grad_residual=None)))
  other = ocp.CheckpointManager(tmp_path / "plain", item_names=("state", "residuals", "meta"))
  other.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(
      state.replace(grad_residual=None)), meta=ocp.args.JsonSave(plain)))
  other.wait_until_finished()
  other.close()
  with CheckpointManager(tmp_path / "plain", async_save=False) as mngr:
    assert (mngr.info().residuals_saved, mngr.info().replicas) == (False, None)
