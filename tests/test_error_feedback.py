"""Error feedback (EF-SGD) in the data-parallel steps, against NumPy.

The model is linear in its parameters, `loss = mean_i <X_i, w> + <z_i, b>`,
so a replica's gradient is the mean of its rows whatever the parameters,
and the data are dyadic (integers times a power of two) so that every
gradient, every share `g / N` and, with int8 and APS, every partial sum of
the reduction is exact in float32. The NumPy reference then follows the
definition step by step (Karimireddy et al. 2019): `p = g / N + e`, the
replica sends `C(p) = 2^-k round(2^k p)` with the APS shift `k` of the
largest `|p|` over the replicas, `e' = p - C(p)`, and the mean is
`Σ_r C(p_r)`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import date_optax
import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax.checkpoint import CheckpointManager

N = 8  # replicas
ROWS = 4  # rows per replica
B = N * ROWS
LR = 0.5


def _loss(params, batch):
  return jnp.mean(jnp.sum(batch["x"] * params["w"], axis=(1, 2)) + batch["z"] @ params["b"])


def _params():
  rng = np.random.default_rng(0)
  return {"w": rng.integers(-64, 65, size=(16, 8)).astype(np.float32) / 64,
          "b": rng.integers(-64, 65, size=(3,)).astype(np.float32) / 64}


def _batch(seed, bits=6):
  """Dyadic rows: X in [-1, 1] on a grid of 2^-bits; z 2^-16 smaller (a layer of
  another scale, which APS shifts on its own)."""
  rng = np.random.default_rng(seed)
  k = 2**bits
  return {"x": rng.integers(-k, k + 1, size=(B, 16, 8)).astype(np.float32) / k,
          "z": rng.integers(-k, k + 1, size=(B, 3)).astype(np.float32) / k * 2.0**-16}


def _local_grads(batch):
  """Each replica's gradient, (N, ...) float32 (exact: dyadic means of 4 rows)."""
  x = batch["x"].reshape(N, ROWS, 16, 8).astype(np.float64).mean(1)
  z = batch["z"].reshape(N, ROWS, 3).astype(np.float64).mean(1)
  return {"w": x.astype(np.float32), "b": z.astype(np.float32)}


def _aps_shift(m, fmt_max=127.0):
  """The largest k with N · m · 2^k <= fmt_max (0 for m = 0): the APS rule."""
  if m == 0:
    return 0
  k = int(np.floor(np.log2(fmt_max / (N * m))))
  while N * m * 2.0**k > fmt_max:
    k -= 1
  while N * m * 2.0 ** (k + 1) <= fmt_max:
    k += 1
  return k


def _int8_ef_reference(params, batches, error_feedback=True):
  """EF with int8 and APS, round half to even; returns params, residuals, means."""
  params = {k: v.copy() for k, v in params.items()}
  e = {k: np.zeros((N,) + v.shape, np.float32) for k, v in params.items()}
  means = []
  for batch in batches:
    g = _local_grads(batch)
    mean = {}
    for k in params:
      p = g[k] / np.float32(N) + (e[k] if error_feedback else 0)
      shift = _aps_shift(float(np.abs(p).max()))
      scaled = np.ldexp(p, shift).astype(np.float32)
      c = np.clip(np.round(scaled), -127, 127)
      if error_feedback:
        e[k] = np.ldexp(scaled - c, -shift).astype(np.float32)
      mean[k] = np.ldexp(c.sum(0), -shift).astype(np.float32)  # integers: exact
      params[k] = params[k] - np.float32(LR) * mean[k]
    means.append(mean)
  return params, e, means


def _run(step, batches, state=None):
  state = step.init(_params()) if state is None else state
  for batch in batches:
    state, metrics = step(state, batch)
  return state, metrics


def _bit_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
               a, b)


def _step(**kw):
  return dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), donate=False, **kw)


BATCHES = [_batch(s) for s in range(1, 5)]


# ---------------------------------------------------------------------------
# Validation: in GradSync, once, naming both options.
# ---------------------------------------------------------------------------


def test_error_feedback_needs_a_low_precision_payload():
  for comm_dtype in (None, "float32", jnp.float32):
    with pytest.raises(ValueError, match=r"error_feedback=True needs a low-precision "
                                         r"comm_dtype.*pass comm_dtype"):
      dp.GradSync("ring", comm_dtype=comm_dtype, error_feedback=True)
  with pytest.raises(TypeError, match=r"error_feedback must be a bool"):
    dp.GradSync("ring", comm_dtype="int8", error_feedback=1)
  with pytest.raises(ValueError, match=r"error_feedback=True needs a low-precision"):
    _step(error_feedback=True)
  with pytest.raises(ValueError, match=r"error_feedback=True needs a low-precision"):
    dp.make_pmap_train_step(_loss, optax.sgd(LR), error_feedback=True)
  with pytest.raises(ValueError, match=r"grad_sync= or the flat keywords error_feedback"):
    _step(error_feedback=True, grad_sync=dp.GradSync(comm_dtype="int8"))
  with pytest.raises(ValueError, match=r"comm_dtype='int8' needs replicated parameters"):
    dp.make_train_step(_loss, optax.sgd(LR), jax.make_mesh((4, 2), ("data", "model")),
                       comm_dtype="int8", error_feedback=True,
                       param_sharding=[("w", jax.sharding.PartitionSpec("model"))])
  sync = dp.GradSync("ring", comm_dtype="int8", error_feedback=True)
  assert sync.error_feedback and not dp.GradSync("ring", comm_dtype="int8").error_feedback
  # sync_gradients: a residual exactly when the config feeds it back.
  mesh = dp.data_mesh()
  call = lambda s, **kw: jax.jit(compat.shard_map(
      lambda t: dp.sync_gradients(t, "data", s, **kw), mesh=mesh,
      in_specs=jax.sharding.PartitionSpec("data"),
      out_specs=jax.sharding.PartitionSpec("data")))(np.ones(N, np.float32))
  with pytest.raises(ValueError, match=r"error_feedback=True needs this replica's residual"):
    call(sync)
  with pytest.raises(ValueError, match=r"residual is only used with error_feedback=True"):
    call(dp.GradSync("ring", comm_dtype="int8"), residual=jnp.zeros(1))
  # A state without residuals is refused by a step that feeds them back.
  step = _step(grad_reduce="ring", comm_dtype="int8", error_feedback=True)
  bare = dp.TrainState.create(_params(), optax.sgd(LR))
  with pytest.raises(ValueError, match=r"needs state.grad_residual.*this step's init"):
    step(bare, BATCHES[0])


# ---------------------------------------------------------------------------
# The NumPy reference over several steps.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("grad_reduce,shard_update", [("psum", False), ("ring", False),
                                                      ("ring", True)])
def test_error_feedback_matches_numpy_over_several_steps(grad_reduce, shard_update):
  step = _step(grad_reduce=grad_reduce, comm_dtype="int8", aps=True, error_feedback=True,
               shard_update=shard_update)
  state = step.init(_params())
  assert state.grad_residual.worker["w"].shape == (N, 16, 8)
  assert state.grad_residual.worker["w"].sharding.spec == jax.sharding.PartitionSpec("data")
  for t in range(1, len(BATCHES) + 1):
    state, metrics = step(state, BATCHES[t - 1])
    params, e, _ = _int8_ef_reference(_params(), BATCHES[:t])
    for k in ("w", "b"):
      np.testing.assert_allclose(np.asarray(state.params[k]), params[k], rtol=0, atol=0)
      np.testing.assert_allclose(np.asarray(state.grad_residual.worker[k]), e[k], rtol=0, atol=0)
    assert not bool(metrics["skipped"])
  # The residual is not trivial, and it changes the result: without feedback
  # the parameters differ (the reference without it matches the plain step).
  assert np.abs(e["b"]).max() > 0
  plain, _ = _run(_step(grad_reduce=grad_reduce, comm_dtype="int8", aps=True,
                        shard_update=shard_update), BATCHES)
  no_ef, _, _ = _int8_ef_reference(_params(), BATCHES, error_feedback=False)
  np.testing.assert_allclose(np.asarray(plain.params["b"]), no_ef["b"], rtol=0, atol=0)
  assert not np.array_equal(no_ef["b"], params["b"])


def test_error_feedback_delivers_what_compression_dropped():
  """Σ_t mean_t + Σ_r e_r = Σ_t Σ_r g_r / N: nothing is lost, only delayed.

  On a repeated batch rounding errs the same way at every step: without
  feedback the parameters drift from the float32 ones linearly in the steps,
  with it the gap stays that of one step's residuals, at most N half steps."""
  batches = [BATCHES[0]] * 12
  params, e, means = _int8_ef_reference(_params(), batches)
  no_ef, _, _ = _int8_ef_reference(_params(), batches, error_feedback=False)
  exact = {k: sum(_local_grads(b)[k].astype(np.float64).mean(0) for b in batches)
           for k in ("w", "b")}
  for k in ("w", "b"):
    delivered = sum(m[k].astype(np.float64) for m in means) + e[k].astype(np.float64).sum(0)
    np.testing.assert_allclose(delivered, exact[k], rtol=0, atol=1e-6 * np.abs(exact[k]).max())
    f32 = _params()[k] - LR * exact[k]
    np.testing.assert_allclose(params[k], f32 + LR * e[k].astype(np.float64).sum(0),
                               rtol=0, atol=1e-6 * np.abs(f32).max())
    assert np.abs(params[k] - f32).max() < 0.25 * np.abs(no_ef[k] - f32).max(), k
  step = _step(grad_reduce="ring", comm_dtype="int8", aps=True, error_feedback=True)
  state, _ = _run(step, batches)
  for k in ("w", "b"):
    np.testing.assert_allclose(np.asarray(state.params[k]), params[k], rtol=0, atol=0)


def test_first_step_with_error_feedback_is_the_plain_step():
  """The residual starts at zero: the first step sends what the plain one does
  (with APS, whose per-layer shift is the same before and during the ring)."""
  ef, _ = _run(_step(grad_reduce="ring", comm_dtype="int4", aps=True, error_feedback=True),
               BATCHES[:1])
  plain, _ = _run(_step(grad_reduce="ring", comm_dtype="int4", aps=True), BATCHES[:1])
  _bit_equal(ef.params, plain.params)
  assert np.abs(np.asarray(ef.grad_residual.worker["w"])).max() > 0


def test_error_feedback_changes_nothing_when_the_payload_is_exact():
  """bfloat16 carries every share of these gradients exactly (at most 6
  significant bits), so the residual stays exactly 0 and EF changes no bit."""
  batches = [_batch(s, bits=3) for s in range(1, 4)]
  for grad_reduce in ("psum", "ring"):
    ef, _ = _run(_step(grad_reduce=grad_reduce, comm_dtype="bfloat16", error_feedback=True),
                 batches)
    plain, _ = _run(_step(grad_reduce=grad_reduce, comm_dtype="bfloat16"), batches)
    _bit_equal(ef.params, plain.params)
    for k in ("w", "b"):
      np.testing.assert_array_equal(np.asarray(ef.grad_residual.worker[k]), 0.0)


def _block_ef_reference(batches, block, fmt_max=127.0):
  """The residuals of EF with block scales (no APS): per block of `block`
  elements of a replica's flattened leaf, e = smallest with max|p| 2^-e <= 127."""
  e = {"w": np.zeros((N, 128), np.float32), "b": np.zeros((N, 3), np.float32)}
  sent = []
  for batch in batches:
    g = _local_grads(batch)
    out = {}
    for k in e:
      p = g[k].reshape(N, -1) / np.float32(N) + e[k]
      pad = (-p.shape[1]) % block
      blocks = np.pad(p, ((0, 0), (0, pad))).reshape(N, -1, block)
      m = np.abs(blocks).max(-1, keepdims=True)
      ex = np.where(m > 0, -np.array([[_aps_shift(v / N) for v in r] for r in m[..., 0]])[
          ..., None], 0)
      c = np.ldexp(np.clip(np.round(np.ldexp(blocks, -ex)), -127, 127), ex)
      c = c.reshape(N, -1)[:, : p.shape[1]].astype(np.float32)
      e[k] = (p - c).astype(np.float32)
      out[k] = c
    sent.append(out)
  return e, sent


@pytest.mark.parametrize("shard_update", [False, True])
def test_block_scaled_error_feedback_matches_numpy(shard_update):
  """With block scales C rounds each block of the replica's own leaf with the
  scale of its own max; the residuals follow exactly, and the parameters are
  within the hop roundings of Σ_r C(p_r)."""
  block = 8
  step = _step(grad_reduce="ring", comm_dtype="int8", block_size=block, error_feedback=True,
               shard_update=shard_update)
  state = step.init(_params())
  e, sent = _block_ef_reference(BATCHES, block)
  expected = {k: v.astype(np.float64) for k, v in _params().items()}
  for t, batch in enumerate(BATCHES):
    state, _ = step(state, batch)
    for k in ("w", "b"):
      mean = sent[t][k].astype(np.float64).sum(0).reshape(expected[k].shape)
      expected[k] = expected[k] - LR * mean
  for k in ("w", "b"):
    np.testing.assert_allclose(np.asarray(state.grad_residual.worker[k]).reshape(N, -1), e[k],
                               rtol=0, atol=0)
    # 7 hops and the final sum round partial sums of at most Σ_r |C(p_r)|, each
    # by half a step of 2 · max / 127, at every one of the steps.
    bound = sum(8 * np.abs(s[k]).sum(0).max() / 127 for s in sent) * LR
    np.testing.assert_allclose(np.asarray(state.params[k]), expected[k], rtol=0, atol=bound)
  assert np.abs(e["w"]).max() > 0


# ---------------------------------------------------------------------------
# State: the skip rule, checkpoints, pmap.
# ---------------------------------------------------------------------------


def test_skipped_step_keeps_the_residual_and_the_run_goes_on_as_without_it():
  step = _step(grad_reduce="ring", comm_dtype="int8", error_feedback=True)
  state, _ = _run(step, BATCHES[:2])
  bad = {k: v.copy() for k, v in BATCHES[2].items()}
  bad["x"][5, 0, 0] = np.nan  # one replica's gradient is NaN
  skipped, metrics = step(state, bad)
  assert bool(metrics["skipped"]) and int(skipped.total_skips) == 1
  _bit_equal(skipped.grad_residual, state.grad_residual)
  _bit_equal(skipped.params, state.params)
  after, _ = step(skipped, BATCHES[2])
  clean, _ = _run(step, BATCHES[:3])
  _bit_equal(after.grad_residual, clean.grad_residual)
  _bit_equal(after.params, clean.params)


def test_residual_survives_a_checkpoint_bit_for_bit(tmp_path):
  step = _step(grad_reduce="ring", comm_dtype="int4", rounding="stochastic",
               error_feedback=True)
  state, _ = _run(step, BATCHES[:2])
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(2, state)
    restored, _ = mngr.restore(step.init(_params()))
  _bit_equal(restored.grad_residual, state.grad_residual)
  assert restored.grad_residual.worker["w"].sharding == state.grad_residual.worker["w"].sharding
  a, _ = _run(step, BATCHES[2:], state=restored)
  b, _ = _run(step, BATCHES[2:], state=state)
  _bit_equal(a.params, b.params)
  _bit_equal(a.grad_residual, b.grad_residual)


@pytest.mark.parametrize("sync", [
    dp.GradSync("torus", grid=(2, 4), comm_dtype="int4", rounding="stochastic",
                error_feedback=True),
    dp.GradSync("ring", comm_dtype="int8", block_size=16, error_feedback=True),
])
def test_pmap_and_jit_error_feedback_bit_for_bit(sync):
  config = dp.StepConfig(donate=False)
  pmap = dp.make_pmap_train_step(_loss, date_optax.lamb(1e-2), grad_sync=sync,
                                 step_config=config)
  jit = dp.make_replicated_train_step(_loss, date_optax.lamb(1e-2), dp.data_mesh(),
                                      grad_sync=sync, step_config=config)
  p_state, _ = _run(pmap, BATCHES[:3])
  state, _ = _run(jit, BATCHES[:3])
  first = jax.tree.map(lambda x: x[0], p_state)
  _bit_equal(state.params, first.params)
  _bit_equal(state.opt_state, first.opt_state)
  _bit_equal(state.grad_residual, p_state.grad_residual)  # (N, ...) both
  assert p_state.grad_residual.worker["w"].shape == (N, 16, 8)
  # ... and the feedback did something.
  plain = dp.make_pmap_train_step(_loss, date_optax.lamb(1e-2), step_config=config,
                                  grad_sync=dataclasses.replace(sync, error_feedback=False))
  n_state, _ = _run(plain, BATCHES[:3])
  assert not np.array_equal(np.asarray(n_state.params["w"][0]), np.asarray(first.params["w"]))

