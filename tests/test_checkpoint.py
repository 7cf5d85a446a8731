"""Checkpoint/resume: exact after SIGKILL, across device counts, crash-safe saves.

The training runs are subprocesses of tests/checkpoint_train_script.py (a
small data-parallel LAMB run whose state holds params, optimizer state with
count and trust ratios, step and a typed PRNG key, plus the input-pipeline
position as checkpoint metadata). Every subprocess has a time limit and is
always killed and reaped.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax
from date_optax.checkpoint import CheckpointManager, CheckpointMismatchError, CorruptCheckpointError

SCRIPT = os.path.join(os.path.dirname(__file__), "checkpoint_train_script.py")
TIMEOUT_S = 180
# With `--dist loadgroup` the subprocess tests share one baseline run.
pytestmark = pytest.mark.xdist_group("checkpoint_subprocess")
STEPS, SAVE_EVERY = 24, 4


def _env():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the script sets its own device count
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _run(workdir, *args, devices=8):
  """Runs the script to completion; returns its stdout."""
  cmd = [sys.executable, SCRIPT, "--workdir", str(workdir), "--devices",
         str(devices), "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
         *map(str, args)]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=_env())
  try:
    out, err = proc.communicate(timeout=TIMEOUT_S)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  return proc.returncode, out, err


def _run_ok(workdir, *args, devices=8):
  rc, out, err = _run(workdir, *args, devices=devices)
  assert rc == 0, f"script failed ({rc}):\n{out}\n{err[-3000:]}"
  return out


def _load(path):
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def _assert_bitwise_equal(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k].dtype == b[k].dtype, k
    np.testing.assert_array_equal(a[k], b[k], err_msg=k, strict=True)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  """The uninterrupted 8-device run, with a dump of the state at every save."""
  workdir = tmp_path_factory.mktemp("baseline")
  _run_ok(workdir, "--out", workdir / "final.npz", "--dump-saves")
  return workdir


def test_sigkill_mid_run_then_resume_is_bitwise_identical(baseline, tmp_path):
  final = _load(baseline / "final.npz")
  # The run slows down after step 8 so the kill lands mid-run.
  cmd = [sys.executable, SCRIPT, "--workdir", str(tmp_path), "--devices", "8",
         "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
         "--slow-after", "8", "--delay", "0.5"]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env=_env())
  lines: queue.Queue = queue.Queue()
  reader = threading.Thread(
      target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True)
  reader.start()
  seen = []
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while "saved 8" not in seen:
      seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.1)))
    assert proc.poll() is None, f"run ended before the kill: {seen}"
    proc.send_signal(signal.SIGKILL)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=30)
    reader.join(timeout=30)
    proc.stdout.close()
  while not lines.empty():
    seen.append(lines.get())
  assert proc.returncode == -signal.SIGKILL
  assert "saved 8" in seen and "done" not in seen, seen

  latest = CheckpointManager(tmp_path / "ckpt").latest_step()
  assert latest == 8
  out = _run_ok(tmp_path, "--out", tmp_path / "final.npz",
                "--dump-restored", tmp_path / "restored.npz")
  assert "resumed from 8 at epoch 1 index 0" in out
  # Restoring is exact, and so is everything computed after it.
  _assert_bitwise_equal(_load(tmp_path / "restored.npz"),
                        _load(baseline / "dump_8.npz"))
  _assert_bitwise_equal(_load(tmp_path / "final.npz"), final)
  # The resumed run appended to the metrics CSV; the values agree with the
  # uninterrupted run's log at every step.
  from date_optax.diagnostics import read_metrics_csv

  ours = read_metrics_csv(tmp_path / "logs" / "metrics.csv")
  ref = read_metrics_csv(baseline / "logs" / "metrics.csv")
  assert sorted(ours) == sorted(ref)
  for name in ref:
    np.testing.assert_array_equal(ours[name][0], np.arange(1, STEPS + 1))
    np.testing.assert_array_equal(ours[name][1], ref[name][1], err_msg=name)


def test_restore_on_fewer_devices_matches(baseline, tmp_path):
  # Take the 8-device checkpoint of step 16 and finish the run on 4 devices.
  shutil.copytree(baseline / "ckpt", tmp_path / "ckpt")
  for step in os.listdir(tmp_path / "ckpt"):
    if step.isdigit() and int(step) > 16:
      shutil.rmtree(tmp_path / "ckpt" / step)
  out = _run_ok(tmp_path, "--restore-step", 16, "--out", tmp_path / "final.npz",
                "--dump-restored", tmp_path / "restored.npz", devices=4)
  assert "resumed from 16 at epoch 2 index 0" in out
  # The restored state is the saved one, bit for bit, resharded over 4 devices.
  _assert_bitwise_equal(_load(tmp_path / "restored.npz"),
                        _load(baseline / "dump_16.npz"))
  # Training on goes on with another reduction order: equal within float noise.
  got, want = _load(tmp_path / "final.npz"), _load(baseline / "final.npz")
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.parametrize(
    "crash_at", ["finalize", pytest.param("create", marks=pytest.mark.slow)])
def test_crash_during_save_keeps_previous_checkpoint(baseline, tmp_path, crash_at):
  # SIGKILL inside orbax's save of step 12: either right after the temporary
  # directory was made ("create") or with all files and the commit marker
  # written but before the rename ("finalize").
  rc, out, _ = _run(tmp_path, "--crash-in-save", 12, "--crash-at", crash_at)
  assert rc == -signal.SIGKILL, out
  assert f"crashing in {crash_at} of step 12" in out
  leftovers = [d for d in os.listdir(tmp_path / "ckpt") if d.startswith("12.")]
  assert leftovers, os.listdir(tmp_path / "ckpt")
  assert "orbax-checkpoint-tmp" in leftovers[0]

  mngr = CheckpointManager(tmp_path / "ckpt")
  assert mngr.all_steps() == (4, 8) and mngr.latest_step() == 8
  mngr.close()
  # The previous checkpoint restores correctly, step 12 is saved again and
  # the run finishes exactly like the uninterrupted one.
  out = _run_ok(tmp_path, "--out", tmp_path / "final.npz",
                "--dump-restored", tmp_path / "restored.npz")
  assert "resumed from 8" in out and "saved 12" in out
  _assert_bitwise_equal(_load(tmp_path / "restored.npz"),
                        _load(baseline / "dump_8.npz"))
  _assert_bitwise_equal(_load(tmp_path / "final.npz"), _load(baseline / "final.npz"))
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["16", "20", "24"]


# In-process tests of the manager itself.


def _state(value: float = 1.0):
  params = {"w": jnp.full((4, 3), value), "b": jnp.zeros(3)}
  opt = date_optax.lamb(1e-2, lower=0.01, upper=10.0)
  opt_state = opt.init(params)
  _, opt_state = opt.update(jax.tree.map(jnp.ones_like, params), opt_state, params)
  return {"params": params, "opt_state": opt_state, "step": jnp.int32(3),
          "rng": jax.random.key(7), "old_rng": jax.random.PRNGKey(3)}


def test_roundtrip_keeps_types_keys_and_telemetry(tmp_path):
  state = _state()
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    assert mngr.save(3, state, metadata={"epoch": 2, "index": 5, "note": "x"})
    restored, meta = mngr.restore(state)
  assert meta == {"epoch": 2, "index": 5, "note": "x"}
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  assert jax.dtypes.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
  assert str(jax.random.key_impl(restored["rng"])) == "threefry2x32"
  np.testing.assert_array_equal(jax.random.key_data(restored["rng"]),
                                jax.random.key_data(state["rng"]))
  assert restored["old_rng"].dtype == jnp.uint32
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == b.dtype
  # The optimizer state still carries its count and ratios.
  assert int(restored["opt_state"].count) == 1
  assert date_optax.trust_ratios(restored["opt_state"]) is not None
  # The restored key draws the same numbers.
  np.testing.assert_array_equal(jax.random.normal(restored["rng"], (3,)),
                                jax.random.normal(state["rng"], (3,)))


def test_restore_onto_abstract_target_with_shardings(tmp_path):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = {"w": jnp.arange(8.0), "rng": jax.random.key(1)}
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state)
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=spec), state)
    restored, meta = mngr.restore(target)
  assert meta == {}
  assert restored["w"].sharding == spec and restored["rng"].sharding == spec
  np.testing.assert_array_equal(restored["w"], np.arange(8.0))


def test_partial_temporary_directory_is_ignored_and_removed(tmp_path):
  # A save killed half-way leaves `<step>.orbax-checkpoint-tmp-<ts>`: simulate
  # one by copying a complete step and truncating its files.
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, _state(1.0), metadata={"epoch": 0, "index": 1})
    mngr.save(2, _state(2.0), metadata={"epoch": 0, "index": 2})
  tmp = tmp_path / "3.orbax-checkpoint-tmp-1234567890"
  shutil.copytree(tmp_path / "2", tmp)
  for root, _, files in os.walk(tmp):
    for f in files:
      with open(os.path.join(root, f), "r+b") as fh:
        fh.truncate(max(os.path.getsize(os.path.join(root, f)) // 2, 0))
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    assert mngr.all_steps() == (1, 2)
    restored, meta = mngr.restore(_state())
    assert meta == {"epoch": 0, "index": 2}
    np.testing.assert_array_equal(restored["params"]["w"], np.full((4, 3), 2.0))
    # Step 3 can be saved for real afterwards; the debris is gone.
    mngr.save(3, _state(3.0), metadata={"epoch": 0, "index": 3})
    assert mngr.all_steps() == (1, 2, 3)
    restored, _ = mngr.restore(_state())
  assert not tmp.exists()
  np.testing.assert_array_equal(restored["params"]["w"], np.full((4, 3), 3.0))


def test_keeps_max_to_keep_and_honours_interval(tmp_path):
  with CheckpointManager(tmp_path, max_to_keep=2, save_interval_steps=2,
                         async_save=False) as mngr:
    saved = [mngr.save(s, {"x": jnp.float32(s)}) for s in range(1, 8)]
    assert saved == [False, True, False, True, False, True, False]
    assert mngr.save(7, {"x": jnp.float32(7)}, force=True)
    assert mngr.all_steps() == (6, 7)
    restored, _ = mngr.restore({"x": jnp.float32(0)}, step=6)
  assert float(restored["x"]) == 6.0


def test_bad_arguments_raise(tmp_path):
  with pytest.raises(ValueError, match="max_to_keep"):
    CheckpointManager(tmp_path, max_to_keep=0)
  with pytest.raises(TypeError, match="save_interval_steps"):
    CheckpointManager(tmp_path, save_interval_steps=1.5)
  with pytest.raises(TypeError, match="async_save"):
    CheckpointManager(tmp_path, async_save="no")
  with pytest.raises(TypeError, match="directory"):
    CheckpointManager(None)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
      mngr.restore({"x": jnp.zeros(2)})
    with pytest.raises(ValueError, match="step"):
      mngr.save(-1, {"x": jnp.zeros(2)})
    with pytest.raises(TypeError, match="metadata"):
      mngr.save(1, {"x": jnp.zeros(2)}, metadata={"position": object()})
    with pytest.raises(TypeError, match="metadata"):
      mngr.save(1, {"x": jnp.zeros(2)}, metadata=[1, 2])
    mngr.save(1, {"x": jnp.zeros(2), "k": jnp.zeros(2, jnp.uint32)})
    with pytest.raises(FileNotFoundError, match="step 5"):
      mngr.restore({"x": jnp.zeros(2), "k": jnp.zeros(2, jnp.uint32)}, step=5)
    # A typed key in the target where the checkpoint holds a plain array.
    with pytest.raises(ValueError, match="typed PRNG key"):
      mngr.restore({"x": jnp.zeros(2), "k": jax.random.key(0)})
    # Another PRNG implementation than the one saved.
    mngr.save(2, {"k": jax.random.key(0, impl="rbg")})
    with pytest.raises(ValueError, match="rbg"):
      mngr.restore({"k": jax.random.key(0, impl="unsafe_rbg")}, step=2)


def test_optax_state_roundtrip_with_inject_hyperparams(tmp_path):
  # Nested optax states (chains, injected hyperparameters) restore to the
  # same structure and values.
  opt = optax.inject_hyperparams(date_optax.lamb)(learning_rate=1e-2)
  params = {"w": jnp.ones((2, 2))}
  state = opt.init(params)
  _, state = opt.update({"w": jnp.ones((2, 2))}, state, params)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state)
    restored, _ = mngr.restore(state)
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  np.testing.assert_array_equal(
      date_optax.trust_ratios(restored)["w"], date_optax.trust_ratios(state)["w"])
  np.testing.assert_allclose(restored.hyperparams["learning_rate"], 1e-2)


def test_missing_orbax_names_the_extra(tmp_path, monkeypatch):
  # A plain `pip install date-optax` has no orbax: the manager must say which
  # extra brings it, not fail with a bare ModuleNotFoundError.
  for name in [m for m in sys.modules if m == "orbax" or m.startswith("orbax.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "orbax", None)
  monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
  with pytest.raises(ImportError, match=r"date-optax\[checkpoint\]"):
    CheckpointManager(str(tmp_path / "ckpt"))


def _two_steps(tmp_path):
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, _state(1.0), metadata={"index": 1})
    mngr.save(2, _state(2.0), metadata={"index": 2})
  return [p for p in (tmp_path / "2").rglob("*") if p.is_file()]


def _assert_falls_back_to_step_1(tmp_path):
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    assert mngr.all_steps() == (1, 2)
    with pytest.warns(RuntimeWarning, match="checkpoint step 2 .* damaged"):
      restored, meta = mngr.restore(_state(0.0))
    assert meta == {"index": 1}
    np.testing.assert_array_equal(restored["params"]["w"], np.full((4, 3), 1.0))
    # Asked for by name, the damaged step is refused, never loaded.
    with pytest.raises(CorruptCheckpointError, match="step 2"):
      mngr.restore(_state(0.0), step=2)


def test_truncated_latest_checkpoint_falls_back(tmp_path):
  files = _two_steps(tmp_path)
  data = [p for p in files if p.parent.name == "d"]
  assert data, files
  for p in data:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
  _assert_falls_back_to_step_1(tmp_path)


def test_half_deleted_latest_checkpoint_falls_back(tmp_path):
  files = sorted(_two_steps(tmp_path))
  for p in files[::2]:
    p.unlink()
  _assert_falls_back_to_step_1(tmp_path)


def test_silently_wrong_payload_is_caught_by_fingerprints(tmp_path):
  # Files that orbax reads without complaint but that hold other numbers
  # (a copy from another run): only the fingerprints can tell.
  _two_steps(tmp_path)
  other = tmp_path.parent / (tmp_path.name + "_other")
  with CheckpointManager(other, async_save=False) as mngr:
    mngr.save(2, _state(5.0), metadata={"index": 2})
  shutil.rmtree(tmp_path / "2" / "state")
  shutil.copytree(other / "2" / "state", tmp_path / "2" / "state")
  _assert_falls_back_to_step_1(tmp_path)


def test_fingerprints_see_every_word_and_its_place():
  from date_optax._src.checkpoint import _fingerprints

  base = {"a": jnp.arange(12.0).reshape(3, 4), "k": jax.random.key_data(jax.random.key(0)),
          "h": jnp.ones(5, jnp.bfloat16), "c": jnp.array([1 + 2j], jnp.complex64)}
  ref = _fingerprints(base)
  assert ref == _fingerprints(jax.tree.map(np.asarray, base))
  changed = [
      dict(base, a=base["a"].at[2, 3].add(1e-6)),
      dict(base, a=base["a"][::-1]),  # same words, other places
      dict(base, h=base["h"].at[0].set(2)),
      dict(base, c=base["c"] * 1j),
      dict(base, k=base["k"] ^ 1),
  ]
  for tree in changed:
    assert _fingerprints(tree) != ref


def test_wrong_target_is_an_error_not_a_fallback(tmp_path):
  _two_steps(tmp_path)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    bad_target = dict(_state(0.0), params={"w": jnp.zeros((5, 3)), "b": jnp.zeros(3)})
    with pytest.raises(CheckpointMismatchError, match="step 2"):
      mngr.restore(bad_target)
