"""Block scales and the measured shift through `GradSync` and the train steps.

The one reduction (`sync_gradients`) carries `block_size` / `measured_shift`
(`low_bit_sum.low_precision_sum` for whole leaves, `low_precision_reduce_scatter`
for the shards of a sharded update); the steps take them as `GradSync` fields
or flat keywords. The model of `test_grad_sync` is linear in its parameters, so
one `sgd(1.0)` step moves them by minus the NumPy mean gradient.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from test_grad_sync import (
  _assert_bit_equal,
  _batch,
  _int8_atol,
  _local_max,
  _loss,
  _params,
  _reference_step,
  _run,
)

import date_optax.parallel as dp
from date_optax._src.parallel import compat


def test_block_size_and_measured_shift_are_refused_in_grad_sync_naming_both_options():
  with pytest.raises(ValueError, match=r"block_size needs a low-precision comm_dtype"):
    dp.GradSync("ring", block_size=32)
  with pytest.raises(ValueError, match=r"measured_shift=True needs a low-precision comm_dtype"):
    dp.GradSync("ring", comm_dtype="float32", measured_shift=True)
  with pytest.raises(ValueError, match=r"block_size needs algorithm 'ring' or 'torus'.*'psum'"):
    dp.GradSync("psum", comm_dtype="int8", block_size=32)
  with pytest.raises(ValueError, match=r"block_size and measured_shift=True exclude each other"):
    dp.GradSync("ring", comm_dtype="int8", block_size=32, measured_shift=True)
  with pytest.raises(ValueError, match=r"block_size must be None or an integer in \[1, 65536\]"):
    dp.GradSync("ring", comm_dtype="int8", block_size=0)
  with pytest.raises(TypeError, match=r"block_size must be None or an integer"):
    dp.GradSync("ring", comm_dtype="int8", block_size=32.0)
  with pytest.raises(TypeError, match=r"measured_shift must be a bool"):
    dp.GradSync("ring", comm_dtype="int8", measured_shift="yes")
  # The same checks reach the flat keywords of both builders.
  with pytest.raises(ValueError, match=r"block_size needs algorithm 'ring' or 'torus'"):
    dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), comm_dtype="int8",
                       block_size=32)
  with pytest.raises(ValueError, match=r"measured_shift=True needs a low-precision"):
    dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="ring", measured_shift=True)
  with pytest.raises(ValueError, match=r"grad_sync= or the flat keywords block_size"):
    dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), block_size=32,
                       grad_sync=dp.GradSync("ring", comm_dtype="int8"))


def test_scales_measured_at_every_hop_turn_aps_off_by_default():
  sync = dp.GradSync("ring", comm_dtype=np.int8, block_size=np.int64(32))
  assert sync.block_size == 32 and type(sync.block_size) is int
  assert not sync.uses_aps and sync.measures_scales
  assert dp.GradSync("ring", comm_dtype="int8", measured_shift=True, aps=True).uses_aps
  assert dp.GradSync("ring", comm_dtype="int8", aps=True).uses_aps
  assert not dp.GradSync("ring", comm_dtype="int8", aps=True).measures_scales


def test_a_payload_alone_gets_blocks_of_32_over_hops_and_aps_over_psum():
  """The default scaling: 8 bits or fewer get MX-style blocks of 32 over "ring"
  and "torus" (scales travel with every hop), APS over "psum"; bfloat16 gets
  neither; `aps=True` or `aps=False` given turns the blocks off."""
  for algorithm, extra in (("ring", {}), ("torus", {"grid": (2, 4)})):
    for fmt in ("int8", "int4", "float8_e4m3fn", "float4_e2m1fn"):
      sync = dp.GradSync(algorithm, comm_dtype=fmt, **extra)
      assert sync.block_size == 32 and not sync.uses_aps, (algorithm, fmt)
      assert sync == dp.GradSync(algorithm, comm_dtype=fmt, block_size=32, **extra)
  psum = dp.GradSync("psum", comm_dtype="int8")
  assert psum.block_size is None and psum.uses_aps
  bf16 = dp.GradSync("ring", comm_dtype="bfloat16")
  assert bf16.block_size is None and not bf16.uses_aps
  on = dp.GradSync("ring", comm_dtype="int8", aps=True)
  assert on.block_size is None and on.uses_aps
  off = dp.GradSync("ring", comm_dtype="int8", aps=False)
  assert off.block_size is None and not off.uses_aps and not off.measures_scales
  shift = dp.GradSync("ring", comm_dtype="int8", measured_shift=True)
  assert shift.block_size is None and not shift.uses_aps
  # Both builders resolve the flat keywords to the same config.
  step = dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), grad_reduce="ring",
                            comm_dtype="int8")
  assert step.grad_sync == dp.GradSync("ring", comm_dtype="int8", block_size=32)
  pstep = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="ring", comm_dtype="int4")
  assert pstep.grad_sync == dp.GradSync("ring", comm_dtype="int4", block_size=32)
  # all_reduce with the payload alone is the explicit block-32 reduction, bit
  # for bit, and beats APS on leaves whose blocks differ in scale.
  rng = np.random.default_rng(3)
  x = rng.normal(size=(8, 256)).astype(np.float32) * np.logspace(-4, 0, 256, dtype=np.float32)
  mesh = dp.data_mesh()

  def reduce(**kw):
    fn = jax.jit(compat.shard_map(
        lambda t: dp.all_reduce(t[0], "data", algorithm="ring", comm_dtype="int8", **kw),
        mesh=mesh, in_specs=P("data"), out_specs=P()))
    return np.asarray(fn(x), np.float64)

  exact = x.astype(np.float64).sum(0)
  default, blocks, aps = reduce(), reduce(block_size=32), reduce(aps=True)
  np.testing.assert_array_equal(default, blocks)
  assert np.abs(default - exact).max() < 0.5 * np.abs(aps - exact).max()


CASES = {
    "ring_block8": ("data", {"grad_reduce": "ring", "block_size": 8}),
    "torus_measured": ("torus", {"grad_reduce": "torus", "measured_shift": True}),
}
MESHES = {"data": dp.data_mesh, "torus": lambda: dp.torus_mesh(2, 4)}


@pytest.mark.parametrize("case,shard_update", [
    ("ring_block8", False), ("ring_block8", True), ("torus_measured", False),
    pytest.param("torus_measured", True, marks=pytest.mark.slow)])  # ~18 s
def test_step_with_measured_scales_flat_equals_config_and_matches_numpy(case, shard_update):
  mesh_name, flat = CASES[case]
  mesh = MESHES[mesh_name]()
  sync = dp.GradSync(flat["grad_reduce"], comm_dtype="int8",
                     block_size=flat.get("block_size"),
                     measured_shift=flat.get("measured_shift", False))
  by_flat = dp.make_train_step(_loss, optax.sgd(1.0), mesh, donate=False, comm_dtype="int8",
                               shard_update=shard_update, **flat)
  by_config = dp.make_train_step(_loss, optax.sgd(1.0), mesh, grad_sync=sync,
                                 shard_update=shard_update, donate=False)
  assert by_flat.grad_sync == sync
  state, _ = _run(by_flat, steps=1)
  other, _ = _run(by_config, steps=1)
  _assert_bit_equal(state.params, other.params)
  expected = _reference_step(_params(), _batch(1))
  for k in ("w", "b"):
    # Each of the 16 roundings (8 casts, 7 hops, the final sum) errs by at most
    # half a step of its group's scale, 2^e <= 2·max|partial sum|/127, and
    # every partial sum of the mean is at most max|local gradient|.
    np.testing.assert_allclose(state.params[k], expected[k], rtol=0,
                               atol=_int8_atol(_local_max(_batch(1), k)))


def test_block_scales_beat_aps_on_a_layer_of_mixed_scales():
  """A layer whose rows differ by 1e6 in scale: APS shifts the whole layer by
  its largest row, so the small rows lose all their digits; block scales keep
  them (the rows of w are 8 wide, one block of 8 each)."""
  rng = np.random.default_rng(5)
  g = {"w": rng.normal(size=(8, 16, 8)).astype(np.float32)}
  g["w"][:, :8] *= 1e-6
  mean = g["w"].astype(np.float64).mean(0)
  mesh = dp.data_mesh()

  def call(sync, scatter):
    out_specs = {"w": P("data") if scatter else P()}
    fn = jax.jit(compat.shard_map(
        lambda t: dp.sync_gradients(jax.tree.map(lambda x: x[0], t), "data", sync,
                                    scatter=scatter),
        mesh=mesh, in_specs=({"w": P("data")},), out_specs=out_specs))
    return np.asarray(fn(g)["w"], np.float64)

  aps = dp.GradSync("ring", comm_dtype="int8", aps=True)
  blocks = dataclasses.replace(aps, aps=None, block_size=8)
  for scatter in (False, True):
    small = np.abs(mean[:8]).max()
    err_aps = np.abs(call(aps, scatter)[:8] - mean[:8]).max()
    err_blocks = np.abs(call(blocks, scatter)[:8] - mean[:8]).max()
    # Block scales: 16 roundings of half a step of 2·max|block|/127.
    assert err_blocks <= 16 * np.abs(g["w"][:, :8]).max() / 127, (scatter, err_blocks)
    assert err_blocks < 0.05 * small
    assert err_aps > 0.5 * small, (scatter, err_aps)


@pytest.mark.slow  # ~15 s; test_two_shot's pmap/mesh test runs block scales too
def test_pmap_and_jit_with_block_scales_bit_for_bit():
  sync = dp.GradSync("torus", grid=(2, 4), comm_dtype="int4", block_size=4)
  pmap = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_sync=sync, donate=False)
  jit = dp.make_replicated_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), grad_sync=sync,
                                      step_config=dp.StepConfig(donate=False))
  p_state, _ = _run(pmap)
  state, _ = _run(jit)
  _assert_bit_equal(state.params, jax.tree.map(lambda x: x[0], p_state).params)
