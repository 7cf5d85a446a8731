"""Low-precision gradient all-reduce and Auto-Precision Scaling (APS).

The rules under test are in docs/algorithms.md ("Low-precision all-reduce and
APS"): the payload is rounded to the format before every send, APS shifts
each layer by 2^k with k = floor(log2(fmt_max / (N · M))), and the per-layer
error satisfies

    max|ŝ - s| / (N · M) <= (N + h) · eps_fmt

with N replicas (one cast each), h roundings of partial sums on the way of
one element (ring: N - 1, torus X×Y: (X - 1) + (Y - 1); psum: XLA's order is
not ours to see, counted as N - 1) and eps_fmt the format's `eps`.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import hlo
from date_optax._src.parallel.comm import low_precision as lp

N = 8
LOW = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "int4", "float4_e2m1fn")
FMAX = {"bfloat16": float(ml_dtypes.finfo(jnp.bfloat16).max), "float8_e4m3fn": 448.0,
        "float8_e5m2": 57344.0, "int8": 127.0, "int4": 7.0, "float4_e2m1fn": 6.0}
NP_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2, "float4_e2m1fn": ml_dtypes.float4_e2m1fn}
SLOW = pytest.mark.slow


def _cases(fast, everything):
  """`everything` as parameters, those not in `fast` marked slow."""
  return [c if c in fast else pytest.param(*(c if isinstance(c, tuple) else (c,)),
                                           marks=SLOW)
          for c in everything]


MESHES = {"ring": lambda: (dp.data_mesh(), "data"),
          "torus": lambda: (dp.torus_mesh(2, 4), ("x", "y")),
          "psum": lambda: (dp.data_mesh(), "data")}


def _round(x: np.ndarray, fmt: str) -> np.ndarray:
  """Round-to-nearest onto the format's grid, in float32 (NumPy reference)."""
  x = np.asarray(x, np.float32)
  if fmt in ("int8", "int4"):
    return np.clip(np.round(x), -FMAX[fmt], FMAX[fmt]).astype(np.float32)
  return x.astype(NP_DTYPE[fmt]).astype(np.float32)


def _exponent(maxabs: float, fmt: str, n: int = N) -> float:
  """APS shift from the math: the largest k with n · M · 2^k <= fmt_max.

  Clipped to ±100 so that 2^k is a normal float32.
  """
  if maxabs == 0:
    return 0.0
  return float(np.clip(math.floor(math.log2(FMAX[fmt] / (n * maxabs))), -100, 100))


def _reduce(tree, alg, **kw):
  """all_reduce over 8 devices; leaves given as (8, ...) per-device rows."""
  mesh, axes = MESHES[alg]()
  spec = P(axes)
  fn = jax.jit(compat.shard_map(
      lambda t: jax.tree.map(lambda v: v[None], dp.all_reduce(
          jax.tree.map(lambda v: v[0], t), axes, algorithm=alg, **kw)),
      mesh=mesh, in_specs=spec, out_specs=spec))
  return jax.tree.map(np.asarray, fn(tree))


def _layers(seed=0):
  """Adversarial layer scales side by side: 1e-8 next to 1e4, and a zero layer."""
  rng = np.random.default_rng(seed)
  return {
      "tiny": (rng.normal(size=(N, 3, 5)) * 1e-8).astype(np.float32),
      "mid": (rng.normal(size=(N, 41)) * 1e-2).astype(np.float32),
      "huge": (rng.normal(size=(N, 7)) * 1e4).astype(np.float32),
      "zero": np.zeros((N, 4), np.float32),
  }


def _hops(alg: str) -> int:
  return {"ring": N - 1, "torus": (2 - 1) + (4 - 1), "psum": N - 1}[alg]


# ---------------------------------------------------------------------------
# float32 is the exact path.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", _cases(["ring"], ["psum", "ring", "torus"]))
def test_float32_payload_is_the_exact_path(alg):
  x = _layers()
  exact = _reduce(x, alg)
  np.testing.assert_array_equal(_reduce(x, alg, comm_dtype="float32")["mid"], exact["mid"])
  np.testing.assert_array_equal(_reduce(x, alg, comm_dtype=jnp.float32)["huge"],
                                exact["huge"])
  for k, v in x.items():
    np.testing.assert_allclose(exact[k][0], v.astype(np.float64).sum(0), rtol=1e-6,
                               atol=1e-6 * np.abs(v).max())


# ---------------------------------------------------------------------------
# The ring rounds every partial sum: a NumPy reference of the hops.
# ---------------------------------------------------------------------------


def _ring_reference(x: dict, fmt: str, aps: bool) -> dict:
  """The ring all-reduce written from its definition.

  The packed buffer is cut into N rows; row j starts on device j + 1 and
  visits j + 2, ..., j + N = j, each device adding its own (rounded) row to
  the rounded partial sum it received; the final sum is rounded once more.
  """
  names = sorted(x)  # the pytree order of a dict
  scale = {k: 2.0 ** (_exponent(float(np.abs(x[k]).max()), fmt) if aps else 0.0)
           for k in names}
  per_dev = np.concatenate([(x[k] * np.float32(scale[k])).reshape(N, -1) for k in names],
                           axis=1).astype(np.float32)
  size = per_dev.shape[1]
  c = -(-size // N)
  per_dev = np.pad(per_dev, ((0, 0), (0, N * c - size)))
  total = np.zeros(N * c, np.float32)
  for j in range(N):
    cols = slice(j * c, (j + 1) * c)
    acc = _round(per_dev[(j + 1) % N, cols], fmt)
    for t in range(2, N + 1):
      acc = _round(_round(per_dev[(j + t) % N, cols], fmt) + acc, fmt)
    total[cols] = acc
  out, offset = {}, 0
  for k in names:
    n = x[k][0].size
    out[k] = (total[offset : offset + n] / np.float32(scale[k])).reshape(x[k].shape[1:])
    offset += n
  return out


@pytest.mark.parametrize("fmt,aps", _cases(
    [("float8_e4m3fn", True), ("int8", True), ("bfloat16", False),
     ("float4_e2m1fn", False)],
    [(f, a) for f in ("bfloat16", "float8_e4m3fn", "int8", "float4_e2m1fn")
     for a in (True, False)]))
def test_ring_rounds_every_partial_sum_like_the_reference(fmt, aps):
  x = {k: v for k, v in _layers(1).items() if k != "huge" or aps}
  got = _reduce(x, "ring", comm_dtype=fmt, aps=aps)
  want = _ring_reference(x, fmt, aps)
  for k in x:
    for d in range(N):  # every device holds the same rounded sum
      np.testing.assert_array_equal(got[k][d], want[k], err_msg=f"{k} device {d}")


# ---------------------------------------------------------------------------
# The error bound with APS, every format and algorithm.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,alg", _cases(
    [(f, "ring") for f in ("bfloat16", "float8_e4m3fn", "int8", "float4_e2m1fn")]
    + [("int8", "torus"), ("float8_e4m3fn", "psum")],
    [(f, a) for a in ("ring", "torus", "psum") for f in LOW]))
def test_aps_error_bound_per_layer(fmt, alg):
  x = _layers(2)
  got = _reduce(x, alg, comm_dtype=fmt, aps=True)
  eps = lp.comm_format(fmt).eps
  bound = (N + _hops(alg)) * eps
  for k, v in x.items():
    assert np.all(np.isfinite(got[k])), k
    exact = v.astype(np.float64).sum(0)
    m = np.abs(v).max()
    if m == 0:
      np.testing.assert_array_equal(got[k], 0.0)
      continue
    for d in range(N):
      err = np.abs(got[k][d] - exact).max() / (N * m)
      assert err <= bound, (k, d, err, bound)
  # The bound is not vacuous for the wide formats: float8/int8 errors are small.
  if fmt in ("bfloat16", "int8", "float8_e4m3fn"):
    assert bound < 1.0


def test_aps_exponent_rule_matches_the_math():
  rng = np.random.default_rng(3)
  m = np.concatenate([10.0 ** rng.uniform(-12, 6, 200), [0.0, 2.0**-3, 448.0 / 8]])
  for fmt in ("float8_e4m3fn", "int8", "int4"):
    k = np.asarray(lp.aps_exponents(jnp.asarray(m, jnp.float32), N, FMAX[fmt]))
    want = [_exponent(float(np.float32(v)), fmt) for v in m]
    np.testing.assert_array_equal(k, want)
    assert np.all(N * m.astype(np.float32) * 2.0**k <= FMAX[fmt])


# ---------------------------------------------------------------------------
# Without APS the formats break; with APS they do not.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", _cases(["ring"], ["ring", "psum"]))
def test_without_aps_fp8_overflows_and_flushes_small_layers(alg):
  x = _layers(4)
  e4m3 = _reduce(x, alg, comm_dtype="float8_e4m3fn", aps=False)
  e5m2 = _reduce(dict(x, huge=x["huge"] * 10), alg, comm_dtype="float8_e5m2", aps=False)
  assert np.isnan(e4m3["huge"]).all()  # e4m3fn has no inf: overflow is NaN
  assert (~np.isfinite(e5m2["huge"])).any()  # inf, and inf - inf = NaN
  np.testing.assert_array_equal(e4m3["tiny"], 0.0)  # 1e-8 is below 2^-9
  np.testing.assert_array_equal(e5m2["tiny"], 0.0)  # ... and below 2^-16
  with_aps = _reduce(x, alg, comm_dtype="float8_e4m3fn")  # APS is the default
  for k in x:
    assert np.isfinite(with_aps[k]).all()
  assert np.abs(with_aps["tiny"]).max() > 0


@pytest.mark.parametrize("fmt", _cases(["int8"], ["int8", "int4"]))
def test_without_aps_integers_flush_gradients_to_zero_and_saturate(fmt):
  x = _layers(5)
  got = _reduce(x, "ring", comm_dtype=fmt, aps=False)
  np.testing.assert_array_equal(got["tiny"], 0.0)
  np.testing.assert_array_equal(got["mid"], 0.0)  # |g| ~ 1e-2 rounds to 0
  qmax = FMAX[fmt]
  # Each replica saturates at ±qmax (and int4 partial sums then wrap around).
  assert np.abs(got["huge"]).max() <= N * qmax
  assert np.abs(got["huge"][0] - x["huge"].sum(0)).max() > 1e3


@pytest.mark.parametrize("fmt,aps", _cases(
    [("int8", True), ("float4_e2m1fn", False)],
    [(f, a) for f in ("int8", "float4_e2m1fn", "float8_e4m3fn") for a in (True, False)]))
def test_non_finite_gradient_arrives_as_nan(fmt, aps):
  x = _layers(6)
  x["mid"][3, 7] = np.nan
  x["tiny"][5, 0, 0] = np.inf
  got = _reduce(x, "torus", comm_dtype=fmt, aps=aps)
  assert np.isnan(got["mid"]).all() and np.isnan(got["tiny"]).all()
  if aps:  # the other layers are untouched by the poisoned ones
    assert np.isfinite(got["huge"]).all()
    np.testing.assert_array_equal(got["zero"], 0.0)


def test_nan_gradient_skips_the_step_with_a_low_precision_payload():
  def loss_fn(p, b):
    # finite loss, NaN gradient: the where-of-sqrt trick on a negative input
    bad = jnp.where(b["x"][0, 0] > 1e9, jnp.sqrt(p["w"]).sum(), 0.0)
    return jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2) + bad

  params = {"w": -np.ones((4, 1), np.float32)}
  batch = {"x": np.ones((16, 4), np.float32), "y": np.zeros((16, 1), np.float32)}
  for fmt in ("int8", "float4_e2m1fn"):
    step = dp.make_train_step(loss_fn, optax.sgd(0.1), dp.data_mesh(), grad_reduce="ring",
                              comm_dtype=fmt)
    state, metrics = step(step.init(params), batch)
    assert np.isfinite(float(metrics["loss"]))
    assert bool(metrics["skipped"]) and int(metrics["total_skips"]) == 1
    np.testing.assert_array_equal(np.asarray(state.params["w"]), params["w"])


# ---------------------------------------------------------------------------
# The train steps.
# ---------------------------------------------------------------------------


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  params = {"w": rng.normal(size=(6, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
  batch = {"x": rng.normal(size=(32, 6)).astype(np.float32),
           "y": rng.normal(size=(32, 3)).astype(np.float32)}
  return params, batch


def _loss(p, b, rng=None):
  """Least squares; `rng` is the step's key (test_stochastic_rounding's steps pass one)."""
  return jnp.mean((b["x"] @ p["w"] + p["b"] - b["y"]) ** 2)


def _manual_grads(params, batch):
  """Per-replica gradients (8, ...) from jax.grad on each slice of the batch."""
  rows = jax.tree.map(lambda v: v.reshape((N, -1) + v.shape[1:]), batch)
  return jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, rows)


@pytest.mark.parametrize("fmt,kind", _cases(
    [("int8", "jit")],
    [(f, k) for f in ("int8", "float8_e5m2") for k in ("jit", "shard_update", "pmap")]))
def test_train_step_mean_gradient_is_the_reduced_payload(fmt, kind):
  """SGD with lr 1: params - new params = all_reduce(local grads / N)."""
  params, batch = _problem()
  local = jax.tree.map(lambda g: np.asarray(g) / N, _manual_grads(params, batch))
  want = _reduce(local, "ring", comm_dtype=fmt)
  if kind == "pmap":
    step = dp.make_pmap_train_step(_loss, optax.sgd(1.0), grad_reduce="ring",
                                   comm_dtype=fmt)
    state, _ = step(step.init(params), batch)
    new = jax.tree.map(lambda x: np.asarray(x[0]), state.params)
  else:
    step = dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(), grad_reduce="ring",
                              comm_dtype=fmt, shard_update=kind == "shard_update")
    state, _ = step(step.init(params), batch)
    new = jax.tree.map(np.asarray, state.params)
  for k in params:
    np.testing.assert_allclose(params[k] - new[k], want[k][0], rtol=1e-6, atol=1e-7)


def test_train_step_float32_payload_equals_default():
  params, batch = _problem(1)
  states = []
  for kw in ({}, {"comm_dtype": "float32"}):
    step = dp.make_train_step(_loss, optax.adam(1e-2), dp.torus_mesh(2, 4),
                              grad_reduce="torus", **kw)
    state = step.init(params)
    for _ in range(2):
      state, _ = step(state, batch)
    states.append(jax.tree.map(np.asarray, state.params))
  for k in params:
    np.testing.assert_array_equal(states[0][k], states[1][k])


@pytest.mark.parametrize("fmt", _cases(["int8"], ["int8", "float8_e4m3fn"]))
def test_payload_keeps_the_rounds_of_the_compiled_program(fmt):
  """The payload changes the bytes, not the 2(P-1) rounds of neighbour exchanges."""
  mesh = dp.data_mesh()
  fn = jax.jit(compat.shard_map(
      lambda t: dp.all_reduce(t, "data", algorithm="ring", comm_dtype=fmt,
                                   aps=True),
      mesh=mesh, in_specs=P("data"), out_specs=P("data")))
  text = fn.lower(np.ones(8 * 5, np.float32)).compile().as_text()
  rounds = hlo.collective_permute_rounds(text)
  assert [r for r, _ in rounds] == list(range(1, 2 * 7 + 1))
  # XLA on CPU carries float8 in a float16 container (exact); int8 as int8.
  wire = {"int8": ("s8[",), "float8_e4m3fn": ("f8e4m3fn[", "f16[")}[fmt]
  # The type of each collective-permute instruction (not of an op whose
  # operand or metadata names one).
  permutes = re.findall(r"= (.+?) collective-permute(?:-start)?\(", text)
  assert permutes and all(any(w in t for w in wire) for t in permutes), permutes[:2]
  # APS adds one all-reduce (the pmax of the per-layer max-abs and flags).
  assert text.count("all-reduce(") + text.count("all-reduce-start(") == 1


# ---------------------------------------------------------------------------
# Validation and the cost model.
# ---------------------------------------------------------------------------


def test_bad_comm_dtype_and_aps_are_refused_at_construction():
  mesh = dp.data_mesh()
  for bad in ("float16", "fp8", jnp.int16, 3):
    with pytest.raises(ValueError, match=r"comm_dtype.*float8_e4m3fn.*int4"):
      dp.make_train_step(_loss, optax.sgd(0.1), mesh, comm_dtype=bad)
  with pytest.raises(ValueError, match="comm_dtype"):
    dp.make_pmap_train_step(_loss, optax.sgd(0.1), comm_dtype="e4m3")
  with pytest.raises(ValueError, match="aps=True"):
    dp.make_train_step(_loss, optax.sgd(0.1), mesh, aps=True)
  with pytest.raises(TypeError, match="aps"):
    dp.make_train_step(_loss, optax.sgd(0.1), mesh, comm_dtype="int8", aps="yes")
  with pytest.raises(ValueError, match="comm_dtype"):
    dp.make_train_step(_loss, optax.sgd(0.1), jax.make_mesh((4, 2), ("data", "model")),
                       param_sharding=[("w", P(None, "model"))], comm_dtype="int2")
  with pytest.raises(ValueError, match="comm_dtype"):
    dp.allreduce_cost("ring", 8, 1e6, alpha=0.0, beta=1e-9, comm_dtype="int2")
  assert set(dp.COMM_DTYPES) == {"float32", *LOW}


def test_aps_default_is_on_for_8_bits_and_fewer():
  for fmt in LOW:
    assert lp.resolve_aps(lp.comm_format(fmt), None) == (fmt != "bfloat16")
  assert lp.resolve_aps(lp.comm_format("bfloat16"), True)
  assert not lp.resolve_aps(None, None)


@pytest.mark.parametrize("fmt,bits", [(None, 32), ("bfloat16", 16), ("float8_e5m2", 8),
                                      ("int8", 8), ("int4", 4), ("float4_e2m1fn", 4)])
@pytest.mark.parametrize("alg,shape", [("ring", (4, 4)), ("torus", (8, 8)),
                                       ("torus", (32, 32))])
def test_cost_model_scales_the_payload_by_its_bits(fmt, bits, alg, shape):
  alpha, beta, m = 2e-6, 1e-10, 1e8
  got = dp.allreduce_cost(alg, shape, m, alpha=alpha, beta=beta, comm_dtype=fmt)
  x, y = shape
  mb = m * bits / 32
  if alg == "ring":
    p = x * y
    steps, per_link = 2 * (p - 1), 2 * (p - 1) / p * mb
  else:
    steps = 2 * (x - 1) + 2 * (y - 1)
    per_link = max(2 * (x - 1) / x * (mb / 2 + mb / (2 * y)),
                   2 * (y - 1) / y * (mb / 2 + mb / (2 * x)))
  assert got.latency_steps == steps
  np.testing.assert_allclose(got.bytes_per_link, per_link, rtol=1e-12)
  np.testing.assert_allclose(got.seconds, alpha * steps + beta * per_link, rtol=1e-12)
