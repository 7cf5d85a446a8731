"""Error-feedback residuals in checkpoints: their size, leaving them out, and
resuming on another replica count (issue 47).

The model is linear in its parameters, `loss = mean_i <X_i, w> + <z_i, b>`,
trained by SGD(1.0) from zeros on dyadic data, so every replica's gradient
is exact in float32 and the parameters are minus the sum of what was
applied. With every rounding fed back, what was applied over a run is the
exact sum minus the residuals held at its end, summed over devices
(SPEC §12). A run that drops the residual `R_k` held at its resume at step k
and ends holding `R'_T` therefore differs from the uninterrupted run, which
ends holding `R_T`, by exactly `R_k + R'_T - R_T`, each term at most one
step's rounding.
"""

from __future__ import annotations

import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager, CheckpointMismatchError

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = 8  # global batch: 8 rows, so 1 or 2 rows per replica at N = 8 or 4
STEPS, RESUME = 6, 3


def loss_fn(params, batch):
  return jnp.mean(jnp.sum(batch["x"] * params["w"], axis=(1, 2)) + batch["z"] @ params["b"])


def zero_params():
  return {"w": np.zeros((32, 16), np.float32), "b": np.zeros(3, np.float32)}


def batch(seed):
  """Dyadic rows (integers / 64): every mean of 1, 2 or 8 rows is exact."""
  rng = np.random.default_rng(seed)
  return {"x": rng.integers(-64, 65, size=(ROWS, 32, 16)).astype(np.float32) / 64,
          "z": rng.integers(-64, 65, size=(ROWS, 3)).astype(np.float32) / 64}


def exact_sum(steps):
  """Σ over steps of the mean gradient, float64 (the float32 payload's sum)."""
  out = {"w": 0.0, "b": 0.0}
  for s in range(steps):
    b = batch(s)
    out["w"] = out["w"] + b["x"].astype(np.float64).mean(0)
    out["b"] = out["b"] + b["z"].astype(np.float64).mean(0)
  return out


def noise(shape, seed):
  """Random float32 values of `shape`, the same in every process."""
  return np.random.default_rng([seed, *shape]).normal(size=shape).astype(np.float32)


def make_step(n, algorithm="ring", **kw):
  """SGD(1.0), int8 payload with error feedback, over the first `n` devices."""
  devices = jax.devices()[:n]
  mesh = (dp.torus_mesh(2, n // 2, devices=devices) if algorithm == "torus"
          else dp.data_mesh(devices=devices))
  return dp.make_train_step(loss_fn, optax.sgd(1.0), mesh, donate=False, grad_reduce=algorithm,
                            comm_dtype="int8", error_feedback=True, **kw)


def placed_zeros(step):
  """Zeros laid out as `step.init(zero_params())` lays its state out (its
  `abstract_state`), placed without compiling init."""
  return jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, a.dtype), a.sharding),
                      step.abstract_state(zero_params()))


def run(step, state, first, last):
  for s in range(first, last):
    state, _ = step(state, batch(s))
  return state


def held(residual):
  """The residuals summed over devices (worker and hop), float64."""
  total = lambda k: sum(np.asarray(getattr(residual, part)[k], np.float64).sum(0)
                        for part in ("worker", "hop") if getattr(residual, part) is not None)
  return {k: total(k) for k in ("w", "b")}


def rounding_bound(n):
  """The most one step's residuals can hold, summed over devices, per element.

  A step rounds each element N + 1 + (N - 1) times: the N replicas' own
  shares (each at most G / N, G the largest replica gradient), the N - 1
  partial sums of 1, ..., N - 1 shares the ring forwards, and the gathered
  sum (at most G). Each goes to a power-of-two grid of its block of 32 with
  the block's largest value below 127 steps (int8), so lands at most
  max|value| / 127 off: G / 127 · (1 + (N - 1) / 2 + 1) in all, values
  with the residuals they carry at most 2/127 larger. Over the dyadic data
  G <= 1.
  """
  return (n + 3) / 2 * (1 + 2 / 127) / 127


def test_checkpoint_bytes_do_not_grow_with_replicas_per_device(tmp_path):
  """Residual bytes: N x (1 gradient for psum, 2 for ring/torus) in the
  checkpoint, 1 or 2 per device whatever N, 1 + 1/N for two_shot; half in
  bfloat16; 0 left out."""
  grad = (32 * 16 + 3) * 4  # one float32 gradient
  rest = grad + 3 * 4  # parameters and the three int32 counters (SGD keeps no state)
  measured = {}
  for algorithm, copies in (("psum", 1), ("ring", 2), ("torus", 2)):
    for n in (8, 4):
      state = make_step(n, algorithm).init(zero_params())
      with CheckpointManager(tmp_path / f"{algorithm}{n}", async_save=False) as mngr:
        mngr.save(1, state)
        mngr.save(2, state, include_residuals=False)
        info, left_out = mngr.info(1), mngr.info(2)
      measured[algorithm, n] = info.residual_bytes
      assert (info.replicas, info.residuals_saved) == (n, True)
      assert info.residual_bytes == n * copies * grad
      assert info.residual_per_device_bytes == copies * grad  # independent of n
      assert info.total_bytes == rest + n * copies * grad
      assert info.per_device_bytes == rest + copies * grad
      assert left_out[:5] == (2, rest, 0, rest, 0) and not left_out.residuals_saved
      assert os.path.isdir(tmp_path / f"{algorithm}{n}" / "1" / "residuals")
      assert not os.path.exists(tmp_path / f"{algorithm}{n}" / "2" / "residuals")
  # two_shot: a worker residual (1 gradient) and a server residual of
  # ceil(size / N) elements per leaf, 1/N of the gradient: 1 + 1/N per device.
  for n in (8, 4):
    server = sum(-(-x.size // n) for x in jax.tree.leaves(zero_params())) * 4
    with CheckpointManager(tmp_path / f"two_shot{n}", async_save=False) as mngr:
      mngr.save(1, placed_zeros(make_step(n, "two_shot")))
      info = mngr.info(1)
    assert info.residual_per_device_bytes == grad + server  # 2,320 at N = 8, 2,576 at 4
    assert info.residual_bytes == n * (grad + server)
    assert info.per_device_bytes == rest + grad + server
  half = dp.make_train_step(loss_fn, optax.sgd(1.0), dp.data_mesh(), grad_sync=dp.GradSync(
      "ring", comm_dtype="int8", error_feedback=True, residual_dtype="bfloat16")).init(
          zero_params())
  with CheckpointManager(tmp_path / "bf16", async_save=False) as mngr:
    mngr.save(1, half)
    assert mngr.info().residual_bytes == 8 * 2 * grad // 2
  print("residual bytes (gradient", grad, "bytes):", measured)


@pytest.mark.parametrize("saved,resumed", [(8, 4), (4, 8)])
def test_resume_on_another_replica_count(tmp_path, saved, resumed):
  """Saved on N replicas, restored onto M: the residuals are the new step's
  zeros, with a warning naming N and M; after training on, the parameters
  are the uninterrupted run's plus exactly the residuals dropped and those
  the two runs hold at the end, within 3 steps' rounding of each other."""
  before, after = make_step(saved), make_step(resumed)
  state = run(before, before.init(zero_params()), 0, RESUME)
  dropped = held(state.grad_residual)
  assert 0 < max(np.abs(v).max() for v in dropped.values()) <= rounding_bound(saved)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(RESUME, state)
    target = after.init(zero_params())
    with pytest.warns(UserWarning, match=rf"saved with {saved} replicas and the target "
                                         rf"has {resumed}: they are reset to zeros"):
      restored, _ = mngr.restore(target)
  for part in ("worker", "hop"):
    for k in ("w", "b"):
      got, fresh = getattr(restored.grad_residual, part)[k], getattr(target.grad_residual,
                                                                     part)[k]
      assert got.shape == (resumed,) + zero_params()[k].shape
      assert got.sharding == fresh.sharding
      np.testing.assert_array_equal(np.asarray(got), 0.0)
  for k in ("w", "b"):
    np.testing.assert_array_equal(np.asarray(restored.params[k]),
                                  np.asarray(state.params[k]))
  resumed_state = run(after, restored, RESUME, STEPS)
  whole = run(before, state, RESUME, STEPS)
  exact = exact_sum(STEPS)
  end_resumed, end_whole = held(resumed_state.grad_residual), held(whole.grad_residual)
  for k in ("w", "b"):
    # Nothing else lost: each run is the exact sum minus the residuals it holds.
    np.testing.assert_allclose(np.asarray(whole.params[k], np.float64) + exact[k],
                               end_whole[k], rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(resumed_state.params[k], np.float64) + exact[k],
                               dropped[k] + end_resumed[k], rtol=0, atol=1e-5)
    gap = np.asarray(resumed_state.params[k], np.float64) - np.asarray(whole.params[k])
    np.testing.assert_allclose(gap, dropped[k] + end_resumed[k] - end_whole[k], rtol=0,
                               atol=1e-5)
    bound = 2 * rounding_bound(saved) + rounding_bound(resumed)
    print(f"{saved}->{resumed} {k}: max|gap| {np.abs(gap).max():.2e}, dropped "
          f"{np.abs(dropped[k]).max():.2e}, bound {bound:.2e}")
    assert np.abs(gap).max() <= bound, (k, np.abs(gap).max(), bound)
    assert np.abs(np.asarray(resumed_state.params[k]) - np.asarray(restored.params[k])).max() > 0


def test_two_shot_resumes_on_half_the_replicas(tmp_path):
  """two_shot's server residual is 1/N of the gradient per device: saved on
  8, restored onto 4, it is the new step's own chunks of zeros."""
  before, after = make_step(8, "two_shot"), make_step(4, "two_shot")
  state = run(before, before.init(zero_params()), 0, RESUME)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(RESUME, state)
    target = after.init(zero_params())
    with pytest.warns(UserWarning, match=r"saved with 8 replicas and the target has 4"):
      restored, _ = mngr.restore(target)
  hop = restored.grad_residual.hop["w"]
  assert hop.shape == target.grad_residual.hop["w"].shape
  assert hop.shape[0] == 4 and hop.size < 2 * zero_params()["w"].size
  np.testing.assert_array_equal(np.asarray(hop), 0.0)
  resumed = run(after, restored, RESUME, RESUME + 3)
  assert np.isfinite(np.asarray(resumed.params["w"])).all()


def test_residuals_left_out_and_unread(tmp_path):
  """`include_residuals=False`: on save nothing is written, on restore
  nothing is read; either way the state resumes from zero residuals, the
  rest bit for bit. A target without residuals needs it."""
  step = make_step(8)
  state = run(step, step.init(zero_params()), 0, 2)
  plain = dp.make_train_step(loss_fn, optax.sgd(1.0), dp.data_mesh(), donate=False)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(1, state, include_residuals=False)
    mngr.save(2, state)
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # a deliberate choice: no warning
      for s, include in ((1, True), (2, False)):
        restored, _ = mngr.restore(step.init(zero_params()), step=s,
                                   include_residuals=include)
        jax.tree.map(lambda x: np.testing.assert_array_equal(np.asarray(x), 0.0),
                     restored.grad_residual)
        for k in ("w", "b"):
          np.testing.assert_array_equal(np.asarray(restored.params[k]),
                                        np.asarray(state.params[k]))
    # Restoring with residuals gives them back bit for bit.
    back, _ = mngr.restore(step.init(zero_params()), step=2)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 back.grad_residual, state.grad_residual)
    with pytest.raises(CheckpointMismatchError, match=r"holds error-feedback residuals and "
                                                      r"the target has none.*include_residuals"):
      mngr.restore(plain.init(zero_params()), step=2)
    bare, _ = mngr.restore(plain.init(zero_params()), step=2, include_residuals=False)
    assert bare.grad_residual is None
    with pytest.raises(TypeError, match="include_residuals must be"):
      mngr.save(3, state, include_residuals=1)
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 7"):
      mngr.info(7)


@pytest.mark.parametrize("kind,algorithm", [("jit", "ring"), ("pmap", "ring"),
                                            ("jit", "two_shot"), ("pmap", "two_shot")])
def test_a_state_without_residuals_starts_from_zeros(kind, algorithm):
  """`state.replace(grad_residual=None)` on a step built with error feedback:
  the step gives it its own zeros (layout included: two_shot's 1/N chunk)
  and runs as from init."""
  if kind == "jit":
    step = make_step(8, algorithm)
  else:
    step = dp.make_pmap_train_step(loss_fn, optax.sgd(1.0), donate=False,
                                   grad_reduce=algorithm, comm_dtype="int8",
                                   error_feedback=True)
  fresh = step.init(zero_params())
  a, _ = step(fresh, batch(0))
  b, _ = step(fresh.replace(grad_residual=None), batch(0))
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  assert b.grad_residual.hop["w"].sharding == a.grad_residual.hop["w"].sharding
  assert b.grad_residual.hop["w"].shape == a.grad_residual.hop["w"].shape
  assert np.abs(np.asarray(b.grad_residual.hop["w"])).max() > 0
  if kind == "jit":
    with pytest.raises(ValueError, match=r"lower and compile need state.grad_residual"):
      step.lower(fresh.replace(grad_residual=None), batch(0))


# Run in a process of 4 devices: the checkpoint of `test_a_target_without_
# shardings_on_fewer_devices` (saved on 8) restored with the targets a user
# builds there.
RESTORE_ON_FOUR = """
import os, sys, warnings
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path[:0] = [{tests!r}, {root!r}]
import jax
import test_residual_restore as t
from date_optax.checkpoint import CheckpointManager, CheckpointMismatchError
assert jax.device_count() == 4
step = t.make_step(4)
with CheckpointManager({ckpt!r}, async_save=False) as mngr:
  for which in (None, 2):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      try:
        mngr.restore(jax.eval_shape(step.init, t.zero_params()), step=which)
        print("RESTORED")
      except CheckpointMismatchError as e:
        print("MISMATCH", e)
    print("WARNINGS", [str(w.message)[:60] for w in caught])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    state, _ = mngr.restore(step.abstract_state(t.zero_params()))
  print("ABSTRACT", int(state.step), state.params["w"].sharding.mesh.shape["data"])
"""


def _saved_on_eight(path):
  """Steps 1 and 2 of an 8-replica step's state; step 2 holds `state.step == 1`."""
  state = placed_zeros(make_step(8))
  with CheckpointManager(path, async_save=False) as mngr:
    mngr.save(1, state)
    mngr.save(2, state.replace(step=jnp.ones_like(state.step)))


def _assert_says_what_the_target_needs(message):
  assert "checkpoint step 2" in message and "does not fit the target" in message, message
  assert "no sharding to restore onto" in message and "step.abstract_state(params)" in message
  assert ".params['w']" in message and "The checkpoint itself is sound" in message


def test_a_target_without_shardings_for_devices_not_here_is_a_misfit_not_corruption(tmp_path):
  """The saved shardings name devices this process does not have (their ids
  moved past its 8, as a checkpoint of another host's devices would): a
  target without shardings (`jax.eval_shape(step.init, params)`) is a
  CheckpointMismatchError that says what the target needs, for the latest
  step and by name, with no older step tried; one with shardings restores."""
  import json  # noqa: PLC0415

  _saved_on_eight(tmp_path)
  for path in tmp_path.glob("*/state/_sharding"):
    text = json.loads(path.read_text())
    for key, value in text.items():
      spec = json.loads(value)
      spec["device_mesh"]["mesh"] = [{"id": d["id"] + 8} for d in spec["device_mesh"]["mesh"]]
      text[key] = json.dumps(spec)
    path.write_text(json.dumps(text))
  step = make_step(8)
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    for which in (None, 2):
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointMismatchError) as error:
          mngr.restore(jax.eval_shape(step.init, zero_params()), step=which)
      _assert_says_what_the_target_needs(str(error.value))
      assert not caught, [str(w.message) for w in caught]  # no step skipped as damaged
    state, _ = mngr.restore(step.abstract_state(zero_params()))
  assert int(state.step) == 1 and state.params["w"].sharding.mesh.shape["data"] == 8


@pytest.mark.slow
def test_a_target_without_shardings_on_fewer_devices_is_a_misfit_not_corruption(tmp_path):
  """Saved on 8 devices with error feedback, restored in a process of 4 onto
  `jax.eval_shape(step.init, params)` (no shardings): as above, and
  `step.abstract_state(params)` restores there with the residuals reset."""
  import subprocess  # noqa: PLC0415

  _saved_on_eight(tmp_path / "ckpt")
  code = RESTORE_ON_FOUR.format(tests=HERE, root=os.path.dirname(HERE),
                                ckpt=str(tmp_path / "ckpt"))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, cwd=HERE)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  mismatches = [x for x in lines if x.startswith("MISMATCH")]
  assert len(mismatches) == 2, out.stdout
  for line in mismatches:
    _assert_says_what_the_target_needs(line)
  # Neither a damaged-checkpoint warning nor a fall back to step 1.
  assert lines.count("WARNINGS []") == 2, out.stdout
  assert "ABSTRACT 1 4" in lines, out.stdout  # step 2 holds state.step == 1


def _worker_args(tmp_path):
  return lambda i: ["--dir", str(tmp_path / "ckpt"), "--steps", str(RESUME)]


@pytest.mark.slow
def test_saved_by_two_processes_restored_by_one(tmp_path):
  """Two processes x 4 devices save (each writing its own replicas' residual
  shards); this process restores onto its 8 devices bit for bit, and onto 4
  with the residuals reset, ending within the bound of the 8-device run."""
  from workers import WorkerPair  # noqa: PLC0415

  pair = WorkerPair(os.path.join(HERE, "residual_worker.py"), _worker_args(tmp_path),
                    [tmp_path / f"log{i}.txt" for i in range(2)], cwd=HERE, timeout=120,
                    what="residual checkpoint workers")
  for i, rc in enumerate(pair.wait()):
    if rc != 0:
      pytest.fail(f"worker {i} exited with {rc}:\n{pair.log(i)[-3000:]}")
  ckpt = tmp_path / "ckpt"
  # Each process wrote its own shards of the (random) residuals: half the
  # bytes each, none gathered to one process. (orbax keeps chunks up to 1 KiB
  # in the index that process 0 merges: a replica's 2 KiB of "w" is not one.)
  info_bytes = 8 * 2 * (32 * 16 + 3) * 4
  folder = ckpt / str(RESUME + 1) / "residuals"
  written = {p: sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder / p)
                    for f in fs) for p in os.listdir(folder) if p.startswith("ocdbt.process_")}
  assert sorted(written) == ["ocdbt.process_0", "ocdbt.process_1"], written
  print("residual bytes written per process:", written, "of", info_bytes)
  assert all(0.4 * info_bytes < b < 0.7 * info_bytes for b in written.values()), written
  merged = sum(os.path.getsize(folder / "d" / f) for f in os.listdir(folder / "d"))
  assert merged < 0.1 * info_bytes, merged
  step = make_step(8)
  state = run(step, step.init(zero_params()), 0, RESUME)
  with CheckpointManager(ckpt, async_save=False) as mngr:
    assert mngr.info().residual_bytes == info_bytes and mngr.info().replicas == 8
    noisy, _ = mngr.restore(step.init(zero_params()), step=RESUME + 1)
    for i, x in enumerate(jax.tree.leaves(noisy.grad_residual)):
      np.testing.assert_array_equal(np.asarray(x), noise(x.shape, i))
    same, _ = mngr.restore(step.init(zero_params()), step=RESUME)
    other = make_step(4)
    with pytest.warns(UserWarning, match=r"saved with 8 replicas and the target has 4"):
      fewer, _ = mngr.restore(other.init(zero_params()), step=RESUME)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                       rtol=0, atol=1e-7),
               (same.params, same.grad_residual), (state.params, state.grad_residual))
  whole = run(step, same, RESUME, STEPS)
  resumed = run(other, fewer, RESUME, STEPS)
  for k in ("w", "b"):
    gap = np.asarray(resumed.params[k], np.float64) - np.asarray(whole.params[k])
    expected = (held(same.grad_residual)[k] + held(resumed.grad_residual)[k]
                - held(whole.grad_residual)[k])
    np.testing.assert_allclose(gap, expected, rtol=0, atol=1e-5)
    assert np.abs(gap).max() <= 2 * rounding_bound(8) + rounding_bound(4)


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
