"""GradSync("two_shot"): the compressed reduce-scatter of 1-bit Adam, against NumPy.

The reference follows the description (Tang et al. 2021), not the code: each
replica r adds its worker residual to its share, `p = g_r / N + e_r`, cuts
every leaf into N chunks (flattened and zero-padded to a multiple of N, or
with weight-update sharding the leaf's shards), rounds every chunk once with
a scale per block of BLOCK elements (blocks never cross a leaf; a leaf whose
rows split among the replicas in whole blocks takes BLOCK rows of a column,
`_two_shot_columns`) and keeps
`e_r' = p - C(p)`; owner k sums the N chunks k it receives, adds its server
residual `s_k` (1/N of the leaf), rounds the sum once and keeps the rest;
everyone gets every owner's rounded chunk. The model and the dyadic data are
those of tests/test_error_feedback.py, so every value is exact in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from test_error_feedback import _batch, _loss, _params  # the same model and rows

import date_optax.parallel as dp
from date_optax._src.parallel import compat

LR = 0.5
BLOCK = 8
ROWS = 32  # rows of the global batch


def _local_grads(batch, n):
  """Each replica's gradient, (n, ...) float64 (exact: dyadic means)."""
  x = batch["x"].reshape(n, ROWS // n, 16, 8).astype(np.float64).mean(1)
  z = batch["z"].reshape(n, ROWS // n, 3).astype(np.float64).mean(1)
  return {"w": x, "b": z}


def _block_round(v, qmax=127.0):
  """One int8 message with a power-of-two scale per block of BLOCK, measured on
  it: 2^e round(v 2^-e), e the smallest with max|block| 2^-e <= qmax."""
  v = np.pad(v, (0, (-v.size) % BLOCK))
  out = np.zeros_like(v)
  for i in range(0, v.size, BLOCK):
    b = v[i : i + BLOCK]
    m = np.abs(b).max()
    if m == 0:
      continue
    e = math.ceil(math.log2(m / qmax))
    while m * 2.0**-e > qmax:
      e += 1
    while m * 2.0 ** -(e - 1) <= qmax:
      e -= 1
    out[i : i + BLOCK] = np.clip(np.round(b * 2.0**-e), -qmax, qmax) * 2.0**e
  return out


def _chunks(a, n, axis):
  """A leaf as n chunks (n, c): its shards along `axis`, or flattened and padded."""
  if axis is not None:
    return np.moveaxis(a, axis, 0).reshape(n, -1)
  flat = a.reshape(-1)
  return np.pad(flat, (0, (-flat.size) % n)).reshape(n, -1)


def _unchunk(rows, shape, axis):
  if axis is not None:
    moved = (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)
    return np.moveaxis(rows.reshape(moved), 0, axis)
  return rows.reshape(-1)[: math.prod(shape)].reshape(shape)


def _two_shot(contrib, worker, server, axis, feedback=True):
  """One two-shot reduction of one leaf over n replicas.

  contrib, worker: (n, *shape) (each replica's share g / N, its residual);
  server: (n, c) (owner k's residual of its chunk k). Returns the reduced
  leaf, the new worker and server residuals."""
  n, shape = contrib.shape[0], contrib.shape[1:]
  p = contrib + worker if feedback else contrib
  sent = np.stack([_chunks(p[r], n, axis) for r in range(n)])  # (n replicas, n chunks, c)
  c = sent.shape[2]
  sent = np.stack([[_block_round(sent[r, k])[:c] for k in range(n)] for r in range(n)])
  new_worker = np.stack([p[r] - _unchunk(sent[r], shape, axis) for r in range(n)])
  total = sent.sum(axis=0)  # owner k's float32 sum of the n chunks k
  t = total + server if feedback else total
  out = np.stack([_block_round(t[k])[:c] for k in range(n)])
  new_server = t - out
  if not feedback:
    new_worker, new_server = worker, server
  return _unchunk(out, shape, axis), new_worker, new_server


def _reference(batches, n, split, feedback=True):
  """SGD(LR) over the steps: params, worker residuals, server residuals."""
  params = {k: v.astype(np.float64) for k, v in _params().items()}
  worker = {k: np.zeros((n,) + v.shape) for k, v in params.items()}
  server = {k: np.zeros((n, -(-v.size // n))) for k, v in params.items()}
  for batch in batches:
    g = _local_grads(batch, n)
    for k in params:
      mean, worker[k], server[k] = _two_shot(g[k] / n, worker[k], server[k], split.get(k),
                                             feedback)
      params[k] = params[k] - LR * mean
  return params, worker, server


BATCHES = [_batch(s) for s in range(1, 6)]


def _check(state, params, worker=None, server=None):
  for k in params:
    np.testing.assert_allclose(np.asarray(state.params[k]), params[k], rtol=1e-6, atol=1e-12)
    if worker is not None:
      np.testing.assert_allclose(np.asarray(state.grad_residual.worker[k]), worker[k],
                                 rtol=1e-6, atol=1e-12)
      np.testing.assert_allclose(np.asarray(state.grad_residual.hop[k]), server[k],
                                 rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("shard_update,feedback", [
    (False, True), (True, True), (False, False)])
def test_two_shot_matches_numpy_over_five_steps(shard_update, feedback):
  """The replicated builder, 8 replicas, int8 with blocks of 8: parameters and
  both residuals after each of 5 steps, against the description in NumPy."""
  step = dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), donate=False,
                            grad_reduce="two_shot", comm_dtype="int8", block_size=BLOCK,
                            error_feedback=feedback, shard_update=shard_update)
  state = step.init(_params())
  split = {"w": 0} if shard_update else {}  # b (3,) does not split over 8
  for t in range(1, len(BATCHES) + 1):
    state, metrics = step(state, BATCHES[t - 1])
    assert not bool(metrics["skipped"])
    params, worker, server = _reference(BATCHES[:t], 8, split, feedback)
    _check(state, params, *((worker, server) if feedback else ()))
  if feedback:  # both stages round something on these data
    assert np.abs(np.asarray(state.grad_residual.hop["w"])).max() > 0
    assert np.abs(np.asarray(state.grad_residual.worker["w"])).max() > 0
  else:
    assert state.grad_residual is None


@pytest.mark.parametrize("shard_update", [False, True])
def test_two_shot_on_the_sharded_builder_matches_numpy(shard_update):
  """A (4 data, 2 model) mesh with w split over "model": every model shard of w
  is reduced on its own over the 4 replicas (its server residual: 1/4 of the
  shard), b whole on every device; 5 steps against NumPy."""
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  step = dp.make_train_step(_loss, optax.sgd(LR), mesh, donate=False,
                            param_sharding=[("w", P("model"))], grad_reduce="two_shot",
                            comm_dtype="int8", block_size=BLOCK, error_feedback=True,
                            shard_update=shard_update)
  state = step.init(_params())
  hop = state.grad_residual.hop
  assert hop["w"].shape == (4, 2 * 16) and hop["w"].sharding.spec == P("data", "model")
  assert hop["b"].shape == (4, 1)
  n = 4
  params = {k: v.astype(np.float64) for k, v in _params().items()}
  worker = {k: np.zeros((n,) + v.shape) for k, v in params.items()}
  server = {"w": np.zeros((n, 32)), "b": np.zeros((n, 1))}
  for batch in BATCHES:
    state, _ = step(state, batch)
    g = _local_grads(batch, n)
    mean_w = []
    for m in range(2):  # model shard m: rows 8m..8m+8 of w, a (8, 8) leaf
      rows, cols = slice(8 * m, 8 * m + 8), slice(16 * m, 16 * m + 16)
      out, worker["w"][:, rows], server["w"][:, cols] = _two_shot(
          g["w"][:, rows] / n, worker["w"][:, rows], server["w"][:, cols],
          0 if shard_update else None)
      mean_w.append(out)
    mean_b, worker["b"], server["b"] = _two_shot(g["b"] / n, worker["b"], server["b"], None)
    params = {"w": params["w"] - LR * np.concatenate(mean_w), "b": params["b"] - LR * mean_b}
    _check(state, params, worker, server)


def _pmap_equals_mesh(loss, params, batches, sync, leaf):
  """Runs the pmap and the replicated mesh builders side by side; their
  residuals and `leaf`'s parameters must be the same bits. Returns both states."""
  config = dp.StepConfig(donate=False)
  pmap = dp.make_pmap_train_step(loss, optax.sgd(LR), grad_sync=sync, step_config=config)
  jit = dp.make_replicated_train_step(loss, optax.sgd(LR), dp.data_mesh(), grad_sync=sync,
                                      step_config=config)
  a, b = pmap.init(params), jit.init(params)
  for batch in batches:
    a, _ = pmap(a, batch)
    b, _ = jit(b, batch)
  for x, y in zip(jax.tree.leaves(b.grad_residual), jax.tree.leaves(a.grad_residual),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal(np.asarray(b.params[leaf]), np.asarray(a.params[leaf][0]))
  return a, b


def test_pmap_two_shot_equals_the_mesh_step_bit_for_bit():
  sync = dp.GradSync("two_shot", comm_dtype="int4", rounding="stochastic",
                     error_feedback=True)
  a, _ = _pmap_equals_mesh(_loss, _params(), BATCHES[:3], sync, "w")
  assert a.grad_residual.hop["w"].shape == (8, 16)


def _constant_batch():
  rng = np.random.default_rng(7)
  return {"x": rng.normal(size=(ROWS, 16, 8)).astype(np.float32),
          "z": (rng.normal(size=(ROWS, 3)) * 1e-3).astype(np.float32)}


def _held(res, k, n, shape, axis):
  """What the residuals hold, summed over devices, in the leaf's layout."""
  worker = np.asarray(res.worker[k], np.float64).sum(0)
  return worker + _unchunk(np.asarray(res.hop[k], np.float64), shape, axis)


@pytest.mark.parametrize("mesh_kind,options", [
    ("data", {"comm_dtype": "int4"}),
    ("data", {"comm_dtype": "float8_e4m3fn", "aps": True, "shard_update": True}),
    ("torus", {"comm_dtype": "int8", "measured_shift": True, "rounding": "stochastic"}),
    ("data", {"comm_dtype": "int4", "residual_dtype": "bfloat16"}),
], ids=["int4-blocks", "fp8-aps-sharded", "torus-int8-shift-stochastic", "int4-bf16-residuals"])
def test_nothing_is_lost_only_delayed(mesh_kind, options):
  """SGD(1.0) from zero on a constant gradient: after 6 steps the parameters
  are the exact sum of the means minus what the residuals hold (worker
  residuals summed over replicas, plus the owners' chunks put back in place).
  A rounding without its residual would break the equality."""
  steps, batch = 6, _constant_batch()
  mesh = dp.torus_mesh(2, 4) if mesh_kind == "torus" else dp.data_mesh()
  g = _local_grads(batch, 8)
  exact = {k: -steps * g[k].mean(0) for k in g}
  shard_update = options.pop("shard_update", False)
  step = dp.make_train_step(_loss, optax.sgd(1.0), mesh, donate=False,
                            shard_update=shard_update,
                            grad_sync=dp.GradSync("two_shot", error_feedback=True, **options))
  state = step.init(jax.tree.map(np.zeros_like, _params()))
  for _ in range(steps):
    state, _ = step(state, batch)
  for k in exact:
    axis = 0 if shard_update and k == "w" else None
    gap = np.asarray(state.params[k], np.float64) - exact[k]
    held = _held(state.grad_residual, k, 8, exact[k].shape, axis)
    # bfloat16 storage rounds each residual once more (not fed back): 2^-9
    # of what it holds.
    tol = 1e-5 if "residual_dtype" not in options else 2e-3
    np.testing.assert_allclose(gap, held, rtol=0, atol=tol * np.abs(exact[k]).max())
  assert np.abs(np.asarray(state.grad_residual.hop["w"], np.float32)).max() > 0
  # b (3,) over 8 owners: owners 3 to 7 hold only pad positions, which stay zero.
  hop_b = np.asarray(state.grad_residual.hop["b"], np.float32)
  assert hop_b.shape == (8, 1) and np.abs(hop_b[:3]).max() > 0
  np.testing.assert_array_equal(hop_b[3:], 0.0)


def test_constant_gradient_int4_ends_within_2_percent_of_float32():
  """The issue-34 case (24 steps, int4, blocks of 32) over two_shot: two
  roundings per element instead of one per hop, both fed back."""
  steps, batch = 24, _constant_batch()
  g = _local_grads(batch, 8)
  exact = {k: -steps * g[k].mean(0) for k in g}
  step = dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), donate=False,
                            grad_reduce="two_shot", comm_dtype="int4", error_feedback=True)
  state = step.init(jax.tree.map(np.zeros_like, _params()))
  for _ in range(steps):
    state, _ = step(state, batch)
  errors = {k: float(np.linalg.norm(np.asarray(state.params[k]) - exact[k])
                     / np.linalg.norm(exact[k])) for k in exact}
  print(f"two_shot int4, 24 steps, |p - p_float32| / |p_float32|: {errors}")
  assert max(errors.values()) < 0.02, errors


@pytest.mark.parametrize("residual_dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_residual_memory_is_one_and_one_nth_gradient(residual_dtype, itemsize):
  """Per device: the worker residual is one gradient, the server residual
  ceil(size / N) per leaf; the ring keeps two gradients."""
  sync = dp.GradSync("two_shot", comm_dtype="int8", error_feedback=True,
                     residual_dtype=residual_dtype)
  step = dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), grad_sync=sync)
  state = step.init(_params())
  sizes = [v.size for v in jax.tree.leaves(_params())]
  per_device = dp.bytes_per_device(state.grad_residual)
  assert per_device == itemsize * sum(s + -(-s // 8) for s in sizes)  # (128+16) + (3+1)
  ring = dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), grad_sync=dp.GradSync(
      "ring", comm_dtype="int8", error_feedback=True, residual_dtype=residual_dtype))
  ring_bytes = dp.bytes_per_device(ring.init(_params()).grad_residual)
  assert ring_bytes == 2 * itemsize * sum(sizes)
  print(f"residual bytes per device ({residual_dtype}): two_shot {per_device}, "
        f"ring {ring_bytes}, gradient {itemsize * sum(sizes)}")
  zeros = dp.ErrorFeedbackState.zeros({"w": jnp.ones((5, 7))}, sync, chunks=8)
  assert zeros.worker["w"].shape == (5, 7) and zeros.hop["w"].shape == (5,)


def test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips():
  """A NaN in one replica's gradient must reach every device as NaN (integer
  payloads carry no NaN): block scales carry it in the block's scale, APS in
  its non-finite flags; the step then skips and keeps params and residuals."""
  spec = P("data")
  g = np.ones((8, 64), np.float32)
  g[3, 5] = np.nan
  for sync in (dp.GradSync("two_shot", comm_dtype="int8"),
               dp.GradSync("two_shot", comm_dtype="int8", aps=True),
               dp.GradSync("two_shot", comm_dtype="int4", error_feedback=True)):
    zeros = dp.ErrorFeedbackState.zeros(np.zeros(64, np.float32), sync, 8)
    fn = jax.jit(compat.shard_map(
        lambda t, e, s=sync: jax.tree.map(lambda a: a[None], dp.sync_gradients(
            t[0], "data", s, residual=None if e is None else jax.tree.map(
                lambda a: a[0], e))),
        mesh=dp.data_mesh(), in_specs=(spec, spec), out_specs=spec))
    out = fn(g, zeros if sync.error_feedback else None)
    mean = np.asarray(out[0] if sync.error_feedback else out)
    assert np.isnan(mean[:, 5]).all(), sync
    if sync.measures_scales:  # the NaN travels in its block's scale: others unaffected
      assert np.isfinite(mean[:, 8:]).all()
    else:  # APS's non-finite flag is per leaf
      assert np.isnan(mean).all()
  step = dp.make_train_step(_loss, optax.sgd(LR), dp.data_mesh(), donate=False,
                            grad_reduce="two_shot", comm_dtype="int8", error_feedback=True)
  state, _ = step(step.init(_params()), BATCHES[0])
  bad = dict(BATCHES[1])
  bad["x"] = bad["x"].copy()
  bad["x"][13, 2, 3] = np.nan  # replica 3's rows
  after, metrics = step(state, bad)
  assert bool(metrics["skipped"])
  for a, b in zip(jax.tree.leaves((state.params, state.grad_residual)),
                  jax.tree.leaves((after.params, after.grad_residual)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_two_shot_refusals():
  """Options that do not fit two_shot are refused when built, naming them."""
  with pytest.raises(ValueError, match=r'grid=\(2, 4\) is the layout of the torus'):
    dp.GradSync("two_shot", grid=(2, 4))
  with pytest.raises(ValueError, match=r"error_feedback=True needs a low-precision"):
    dp.GradSync("two_shot", error_feedback=True)
  with pytest.raises(ValueError, match=r"block_size and measured_shift=True exclude"):
    dp.GradSync("two_shot", comm_dtype="int8", block_size=32, measured_shift=True)
  sync = dp.GradSync("two_shot", comm_dtype="int8", error_feedback=True)
  with pytest.raises(ValueError, match=r"two_shot's server residual is 1/N .* chunks=N"):
    dp.ErrorFeedbackState.zeros({"w": jnp.ones(4)}, sync)
  with pytest.raises(ValueError, match=r"chunks"):
    dp.ErrorFeedbackState.zeros({"w": jnp.ones(4)}, sync, chunks=0)
  # A ring's residuals (hop shaped like the gradient) fed to two_shot.
  spec = P("data")
  ring_like = dp.ErrorFeedbackState.zeros(
      jnp.zeros(64), dp.GradSync("ring", comm_dtype="int8", error_feedback=True))
  with pytest.raises(ValueError, match=r"two_shot's server residual of a leaf of shape "
                                       r"\(8,\) over 8 replicas is \(1,\)"):
    jax.jit(compat.shard_map(lambda t, e: dp.sync_gradients(t, "data", sync, residual=e)[0],
                             mesh=dp.data_mesh(), in_specs=spec, out_specs=spec))(
        jnp.ones(64), ring_like)


def test_exact_two_shot_is_the_mean():
  """Without a payload format two_shot is an exact all-to-all and all-gather."""
  mesh = dp.data_mesh()
  x = np.random.default_rng(1).integers(-9, 9, size=(8, 13)).astype(np.float32)
  f = jax.jit(compat.shard_map(
      lambda t: dp.all_reduce({"f": t, "i": t.astype(jnp.int32)}, "data",
                              algorithm="two_shot"),
      mesh=mesh, in_specs=P("data"), out_specs=P("data")))
  out = f(x)
  np.testing.assert_array_equal(np.asarray(out["f"]).reshape(8, 13), np.tile(x.sum(0), (8, 1)))
  assert np.asarray(out["i"]).dtype == np.int32


def test_two_shot_cost_is_two_rounds():
  """One all-to-all and one all-gather: 2 latency steps whatever P, and each
  device's link carries (P-1)/P of the payload twice."""
  m, p = 1e6, 256
  cost = dp.allreduce_cost("two_shot", p, m, alpha=1e-6, beta=1e-9)
  assert cost.latency_steps == 2
  np.testing.assert_allclose(cost.bytes_per_link, 2 * (p - 1) / p * m)
  np.testing.assert_allclose(cost.seconds, 2e-6 + 1e-9 * 2 * (p - 1) / p * m)
  mx = dp.allreduce_cost("two_shot", (16, 16), m, alpha=0.0, beta=1.0, comm_dtype="int8",
                         block_size=32)
  np.testing.assert_allclose(mx.bytes_per_link, 2 * (p - 1) / p * m * (8 + 8 / 32) / 32)
  aps = dp.allreduce_cost("two_shot", p, m, alpha=1.0, beta=0.0, comm_dtype="int8",
                          aps=True, layers=10)
  assert aps.latency_steps == 4  # the APS pmax is one more two-shot reduction


@pytest.mark.parametrize("comm_dtype", ["int8", "int4", "float8_e4m3fn"])
def test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once(comm_dtype):
  # Rounding to nearest, two_shot encodes each (r, w) row alone (a TPU never
  # flattens the buffer); the messages and the values sent are, byte for
  # byte, those of the whole buffer encoded at once and cut into rows.
  from date_optax._src.parallel.comm import low_precision as lp
  from date_optax._src.parallel.comm import two_shot

  rng = np.random.default_rng(0)
  t = (rng.normal(size=(8, 4 * 32)) * np.exp(rng.normal(size=(8, 4 * 32)) * 4)).astype(np.float32)
  t[2, 5], t[5, 70], t[7, 32:64] = np.nan, np.inf, 0.0
  fmt = lp.comm_format(comm_dtype)
  msgs, sent = jax.jit(two_shot._Codec(fmt, 32, None).encode)(t)
  codec = lp.ScaledFormat(fmt, block_size=32)
  wire = codec.encode(jnp.asarray(t.reshape(-1)))
  want = jnp.concatenate([wire[: t.size].reshape(8, -1), wire[t.size :].reshape(8, -1)], axis=1)
  assert msgs.dtype == want.dtype and msgs.shape == want.shape
  np.testing.assert_array_equal(np.asarray(msgs.astype(jnp.int32)),
                                np.asarray(want.astype(jnp.int32)))
  np.testing.assert_array_equal(np.asarray(sent),
                                np.asarray(codec.decode(wire)).reshape(t.shape))


def _column_round(v, b=BLOCK):
  """`_block_round` on every run of b consecutive rows of one column of v (p, C)."""
  out = np.zeros_like(v)
  for i in range(0, v.shape[0], b):
    for j in range(v.shape[1]):
      out[i : i + b, j] = _block_round(v[i : i + b, j])
  return out


def _two_shot_columns(contrib, worker, server, axis=None):
  """`_two_shot` for a column-blocked leaf: the leaf, its split axis moved
  first (weight-update sharding), viewed as (rows, last dimension); replica k
  owns rows k·r .. k·r + r, the same elements as the flat layout's chunk k (or
  its shard); each chunk, zero-padded to whole blocks of rows, is rounded with
  one scale per BLOCK rows of a column."""
  n, shape = contrib.shape[0], contrib.shape[1:]
  moved = lambda a: a if axis is None else np.moveaxis(a, axis, 0)  # noqa: E731
  mshape = moved(np.zeros(shape)).shape
  c, r = mshape[-1], math.prod(mshape[:-1]) // n
  back = lambda rows: rows.reshape(mshape) if axis is None else np.moveaxis(  # noqa: E731
      rows.reshape(mshape), 0, axis)
  pad = (-r) % BLOCK

  def rnd(rows):
    return _column_round(np.pad(rows, ((0, pad), (0, 0))))[:r]

  p = contrib + worker
  sent = np.stack([[rnd(moved(p[q]).reshape(n, r, c)[k]) for k in range(n)]
                   for q in range(n)])
  new_worker = p - np.stack([back(sent[q]) for q in range(n)])
  t = sent.sum(axis=0) + server.reshape(n, r, c)
  out = np.stack([rnd(t[k]) for k in range(n)])
  return back(out), new_worker, (t - out).reshape(n, r * c)


# Leaves of the column-blocks test: k's 128 rows give each of 8 replicas 16
# rows (2 blocks of 8), p's 528 give 66 (8.25 blocks: padded to 9), f's 6 rows
# and the vector v do not divide: the flat layout.
COLUMN_LEAVES = {"k": (8, 16, 24), "p": (528, 3), "f": (6, 10), "v": (40,)}


def _dyadic(rng, shape):
  """Integers times powers of two that vary along both axes (so rows and
  columns need different scales): sums of 8 of them, /8, are exact."""
  e = rng.integers(-2, 3, size=shape[:-1] + (1,)) + rng.integers(-2, 3, size=shape[-1:])
  return (rng.integers(-64, 65, size=shape) * 2.0**e).astype(np.float32)


@pytest.mark.parametrize("scatter", [False, True])
def test_column_blocks_match_numpy_over_three_steps(scatter):
  """int8 with blocks of 8 and both residuals, 8 replicas, 3 steps: leaves whose
  rows split into whole (or at least 8) blocks per replica are rounded per
  column block, the others per flat block; means (with `scatter`, each
  replica's shard) and residuals against NumPy."""
  from date_optax._src.parallel.comm import two_shot

  n = 8
  axis = {k: dp.update_shard_axis(s, n) if scatter else None for k, s in COLUMN_LEAVES.items()}
  assert axis == ({"k": 2, "p": 0, "f": None, "v": 0} if scatter else dict.fromkeys(axis))
  rows = {k: two_shot.column_rows(s, n, BLOCK, axis[k]) for k, s in COLUMN_LEAVES.items()}
  assert rows == {"k": 24 if scatter else 16, "p": 72, "f": None, "v": None}
  sync = dp.GradSync("two_shot", comm_dtype="int8", block_size=BLOCK, error_feedback=True)
  spec = P("data")
  fn = jax.jit(compat.shard_map(
      lambda g, e: jax.tree.map(lambda a: a[None], dp.sync_gradients(
          jax.tree.map(lambda a: a[0], g), "data", sync, scatter=scatter,
          residual=jax.tree.map(lambda a: a[0], e))),
      mesh=dp.data_mesh(), in_specs=(spec, spec), out_specs=spec))
  shapes = {k: jnp.zeros(s, jnp.float32) for k, s in COLUMN_LEAVES.items()}
  res = jax.tree.map(lambda a: np.stack([a] * n),
                     dp.ErrorFeedbackState.zeros(shapes, sync, chunks=n))
  worker = {k: np.zeros((n,) + s) for k, s in COLUMN_LEAVES.items()}
  server = {k: np.zeros((n, -(-math.prod(s) // n))) for k, s in COLUMN_LEAVES.items()}
  rng = np.random.default_rng(3)
  for step in range(3):
    g = {k: _dyadic(rng, (n,) + s) for k, s in COLUMN_LEAVES.items()}
    mean, res = fn(g, res)
    for k in COLUMN_LEAVES:
      contrib = g[k].astype(np.float64) / n
      ref = _two_shot_columns if rows[k] else _two_shot
      want, worker[k], server[k] = ref(contrib, worker[k], server[k], axis[k])
      got = np.asarray(mean[k])
      if axis[k] is None:  # every replica has the whole mean
        want = np.broadcast_to(want, got.shape)
      else:  # replica j has shard j
        want = np.stack(np.split(want, n, axis=axis[k]))
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12, err_msg=f"{k} {step}")
      np.testing.assert_allclose(np.asarray(res.worker[k]), worker[k], rtol=1e-6,
                                 atol=1e-12, err_msg=k)
      np.testing.assert_allclose(np.asarray(res.hop[k]), server[k], rtol=1e-6, atol=1e-12,
                                 err_msg=k)
  # Both stages round something, and a flat block would round k differently.
  assert np.abs(server["k"]).max() > 0 and np.abs(worker["p"]).max() > 0
  zero = (np.zeros((n, 8, 16, 24)), np.zeros((n, 384)), axis["k"])
  contrib = g["k"].astype(np.float64) / n
  assert np.abs(_two_shot(contrib, *zero)[0] - _two_shot_columns(contrib, *zero)[0]).max() > 0


@pytest.mark.parametrize("comm_dtype", ["int8", "int4", "float8_e4m3fn", "bfloat16"])
def test_a_column_block_rounds_as_a_flat_block(comm_dtype):
  # Column blocks change which values share a scale, not how a block rounds:
  # payload and exponents are, bit for bit, the flat format's on the columns
  # laid end to end (NaN and Inf blocks included).
  from date_optax._src.parallel.comm import low_precision as lp
  from date_optax._src.parallel.comm import two_shot

  rng = np.random.default_rng(0)
  t = (rng.normal(size=(4 * 32, 5)) * np.exp(rng.normal(size=(4 * 32, 5)) * 4)).astype(np.float32)
  t[2, 1], t[70, 3], t[32:64, 4] = np.nan, -np.inf, 0.0
  fmt = lp.comm_format(comm_dtype)
  payload, exps, sent = jax.jit(two_shot._ColumnCodec(fmt, 32).encode)(t)
  flat = lp.ScaledFormat(fmt, block_size=32)
  wire = flat.encode(jnp.asarray(t.T.reshape(-1)))
  assert payload.dtype == wire.dtype and payload.shape == t.shape and exps.shape == (4, 5)
  np.testing.assert_array_equal(np.asarray(payload.astype(jnp.int32)).T.reshape(-1),
                                np.asarray(wire[: t.size].astype(jnp.int32)))
  np.testing.assert_array_equal(np.asarray(exps).T.reshape(-1),
                                np.asarray(flat.exponents(jnp.asarray(t.T.reshape(-1)))))
  np.testing.assert_array_equal(np.asarray(sent).T.reshape(-1),
                                np.asarray(flat.decode(wire)))
  assert np.isnan(np.asarray(sent)[:32, 1]).all() and np.isnan(np.asarray(sent)[64:96, 3]).all()
  assert np.isfinite(np.asarray(sent)[32:64]).all()


def test_column_blocks_under_pmap_equal_the_mesh_step_bit_for_bit():
  """A kernel of 256 rows (32 per replica, 4 blocks of 8) takes column blocks
  on both the pmap and the replicated mesh builder: parameters and residuals
  the same bits after 3 steps."""
  from date_optax._src.parallel.comm import two_shot

  rng = np.random.default_rng(5)
  params = {"k": (rng.normal(size=(256, 4)) / 16).astype(np.float32),
            "b": np.zeros(4, np.float32)}
  batches = [{"x": rng.normal(size=(ROWS, 256)).astype(np.float32),
              "y": rng.normal(size=(ROWS, 4)).astype(np.float32)} for _ in range(3)]

  def loss(p, b):
    return jnp.mean((b["x"] @ p["k"] + p["b"] - b["y"]) ** 2)

  sync = dp.GradSync("two_shot", comm_dtype="int8", block_size=BLOCK, error_feedback=True)
  assert two_shot.column_rows((256, 4), 8, BLOCK) == 32
  _, b = _pmap_equals_mesh(loss, params, batches, sync, "k")
  assert np.abs(np.asarray(b.grad_residual.hop["k"])).max() > 0


def test_large_payloads_travel_in_collectives_of_their_own():
  """Column-blocked payloads of 4 MiB or more get an all-to-all each
  (concatenating them would copy them once more); smaller ones with the same
  last dimension share one, their exponents with them. The owners' rounded
  sums, 1/8 of that, share one all-gather."""
  from date_optax._src.parallel.comm import two_shot

  big, small = (8192, 1024), (256, 1024)
  assert 8 * (8192 // 8) * 1024 >= two_shot._ALONE_BYTES > 8 * (256 // 8) * 1024
  sync = dp.GradSync("two_shot", comm_dtype="int8", block_size=32)
  shapes = {"a": big, "b": big, "c": small}
  f = jax.jit(compat.shard_map(
      lambda g: jax.tree.map(lambda a: a[None], dp.sync_gradients(
          jax.tree.map(lambda a: a[0], g), "data", sync)),
      mesh=dp.data_mesh(), in_specs=P("data"), out_specs=P("data")))
  text = f.lower({k: jax.ShapeDtypeStruct((8, *s), jnp.float32)
                  for k, s in shapes.items()}).as_text()
  # a and b alone; c's payload with the three leaves' exponents.
  assert text.count('"stablehlo.all_to_all"') == 3
  assert text.count('"stablehlo.all_gather"') == 1
