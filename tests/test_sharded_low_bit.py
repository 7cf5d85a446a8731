"""The sharded (GSPMD) step with a low-bit gradient reduction (`grad_sync=`).

A (4 data, 2 model) mesh: an MLP whose kernels are split over "model". The
gradients of the replicas are reduced in a `shard_map` island over "data",
each device its own model shard, in the payload format of `GradSync`.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager

N = 4  # replicas ("data")
ROWS = 8  # rows per replica
RULES = [("w1", P(None, "model")), ("b1", P("model")), ("w2", P("model", None))]
LR = 0.1


def _mesh():
  return jax.make_mesh((N, 2), ("data", "model"))


def _loss(params, batch):
  h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def _params():
  rng = np.random.default_rng(0)
  return {"w1": (rng.normal(size=(16, 64)) * 0.3).astype(np.float32),
          "b1": (rng.normal(size=(64,)) * 0.1).astype(np.float32),
          "w2": (rng.normal(size=(64, 4)) * 0.3).astype(np.float32)}


def _batch(seed):
  rng = np.random.default_rng(100 + seed)
  return {"x": rng.normal(size=(N * ROWS, 16)).astype(np.float32),
          "y": rng.normal(size=(N * ROWS, 4)).astype(np.float32)}


OPTIMIZERS = {"sgd": lambda: optax.sgd(LR), "lamb": lambda: date_optax.lamb(1e-2)}


def _build(opt="sgd", sharded=True, **kw):
  kw.setdefault("step_config", dp.StepConfig(donate=False))
  if sharded:
    return dp.make_sharded_train_step(_loss, OPTIMIZERS[opt](), _mesh(), param_sharding=RULES,
                                      **kw)
  return dp.make_replicated_train_step(_loss, OPTIMIZERS[opt](), _mesh(), data_axes=("data",),
                                       **kw)


def _step(opt="sgd", sharded=True, shard_update=False, grad_sync=None):
  """One step per configuration for the module (built with donate=False, so
  a step is a pure function): the tests that use the same step share its
  compiles."""
  return _one_step(opt, sharded, shard_update, grad_sync)


@functools.cache
def _one_step(opt, sharded, shard_update, grad_sync):
  return _build(opt, sharded, shard_update=shard_update, grad_sync=grad_sync)


def _host(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _bit_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _format_bound(params, batch, qmax):
  """Per-layer bound on |low-bit mean - exact mean| of the replicas' gradients.

  Every partial sum a device sends on the ring of N replicas, and the final
  sum, is rounded once with a power-of-two scale 2^e measured on its block
  (the smallest with m·2^-e <= qmax, m the block's max-abs), so one rounding
  errs by at most half a step, 2^(e-1) < m/qmax. A partial sum of the shares
  g_r/N is at most A = mean_r max|g_r| in magnitude, and each element is
  rounded N times (N - 1 hops and the final sum): N·A/qmax.
  """
  grads = [jax.grad(_loss)(params, {k: v[r * ROWS:(r + 1) * ROWS] for k, v in batch.items()})
           for r in range(N)]
  return {k: N * np.mean([np.abs(np.asarray(g[k])).max() for g in grads]) / qmax
          for k in params}


# ---------------------------------------------------------------------------
# (a) within the format's bound of the float32 sharded step
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sync,qmax", [
    (dp.GradSync("ring", comm_dtype="int8"), 127.0),  # block scales of 32
    (dp.GradSync("ring", comm_dtype="int4", block_size=32), 7.0),
    # (X-1) + (Y-1) hops and the final sum: fewer roundings than the ring's N.
    (dp.GradSync("torus", grid=(2, 2), comm_dtype="int8"), 127.0),
])
def test_low_bit_sharded_step_is_within_the_formats_bound_of_float32(sync, qmax):
  low, exact = _step(grad_sync=sync), _step()
  assert low.explicit_sync and not exact.explicit_sync
  assert low.grad_reduce == sync.algorithm
  state = low.init(_params())
  worst = 0.0
  for t in range(3):  # along the low-bit run: each step against the exact one
    batch = _batch(t)
    bound = _format_bound(_host(state.params), batch, qmax)
    new, metrics = low(state, batch)
    ref, _ = exact(state, batch)
    assert not bool(metrics["skipped"])
    for k in bound:
      err = np.abs(_host(new.params)[k] - _host(ref.params)[k]) / LR
      assert err.max() <= bound[k] + 1e-6, (k, t, err.max(), bound[k])
      worst = max(worst, err.max() / bound[k])
    state = new
  assert worst > 1e-3  # the payload really is low-bit


# ---------------------------------------------------------------------------
# (b) the sharded layout reduces as the replicated one does
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shard_update", [False, True])
def test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync(shard_update):
  """bfloat16 over "psum" rounds each element alone, whatever the layout:
  the two layouts agree to float32 rounding over several lamb steps."""
  sync = dp.GradSync("psum", comm_dtype="bfloat16")
  sharded = _step("lamb", grad_sync=sync, shard_update=shard_update)
  replicated = _step("lamb", sharded=False, grad_sync=sync, shard_update=shard_update)
  a, b = sharded.init(_params()), replicated.init(_params())
  exact = _step("lamb", shard_update=shard_update)
  c = exact.init(_params())
  for t in range(3):
    a, ma = sharded(a, _batch(t))
    b, mb = replicated(b, _batch(t))
    c, _ = exact(c, _batch(t))
  for k in a.params:
    np.testing.assert_allclose(_host(a.params)[k], _host(b.params)[k], rtol=0, atol=1e-6)
    assert np.abs(_host(a.params)[k] - _host(c.params)[k]).max() > 1e-5  # bf16 shows
  assert a.params["w1"].sharding.spec == P(None, "model")


def test_block_scaled_sharded_step_is_within_twice_the_bound_of_the_replicated_one():
  """Block scales are measured on each device's model shard: the layouts
  group other elements in a block, so they agree within the bound twice."""
  sync = dp.GradSync("ring", comm_dtype="int8", block_size=32)
  state = _step().init(_params())
  batch = _batch(0)
  bound = _format_bound(_host(state.params), batch, 127.0)
  a, _ = _step(grad_sync=sync)(state, batch)
  b, _ = _step(sharded=False, grad_sync=sync)(_step(sharded=False).init(_params()), batch)
  for k in bound:
    err = np.abs(_host(a.params)[k] - _host(b.params)[k]) / LR
    assert err.max() <= 2 * bound[k] + 1e-6, (k, err.max(), bound[k])


# ---------------------------------------------------------------------------
# Trust ratios over sharded layers stay exact
# ---------------------------------------------------------------------------


def test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout():
  """The norms of a layer split over "model" are summed over its shards by
  GSPMD outside the island: the same ratios as the replicated layout with
  the same reduction, and close to the exact ones with an int8 payload."""
  batch = _batch(0)
  exact = _step("lamb", sharded=False)
  _, me = exact(exact.init(_params()), batch)
  for sync, to_exact in ((dp.GradSync("psum", comm_dtype="bfloat16"), 1e-2),
                         (dp.GradSync("ring"), 1e-5),  # float32 ring in the island
                         (dp.GradSync("ring", comm_dtype="int8"), 1e-2)):
    sharded = _step("lamb", grad_sync=sync, shard_update=True)
    _, ms = sharded(sharded.init(_params()), batch)
    replicated = _step("lamb", sharded=False, grad_sync=sync)
    _, mr = replicated(replicated.init(_params()), batch)
    rs, rr, re_ = (m["trust_ratios"].unpack() for m in (ms, mr, me))
    for k in ("w1", "b1", "w2"):
      ratio = float(rs[k])
      same = 1e-5 if sync.comm_dtype != "int8" else 1e-2  # int8: blocks per shard
      np.testing.assert_allclose(ratio, float(rr[k]), rtol=same)
      np.testing.assert_allclose(ratio, float(re_[k]), rtol=to_exact)


# ---------------------------------------------------------------------------
# (c) the compiled program carries the low-bit payload over "data" only
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shard_update", [False, True])
def test_compiled_sharded_step_sends_the_gradients_in_the_payload_format(shard_update):
  for fmt, wire in (("int8", ("s8[",)), ("int4", ("s4[", "s8["))):
    step = _step(grad_sync=dp.GradSync("ring", comm_dtype=fmt), shard_update=shard_update)
    state = step.init(_params())
    text = step.lower(state, _batch(0)).compile().as_text()
    rounds = dp.collective_permute_rounds(text)
    hops = (N - 1) * (1 if shard_update else 2)  # reduce-scatter (+ all-gather)
    assert [r for r, _ in rounds] == list(range(1, hops + 1)), rounds
    # Rings over "data" within each model shard: device ids are data-major,
    # so a pair never crosses the model index (id % 2).
    assert all(a % 2 == b % 2 for _, pairs in rounds for a, b in pairs)
    # The type of each collective-permute instruction (not of an op whose
    # operand or metadata names one).
    permutes = re.findall(r"= (.+?) collective-permute(?:-start)?\(", text)
    assert permutes and all(any(w in t for w in wire) for t in permutes), permutes[:2]
    # No gradient is gathered over "model" first: the only all-gather is
    # that of the new parameters over "data" (shard_update).
    gathers = [ln for ln in text.splitlines() if " all-gather(" in ln
               or " all-gather-start(" in ln]
    assert bool(gathers) == shard_update, gathers
    assert all("replica_groups=[2,4]" in ln for ln in gathers), gathers  # 2 groups of 4


# ---------------------------------------------------------------------------
# (d) error feedback: the residual in the state
# ---------------------------------------------------------------------------


def test_error_feedback_residual_is_sharded_checkpointed_and_kept_on_a_skip(tmp_path):
  sync = dp.GradSync("ring", comm_dtype="int4", rounding="stochastic", error_feedback=True)
  step = _step(grad_sync=sync, shard_update=True)
  state = step.init(_params())
  assert isinstance(state.grad_residual, dp.ErrorFeedbackState)
  for stage in state.grad_residual:  # the worker and the hop residuals
    assert stage["w1"].shape == (N, 16, 64)
    assert stage["w1"].sharding.spec == P("data", None, "model")
    assert stage["w2"].sharding.spec == P("data", "model", None)
  for t in range(2):
    state, metrics = step(state, _batch(t))
    assert not bool(metrics["skipped"])
  res = _host(state.grad_residual)
  assert all(np.abs(v).max() > 0 for v in res.worker.values())
  assert all(np.abs(v).max() > 0 for v in res.hop.values())
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(2, state)
    restored, _ = mngr.restore(step.init(_params()))
  _bit_equal(restored.grad_residual, state.grad_residual)
  assert (restored.grad_residual.hop["w1"].sharding
          == state.grad_residual.hop["w1"].sharding)
  a, _ = step(restored, _batch(2))
  b, _ = step(state, _batch(2))
  _bit_equal(a.params, b.params)
  _bit_equal(a.grad_residual, b.grad_residual)
  bad = {k: v.copy() for k, v in _batch(2).items()}
  bad["x"][3 * ROWS, 0] = np.nan  # replica 3's gradient is NaN
  skipped, metrics = step(state, bad)
  assert bool(metrics["skipped"]) and int(skipped.total_skips) == 1
  _bit_equal(skipped.grad_residual, state.grad_residual)
  _bit_equal(skipped.params, state.params)


def test_error_feedback_on_the_sharded_step_matches_the_replicated_one_where_exact():
  """bfloat16 over "psum" rounds each element alone, so the residuals (and
  the parameters) of the two layouts agree over several steps."""
  sync = dp.GradSync("psum", comm_dtype="bfloat16", error_feedback=True)
  a_step, b_step = _step(grad_sync=sync), _step(sharded=False, grad_sync=sync)
  a, b = a_step.init(_params()), b_step.init(_params())
  for t in range(3):
    a, _ = a_step(a, _batch(t))
    b, _ = b_step(b, _batch(t))
  for k in a.params:
    np.testing.assert_allclose(_host(a.grad_residual).worker[k],
                               _host(b.grad_residual).worker[k], rtol=0, atol=1e-6)
    np.testing.assert_allclose(_host(a.params)[k], _host(b.params)[k], rtol=0, atol=1e-6)
  assert np.abs(_host(a.grad_residual).worker["w1"]).max() > 0
  assert a.grad_residual.hop is None and b.grad_residual.hop is None  # psum: no hops


# ---------------------------------------------------------------------------
# (e) bad input, and the flat keywords of make_train_step
# ---------------------------------------------------------------------------


def test_make_train_step_routes_the_payload_to_the_sharded_builder_and_refuses_misfits():
  step = dp.make_train_step(_loss, optax.sgd(LR), _mesh(), param_sharding=RULES,
                            grad_reduce="ring", comm_dtype="int4", error_feedback=True)
  assert isinstance(step, dp.ShardedTrainStep) and step.error_feedback
  assert step.grad_sync == dp.GradSync("ring", comm_dtype="int4", error_feedback=True)
  stats = dp.make_train_step(_loss, optax.sgd(LR), _mesh(), param_sharding=RULES,
                             grad_reduce="ring", comm_dtype="int8", grad_stats=True,
                             microbatches=2)
  _, metrics = stats(stats.init(_params()), _batch(0))
  assert np.isfinite(float(metrics["grad_noise_scale"])) and not bool(metrics["skipped"])
  plain = dp.make_train_step(_loss, optax.sgd(LR), _mesh(), param_sharding=RULES)
  assert plain.grad_reduce == "psum" and not plain.explicit_sync
  with pytest.raises(ValueError, match=r'grad_reduce="torus" needs two data axes'):
    _build(grad_sync=dp.GradSync("torus", comm_dtype="int8"))
  with pytest.raises(ValueError, match=r"grid \(2, 3\) must multiply to the number of "
                                       r"devices, 4"):
    _build(grad_sync=dp.GradSync("torus", grid=(2, 3), comm_dtype="int8"))
  with pytest.raises(TypeError, match="grad_sync must be a date_optax.parallel.GradSync"):
    _build(grad_sync={"comm_dtype": "int8"})
  with pytest.raises(ValueError, match=r"state.grad_residual holds error-feedback"):
    state = step.init(_params())
    plain(state, _batch(0))
