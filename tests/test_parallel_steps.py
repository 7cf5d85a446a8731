"""Data-parallel train steps: equivalences, non-finite skipping, mixed precision.

The reference is the plain single-device loop written here: one gradient of
the mean loss over the whole global batch B, then `optimizer.update`. The
data-parallel steps split B over 8 devices (B/8 each).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import parallel_model as pm
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.step import local_grads

B = 32  # global batch: 4 examples on each of 8 devices
STEPS = 3

OPTIMIZERS = {
    "lars": lambda: date_optax.lars(0.5, weight_decay=1e-3),
    "lamb": lambda: date_optax.lamb(1e-2, weight_decay=1e-2),
    "bounded_lars": lambda: date_optax.bounded_lars(0.05, base="momentum"),
}
MESHES = {"data": lambda: dp.data_mesh(), "torus": lambda: dp.torus_mesh(2, 4)}


def _batches(n=STEPS, seed=1):
  data = pm.make_data(B * n, seed=seed)
  return [jax.tree.map(lambda x, i=i: x[i * B:(i + 1) * B], data) for i in range(n)]


BATCHES = _batches()


@functools.cache
def reference(opt_name: str):
  """Single device, global batch B: params, opt_state and last-step metrics."""
  opt = OPTIMIZERS[opt_name]()
  params = jax.tree.map(jnp.asarray, pm.init_params())
  state = opt.init(params)
  for batch in BATCHES:
    loss, grads = jax.value_and_grad(pm.loss_fn)(params, batch)
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  norm = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)))
                     for g in jax.tree.leaves(grads)))
  return params, state, {"loss": loss, "grad_norm": norm}


@functools.cache
def make_step(opt_name, mesh_name, grad_reduce, shard_update=False, has_aux=False):
  loss_fn = pm.loss_fn
  if has_aux:
    def loss_fn(params, batch):
      loss = pm.loss_fn(params, batch)
      return loss, {"mse": loss, "rows": jnp.int32(batch["x"].shape[0])}
  return dp.make_train_step(
      loss_fn, OPTIMIZERS[opt_name](), MESHES[mesh_name](), grad_reduce=grad_reduce,
      shard_update=shard_update, has_aux=has_aux, donate=False,
  )


@functools.cache
def run(opt_name, mesh_name, grad_reduce, shard_update=False, has_aux=False):
  step = make_step(opt_name, mesh_name, grad_reduce, shard_update, has_aux)
  state = step.init(pm.init_params())
  for batch in BATCHES:
    state, metrics = step(state, batch)
  return state, metrics


def assert_trees_close(a, b, rtol=2e-6, atol=1e-7):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------
# Equivalences (issue item 9).
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opt_name, mesh_name, grad_reduce",
    [("lars", "data", "psum"), ("lamb", "torus", "psum"),
     ("bounded_lars", "torus", "torus")],
)
def test_one_device_batch_b_equals_8_devices(opt_name, mesh_name, grad_reduce):
  ref_params, ref_state, ref_metrics = reference(opt_name)
  state, metrics = run(opt_name, mesh_name, grad_reduce)
  assert int(state.step) == STEPS and int(state.total_skips) == 0
  assert_trees_close(state.params, ref_params)
  assert_trees_close(state.opt_state, ref_state)
  np.testing.assert_allclose(metrics["loss"], ref_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], ref_metrics["grad_norm"], rtol=1e-5)
  assert metrics["loss"].dtype == jnp.float32
  # The optimizer's per-layer ratios are reported as they are in its state.
  # The metric is the state's record: one vector, unpacked by layer.
  assert isinstance(metrics["trust_ratios"], date_optax.LayerRatios)
  assert_trees_close(metrics["trust_ratios"].unpack(), date_optax.trust_ratios(ref_state))
  ratios = np.asarray(metrics["trust_ratios"].values)
  assert not np.allclose(ratios, 1.0)  # non-trivial ratios, or the test is weak
  # And training moved the parameters.
  assert not np.allclose(state.params["hidden"]["kernel"],
                         pm.init_params()["hidden"]["kernel"])


@pytest.mark.parametrize("mesh_name, grad_reduce",
                         [("data", "ring"), ("torus", "ring"), ("torus", "torus")])
def test_ring_and_torus_equal_psum(mesh_name, grad_reduce):
  expected, expected_metrics = run("lamb", "torus", "psum")
  state, metrics = run("lamb", mesh_name, grad_reduce)
  assert_trees_close(state.params, expected.params)
  assert_trees_close(state.opt_state, expected.opt_state)
  np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-6)


@pytest.mark.parametrize(
    "opt_name, mesh_name, grad_reduce, unsharded",
    [("lars", "data", "psum", ("lars", "data", "psum")),
     ("lamb", "torus", "torus", ("lamb", "torus", "torus")),
     ("bounded_lars", "torus", "ring", ("bounded_lars", "torus", "torus"))],
)
def test_shard_update_equals_unsharded(opt_name, mesh_name, grad_reduce, unsharded):
  expected, expected_metrics = run(*unsharded)
  state, metrics = run(opt_name, mesh_name, grad_reduce, shard_update=True)
  assert_trees_close(state.params, expected.params)
  assert_trees_close(state.opt_state, expected.opt_state)
  assert_trees_close(metrics["trust_ratios"].unpack(),
                     expected_metrics["trust_ratios"].unpack())
  np.testing.assert_allclose(metrics["grad_norm"], expected_metrics["grad_norm"],
                             rtol=1e-6)
  # Parameters come back whole on every device; the optimizer state stays split.
  for leaf in jax.tree.leaves(state.params):
    assert leaf.sharding.is_fully_replicated
  n = 8
  expected_bytes = sum(
      x.nbytes // (n if us.update_shard_axis(x.shape, n) is not None else 1)
      for x in jax.tree.leaves(expected.opt_state)
  )
  assert dp.bytes_per_device(state.opt_state) == expected_bytes
  whole = dp.bytes_per_device(expected.opt_state)
  assert dp.bytes_per_device(state.opt_state) < whole / 3


def test_shard_update_program_has_one_reduce_scatter_and_one_all_gather():
  step = make_step("lars", "data", "psum", shard_update=True)
  state = step.init(pm.init_params())
  hlo = step.lower(state, BATCHES[0]).compile().as_text()
  ops = lambda name: re.findall(rf"= \S+ {name}\(", hlo) + re.findall(
      rf"= \([^)]*\) {name}\(", hlo)
  assert len(ops("reduce-scatter")) == 1, "gradients: one reduce-scatter"
  assert len(ops("all-gather")) == 1, "parameters: one all-gather"
  # What is all-reduced is small: per-layer partial norms, the (3,) bias that no
  # 8-way split fits, the loss and the finiteness flags; never a whole layer.
  for line in hlo.splitlines():
    if re.search(r" all-reduce\(", line):
      shapes = re.findall(r"[a-z0-9]+\[([0-9,]*)\]", line.split("all-reduce(")[0])
      assert all(int(np.prod([int(d) for d in s.split(",") if d] or [1])) <= 3
                 for s in shapes), line


def test_pmap_equals_jit():
  """pmap with the torus all-reduce over a 2x4 grid == jit over a mesh with psum."""
  step = dp.make_pmap_train_step(pm.loss_fn, OPTIMIZERS["lamb"](), grad_reduce="torus",
                                 grid=(2, 4), donate=False)
  state = step.init(pm.init_params())
  for batch in BATCHES:
    state, metrics = step(state, batch)
  expected, expected_metrics = run("lamb", "torus", "psum")
  first = jax.tree.map(lambda x: x[0], state)
  assert int(first.step) == STEPS
  assert_trees_close(first.params, expected.params)
  assert_trees_close(first.opt_state, expected.opt_state)
  for k in ("loss", "grad_norm"):
    np.testing.assert_allclose(metrics[k], expected_metrics[k], rtol=1e-6)
  assert_trees_close(metrics["trust_ratios"].unpack(),
                     expected_metrics["trust_ratios"].unpack())
  # Every device holds the same parameters.
  leaf = np.asarray(state.params["out"]["kernel"])
  np.testing.assert_array_equal(leaf, np.broadcast_to(leaf[0], leaf.shape))


# --------------------------------------------------------------------------
# The shard_map trap: gradients of replicated parameters are reduced once.
# --------------------------------------------------------------------------


def _scalar_loss(w, batch):
  return jnp.mean(w * batch)


def test_checked_shard_map_already_sums_replicated_gradients():
  """The trap the steps avoid: with check_vma the gradient comes back summed."""
  mesh = dp.data_mesh()
  x = np.arange(8.0, dtype=np.float32)  # one example per device

  def plain(w, xb):
    return jax.grad(_scalar_loss)(w, xb)

  def local(w, xb):
    _, _, g, _ = local_grads.loss_and_grads(
        _scalar_loss, False, None, compat.to_varying(w, "data"), xb)
    return g[None]

  w = jnp.float32(1.0)
  summed = jax.jit(compat.shard_map(plain, mesh=mesh, in_specs=(P(), P("data")),
                                    out_specs=P(), check=True))(w, x)
  np.testing.assert_allclose(summed, x.sum())  # already reduced over devices
  for check in (True, False):
    got = jax.jit(compat.shard_map(local, mesh=mesh, in_specs=(P(), P("data")),
                                   out_specs=P("data"), check=check))(w, x)
    np.testing.assert_allclose(got, x)  # local: each device its own gradient


@pytest.mark.parametrize("grad_reduce", ["psum", "ring"])
def test_step_reduces_gradients_exactly_once(grad_reduce):
  # SGD with learning rate 1 on mean(w * x): the step must move w by the mean
  # of x over the global batch, not by 8 times it.
  x = np.arange(16.0, dtype=np.float32)
  step = dp.make_train_step(_scalar_loss, optax.sgd(1.0), dp.data_mesh(),
                            grad_reduce=grad_reduce)
  state = step.init(jnp.float32(3.0))
  old = state.params
  state, metrics = step(state, x)
  np.testing.assert_allclose(state.params, 3.0 - x.mean(), rtol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], x.mean(), rtol=1e-6)
  assert "trust_ratios" not in metrics  # plain SGD keeps none
  assert old.is_deleted()  # donate=True by default


# --------------------------------------------------------------------------
# Non-finite steps (issue 7, item 2).
# --------------------------------------------------------------------------


def _poison(batch, value, row):
  batch = jax.tree.map(np.array, batch)
  batch["x"][row] = value  # one example on one device
  return batch


@given(
    poisoned=st.lists(st.booleans(), min_size=5, max_size=5),
    value=st.sampled_from([np.nan, np.inf, -np.inf]),
    row=st.integers(0, B - 1),
)
def test_nonfinite_steps_are_skipped(poisoned, value, row):
  step = make_step("lamb", "torus", "psum")  # compiled once, reused
  clean = _batches(5, seed=7)
  state = step.init(pm.init_params())
  consecutive = 0
  for batch, bad in zip(clean, poisoned, strict=True):
    before = state
    state, metrics = step(state, _poison(batch, value, row) if bad else batch)
    assert bool(metrics["skipped"]) == bad
    consecutive = consecutive + 1 if bad else 0
    assert int(metrics["consecutive_skips"]) == consecutive
    if bad:
      jax.tree.map(np.testing.assert_array_equal, state.params, before.params)
      jax.tree.map(np.testing.assert_array_equal, state.opt_state, before.opt_state)
  assert int(state.total_skips) == sum(poisoned) == int(metrics["total_skips"])
  assert int(state.step) == 5 and int(state.applied_steps) == 5 - sum(poisoned)
  # Equal to a run in which the poisoned steps never happened.
  other = step.init(pm.init_params())
  for batch, bad in zip(clean, poisoned, strict=True):
    if not bad:
      other, _ = step(other, batch)
  jax.tree.map(np.testing.assert_array_equal, state.params, other.params)
  jax.tree.map(np.testing.assert_array_equal, state.opt_state, other.opt_state)
  for leaf in jax.tree.leaves(state.params):
    assert np.isfinite(np.asarray(leaf)).all()


def test_max_consecutive_skips_raises_on_the_host():
  step = dp.make_train_step(_scalar_loss, optax.sgd(0.1), dp.data_mesh(),
                            max_consecutive_skips=1)
  state = step.init(jnp.float32(1.0))
  bad = np.full(8, np.nan, np.float32)
  state, _ = step(state, np.ones(8, np.float32))
  state, metrics = step(state, bad)  # one skip is tolerated
  assert int(metrics["consecutive_skips"]) == 1
  with pytest.raises(dp.NonFiniteError, match="2 consecutive steps"):
    step(state, bad)


@pytest.mark.parametrize("consecutive, limit, raises",
                         [(0, 0, False), (1, 0, True), (3, 3, False), (4, 3, True)])
def test_check_metrics(consecutive, limit, raises):
  metrics = {"consecutive_skips": jnp.int32(consecutive), "total_skips": jnp.int32(9)}
  if raises:
    with pytest.raises(dp.NonFiniteError, match="9 skipped in all"):
      dp.check_metrics(metrics, limit)
  else:
    dp.check_metrics(metrics, limit)
  with pytest.raises(ValueError, match="max_consecutive_skips"):
    dp.check_metrics(metrics, -1)


# --------------------------------------------------------------------------
# Mixed precision, aux, batches.
# --------------------------------------------------------------------------


def test_bfloat16_compute_keeps_float32_state():
  seen = []

  def loss_fn(params, batch):
    seen.append((params["hidden"]["kernel"].dtype, batch["x"].dtype))
    return pm.loss_fn(params, batch)

  opt = OPTIMIZERS["lamb"]()
  step = dp.make_train_step(loss_fn, opt, dp.data_mesh(), compute_dtype=jnp.bfloat16)
  state = step.init(pm.init_params())
  state, metrics = step(state, BATCHES[0])
  assert seen == [(jnp.bfloat16, jnp.bfloat16)]
  for leaf in jax.tree.leaves((state.params, state.opt_state.mu, state.opt_state.nu)):
    assert leaf.dtype == jnp.float32
  assert metrics["loss"].dtype == jnp.float32
  # Reference: the same bfloat16 casts on one device, float32 master weights.
  params = jax.tree.map(jnp.asarray, pm.init_params())
  cast = lambda t: jax.tree.map(lambda x: x.astype(jnp.bfloat16), t)
  loss, grads = jax.value_and_grad(
      lambda p: pm.loss_fn(cast(p), cast(BATCHES[0])).astype(jnp.float32))(params)
  updates, _ = opt.update(grads, opt.init(params), params)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-2)
  assert_trees_close(state.params, optax.apply_updates(params, updates),
                     rtol=0, atol=2e-3)


def test_aux_is_averaged_and_counts_are_summed():
  state, metrics = run("lamb", "data", "ring", has_aux=True)
  np.testing.assert_allclose(metrics["aux"]["mse"], metrics["loss"], rtol=1e-6)
  assert int(metrics["aux"]["rows"]) == B  # 4 rows on each of 8 devices
  expected, _ = run("lamb", "torus", "psum")
  assert_trees_close(state.params, expected.params)


def test_global_and_host_batches_give_the_same_step():
  step = make_step("lamb", "torus", "psum")
  state = step.init(pm.init_params())
  a, _ = step(state, BATCHES[0])
  b, _ = step(state, step.shard_batch(BATCHES[0]))
  jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
  prefetched = next(iter(dp.prefetch_to_device(BATCHES, step.batch_sharding)))
  c, _ = step(state, prefetched)
  jax.tree.map(np.testing.assert_array_equal, a.params, c.params)


def test_validation():
  mesh, opt = dp.data_mesh(), optax.sgd(0.1)
  with pytest.raises(ValueError, match="grad_reduce"):
    dp.make_train_step(pm.loss_fn, opt, mesh, grad_reduce="allreduce")
  with pytest.raises(ValueError, match="torus"):
    dp.make_train_step(pm.loss_fn, opt, mesh, grad_reduce="torus")
  with pytest.raises(ValueError, match="data_axes"):
    dp.make_train_step(pm.loss_fn, opt, mesh, data_axes=("x",))
  with pytest.raises(TypeError, match="compute_dtype"):
    dp.make_train_step(pm.loss_fn, opt, mesh, compute_dtype=jnp.int32)
  with pytest.raises(ValueError, match="max_consecutive_skips"):
    dp.make_train_step(pm.loss_fn, opt, mesh, max_consecutive_skips=-1)
  with pytest.raises(TypeError, match="shard_update"):
    dp.make_train_step(pm.loss_fn, opt, mesh, shard_update=1)
  with pytest.raises(TypeError, match="optimizer"):
    dp.make_train_step(pm.loss_fn, lambda g: g, mesh)
  with pytest.raises(TypeError, match="mesh"):
    dp.make_train_step(pm.loss_fn, opt, "data")
  with pytest.raises(ValueError, match="torus"):
    dp.make_pmap_train_step(pm.loss_fn, opt, torus_shape=(2, 4))
  with pytest.raises(ValueError, match="torus_shape"):
    dp.make_pmap_train_step(pm.loss_fn, opt, grad_reduce="torus", torus_shape=(3, 3))
  step = make_step("lamb", "torus", "psum")
  state = step.init(pm.init_params())
  with pytest.raises(ValueError, match="divisible by its 8"):
    step(state, jax.tree.map(lambda x: x[:12], BATCHES[0]))
  bad = dp.make_train_step(lambda p, b: (pm.loss_fn(p, b), 1.0), opt, mesh)
  with pytest.raises(ValueError, match="scalar loss"):
    bad(bad.init(pm.init_params()), BATCHES[0])
  noaux = dp.make_train_step(pm.loss_fn, opt, mesh, has_aux=True)
  with pytest.raises(TypeError, match=r"\(loss, aux\)"):
    noaux(noaux.init(pm.init_params()), BATCHES[0])



def test_sharded_state_checkpoints_and_resumes_exactly(tmp_path):
  """A TrainState with split optimizer state round-trips through orbax."""
  from date_optax.checkpoint import CheckpointManager
  from date_optax.diagnostics import trust_ratio_summary

  step = make_step("lamb", "torus", "torus", shard_update=True)
  state, _ = step(step.init(pm.init_params()), BATCHES[0])
  with CheckpointManager(str(tmp_path)) as mgr:
    mgr.save(1, state, force=True)
    mgr.wait_until_finished()
    restored, _ = mgr.restore(step.init(pm.init_params()), step=1)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    np.testing.assert_array_equal(a, b)
  resumed, metrics = step(restored, BATCHES[1])
  straight, _ = step(state, BATCHES[1])
  jax.tree.map(np.testing.assert_array_equal, resumed, straight)
  # The raw per-layer ratios feed the telemetry summary as they are.
  summary = trust_ratio_summary(metrics["trust_ratios"])
  ratios = np.array(jax.tree.leaves(metrics["trust_ratios"]))
  np.testing.assert_allclose(summary["max"], ratios.max())


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_trust_ratio_summary_in_metrics(kind):
  """min/median/max, the fraction at each bound and the learning rate, from
  the optimizer state alone, against a numpy reference."""
  lower, upper = 0.02, 0.5
  lr = optax.linear_schedule(0.05, 0.01, 10)
  opt = date_optax.bounded_lars(lr, lower=lower, upper=lambda c: upper)
  if kind == "jit":
    step = dp.make_train_step(pm.loss_fn, opt, dp.data_mesh(), donate=False)
  else:
    step = dp.make_pmap_train_step(pm.loss_fn, opt, donate=False)
  state = step.init(pm.init_params())
  for batch in BATCHES:
    state, metrics = step(state, batch)
  r = np.concatenate([np.ravel(x) for x in jax.tree.leaves(metrics["trust_ratios"])])
  assert (r == lower).any() or (r == upper).any(), r  # bounds are exercised
  np.testing.assert_allclose(metrics["trust_ratio/min"], r.min(), rtol=1e-6)
  np.testing.assert_allclose(metrics["trust_ratio/max"], r.max(), rtol=1e-6)
  np.testing.assert_allclose(metrics["trust_ratio/median"], np.median(r), rtol=1e-6)
  np.testing.assert_allclose(metrics["trust_ratio/frac_at_lower"],
                             np.mean(np.isclose(r, lower, rtol=1e-6)), atol=1e-7)
  np.testing.assert_allclose(metrics["trust_ratio/frac_at_upper"],
                             np.mean(np.isclose(r, upper, rtol=1e-6)), atol=1e-7)
  # The learning rate applied at the last step (update count STEPS - 1).
  np.testing.assert_allclose(metrics["learning_rate"], lr(STEPS - 1), rtol=1e-6)


def test_learning_rate_metric_from_inject_hyperparams_and_absent_otherwise():
  opt = optax.inject_hyperparams(optax.sgd)(learning_rate=0.25)
  step = dp.make_train_step(pm.loss_fn, opt, dp.data_mesh(), donate=False)
  _, metrics = step(step.init(pm.init_params()), BATCHES[0])
  np.testing.assert_allclose(metrics["learning_rate"], 0.25)
  step = dp.make_train_step(pm.loss_fn, optax.sgd(0.25), dp.data_mesh(), donate=False)
  _, metrics = step(step.init(pm.init_params()), BATCHES[0])
  assert "learning_rate" not in metrics and "trust_ratios" not in metrics
  with pytest.raises(TypeError, match="trust_ratio_bounds"):  # one source of truth
    dp.make_train_step(pm.loss_fn, optax.sgd(0.1), dp.data_mesh(),
                       trust_ratio_bounds=(0.0, 1.0))
