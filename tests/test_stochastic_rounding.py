"""Stochastic rounding of the low-precision all-reduce payload.

The rule (docs/algorithms.md, "Stochastic rounding"; Gupta et al., "Deep
Learning with Limited Numerical Precision", ICML 2015,
https://arxiv.org/abs/1502.02551): a value x with grid neighbours lo <= x <= hi
rounds to hi with probability (x - lo) / (hi - lo) and to lo otherwise, so
E[SR(x)] = x; grid values are unchanged. One rounding errs by less than one
grid step, twice the half step of round-to-nearest, so with APS the per-layer
error of the reduced value obeys, deterministically,

    max|ŝ - s| / (N · M) <= (N + h) · 2 · eps_fmt.

The NumPy reference of the neighbours enumerates every finite value of the
format (all bit patterns), independently of the ulp arithmetic under test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

# The adversarial layers and hop counts of the nearest-rounding tests, and the
# least-squares problem of the train-step tests.
from test_low_precision import _hops, _layers, _loss, _manual_grads, _problem

import date_optax.parallel as dp
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import hlo
from date_optax._src.parallel.comm import low_precision as lp

N = 8
LOW = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "int4", "float4_e2m1fn")
NP_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2, "float4_e2m1fn": ml_dtypes.float4_e2m1fn}
QMAX = {"int8": 127, "int4": 7}
SLOW = pytest.mark.slow
MESHES = {"ring": lambda: (dp.data_mesh(), "data"),
          "torus": lambda: (dp.torus_mesh(2, 4), ("x", "y")),
          "psum": lambda: (dp.data_mesh(), "data")}


def _cases(fast, everything):
  return [c if c in fast else pytest.param(*(c if isinstance(c, tuple) else (c,)),
                                           marks=SLOW)
          for c in everything]


def _grid(fmt: str) -> np.ndarray:
  """Every finite value of the format, sorted (float64)."""
  if fmt in QMAX:
    return np.arange(-QMAX[fmt], QMAX[fmt] + 1, dtype=np.float64)
  raw = {"bfloat16": np.arange(2**16, dtype=np.uint16),
         "float4_e2m1fn": np.arange(16, dtype=np.uint8)}.get(
             fmt, np.arange(256, dtype=np.uint8))
  with np.errstate(invalid="ignore"):  # NaN bit patterns
    vals = raw.view(NP_DTYPE[fmt]).astype(np.float64)
  return np.unique(vals[np.isfinite(vals)])


def _neighbours(x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  x = np.asarray(x, np.float64)
  lo = grid[np.searchsorted(grid, x, side="right") - 1]
  hi = grid[np.searchsorted(grid, x, side="left")]
  return lo, hi


def _inputs(fmt: str, seed: int = 0) -> np.ndarray:
  """Values across the range: subnormals to max, both signs, grid points, 0."""
  rng = np.random.default_rng(seed)
  grid = _grid(fmt)
  top = grid[-1]
  if fmt in QMAX:
    x = rng.uniform(-top, top, 300)
  else:
    # bfloat16's grid step is a float32 normal above 2^-119 (below it the
    # rounding is to nearest, documented).
    low = 2.0**-118 if fmt == "bfloat16" else grid[grid > 0][0] / 4
    mag = np.exp(rng.uniform(np.log(low), np.log(top), 300))
    x = mag * rng.choice([-1.0, 1.0], 300)
  x = np.concatenate([x, rng.choice(grid, 40), [0.0, top, -top]])
  return np.clip(x, -top, top).astype(np.float32)


# ---------------------------------------------------------------------------
# The rounding itself against the enumerated grid.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", LOW)
def test_stochastic_round_is_an_unbiased_choice_between_the_neighbours(fmt):
  k = 4000
  x = _inputs(fmt)
  f = lp.comm_format(fmt)
  keys = jax.random.split(jax.random.key(1), k)
  out = np.asarray(jax.jit(jax.vmap(lambda key: lp.stochastic_round(f, jnp.asarray(x),
                                                                    key)))(keys),
                   np.float64)
  lo, hi = _neighbours(x, _grid(fmt))
  # Every output is one of the two neighbours; grid values never move.
  assert np.all((out == lo) | (out == hi))
  exact = lo == hi
  assert exact.sum() >= 40
  np.testing.assert_array_equal(out[:, exact], np.broadcast_to(x[exact], (k, exact.sum())))
  # E[SR(x)] = x: the mean over keys is within 6 standard errors (+1 draw).
  step = np.where(exact, 1.0, hi - lo)
  p = (x.astype(np.float64) - lo) / step
  err = np.abs(out.mean(0) - x)
  bound = step * (6 * np.sqrt(p * (1 - p) / k) + 1.0 / k)
  assert np.all(err <= bound), (x[err > bound], err[err > bound], bound[err > bound])
  # ... and not by luck: round-to-nearest misses it where p is far from 0 and 1.
  mid = (p > 0.2) & (p < 0.8)
  near = _nearest(x, fmt)
  assert np.all(np.abs(near - x)[mid] > bound[mid])


def _nearest(x: np.ndarray, fmt: str) -> np.ndarray:
  if fmt in QMAX:
    return np.clip(np.round(x), -QMAX[fmt], QMAX[fmt]).astype(np.float64)
  return x.astype(NP_DTYPE[fmt]).astype(np.float64)


def test_stochastic_round_keeps_nan_and_rounds_overflow_to_nearest():
  f = lp.comm_format("float8_e4m3fn")
  x = jnp.asarray([np.nan, 1e4, -1e4, 300.0], jnp.float32)
  out = np.asarray(lp.stochastic_round(f, x, jax.random.key(0)))
  assert np.isnan(out[:3]).all()  # e4m3fn has no inf: NaN, as the cast gives
  assert out[3] in (288.0, 320.0)
  i = lp.comm_format("int4")
  np.testing.assert_array_equal(
      lp.stochastic_round(i, jnp.asarray([30.0, -30.0]), jax.random.key(0)), [7, -7])


# ---------------------------------------------------------------------------
# Through the all-reduce.
# ---------------------------------------------------------------------------


def _reducer(alg, **kw):
  mesh, axes = MESHES[alg]()
  spec = P(axes)
  return jax.jit(compat.shard_map(
      lambda t, key: jax.tree.map(lambda v: v[None], dp.all_reduce(
          jax.tree.map(lambda v: v[0], t), axes, algorithm=alg, key=key, **kw)),
      mesh=mesh, in_specs=(spec, P()), out_specs=spec))


@pytest.mark.parametrize("fmt,alg", _cases(
    [("int8", "ring"), ("float4_e2m1fn", "ring")],
    [(f, a) for a in ("ring", "torus", "psum") for f in LOW]))
def test_stochastic_error_bound_per_layer(fmt, alg):
  x = _layers(2)
  f = _reducer(alg, comm_dtype=fmt, aps=True, rounding="stochastic")
  eps = lp.comm_format(fmt).eps
  bound = (N + _hops(alg)) * 2 * eps
  for seed in range(3):
    got = jax.tree.map(np.asarray, f(x, jax.random.key(seed)))
    for k, v in x.items():
      assert np.all(np.isfinite(got[k])), k
      for d in range(1, N):  # every device holds the same sum
        np.testing.assert_array_equal(got[k][d], got[k][0])
      m = np.abs(v).max()
      if m == 0:
        np.testing.assert_array_equal(got[k], 0.0)
        continue
      err = np.abs(got[k][0] - v.astype(np.float64).sum(0)).max() / (N * m)
      assert err <= bound, (k, err, bound)


@pytest.mark.parametrize("fmt,alg", _cases(
    [("int4", "ring")],
    [("int4", "ring"), ("int8", "torus"), ("int4", "psum"), ("int4", "torus")]))
def test_stochastic_all_reduce_is_unbiased_where_nearest_is_not(fmt, alg):
  """Mean over keys -> exact sum; each rounding has variance <= step²/4."""
  rng = np.random.default_rng(7)
  x = {"w": rng.uniform(-1, 1, (N, 64)).astype(np.float32)}
  m = float(np.abs(x["w"]).max())
  step = 2.0 ** -float(np.floor(np.log2(QMAX[fmt] / (N * m))))  # APS grid step
  exact = x["w"].astype(np.float64).sum(0)
  f = _reducer(alg, comm_dtype=fmt, aps=True, rounding="stochastic")
  k = 300
  runs = np.stack([np.asarray(f(x, jax.random.key(i))["w"][0]) for i in range(k)])
  assert len({r.tobytes() for r in runs[:20]}) == 20  # keys differ per call
  sd = np.sqrt(N + _hops(alg)) * step / 2 / np.sqrt(k)
  err = np.abs(runs.mean(0) - exact)
  assert err.max() <= 6 * sd, (err.max(), sd)
  near = np.asarray(_reducer_nearest(alg, fmt)(x)["w"][0])
  assert np.abs(near - exact).max() > 6 * sd  # nearest is off by whole steps


def _reducer_nearest(alg, fmt):
  mesh, axes = MESHES[alg]()
  spec = P(axes)
  return jax.jit(compat.shard_map(
      lambda t: jax.tree.map(lambda v: v[None], dp.all_reduce(
          jax.tree.map(lambda v: v[0], t), axes, algorithm=alg, comm_dtype=fmt)),
      mesh=mesh, in_specs=spec, out_specs=spec))


def test_devices_draw_different_keys():
  """Equal values on every device: a shared key would give only 0 or N."""
  f = _reducer("ring", comm_dtype="int4", aps=False, rounding="stochastic")
  out = np.asarray(f({"w": np.full((N, 16), 0.3, np.float32)}, jax.random.key(0))["w"][0])
  assert not np.isin(out, [0.0, N]).all()
  assert len(np.unique(out)) > 1  # and the elements of the buffer differ too


def test_stochastic_keeps_the_rounds_of_the_compiled_program():
  mesh = dp.data_mesh()
  fn = jax.jit(compat.shard_map(
      lambda t, key: dp.all_reduce(t, "data", algorithm="ring", comm_dtype="int8",
                                   aps=True, rounding="stochastic", key=key),
      mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")))
  text = fn.lower(np.ones(8 * 5, np.float32), jax.random.key(0)).compile().as_text()
  assert [r for r, _ in hlo.collective_permute_rounds(text)] == list(range(1, 15))
  assert text.count("all-reduce(") + text.count("all-reduce-start(") == 1


# ---------------------------------------------------------------------------
# The train steps: the documented key of each step.
# ---------------------------------------------------------------------------


def _step_key(seed, step):
  """fold_in(fold_in(base, 0x5352), step); base PRNGKey(0) without a state key."""
  base = jax.random.PRNGKey(0 if seed is None else seed)
  return jax.random.fold_in(jax.random.fold_in(base, 0x5352), step)


@pytest.mark.parametrize("kind,seed", _cases(
    [("jit", None)],
    [("jit", None), ("jit", 5), ("shard_update", None), ("pmap", 5)]))
def test_train_step_reduces_with_the_key_of_each_step(kind, seed):
  """SGD with lr 1: params - new params = all_reduce(local grads / N, key)."""
  params, batch = _problem()
  reduce = _reducer("ring", comm_dtype="int8", rounding="stochastic")
  kw = dict(grad_reduce="ring", comm_dtype="int8", rounding="stochastic")
  if kind == "pmap":
    step = dp.make_pmap_train_step(_loss, optax.sgd(1.0), **kw)
  else:
    step = dp.make_train_step(_loss, optax.sgd(1.0), dp.data_mesh(),
                              shard_update=kind == "shard_update", **kw)
  state = step.init(params, rng=seed)
  cur = params
  for s in range(2):
    local = jax.tree.map(lambda g: np.asarray(g) / N, _manual_grads(cur, batch))
    want = reduce(local, _step_key(seed, s))
    state, _ = step(state, batch)
    new = jax.tree.map(lambda x: np.asarray(x[0] if kind == "pmap" else x), state.params)
    for k in params:
      np.testing.assert_allclose(cur[k] - new[k], want[k][0], rtol=1e-6, atol=1e-7,
                                 err_msg=f"step {s} {k}")
    cur = new


# ---------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------


def test_bad_rounding_is_refused_at_construction():
  mesh = dp.data_mesh()
  for bad in ("round", "Stochastic", None, 1):
    with pytest.raises(ValueError, match=r"rounding.*nearest.*stochastic"):
      dp.make_train_step(_loss, optax.sgd(0.1), mesh, comm_dtype="int8", rounding=bad)
  with pytest.raises(ValueError, match=r"rounding.*nearest.*stochastic"):
    dp.make_pmap_train_step(_loss, optax.sgd(0.1), comm_dtype="int8", rounding="up")
  for kw in ({}, {"comm_dtype": "float32"}):
    with pytest.raises(ValueError, match="stochastic.*comm_dtype"):
      dp.make_train_step(_loss, optax.sgd(0.1), mesh, rounding="stochastic", **kw)
  assert dp.ROUNDINGS == ("nearest", "stochastic")

  def call(**kw):
    return jax.jit(compat.shard_map(
        lambda t: dp.all_reduce(t, "data", algorithm="ring", **kw), mesh=mesh,
        in_specs=P("data"), out_specs=P("data")))(np.ones(8, np.float32))

  with pytest.raises(ValueError, match="key"):
    call(comm_dtype="int8", rounding="stochastic")
  with pytest.raises(ValueError, match="key"):
    call(comm_dtype="int8", key=jax.random.key(0))
  with pytest.raises(ValueError, match="rounding"):
    call(comm_dtype="int8", rounding="floor", key=jax.random.key(0))
