"""GradSync("hierarchical"): Cloud TPU Multislice's sync, against psum and NumPy.

The mesh is two slices of four devices, `Mesh(devices.reshape(2, 4), ("dcn",
"ici"))`. The reference follows the description (Google Cloud's Multislice
overview; Tang et al. 2021 for the cross-slice two-shot), not the code: each
slice sums its replicas' shares `g_r / N` exactly, row by row (a leaf
flattened and zero-padded to a multiple of M = 4, or with weight-update
sharding the blocks `s·M + i` of every slice in row i), device (s, i) adds
its worker residual to row i of its slice's sum, `p = row + e`, and the two
devices at in-slice position i run 1-bit Adam's two-shot on `p`: every
chunk rounded once with a scale per block of BLOCK elements, `e' = p -
C(p)`, owner s sums the chunks s, adds its server residual, rounds once and
keeps the rest; the slice gathers the rows. The model and the dyadic data
are those of tests/test_error_feedback.py, so every value is exact in
float32.
"""

from __future__ import annotations

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from test_error_feedback import _batch, _loss, _params  # the same model and rows
from test_two_shot import BLOCK, LR, _block_round, _chunks, _local_grads, _unchunk

import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm.hierarchical import exact_is_smaller
from date_optax._src.parallel.layout.distributed import fetch_replicated
from date_optax.checkpoint import CheckpointManager

HERE = os.path.dirname(os.path.abspath(__file__))
S, M = 2, 4  # slices, devices per slice
N = S * M
AX = ("dcn", "ici")
ROWS = 32  # rows of the global batch
STEPS = 3
QMAX = {"int8": 127.0, "int4": 7.0}


def slice_mesh(devices=None, slices=S):
  """`slices` slices over `devices` (default: all), the outer axis crossing them."""
  devices = np.array(jax.devices() if devices is None else devices)
  return Mesh(devices.reshape(slices, -1), AX)


# ---------------------------------------------------------------------------
# The float32 sync against psum, on a tree of odd shapes and dtypes.
# ---------------------------------------------------------------------------

_RNG = np.random.default_rng(3)
#: Every replica's gradient, stacked: a leaf that splits over 8 (w), one that
#: does not (b, 15 elements: padded to rows of 4), bfloat16 and int32 leaves.
GRADS = {"w": _RNG.normal(size=(N, 16, 8)).astype(np.float32),
         "b": _RNG.normal(size=(N, 5, 3)).astype(np.float32),
         "h": _RNG.normal(size=(N, 6)).astype(jnp.bfloat16),
         "i": _RNG.integers(-50, 50, size=(N, 7)).astype(np.int32)}


@functools.cache
def _mean_fn(mesh, sync, scatter):
  """The mean (or with `scatter` the update shards: over every replica for
  psum, over the slice's M devices for "hierarchical") as global arrays."""
  own = lambda tree: jax.tree.map(lambda x: x[0], tree)
  n, axes = (M, P("ici")) if sync.algorithm == "hierarchical" else (N, P(AX))
  specs = {k: P() if dp.update_shard_axis(v.shape[1:], n) is None or not scatter else axes
           for k, v in GRADS.items()}
  return jax.jit(compat.shard_map(
      lambda t: dp.sync_gradients(own(t), AX, sync, scatter=scatter), mesh=mesh,
      in_specs=P(AX), out_specs=specs))


def _global(mesh, tree):
  """Host arrays of all replicas -> global arrays split over the replicas (each
  process gives its own devices' rows)."""
  sharding = NamedSharding(mesh, P(AX))
  return {k: jax.make_array_from_callback(v.shape, sharding, lambda i, v=v: v[i])
          for k, v in tree.items()}


@pytest.mark.parametrize("scatter", [False, True])
def test_float32_equals_the_psum_mean(scatter):
  """Exact in-slice reduce-scatter, float32 psum across the slices, in-slice
  all-gather: the mean of every leaf (or with `scatter` its shards: w splits
  along axis 0 over the slice's devices, the same block on each slice, the
  others come back whole) to float32 rounding."""
  mesh = slice_mesh()
  g = _global(mesh, GRADS)
  got = _mean_fn(mesh, dp.GradSync("hierarchical"), scatter)(g)
  want = _mean_fn(mesh, dp.GradSync(), scatter)(g)
  for k, v in GRADS.items():
    assert got[k].dtype == v.dtype and got[k].shape == want[k].shape
    np.testing.assert_allclose(np.asarray(got[k], np.float64),
                               np.asarray(want[k], np.float64), rtol=1e-6, atol=1e-6)
    if k in ("w", "b"):
      np.testing.assert_allclose(np.asarray(got[k]), v.astype(np.float64).mean(0),
                                 rtol=1e-5, atol=1e-6)
  if scatter:
    assert got["w"].sharding.spec == P("ici") and want["w"].sharding.spec == P(AX)
  total = jax.jit(compat.shard_map(
      lambda t: dp.all_reduce(t[0], AX, algorithm="hierarchical"), mesh=mesh,
      in_specs=P(AX), out_specs=P()))(g["w"])
  np.testing.assert_allclose(np.asarray(total), GRADS["w"].astype(np.float64).sum(0),
                             rtol=1e-5, atol=1e-5)


def _bn_loss(params, batch, model_state):
  """A batch-norm-like running mean of 150 floats (a bias of width 150)."""
  h = batch["x"] @ params["w"] + params["b"]
  new = {"mean": 0.9 * model_state["mean"] + 0.1 * jnp.mean(h, axis=0),
         "count": model_state["count"] + 1}
  return jnp.mean((h - jnp.mean(h, axis=0)) ** 2), new


def test_model_state_crosses_the_slices_as_a_shard():
  """With "hierarchical" the running statistics are averaged as the gradient
  is: reduce-scatter in the slice, the 1/M shard across, all-gather; the
  same numbers as psum's mean, and no all-reduce over all 8 devices carries
  more than the step's few scalars."""
  mesh = slice_mesh()
  rng = np.random.default_rng(5)
  params = {"w": rng.normal(size=(8, 150)).astype(np.float32),
            "b": np.zeros(150, np.float32)}
  model_state = {"mean": np.zeros(150, np.float32), "count": np.zeros((), np.int32)}
  batch = {"x": rng.normal(size=(ROWS, 8)).astype(np.float32)}
  out, texts = {}, {}
  for sync in (None, dp.GradSync("hierarchical")):
    step = dp.make_train_step(_bn_loss, optax.sgd(0.1), mesh, data_axes=AX, grad_sync=sync,
                              donate=False)
    state = step.init(params, model_state=model_state)
    texts[sync] = step.lower(state, step.shard_batch(batch)).compile().as_text()
    for _ in range(2):
      state, _ = step(state, batch)
    out[sync] = state
  want, got = out[None], out[dp.GradSync("hierarchical")]
  np.testing.assert_allclose(got.model_state["mean"], want.model_state["mean"], rtol=1e-6,
                             atol=1e-7)
  assert int(got.model_state["count"]) == 2
  np.testing.assert_allclose(got.params["w"], want.params["w"], rtol=1e-6, atol=1e-7)
  whole = lambda text: [c for c in dp.collectives(text)
                        if c["kind"] == "all-reduce" and c["group_size"] == N]
  assert any(c["elements"] >= 150 for c in whole(texts[None]))  # psum: the whole mean
  assert all(c["elements"] <= 8 for c in whole(texts[dp.GradSync("hierarchical")]))


def test_more_than_two_data_axes_keep_all_but_the_first_inside_the_slice():
  # ("dcn", "data", "model") all carrying replicas (a step without sharding
  # rules on a Multislice mesh with a model axis): the first crosses slices.
  axes = ("dcn", "data", "model")
  mesh = Mesh(np.array(jax.devices()).reshape(S, 2, 2), axes)
  sync = dp.GradSync("hierarchical", comm_dtype="int8")
  own = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
  f = jax.jit(compat.shard_map(
      lambda t: dp.sync_gradients(own(t), axes, sync), mesh=mesh, in_specs=P(axes),
      out_specs=P()))
  sharding = NamedSharding(mesh, P(axes))
  w = jax.make_array_from_callback(GRADS["w"].shape, sharding, lambda i: GRADS["w"][i])
  got = np.asarray(f({"w": w})["w"], np.float64)
  want = GRADS["w"].astype(np.float64).mean(0)
  # int8 with block scales of 32 across the two slices: within a rounding step.
  np.testing.assert_allclose(got, want, atol=2 * np.abs(GRADS["w"]).max() / 127)
  assert not np.allclose(got, want, rtol=0, atol=1e-7)  # it did round


# ---------------------------------------------------------------------------
# int8 and int4 with error feedback over three steps, against NumPy.
# ---------------------------------------------------------------------------


def _rows(x, axis):
  """A leaf as M rows `(M, w)`: row i what in-slice device i reduces (with
  weight-update sharding, block i of the leaf split along `axis`: device i's
  shard in every slice)."""
  if axis is None:
    flat = x.reshape(-1)
    return np.pad(flat, (0, (-flat.size) % M)).reshape(M, -1)
  return np.moveaxis(x, axis, 0).reshape(M, -1)


def _hierarchical(shares, worker, server, axis, qmax):
  """One hierarchical reduction of one leaf.

  shares: (N, *shape), replica k = s·M + i's share g / N; worker (N, w) and
  server (N, ceil(w / S)): device k's residuals. Returns the mean leaf and
  the new residuals."""
  shape = shares.shape[1:]
  rows = np.stack([_rows(shares[k], axis) for k in range(N)])  # (N, M, w)
  slice_sum = rows.reshape(S, M, M, -1).sum(axis=1)  # [s, i]: row i of slice s's sum
  worker, server = worker.copy(), server.copy()
  w = slice_sum.shape[2]
  piece, cut = (w,), None  # device (s, i)'s row, summed whole across the slices
  out_rows = []
  for i in range(M):
    devs = [s * M + i for s in range(S)]
    p = (slice_sum[:, i] + worker[devs]).reshape((S,) + piece)
    chunks = [_chunks(p[s], S, cut) for s in range(S)]  # (S, c) per sending slice
    c = chunks[0].shape[1]
    sent = np.stack([[_block_round(ch[j], qmax)[:c] for j in range(S)] for ch in chunks])
    worker[devs] = (p - np.stack([_unchunk(sent[s], piece, cut) for s in range(S)])
                    ).reshape(S, -1)
    total = sent.sum(axis=0) + server[devs]  # owner j's sum of the chunks j
    out = np.stack([_block_round(total[j], qmax)[:c] for j in range(S)])
    server[devs] = total - out
    out_rows.append(_unchunk(out, piece, cut).reshape(-1))
  if axis is None:
    mean = np.stack(out_rows).reshape(-1)[: int(np.prod(shape))].reshape(shape)
  else:  # device (s, i) keeps block i; the step gathers the parameters in the slice
    moved = (shape[axis],) + tuple(d for j, d in enumerate(shape) if j != axis)
    mean = np.moveaxis(np.stack(out_rows).reshape(moved), 0, axis)
  return mean, worker, server


#: Whole leaves whose shard crosses the slices in float32: b's 3 elements
#: leave a shard of 1 per device, 1 per chunk padded to a block of 8 (9 or
#: 5 bytes with its exponent, against 4 in float32).
EXACT = {"b"}


def _reference(batches, qmax, split):
  """SGD(LR) over the steps: params, worker residuals, server residuals."""
  params = {k: v.astype(np.float64) for k, v in _params().items()}
  worker = {k: np.zeros((N, -(-v.size // M))) for k, v in params.items()}
  server = {k: np.zeros((N, -(-worker[k].shape[1] // S))) for k in params}
  for batch in batches:
    g = _local_grads(batch, N)
    for k in params:
      if k in EXACT and split.get(k) is None:
        mean = g[k].mean(0)  # exact; the residuals stay zero
      else:
        mean, worker[k], server[k] = _hierarchical(g[k] / N, worker[k], server[k],
                                                   split.get(k), qmax)
      params[k] = params[k] - LR * mean
  return params, worker, server


@pytest.mark.parametrize("fmt,shard_update", [("int8", False), ("int4", False),
                                              ("int8", True)])
def test_error_feedback_matches_numpy_over_three_steps(fmt, shard_update):
  """make_train_step over ("dcn", "ici"), block scales of 8: parameters and both
  residuals (shards of 1/4 of each leaf, and 1/2 of that) after every step."""
  sync = dp.GradSync("hierarchical", comm_dtype=fmt, block_size=BLOCK, error_feedback=True)
  step = dp.make_train_step(_loss, optax.sgd(LR), slice_mesh(), data_axes=AX, donate=False,
                            grad_sync=sync, shard_update=shard_update)
  state = step.init(_params())
  assert state.grad_residual.worker["w"].shape == (N, 128 // M)
  assert state.grad_residual.hop["w"].shape == (N, 128 // M // S)
  assert state.grad_residual.hop["b"].shape == (N, 1)  # b: 3 -> rows of 1 -> 1 chunk
  split = {"w": 0} if shard_update else {}
  for t in range(1, STEPS + 1):
    state, metrics = step(state, _batch(t))
    assert not bool(metrics["skipped"])
    params, worker, server = _reference([_batch(s) for s in range(1, t + 1)], QMAX[fmt],
                                        split)
    for k in params:
      np.testing.assert_allclose(np.asarray(state.params[k]), params[k], rtol=1e-6,
                                 atol=1e-12)
      np.testing.assert_allclose(np.asarray(state.grad_residual.worker[k]), worker[k],
                                 rtol=1e-6, atol=1e-12)
      np.testing.assert_allclose(np.asarray(state.grad_residual.hop[k]), server[k],
                                 rtol=1e-6, atol=1e-12)
  # Both stages round something on these data.
  assert np.abs(np.asarray(state.grad_residual.worker["w"])).max() > 0
  assert np.abs(np.asarray(state.grad_residual.hop["w"])).max() > 0


# ---------------------------------------------------------------------------
# The other builders, the ring across the slices and sharded parameters.
# ---------------------------------------------------------------------------


def _constant_batch():
  rng = np.random.default_rng(7)
  return {"x": rng.normal(size=(ROWS, 16, 8)).astype(np.float32),
          "z": (rng.normal(size=(ROWS, 3)) * 1e-3).astype(np.float32)}


def _unrows(rows, shape, axis):
  """Inverse of `_rows`: `(M, w)` rows back as the leaf."""
  if axis is None:
    return rows.reshape(-1)[: int(np.prod(shape))].reshape(shape)
  moved = (shape[axis],) + tuple(d for j, d in enumerate(shape) if j != axis)
  return np.moveaxis(rows.reshape(moved), 0, axis)


def test_a_shard_smaller_than_its_blocks_crosses_exactly_with_its_residuals():
  """b (3 elements: a shard of 1 per device, padded to a block in each chunk)
  crosses the slices in float32; the residuals it holds from before (a
  checkpoint of another layout) are added once, the worker's from every
  device, the two-shot server's from the owner of the chunk it covers, and
  come back zero."""
  mesh = slice_mesh()
  rng = np.random.default_rng(11)
  shares = rng.normal(size=(N, 3)).astype(np.float32)
  worker = rng.normal(size=(N, 1)).astype(np.float32)
  hop = rng.normal(size=(N, 1)).astype(np.float32)
  sync = dp.GradSync("hierarchical", comm_dtype="int8", error_feedback=True)
  # Bytes across the slices: a shard of 1 in int8 is 2 chunks x (32 + 1
  # exponent) = 66 against 4 in float32; w's shard of 32 with blocks of 8 is
  # 2 x (16 + 2) = 36 against 128.
  assert exact_is_smaller(1, S, 32, 8) and not exact_is_smaller(32, S, 8, 8)
  assert exact_is_smaller(16, 4, 32, 4) and not exact_is_smaller(128, 4, 32, 4)

  def f(b, w, h):
    state = dp.ErrorFeedbackState(worker={"b": w[0]}, hop={"b": h[0]})
    out, res = dp.sync_gradients({"b": b[0]}, AX, sync, residual=state)
    return out["b"], res.worker["b"][None], res.hop["b"][None]

  run = jax.jit(compat.shard_map(f, mesh=mesh, in_specs=(P(AX),) * 3,
                                 out_specs=(P(), P(AX), P(AX))))
  sharding = NamedSharding(mesh, P(AX))
  put = lambda a: jax.make_array_from_callback(a.shape, sharding, lambda i: a[i])  # noqa: E731
  got, new_w, new_h = run(put(shares), put(worker), put(hop))
  # Element j is row j of each slice's sum (device (s, j) of every slice s);
  # the chunk holding it belongs to slice 0, whose server residual counts.
  want = [sum(shares[s * M:(s + 1) * M, j].sum() / N + worker[s * M + j, 0] for s in range(S))
          + hop[j, 0] for j in range(3)]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
  assert not np.asarray(new_w).any() and not np.asarray(new_h).any()


def test_ring_across_slices_loses_nothing_with_sharded_updates():
  """make_replicated_train_step, dcn_algorithm="ring", int4, shard_update: SGD(1.0)
  from zero on a constant gradient. After 4 steps the parameters are the exact
  sum of the means minus what the residuals hold (worker and ring hop, each a
  shard of row i, summed over the slices and put back in place)."""
  steps, batch = 4, _constant_batch()
  g = _local_grads(batch, N)
  exact = {k: -steps * g[k].mean(0) for k in g}
  sync = dp.GradSync("hierarchical", comm_dtype="int4", dcn_algorithm="ring",
                     error_feedback=True)
  step = dp.make_replicated_train_step(_loss, optax.sgd(1.0), slice_mesh(), grad_sync=sync,
                                       data_axes=AX, shard_update=True,
                                       step_config=dp.StepConfig(donate=False))
  state = step.init(jax.tree.map(np.zeros_like, _params()))
  assert state.grad_residual.hop["w"].shape == (N, 128 // M)  # the ring's: the whole shard
  for _ in range(steps):
    state, _ = step(state, batch)
  for k in exact:
    res = state.grad_residual
    held = (np.asarray(res.worker[k], np.float64) + np.asarray(res.hop[k], np.float64))
    held = _unrows(held.reshape(S, M, -1).sum(axis=0), exact[k].shape,
                   0 if k == "w" else None)
    gap = np.asarray(state.params[k], np.float64) - exact[k]
    np.testing.assert_allclose(gap, held, rtol=0, atol=1e-5 * np.abs(exact[k]).max())
    # b's shard of 1 element crosses in float32 (EXACT): nothing held back.
    assert (np.abs(held).max() == 0) == (k in EXACT)
  # One int4 step's rounding (a grid step of 1/7 to 1/14 of a block's largest value),
  # spread over the 4 steps.
  ratio = np.linalg.norm(np.asarray(state.params["w"]) - exact["w"]) / np.linalg.norm(
      exact["w"])
  assert ratio < 0.1, ratio


def test_sharded_builder_over_slices_and_a_model_axis():
  """make_train_step with w split over "model" on a (2, 2, 2) ("dcn", "ici",
  "model") mesh and weight-update sharding: each model shard of w is reduced
  on its own and scattered, its residuals flat shards laid out over (data,
  model); int8 ends within 1 % of float32."""
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), AX + ("model",))
  build = lambda sync: dp.make_train_step(
      _loss, optax.sgd(LR), mesh, data_axes=AX, param_sharding=[("w", P("model"))],
      grad_sync=sync, donate=False, shard_update=True)
  step = build(dp.GradSync("hierarchical", comm_dtype="int8", error_feedback=True))
  exact = build(None)
  state, ref = step.init(_params()), exact.init(_params())
  worker, hop = state.grad_residual.worker["w"], state.grad_residual.hop["w"]
  # 4 replicas; each model shard of w (64 elements) -> 32 per device, 16 after the slices.
  assert worker.shape == (4, 2 * 32) and worker.sharding.spec == P(AX, "model")
  assert hop.shape == (4, 2 * 16) and hop.sharding.spec == P(AX, "model")
  for t in range(1, STEPS + 1):
    state, _ = step(state, _batch(t))
    ref, _ = exact(ref, _batch(t))
  for k in ("w", "b"):
    a, b = np.asarray(state.params[k]), np.asarray(ref.params[k])
    moved = np.asarray(_params()[k]) - b
    assert np.linalg.norm(a - b) <= 0.01 * np.linalg.norm(moved), k


# ---------------------------------------------------------------------------
# Two processes as two slices.
# ---------------------------------------------------------------------------


@functools.cache
def _int8_step(mesh):
  return dp.make_train_step(_loss, optax.sgd(LR), mesh, data_axes=AX, donate=False,
                            grad_sync=dp.GradSync("hierarchical", comm_dtype="int8",
                                                  error_feedback=True))


def multislice_results(mesh):
  """What the two-process test compares, on `mesh` (2 slices of 4): the float32
  hierarchical and psum means of GRADS, and three int8 error-feedback steps
  (parameters and residuals, fetched whole by every process)."""
  g = _global(mesh, GRADS)
  out = {}
  for name, sync in (("hierarchical", dp.GradSync("hierarchical")), ("psum", dp.GradSync())):
    out.update({f"{name}/{k}": np.asarray(v, np.float64)
                for k, v in fetch_replicated(_mean_fn(mesh, sync, False)(g)).items()})
  step = _int8_step(mesh)
  state = step.init(_params())
  share = ROWS // jax.process_count()
  rows = slice(jax.process_index() * share, (jax.process_index() + 1) * share)
  for t in range(1, STEPS + 1):
    state, _ = step(state, {k: v[rows] for k, v in _batch(t).items()})
  for k, v in fetch_replicated(state.params).items():
    out[f"int8/params/{k}"] = v
  for part in ("worker", "hop"):
    for k, v in getattr(state.grad_residual, part).items():
      out[f"int8/{part}/{k}"] = np.asarray(multihost_utils.process_allgather(v, tiled=True))
  return out


def test_two_processes_as_two_slices_match_one_process(tmp_path):
  """Two processes of 4 CPU devices (gloo), each one slice: the float32 sync
  equals psum and this process's 8-device result, and three int8 steps with
  error feedback give the same parameters and residuals."""
  from workers import WorkerPair  # noqa: PLC0415

  outs = [tmp_path / f"out{i}.npz" for i in range(2)]
  pair = WorkerPair(os.path.join(HERE, "hierarchical_worker.py"),
                    lambda i: ["--out", str(outs[i])],
                    [tmp_path / f"log{i}.txt" for i in range(2)], cwd=HERE, timeout=120,
                    what="hierarchical sync workers")
  for i, rc in enumerate(pair.wait()):
    if rc != 0:
      pytest.fail(f"worker {i} exited with {rc}:\n{pair.log(i)[-3000:]}")
  here = multislice_results(slice_mesh())
  for out in outs:
    got = dict(np.load(out))
    assert sorted(got) == sorted(here)
    for k in GRADS:
      np.testing.assert_allclose(got[f"hierarchical/{k}"], got[f"psum/{k}"], rtol=1e-6,
                                 atol=1e-6)
    for key, want in here.items():
      np.testing.assert_allclose(got[key], want, rtol=1e-6, atol=1e-7, err_msg=key)


# ---------------------------------------------------------------------------
# Checkpoints: saved on two slices, resumed on one.
# ---------------------------------------------------------------------------


def test_saved_on_two_slices_resumes_on_one_with_fresh_residuals(tmp_path):
  """The residuals (shards of 1/M per device) are the target's zeros, with a
  warning naming both replica counts and both slice layouts; the same 8
  replicas laid out as 4 slices of 2 have other shards and reset too."""
  before = _int8_step(slice_mesh())
  state = before.init(_params())
  for t in range(1, 3):
    state, _ = before(state, _batch(t))
  one = _int8_step(slice_mesh(jax.devices()[:4], slices=1))
  four = _int8_step(slice_mesh(slices=4))
  with CheckpointManager(tmp_path, async_save=False) as mngr:
    mngr.save(2, state)
    target = one.init(_params())
    with pytest.warns(UserWarning, match=r"saved with 8 replicas and the target has 4: they "
                                         r"are reset to zeros.* dcn=2 × ici=4 when saved, "
                                         r"the target over dcn=1 × ici=4"):
      restored, _ = mngr.restore(target)
    with pytest.warns(UserWarning, match=r"dcn=2 × ici=4 when saved, the target over "
                                         r"dcn=4 × ici=2"):
      relaid, _ = mngr.restore(four.init(_params()))
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # the same layout reads them back, silently
      same, _ = mngr.restore(before.init(_params()))
  for part in ("worker", "hop"):
    got, fresh = getattr(restored.grad_residual, part), getattr(target.grad_residual, part)
    for k in got:
      assert got[k].shape == fresh[k].shape and got[k].sharding == fresh[k].sharding
      np.testing.assert_array_equal(np.asarray(got[k]), 0.0)
      np.testing.assert_array_equal(np.asarray(getattr(relaid.grad_residual, part)[k]), 0.0)
      np.testing.assert_array_equal(np.asarray(getattr(same.grad_residual, part)[k]),
                                    np.asarray(getattr(state.grad_residual, part)[k]))
  assert restored.grad_residual.worker["w"].shape == (4, 128 // M)  # one slice of 4
  assert relaid.grad_residual.worker["w"].shape == (8, 128 // 2)  # slices of 2
  for k in ("w", "b"):
    np.testing.assert_array_equal(np.asarray(restored.params[k]), np.asarray(state.params[k]))
  resumed, metrics = one(restored, _batch(3))
  assert not bool(metrics["skipped"]) and np.isfinite(np.asarray(resumed.params["w"])).all()


# ---------------------------------------------------------------------------
# Refusals, and the cost model.
# ---------------------------------------------------------------------------


def test_bad_inputs_are_refused_naming_the_argument():
  with pytest.raises(ValueError, match=r"grid=\(2, 4\) is the layout of the torus"):
    dp.GradSync("hierarchical", grid=(2, 4))
  with pytest.raises(ValueError, match=r"dcn_algorithm must be None or one of "
                                       r"\('two_shot', 'ring'\).*got 'torus'"):
    dp.GradSync("hierarchical", dcn_algorithm="torus")
  with pytest.raises(ValueError, match=r"dcn_algorithm='ring' is the cross-slice algorithm "
                                       r"of algorithm=\"hierarchical\".*got algorithm='ring'"):
    dp.GradSync("ring", dcn_algorithm="ring")
  with pytest.raises(ValueError, match=r"must be one of \('psum', 'ring', 'torus', "
                                       r"'two_shot', 'hierarchical'\)"):
    dp.GradSync("multislice")
  assert dp.GradSync("hierarchical").dcn_algorithm == "two_shot"
  assert dp.GradSync("ring").dcn_algorithm is None
  one_axis = r'grad_reduce="hierarchical" needs two data axes \(slices, in-slice\)'
  with pytest.raises(ValueError, match=one_axis + r".*got data axes \('data',\)"):
    dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), grad_reduce="hierarchical")
  with pytest.raises(ValueError, match=one_axis):
    dp.make_pmap_train_step(_loss, optax.sgd(LR), grad_reduce="hierarchical")
  with pytest.raises(ValueError, match=one_axis):
    jax.jit(compat.shard_map(lambda t: dp.sync_gradients(t, "data", dp.GradSync(
        "hierarchical")), mesh=dp.data_mesh(), in_specs=P("data"), out_specs=P("data")))(
        jnp.ones(8))
  sync = dp.GradSync("hierarchical", comm_dtype="int8", error_feedback=True)
  with pytest.raises(ValueError, match=r"pass chunks=N .* and slices=S"):
    dp.ErrorFeedbackState.zeros({"w": jnp.ones(8)}, sync, chunks=8)
  with pytest.raises(ValueError, match=r"slices=3 must divide the number of replicas, "
                                       r"chunks=8"):
    dp.ErrorFeedbackState.zeros({"w": jnp.ones(8)}, sync, chunks=8, slices=3)
  with pytest.raises(ValueError, match=r"slices must be"):
    dp.ErrorFeedbackState.zeros({"w": jnp.ones(8)}, sync, chunks=8, slices=0)
  # A two_shot residual (the worker shaped like the gradient) fed to hierarchical.
  flat = dp.ErrorFeedbackState.zeros(jnp.zeros(64), dp.GradSync(
      "two_shot", comm_dtype="int8", error_feedback=True), chunks=8)
  mesh = slice_mesh()
  with pytest.raises(ValueError, match=r"hierarchical's worker residual of a leaf over 2 "
                                       r"slices of 4 devices is \(2,\) on each device, got "
                                       r"\(64,\).*slices=S"):
    jax.jit(compat.shard_map(lambda t, e: dp.sync_gradients(t, AX, sync, residual=e)[0],
                             mesh=mesh, in_specs=(P(AX), P()), out_specs=P(AX)))(
        jnp.ones(64), flat)


def test_cost_prices_the_slices_network_apart():
  """allreduce_cost("hierarchical", (S, N)): a float32 ring over N in the slice at
  (alpha, beta), the cross-slice algorithm over S on 1/N of the payload at
  (dcn_alpha, dcn_beta), against numbers worked by hand."""
  mb, alpha, beta, dcn_alpha, dcn_beta = 1e6, 1e-6, 2e-11, 1e-5, 1 / 3e9
  kw = dict(alpha=alpha, beta=beta, dcn_alpha=dcn_alpha, dcn_beta=dcn_beta,
            comm_dtype="int8", block_size=32)
  cost = dp.allreduce_cost("hierarchical", (2, 4), mb, **kw)
  # In the slice: 2·3 steps, 2·3/4 of 1 MB. Across: 2 steps, each device's
  # quarter in int8 with 8/32 bit of scales, 1e6 · 8.25 / 32 / 4 = 64453.125
  # bytes, of which (2-1)/2, twice.
  assert (cost.latency_steps, cost.dcn_latency_steps) == (8, 2)
  np.testing.assert_allclose(cost.bytes_per_link, 1.5e6)
  np.testing.assert_allclose(cost.dcn_bytes_per_link, 64453.125)
  np.testing.assert_allclose(cost.seconds, 6e-6 + 3e-5 + 2e-5 + 64453.125 / 3e9)
  np.testing.assert_allclose(cost.seconds, 7.7484375e-5)
  four = dp.allreduce_cost("hierarchical", (4, 4), mb, **kw)
  ring = dp.allreduce_cost("hierarchical", (4, 4), mb, dcn_algorithm="ring", **kw)
  assert (four.dcn_latency_steps, ring.dcn_latency_steps) == (2, 6)
  np.testing.assert_allclose(four.dcn_bytes_per_link, 2 * 3 / 4 * 64453.125)
  np.testing.assert_allclose(ring.seconds - four.seconds, 4 * dcn_alpha)
  flat = dp.allreduce_cost("two_shot", 8, mb, alpha=dcn_alpha, beta=dcn_beta,
                           comm_dtype="int8", block_size=32)
  assert cost.seconds < flat.seconds / 2  # the slow network carries 1/4 of it
  with pytest.raises(ValueError, match=r"needs dcn_alpha and dcn_beta"):
    dp.allreduce_cost("hierarchical", (2, 4), mb, alpha=alpha, beta=beta, dcn_alpha=1e-5)
  with pytest.raises(ValueError, match=r"dcn_alpha and dcn_beta price the cross-slice"):
    dp.allreduce_cost("ring", 8, mb, alpha=alpha, beta=beta, dcn_alpha=1e-5, dcn_beta=1e-9)
  with pytest.raises(ValueError, match=r"needs mesh_shape=\(S, N_ici\)"):
    dp.allreduce_cost("hierarchical", 8, mb, alpha=alpha, beta=beta, dcn_alpha=1e-5,
                      dcn_beta=1e-9)
  with pytest.raises(ValueError, match=r"dcn_beta must be"):
    dp.allreduce_cost("hierarchical", (2, 4), mb, alpha=alpha, beta=beta, dcn_alpha=1e-5,
                      dcn_beta=-1.0)
  with pytest.raises(ValueError, match=r"dcn_algorithm must be None or one of"):
    dp.allreduce_cost("hierarchical", (2, 4), mb, alpha=alpha, beta=beta, dcn_alpha=1e-5,
                      dcn_beta=1e-9, dcn_algorithm="psum")
  with pytest.raises(ValueError, match=r"dcn_algorithm='ring' is the cross-slice"):
    dp.allreduce_cost("two_shot", 8, mb, alpha=alpha, beta=beta, dcn_algorithm="ring")
