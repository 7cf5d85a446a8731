"""Gradient synchronisation: the `GradSync`/`StepConfig` configs and the one reduction.

The model is linear in its parameters, so the gradient of a slice of the
batch does not depend on the parameters: with `sgd(1.0)` one step moves the
parameters by minus the mean gradient over the global batch, which NumPy
computes from the data alone (`_reference_step`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import collectives, grad_sync
from date_optax._src.parallel.step import local_grads
from date_optax._src.parallel.step import replica_step as replica_step_lib

B = 32  # 4 rows on each of 8 devices


def _loss(params, batch):
  # d/dw = mean_i x_i^T y_i, d/db = mean_i z_i: independent of the parameters.
  return jnp.mean(jnp.sum((batch["x"] @ params["w"]) * batch["y"], axis=1)
                  + batch["z"] @ params["b"])


def _params():
  rng = np.random.default_rng(0)
  return {"w": rng.normal(size=(16, 8)).astype(np.float32),
          "b": rng.normal(size=(3,)).astype(np.float32)}


def _batch(seed=1):
  rng = np.random.default_rng(seed)
  return {"x": rng.normal(size=(B, 16)).astype(np.float32),
          "y": rng.normal(size=(B, 8)).astype(np.float32),
          "z": rng.normal(size=(B, 3)).astype(np.float32) * 1e-3}


def _reference_step(params, batch):
  x, y, z = (np.asarray(batch[k], np.float64) for k in ("x", "y", "z"))
  return {"w": params["w"] - x.T @ y / B, "b": params["b"] - z.mean(0)}


def _int8_atol(local_max, roundings=16):
  """Error bound of an int8 mean with APS. The shift makes the grid step at most
  2·max|local gradient|/127; a ring or torus rounds each entry at most 16 times
  (8 first casts, 7 hops, the final sum), each by half a step (stochastic: a
  whole step, pass 32)."""
  return roundings * 0.5 * 2 * local_max / 127


def _local_max(batch, k):
  """max |gradient| of `k` over the 8 replicas' slices (4 rows each)."""
  x, y, z = (np.asarray(batch[n], np.float64).reshape(8, 4, -1) for n in ("x", "y", "z"))
  local = np.einsum("rni,rnj->rij", x, y) / 4 if k == "w" else z.mean(1)
  return np.abs(local).max()


def _run(step, steps=2):
  state = step.init(_params())
  for i in range(steps):
    state, metrics = step(state, _batch(seed=i + 1))
  return state, metrics


def _assert_bit_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
               a, b)


# ---------------------------------------------------------------------------
# The configs: every invalid combination refused once, naming both options.
# ---------------------------------------------------------------------------


def test_grad_sync_refuses_invalid_combinations_naming_both_options():
  with pytest.raises(ValueError, match=r"aps=True needs a low-precision comm_dtype"):
    dp.GradSync(aps=True)
  with pytest.raises(ValueError, match=r'rounding="stochastic" needs a low-precision '
                                       r"comm_dtype"):
    dp.GradSync("ring", rounding="stochastic")
  with pytest.raises(ValueError, match=r"grid=\(2, 4\).*algorithm=\"torus\".*'ring'"):
    dp.GradSync("ring", grid=(2, 4))
  with pytest.raises(ValueError, match=r"algorithm \(the step's grad_reduce\) must be one of "
                                       r"\('psum', 'ring', 'torus', 'two_shot', "
                                       r"'hierarchical'\), "
                                       r"got 'allreduce'"):
    dp.GradSync("allreduce")
  with pytest.raises(ValueError, match=r"grid must be \(X, Y\)"):
    dp.GradSync("torus", grid=(8,))
  with pytest.raises(ValueError, match=r"grid\[0\] must be an integer in \[1, inf\]"):
    dp.GradSync("torus", grid=(0, 8))
  with pytest.raises(ValueError, match=r"comm_dtype must be None or one of"):
    dp.GradSync(comm_dtype="int2")
  with pytest.raises(TypeError, match="aps must be None or a bool"):
    dp.GradSync(comm_dtype="int8", aps="yes")
  with pytest.raises(ValueError, match=r"rounding must be one of \('nearest', 'stochastic'\)"):
    dp.GradSync(comm_dtype="int8", rounding="up")


def test_grad_sync_is_a_frozen_normalised_value():
  sync = dp.GradSync("torus", grid=[2, 4], comm_dtype=jnp.int8)
  assert sync == dp.GradSync("torus", grid=(2, 4), comm_dtype="int8")
  assert hash(sync) == hash(dp.GradSync("torus", grid=(2, 4), comm_dtype="int8"))
  # The default scaling of 8 bits or fewer over a torus: MX-style blocks of 32.
  assert sync.grid == (2, 4) and sync.comm_dtype == "int8" and sync.block_size == 32
  assert not sync.uses_aps
  assert dp.GradSync(comm_dtype="float32") == dp.GradSync()
  assert not dp.GradSync(comm_dtype="bfloat16").uses_aps
  with pytest.raises(dataclasses.FrozenInstanceError):
    sync.algorithm = "ring"
  # A variant is validated as the original was.
  with pytest.raises(ValueError, match="grid"):
    dataclasses.replace(sync, algorithm="psum")


def test_step_config_refuses_bad_values_naming_them():
  with pytest.raises(ValueError, match=r"microbatches must be an integer in \[1, inf\]"):
    dp.StepConfig(microbatches=0)
  with pytest.raises(TypeError, match="donate must be a bool"):
    dp.StepConfig(donate=1)
  with pytest.raises(TypeError, match="has_aux must be a bool"):
    dp.StepConfig(has_aux="yes")
  with pytest.raises(TypeError, match="compute_dtype must be None or a floating dtype"):
    dp.StepConfig(compute_dtype=jnp.int32)
  with pytest.raises(ValueError, match="max_consecutive_skips"):
    dp.StepConfig(max_consecutive_skips=-1)
  assert dp.StepConfig(microbatches=np.int64(2)).microbatches == 2


def test_builders_refuse_a_config_together_with_its_flat_keywords():
  mesh, opt = dp.data_mesh(), optax.sgd(1.0)
  with pytest.raises(ValueError, match=r"grad_sync= or the flat keywords grad_reduce, "
                                       r"comm_dtype, not both"):
    dp.make_train_step(_loss, opt, mesh, grad_sync=dp.GradSync(), grad_reduce="ring",
                       comm_dtype="int8")
  with pytest.raises(ValueError, match=r"step_config= or the flat keywords microbatches"):
    dp.make_train_step(_loss, opt, mesh, step_config=dp.StepConfig(), microbatches=2)
  with pytest.raises(ValueError, match=r"grad_sync= or the flat keywords rounding"):
    dp.make_pmap_train_step(_loss, opt, grad_sync=dp.GradSync(), rounding="stochastic")
  with pytest.raises(ValueError, match=r"step_config= or the flat keywords donate, has_aux"):
    dp.make_pmap_train_step(_loss, opt, step_config=dp.StepConfig(), donate=False,
                            has_aux=True)
  with pytest.raises(TypeError, match="grad_sync must be a date_optax.parallel.GradSync"):
    dp.make_replicated_train_step(_loss, opt, mesh, grad_sync="ring")
  with pytest.raises(TypeError, match="step_config must be a date_optax.parallel.StepConfig"):
    dp.make_sharded_train_step(_loss, opt, mesh, param_sharding=[("w", P())],
                               step_config={"microbatches": 2})
  two = jax.make_mesh((4, 2), ("data", "model"))
  with pytest.raises(ValueError, match=r'grad_reduce="torus" needs two data axes'):
    dp.make_train_step(_loss, opt, two, param_sharding=[("w", P(None, "model"))],
                       grad_sync=dp.GradSync("torus"))
  with pytest.raises(TypeError, match="grad_sync must be a date_optax.parallel.GradSync"):
    dp.make_sharded_train_step(_loss, opt, two, param_sharding=[("w", P(None, "model"))],
                               grad_sync="ring")
  with pytest.raises(TypeError, match="param_sharding must be"):
    dp.make_sharded_train_step(_loss, opt, two, param_sharding=None)


def test_a_torus_that_does_not_fit_the_replicas_is_refused_naming_its_layout():
  mesh, opt = dp.data_mesh(), optax.sgd(1.0)
  with pytest.raises(ValueError, match=r'grad_reduce="torus" needs two data axes.*'
                                       r"grid=\(X, Y\)"):
    dp.make_replicated_train_step(_loss, opt, mesh, grad_sync=dp.GradSync("torus"))
  with pytest.raises(ValueError, match=r"grid \(3, 3\) must multiply to the number of "
                                       r"devices, 8"):
    dp.make_replicated_train_step(_loss, opt, mesh,
                                  grad_sync=dp.GradSync("torus", grid=(3, 3)))
  with pytest.raises(ValueError, match=r"grid \(2, 2\) must multiply.*8"):
    dp.make_pmap_train_step(_loss, opt, grad_reduce="torus", grid=(2, 2))


# ---------------------------------------------------------------------------
# A config-built step is the flat-keyword step, bit for bit, and both are the
# NumPy step.
# ---------------------------------------------------------------------------

CASES = {
    "psum": ("data", {}),
    "ring": ("data", {"grad_reduce": "ring"}),
    "torus": ("torus", {"grad_reduce": "torus"}),
    "int8_aps_ring": ("data", {"grad_reduce": "ring", "comm_dtype": "int8", "aps": True}),
    "int8_aps_psum_stochastic": ("data", {"comm_dtype": "int8", "aps": True,
                                          "rounding": "stochastic"}),
}
MESHES = {"data": dp.data_mesh, "torus": lambda: dp.torus_mesh(2, 4)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_grad_sync_step_equals_flat_keyword_step_bit_for_bit(case):
  mesh_name, flat = CASES[case]
  mesh = MESHES[mesh_name]()
  sync = dp.GradSync(flat.get("grad_reduce", "psum"), comm_dtype=flat.get("comm_dtype"),
                     aps=flat.get("aps"), rounding=flat.get("rounding", "nearest"))
  by_flat = dp.make_train_step(_loss, optax.sgd(1.0), mesh, donate=False, **flat)
  by_config = dp.make_train_step(_loss, optax.sgd(1.0), mesh, grad_sync=sync,
                                 step_config=dp.StepConfig(donate=False))
  by_builder = dp.make_replicated_train_step(_loss, optax.sgd(1.0), mesh, grad_sync=sync,
                                             step_config=dp.StepConfig(donate=False))
  assert by_flat.grad_sync == sync and isinstance(by_builder, dp.ReplicatedTrainStep)
  state, metrics = _run(by_flat, steps=1)
  for other in (by_config, by_builder):
    s, m = _run(other, steps=1)
    _assert_bit_equal(s.params, state.params)
    _assert_bit_equal(m["loss"], metrics["loss"])
  expected = _reference_step(_params(), _batch(1))
  roundings = 32 if flat.get("rounding") == "stochastic" else 16
  for k in ("w", "b"):
    atol = _int8_atol(_local_max(_batch(1), k), roundings) if "comm_dtype" in flat else 1e-6
    np.testing.assert_allclose(state.params[k], expected[k], rtol=0, atol=atol)


@pytest.mark.slow  # ~50 s; test_parallel_steps and test_two_shot compare pmap and jit
def test_pmap_and_jit_run_the_same_body_bit_for_bit():
  """One GradSync (torus over a 2x4 grid, int8, stochastic rounding) on pmap,
  on a mesh with one data axis and on a 2x4 torus mesh: the same numbers."""
  sync = dp.GradSync("torus", grid=(2, 4), comm_dtype="int8", rounding="stochastic")
  config = dp.StepConfig(donate=False, microbatches=2)
  pmap = dp.make_pmap_train_step(_loss, date_optax.lamb(1e-2), grad_sync=sync,
                                 step_config=config)
  one_axis = dp.make_replicated_train_step(_loss, date_optax.lamb(1e-2), dp.data_mesh(),
                                           grad_sync=sync, step_config=config)
  two_axes = dp.make_replicated_train_step(
      _loss, date_optax.lamb(1e-2), dp.torus_mesh(2, 4),
      grad_sync=dataclasses.replace(sync, grid=None), step_config=config)
  p_state, p_metrics = _run(pmap)
  first = jax.tree.map(lambda x: x[0], p_state)
  for step in (one_axis, two_axes):
    state, metrics = _run(step)
    _assert_bit_equal(state.params, first.params)
    _assert_bit_equal(state.opt_state, first.opt_state)
    _assert_bit_equal(metrics["grad_norm"], p_metrics["grad_norm"])
  # ... and the stochastic rounding did something: nearest rounding differs.
  nearest = dp.make_pmap_train_step(
      _loss, date_optax.lamb(1e-2),
      grad_sync=dataclasses.replace(sync, rounding="nearest"), step_config=config)
  n_state, _ = _run(nearest)
  assert not np.array_equal(np.asarray(n_state.params["w"][0]), np.asarray(first.params["w"]))


def test_deprecated_torus_shape_warns_and_is_grid():
  with pytest.warns(DeprecationWarning, match=r"torus_shape=.*deprecated.*grid="):
    old = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="torus",
                                  torus_shape=(4, 2), donate=False)
  new = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="torus", grid=(4, 2),
                                donate=False)
  assert old.grad_sync == new.grad_sync == dp.GradSync("torus", grid=(4, 2))
  with pytest.warns(DeprecationWarning, match=r"\.grid"):
    assert old.torus_shape == (4, 2)
  a, _ = _run(old, steps=1)
  b, _ = _run(new, steps=1)
  _assert_bit_equal(a.params, b.params)
  with pytest.warns(DeprecationWarning), pytest.raises(
      ValueError, match=r"grid= or its deprecated name torus_shape=, not both"):
    dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="torus", grid=(4, 2),
                            torus_shape=(4, 2))
  with pytest.warns(DeprecationWarning), pytest.raises(
      ValueError, match=r"torus_shape \(the deprecated name of grid\): grid=\(4, 2\).*torus"):
    dp.make_pmap_train_step(_loss, optax.sgd(1.0), torus_shape=(4, 2))
  # The default layout of a pmap torus is the most square grid.
  default = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="torus")
  assert default.grid == (2, 4)


# ---------------------------------------------------------------------------
# Every replicated step reduces through `sync_gradients`, reduce-scatter too.
# ---------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
  calls = []
  original = replica_step_lib.sync_gradients

  def recording(grads, axes, sync, **kw):
    calls.append((tuple(axes), sync, kw["scatter"]))
    return original(grads, axes, sync, **kw)

  monkeypatch.setattr(replica_step_lib, "sync_gradients", recording)
  return calls


def test_shard_update_and_pmap_reduce_through_the_one_function(spy):
  sync = dp.GradSync("ring", comm_dtype="int8")
  mesh = dp.data_mesh()
  sharded = dp.make_replicated_train_step(_loss, optax.sgd(1.0), mesh, grad_sync=sync,
                                          shard_update=True,
                                          step_config=dp.StepConfig(donate=False))
  whole = dp.make_replicated_train_step(_loss, optax.sgd(1.0), mesh, grad_sync=sync,
                                        step_config=dp.StepConfig(donate=False))
  a, _ = _run(sharded, steps=1)
  b, _ = _run(whole, steps=1)
  pmap = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_sync=sync, donate=False)
  pmap(pmap.init(_params()), _batch())
  assert spy == [(("data",), sync, True), (("data",), sync, False),
                 (("batch",), sync, False)]
  # The gathered parameters are whole on every device again.
  assert a.params["w"].sharding.spec == P()
  expected = _reference_step(_params(), _batch(1))
  for state in (a, b):
    for k in ("w", "b"):
      np.testing.assert_allclose(state.params[k], expected[k], rtol=0,
                                 atol=_int8_atol(_local_max(_batch(1), k)))


@pytest.mark.parametrize("algorithm", ["psum", "ring", "torus"])
@pytest.mark.parametrize("comm_dtype", [None, "int8"])
def test_sync_gradients_mean_and_reduce_scatter_against_numpy(algorithm, comm_dtype):
  mesh = dp.data_mesh()
  grid = (2, 4) if algorithm == "torus" else None
  sync = dp.GradSync(algorithm, grid=grid, comm_dtype=comm_dtype)
  rng = np.random.default_rng(3)
  g = {"w": rng.normal(size=(8, 16, 4)).astype(np.float32),  # 16 rows split 8 ways
       "b": rng.normal(size=(8, 3)).astype(np.float32)}  # (3,) stays whole
  mean = {k: v.astype(np.float64).mean(0) for k, v in g.items()}

  def call(scatter):
    out_specs = {"w": P("data") if scatter else P(), "b": P()}
    fn = jax.jit(compat.shard_map(
        lambda t: dp.sync_gradients(jax.tree.map(lambda x: x[0], t), "data", sync,
                                    scatter=scatter),
        mesh=mesh, in_specs=({"w": P("data"), "b": P("data")},), out_specs=out_specs))
    return fn(g)

  for scatter in (False, True):
    out = call(scatter)
    for k in ("w", "b"):
      assert out[k].dtype == np.float32 and out[k].shape == mean[k].shape
      atol = _int8_atol(np.abs(g[k]).max()) if comm_dtype else 1e-6
      np.testing.assert_allclose(out[k], mean[k], rtol=0, atol=atol)


def test_sync_gradients_needs_a_key_for_stochastic_rounding_only():
  mesh = dp.data_mesh()

  def call(sync, key):
    return jax.jit(compat.shard_map(
        lambda t: dp.sync_gradients(t, "data", sync, key=key), mesh=mesh,
        in_specs=P("data"), out_specs=P("data")))(np.ones(8, np.float32))

  with pytest.raises(ValueError, match=r'rounding="stochastic" needs a PRNG key'):
    call(dp.GradSync(comm_dtype="int8", rounding="stochastic"), None)
  with pytest.raises(ValueError, match=r'key is only used with rounding="stochastic"'):
    call(dp.GradSync(comm_dtype="int8"), jax.random.key(0))
  np.testing.assert_array_equal(call(dp.GradSync(), None), np.ones(8, np.float32))


def test_one_accumulation_dtype_rule():
  assert local_grads.acc_dtype is collectives.acc_dtype is grad_sync.acc_dtype
  expected = {"bfloat16": "float32", "float16": "float32", "float32": "float32",
              "float64": "float64", "int8": "int32", "uint16": "int32", "bool": "int32",
              "int32": "int32"}
  for dtype, acc in expected.items():
    assert collectives.acc_dtype(dtype) == np.dtype(acc), dtype
