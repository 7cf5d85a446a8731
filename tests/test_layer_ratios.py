"""The per-layer trust ratios are recorded as one vector (issue 31, item 2).

A state with one ratio array per parameter leaf makes every compiled step
take and return a buffer per leaf, and write each with a kernel of its own.
The record (`date_optax.LayerRatios`) holds every layer's ratio in one
float32 vector, in leaf order; `date_optax.trust_ratios` unpacks it. The
reference ratios here are written from the formula, r = ‖w‖ / ‖g‖ (1 where
either norm is 0 or the layer is outside the trust mask).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import parallel_model as pm
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax.checkpoint import CheckpointManager, CheckpointMismatchError
from date_optax.diagnostics import per_layer_ratios, trust_ratio_summary


def _tree(seed=0):
  """Small leaves of two shapes (stacked into groups), interleaved with a
  large leaf, a stacked leaf with 4 layers, a zero leaf and an excluded one."""
  rng = np.random.default_rng(seed)
  tree = {}
  for i in range(12):
    tree[f"l{i:02d}"] = {"kernel": rng.normal(size=(6, 6)).astype(np.float32),
                         "bias": rng.normal(size=(6,)).astype(np.float32)}
  tree["big"] = rng.normal(size=(160, 128)).astype(np.float32)  # > 16,384
  tree["blocks"] = rng.normal(size=(4, 5, 3)).astype(np.float32)
  tree["zero"] = np.zeros((6,), np.float32)
  tree["skip"] = rng.normal(size=(6, 6)).astype(np.float32)
  return tree


AXES = lambda p: jax.tree.map(lambda _: None, p) | {"blocks": (0,)}  # noqa: E731
MASK = lambda p: jax.tree.map(lambda _: True, p) | {"skip": False}  # noqa: E731


def _reference(params, grads):
  """Per leaf, the ratios ‖w‖ / ‖g‖ by the formula: a pytree like params."""
  def ratio(w, g):
    w_n, g_n = np.linalg.norm(np.float64(w)), np.linalg.norm(np.float64(g))
    return 1.0 if w_n == 0 or g_n == 0 else w_n / g_n

  out = jax.tree.map(lambda w, g: np.float32(ratio(w, g)), params, grads)
  out["blocks"] = np.array([ratio(params["blocks"][i], grads["blocks"][i])
                            for i in range(4)], np.float32)
  out["skip"] = np.float32(1.0)
  return out


def _step(params, grads):
  tx = date_optax.scale_by_trust_ratio(layer_axes=AXES, trust_ratio_mask=MASK)
  params, grads = jax.tree.map(jnp.asarray, (params, grads))
  return jax.jit(tx.update)(grads, tx.init(params), params)[1]


def test_the_record_holds_every_layers_ratio_in_leaf_order():
  params, grads = _tree(0), _tree(1)
  state = _step(params, grads)
  want = _reference(params, grads)
  record = state.ratios
  assert isinstance(record, date_optax.LayerRatios)
  assert len(jax.tree.leaves(record)) == 1  # one array for 28 leaves
  assert record.num_layers == len(jax.tree.leaves(params)) - 1 + 4
  np.testing.assert_allclose(
      np.asarray(record.values),
      np.concatenate([np.ravel(x) for x in jax.tree.leaves(want)]), rtol=1e-5)
  got = date_optax.trust_ratios(state)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), got, want)
  assert got["blocks"].shape == (4,) and got["zero"].shape == ()
  # The groups' ratios are not all one value (the order matters).
  assert len(np.unique(np.round(np.asarray(record.values), 4))) > 20


def test_telemetry_reads_the_record_as_the_tree():
  state = _step(_tree(0), _tree(1))
  record, tree = state.ratios, date_optax.trust_ratios(state)
  s_record = trust_ratio_summary(record, lower=0.0, upper=10.0)
  s_tree = trust_ratio_summary(tree, lower=0.0, upper=10.0)
  for k in s_tree:
    np.testing.assert_allclose(s_record[k], s_tree[k], err_msg=k)
  named = per_layer_ratios(record)
  assert list(named) == list(per_layer_ratios(tree))
  assert "blocks[3]" in named and "l11/kernel" in named
  # After jax.device_get the record unpacks into NumPy arrays.
  host = jax.device_get(record)
  assert isinstance(host.unpack()["big"], np.ndarray)


def test_init_and_abstract_records():
  params = jax.tree.map(jnp.asarray, _tree(0))
  tx = date_optax.lars(0.1, layer_axes=AXES)
  state = tx.init(params)
  np.testing.assert_array_equal(np.asarray(state.ratios.values), np.ones(28 - 1 + 4))
  abstract = jax.eval_shape(tx.init, params)
  tree = date_optax.trust_ratios(abstract)
  assert tree["blocks"] == jax.ShapeDtypeStruct((4,), jnp.float32)
  assert date_optax.trust_ratios(date_optax.lars(0.1).init({})) == {}


def test_pack_rejects_pieces_that_do_not_cover_the_leaves():
  treedef = jax.tree.structure({"a": 0, "b": 0})
  with pytest.raises(ValueError, match="ratio shapes"):
    layer_ratios_lib.pack([([0, 1], jnp.ones(3))], treedef, ((), ()))
  with pytest.raises(ValueError, match="the leaves have 2"):
    layer_ratios_lib.pack([([0], jnp.ones(1))], treedef, ((), ()))
  got = layer_ratios_lib.pack([([1], jnp.array([2.0])), ([0], jnp.array([1.0]))],
                              treedef, ((), ()))
  np.testing.assert_array_equal(np.asarray(got.values), [1.0, 2.0])


def _outputs(step_fn, *args) -> int:
  text = jax.jit(step_fn).lower(*args).compile().as_text()
  root = re.search(r"ROOT \S+ = \((.*?)\) tuple", text.split("ENTRY")[1])
  return len(root.group(1).split("}, ")) if root else 0


def test_a_train_step_returns_one_array_for_all_ratios():
  """Per parameter leaf, a LAMB step returns the parameter and the two
  moments: no ratio in the state and none in the metrics (it was 5)."""
  from date_optax._src.parallel.step import train_state as ts

  def outputs(n):
    params = {f"l{i}": jnp.full((8, 8), 1.0 + i) for i in range(n)}
    opt = date_optax.lamb(1e-3)
    state = dp.TrainState.create(params, opt)
    return _outputs(lambda s, g: ts.apply_gradients(s, g, jnp.float32(1.0), opt),
                    state, params)

  assert outputs(24) - outputs(12) == 3 * 12


def test_the_sharded_step_replicates_the_record():
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  step = dp.make_train_step(pm.loss_fn, date_optax.lamb(1e-3), mesh,
                            param_sharding=[(r".*kernel", P("model", None))],
                            shard_update=True, donate=False)
  state = step.init(pm.init_params())
  record = date_optax._src.state_readers.recorded_ratios(state.opt_state)
  assert record.values.sharding.spec == P()
  new_state, metrics = step(state, pm.make_data(64, seed=0))
  assert isinstance(metrics["trust_ratios"], date_optax.LayerRatios)
  np.testing.assert_allclose(
      np.asarray(metrics["trust_ratios"].values),
      np.asarray(date_optax._src.state_readers.recorded_ratios(new_state.opt_state).values))


def test_a_checkpoint_with_a_ratio_per_leaf_restores_into_the_record(tmp_path):
  """Checkpoints written before the record (one ratio array per leaf) restore
  onto today's state; a target that fits neither layout is still refused."""
  params = jax.tree.map(jnp.asarray, _tree(0))
  grads = jax.tree.map(jnp.asarray, _tree(1))
  tx = date_optax.lars(0.1, weight_decay=1e-4, layer_axes=AXES)
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  legacy = {"opt_state": state._replace(ratios=state.ratios.unpack()), "step": 3}
  with CheckpointManager(str(tmp_path)) as mgr:
    mgr.save(3, legacy, force=True)
    mgr.wait_until_finished()
    target = {"opt_state": tx.init(params), "step": 0}
    restored, _ = mgr.restore(target)
    assert isinstance(restored["opt_state"].ratios, date_optax.LayerRatios)
    np.testing.assert_array_equal(np.asarray(restored["opt_state"].ratios.values),
                                  np.asarray(state.ratios.values))
    jax.tree.map(np.testing.assert_array_equal, restored["opt_state"].momentum,
                 state.momentum)
    _, again = jax.jit(tx.update)(grads, restored["opt_state"], params)  # usable as is
    assert isinstance(again.ratios, date_optax.LayerRatios)
    wrong = {"opt_state": tx.init({**params, "extra": jnp.ones(3)}), "step": 0}
    with pytest.raises(CheckpointMismatchError, match="extra"):
      mgr.restore(wrong)


def test_optax_wrappers_carry_the_record():
  params = jax.tree.map(jnp.asarray, _tree(0))
  grads = jax.tree.map(jnp.asarray, _tree(1))
  for tx in (optax.MultiSteps(date_optax.lamb(1e-3), every_k_schedule=2),
             optax.inject_hyperparams(date_optax.lars)(learning_rate=0.1)):
    state = tx.init(params)
    for _ in range(2):
      _, state = jax.jit(tx.update)(grads, state, params)
    ratios = date_optax.trust_ratios(state)
    assert jax.tree.structure(ratios) == jax.tree.structure(params)
    assert not np.allclose(np.asarray(jax.tree.leaves(ratios)[0]), 1.0)


def test_flax_msgpack_round_trips_the_record_and_reads_a_per_leaf_one():
  from flax import serialization

  params = jax.tree.map(jnp.asarray, _tree(0))
  tx = date_optax.lamb(1e-3, layer_axes=AXES)
  _, state = tx.update(jax.tree.map(jnp.asarray, _tree(1)), tx.init(params), params)
  target = tx.init(params)
  back = serialization.from_bytes(target, serialization.to_bytes(state))
  np.testing.assert_array_equal(np.asarray(back.ratios.values), np.asarray(state.ratios.values))
  legacy = serialization.to_bytes(state._replace(ratios=state.ratios.unpack()))
  back = serialization.from_bytes(target, legacy)
  assert isinstance(back.ratios, date_optax.LayerRatios)
  np.testing.assert_array_equal(np.asarray(back.ratios.values), np.asarray(state.ratios.values))
