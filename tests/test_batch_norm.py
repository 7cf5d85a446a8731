"""Tests for date_optax.nn.GhostBatchNorm (linen), its nnx twin and the layout helper.

The reference is written from the maths (docs/algorithms.md, "Data parallelism
on TPU pods"): replica r holds rows r*b .. r*b+b-1 of the global batch; the
group of (replica group G, ghost j) is the ghost j of each of the k replicas
of G; statistics are count-weighted
mean and biased variance over the group's rows and the non-feature axes.
"""

from __future__ import annotations

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax.nn as dnn
from date_optax.nn import nnx as dnnx

R = 8  # emulated devices (tests/conftest.py)
B_LOCAL = 8
SPATIAL = (2,)
C = 3
EPS = 1e-5
MOMENTUM = 0.9


# --------------------------------------------------------------------------
# numpy reference
# --------------------------------------------------------------------------


def reference(x, *, num_replicas, group_size, ghost, mask=None, eps=EPS):
  """Returns y, per-replica batch statistics (R, C) x2, global ones (C,) x2.

  Per-replica statistics are the count-weighted average over the replica's
  ghosts of its group's statistics; global ones average over all groups.
  """
  x = np.asarray(x, np.float64)
  w = np.ones_like(x) if mask is None else np.broadcast_to(mask, x.shape) * 1.0
  b = x.shape[0] // num_replicas
  k, g = group_size, ghost
  red = tuple(range(x.ndim - 1))
  y = np.empty_like(x)
  rep_mean = np.zeros((num_replicas, x.shape[-1]))
  rep_var = np.zeros_like(rep_mean)
  all_stats = []
  for grp in range(num_replicas // k):
    stats = []
    for j in range(b // g):
      rows = [(grp * k + q) * b + j * g + t for q in range(k) for t in range(g)]
      xs, ws = x[rows], w[rows]
      n = ws.sum(red)
      safe = np.where(n > 0, n, 1.0)
      mean = (ws * xs).sum(red) / safe
      var = (ws * (xs - mean) ** 2).sum(red) / safe
      y[rows] = (xs - mean) / np.sqrt(var + eps)
      stats.append((mean, var, n))
    all_stats += stats
    n_tot = sum(s[2] for s in stats)
    bm = sum(s[2] * s[0] for s in stats) / n_tot
    bv = sum(s[2] * s[1] for s in stats) / n_tot
    rep_mean[grp * k : (grp + 1) * k] = bm
    rep_var[grp * k : (grp + 1) * k] = bv
  n_tot = sum(s[2] for s in all_stats)
  gm = sum(s[2] * s[0] for s in all_stats) / n_tot
  gv = sum(s[2] * s[1] for s in all_stats) / n_tot
  return y, rep_mean, rep_var, gm, gv


def ema(batch_stat, init):
  return MOMENTUM * init + (1 - MOMENTUM) * batch_stat


def make_x(seed=0, batch=R * B_LOCAL, spatial=SPATIAL, c=C):
  rng = np.random.default_rng(seed)
  # Different offsets/scales per row block so groups really differ.
  per_row = (batch,) + (1,) * (len(spatial) + 1)
  x = rng.normal(size=(batch, *spatial, c)) * rng.uniform(0.5, 3.0, size=per_row)
  x += rng.normal(size=per_row) * 2
  return x.astype(np.float32)


def make_mask(seed=1, batch=R * B_LOCAL):
  rng = np.random.default_rng(seed)
  # Very uneven valid counts per replica (row-wise mask, broadcast over C).
  keep = rng.uniform(size=(batch, 1, 1)) < np.repeat(
      rng.uniform(0.2, 1.0, size=batch // B_LOCAL), B_LOCAL
  ).reshape(-1, 1, 1)
  keep[::B_LOCAL] = True  # at least one valid row per replica and ghost start
  return keep


def init_vars(module, x):
  kw = {} if module.use_running_average is not None else {"use_running_average": False}
  variables = module.init(jax.random.key(0), x, **kw)
  # Non-trivial scale and bias so they are checked too.
  params = {
      "scale": jnp.array([0.5, 1.5, 2.0], jnp.float32),
      "bias": jnp.array([0.1, -0.2, 0.3], jnp.float32),
  }
  return {"params": params, "batch_stats": variables["batch_stats"]}


def affine(y):
  return y * np.array([0.5, 1.5, 2.0]) + np.array([0.1, -0.2, 0.3])


def mesh1d():
  return Mesh(np.array(jax.devices()[:R]), ("batch",))


# --------------------------------------------------------------------------
# Runners: the same module under pmap, shard_map, vmap and jit (global batch).
# --------------------------------------------------------------------------


def run_pmap(module, variables, x, mask=None):
  xs = x.reshape(R, -1, *x.shape[1:])
  ms = None if mask is None else mask.reshape(R, -1, *mask.shape[1:])

  def f(v, x, m):
    return module.apply(v, x, mask=m, mutable=["batch_stats"])

  y, upd = jax.pmap(f, axis_name="batch", in_axes=(None, 0, 0))(variables, xs, ms)
  return np.asarray(y).reshape(x.shape), upd["batch_stats"]


def run_vmap(module, variables, x, mask=None):
  xs = x.reshape(R, -1, *x.shape[1:])
  ms = None if mask is None else mask.reshape(R, -1, *mask.shape[1:])

  def f(x, m):
    return module.apply(variables, x, mask=m, mutable=["batch_stats"])

  y, upd = jax.vmap(f, axis_name="batch")(xs, ms)
  return np.asarray(y).reshape(x.shape), upd["batch_stats"]


def run_shard_map(module, variables, x, mask=None, mesh=None, spec=None):
  mesh = mesh or mesh1d()
  spec = spec or P("batch")
  sharding = NamedSharding(mesh, spec)
  xs = jax.device_put(x, sharding)
  ms = None if mask is None else jax.device_put(mask, sharding)

  def f(v, x, m):
    y, upd = module.apply(v, x, mask=m, mutable=["batch_stats"])
    return y, jax.tree.map(lambda a: a[None], upd["batch_stats"])

  g = jax.jit(
      jax.shard_map(f, mesh=mesh, in_specs=(P(), spec, spec), out_specs=(spec, spec))
  )
  y, stats = g(variables, xs, ms)
  return np.asarray(y), stats


def run_jit(module, variables, x, mask=None):
  sharding = NamedSharding(mesh1d(), P("batch"))
  xs = jax.device_put(x, sharding)
  ms = None if mask is None else jax.device_put(mask, sharding)
  f = jax.jit(lambda v, x, m: module.apply(v, x, mask=m, mutable=["batch_stats"]))
  y, upd = f(variables, xs, ms)
  return np.asarray(y), upd["batch_stats"]


RUNNERS = {
    "pmap": run_pmap,
    "shard_map": run_shard_map,
    "vmap": run_vmap,
}


def check_against_reference(y, stats, x, *, k, g, mask=None, per_replica=True):
  y_ref, rm, rv, gm, gv = reference(
      x, num_replicas=R, group_size=k, ghost=g, mask=mask
  )
  np.testing.assert_allclose(y, affine(y_ref), rtol=2e-4, atol=2e-4)
  mean0, var0 = np.zeros(C), np.ones(C)
  if per_replica:
    np.testing.assert_allclose(stats["mean"], ema(rm, mean0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["var"], ema(rv, var0), rtol=1e-4, atol=1e-5)
  else:
    np.testing.assert_allclose(stats["mean"], ema(gm, mean0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["var"], ema(gv, var0), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# One device: equals flax BatchNorm when the ghost is the whole batch.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("ghost", [None, 16])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_whole_batch_equals_flax_linen(ghost, masked, fast):
  x = make_x(batch=16, spatial=(3, 2))
  mask = make_mask(batch=16)[..., None] if masked else None
  kw = dict(momentum=MOMENTUM, use_fast_variance=fast)
  ours = dnn.GhostBatchNorm(ghost_batch_size=ghost, **kw)
  theirs = nn.BatchNorm(**kw)
  variables = init_vars(ours, x)
  for step in range(3):  # the running statistics accumulate over steps
    xs = x * (1 + step) + step
    y1, u1 = ours.apply(
        variables, xs, use_running_average=False, mask=mask, mutable=["batch_stats"]
    )
    y2, u2 = theirs.apply(
        variables, xs, use_running_average=False, mask=mask, mutable=["batch_stats"]
    )
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
    for name in ("mean", "var"):
      np.testing.assert_allclose(
          u1["batch_stats"][name], u2["batch_stats"][name], rtol=1e-5, atol=1e-6
      )
    variables = {"params": variables["params"], **u1}
  e1 = ours.apply(variables, x, use_running_average=True)
  e2 = theirs.apply(variables, x, use_running_average=True)
  np.testing.assert_allclose(e1, e2, rtol=1e-5, atol=1e-5)
  # The statistics really moved away from the initial (0, 1).
  assert np.abs(np.asarray(variables["batch_stats"]["var"]) - 1.0).min() > 0.1


def test_whole_batch_equals_flax_nnx():
  x = make_x(batch=16)
  ours = dnnx.GhostBatchNorm(C, momentum=MOMENTUM, rngs=nnx.Rngs(0))
  theirs = nnx.BatchNorm(C, momentum=MOMENTUM, rngs=nnx.Rngs(0))
  for m in (ours, theirs):
    m.scale[...] = jnp.array([0.5, 1.5, 2.0])
    m.bias[...] = jnp.array([0.1, -0.2, 0.3])
  for step in range(3):
    xs = x * (1 + step) + step
    np.testing.assert_allclose(ours(xs), theirs(xs), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ours.mean[...], theirs.mean[...], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours.var[...], theirs.var[...], rtol=1e-5, atol=1e-6)
  ours.eval()
  theirs.eval()
  np.testing.assert_allclose(ours(x[:3]), theirs(x[:3]), rtol=1e-5, atol=1e-5)
  view = nnx.view(ours, use_running_average=False)
  assert view.use_running_average is False and ours.use_running_average is True


@pytest.mark.parametrize("ghost", [2, 4])
def test_ghost_on_one_device_matches_reference(ghost):
  x = make_x(batch=B_LOCAL)
  module = dnn.GhostBatchNorm(
      use_running_average=False, ghost_batch_size=ghost, momentum=MOMENTUM
  )
  variables = init_vars(module, x)
  y, upd = module.apply(variables, x, mutable=["batch_stats"])
  y_ref, _, _, gm, gv = reference(x, num_replicas=1, group_size=1, ghost=ghost)
  np.testing.assert_allclose(y, affine(y_ref), rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], ema(gm, 0.0), rtol=1e-4)
  np.testing.assert_allclose(upd["batch_stats"]["var"], ema(gv, 1.0), rtol=1e-4)
  # Ghost statistics differ from whole-batch ones (the test can fail).
  y_full = reference(x, num_replicas=1, group_size=1, ghost=B_LOCAL)[0]
  assert np.abs(y_ref - y_full).max() > 0.1


# --------------------------------------------------------------------------
# Replica groups: pmap, shard_map (all-gather fallback), vmap, jit.
# --------------------------------------------------------------------------

LAYOUTS = [(None, None), (1, None), (2, None), (4, 4), (8, 2), (2, 2)]


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("group_size,ghost", LAYOUTS)
def test_groups_match_reference(runner, group_size, ghost):
  x = make_x()
  module = dnn.GhostBatchNorm(
      use_running_average=False,
      axis_name="batch",
      group_size=group_size,
      ghost_batch_size=ghost,
      momentum=MOMENTUM,
  )
  variables = init_vars(module, x[:B_LOCAL])
  y, stats = RUNNERS[runner](module, variables, x)
  check_against_reference(y, stats, x, k=group_size or R, g=ghost or B_LOCAL)


@pytest.mark.parametrize("group_size,ghost", LAYOUTS)
def test_jit_global_batch_matches_reference(group_size, ghost):
  x = make_x()
  module = dnn.GhostBatchNorm(
      use_running_average=False,
      num_replicas=R,
      group_size=group_size,
      ghost_batch_size=ghost,
      momentum=MOMENTUM,
  )
  variables = init_vars(module, x[:B_LOCAL])
  y, stats = run_jit(module, variables, x)
  check_against_reference(
      y, stats, x, k=group_size or R, g=ghost or B_LOCAL, per_replica=False
  )


def test_group_of_all_equals_synchronised_flax_bn():
  x = make_x()
  ours = dnn.GhostBatchNorm(use_running_average=False, axis_name="batch")
  sync = nn.BatchNorm(use_running_average=False, axis_name="batch")
  variables = init_vars(ours, x[:B_LOCAL])
  y1, s1 = run_pmap(ours, variables, x)
  y2, s2 = run_pmap(sync, variables, x)
  np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(s1["var"], s2["var"], rtol=1e-5)
  # ... which is flax BatchNorm on the concatenated global batch.
  y3, s3 = nn.BatchNorm(use_running_average=False).apply(
      variables, x, mutable=["batch_stats"]
  )
  np.testing.assert_allclose(y1, y3, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(s1["mean"][3], s3["batch_stats"]["mean"], rtol=1e-5)


def test_group_of_one_equals_per_device_flax_bn():
  x = make_x()
  ours = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=1, momentum=MOMENTUM
  )
  variables = init_vars(ours, x[:B_LOCAL])
  y1, s1 = run_pmap(ours, variables, x)
  local = nn.BatchNorm(use_running_average=False, momentum=MOMENTUM)
  for r in range(R):
    rows = slice(r * B_LOCAL, (r + 1) * B_LOCAL)
    y2, s2 = local.apply(variables, x[rows], mutable=["batch_stats"])
    np.testing.assert_allclose(y1[rows], y2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s1["var"][r], s2["batch_stats"]["var"], rtol=1e-5)
  assert np.abs(np.asarray(s1["mean"][0]) - np.asarray(s1["mean"][-1])).max() > 0.05


def test_mesh_sub_axis_equals_group_size():
  """A (groups, bn) mesh with axis_name='bn' equals group_size=4 on one axis."""
  x = make_x()
  mesh = Mesh(np.array(jax.devices()[:R]).reshape(2, 4), ("groups", "bn"))
  spec = P(("groups", "bn"))
  sub = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="bn", ghost_batch_size=4, momentum=MOMENTUM
  )
  variables = init_vars(sub, x[:B_LOCAL])
  y, stats = run_shard_map(sub, variables, x, mesh=mesh, spec=spec)
  check_against_reference(y, stats, x, k=4, g=4)


@pytest.mark.parametrize("runner", ["pmap", "shard_map", "jit"])
def test_masks_are_count_weighted_across_replicas(runner):
  x = make_x()
  mask = make_mask()
  kw = dict(use_running_average=False, group_size=4, ghost_batch_size=4,
            momentum=MOMENTUM)
  if runner == "jit":
    module = dnn.GhostBatchNorm(num_replicas=R, **kw)
    y, stats = run_jit(module, init_vars(module, x[:B_LOCAL]), x, mask)
  else:
    module = dnn.GhostBatchNorm(axis_name="batch", **kw)
    y, stats = RUNNERS[runner](module, init_vars(module, x[:B_LOCAL]), x, mask)
  check_against_reference(y, stats, x, k=4, g=4, mask=mask, per_replica=runner != "jit")
  # Averaging each replica's masked mean (flax's pmean) gives something else.
  xs = x.reshape(R, B_LOCAL, -1, C)
  ms = np.broadcast_to(mask, x.shape).reshape(R, B_LOCAL, -1, C)
  per_rep = (xs * ms).sum((1, 2)) / ms.sum((1, 2))
  _, _, _, gm, _ = reference(x, num_replicas=R, group_size=R, ghost=B_LOCAL, mask=mask)
  assert np.abs(per_rep.mean(0) - gm).max() > 1e-2


def test_elementwise_mask_counts_per_feature():
  x = make_x()
  mask = np.random.default_rng(3).uniform(size=x.shape) < 0.6
  module = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=2,
      ghost_batch_size=4, momentum=MOMENTUM,
  )
  y, stats = run_vmap(module, init_vars(module, x[:B_LOCAL]), x, mask)
  check_against_reference(y, stats, x, k=2, g=4, mask=mask)


def test_fully_masked_group_stays_finite_and_keeps_running_stats():
  x = make_x()
  mask = np.ones((R * B_LOCAL, 1, 1), bool)
  mask[:2 * B_LOCAL] = False  # the first group of two replicas has no data
  module = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=2, momentum=MOMENTUM
  )
  y, stats = run_pmap(module, init_vars(module, x[:B_LOCAL]), x, mask)
  assert np.isfinite(y).all()
  np.testing.assert_array_equal(stats["mean"][:2], 0.0)
  np.testing.assert_array_equal(stats["var"][:2], 1.0)
  y_ref, rm, _, _, _ = reference(
      x[2 * B_LOCAL:], num_replicas=R - 2, group_size=2, ghost=B_LOCAL
  )
  np.testing.assert_allclose(y[2 * B_LOCAL:], affine(y_ref), rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(stats["mean"][2:], ema(rm, 0.0), rtol=1e-4, atol=1e-6)


def test_gradients_agree_across_collectives():
  """axis_index_groups (pmap), all-gather (shard_map) and reshape (jit) agree."""
  x = make_x()
  r = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  kw = dict(use_running_average=False, group_size=2, ghost_batch_size=4)
  per_dev = dnn.GhostBatchNorm(axis_name="batch", **kw)
  glob = dnn.GhostBatchNorm(num_replicas=R, **kw)
  variables = init_vars(glob, x[:B_LOCAL])

  def loss(module, v, x, r):
    y, _ = module.apply(v, x, mutable=["batch_stats"])
    return jnp.sum(y * r)

  gx_jit, gp_jit = jax.jit(jax.grad(functools.partial(loss, glob), argnums=(1, 0)))(
      variables, x, r
  )
  gx_pmap, gp_pmap = jax.pmap(
      jax.grad(functools.partial(loss, per_dev), argnums=(1, 0)),
      axis_name="batch",
      in_axes=(None, 0, 0),
  )(variables, x.reshape(R, B_LOCAL, *x.shape[1:]), r.reshape(R, B_LOCAL, *x.shape[1:]))
  mesh = mesh1d()
  sm = jax.jit(jax.shard_map(
      lambda v, x, r: jax.grad(functools.partial(loss, per_dev), argnums=1)(v, x, r),
      mesh=mesh, in_specs=(P(), P("batch"), P("batch")), out_specs=P("batch"),
  ))
  sh = NamedSharding(mesh, P("batch"))
  gx_sm = sm(variables, jax.device_put(x, sh), jax.device_put(r, sh))
  np.testing.assert_allclose(np.asarray(gx_pmap).reshape(x.shape), gx_jit, atol=1e-4)
  np.testing.assert_allclose(gx_sm, gx_jit, atol=1e-4)
  # Parameter gradients: per-device pieces sum to the global one.
  np.testing.assert_allclose(
      np.asarray(gp_pmap["params"]["scale"]).sum(0), gp_jit["params"]["scale"],
      rtol=1e-4, atol=1e-4,
  )
  assert np.abs(gx_jit).max() > 1e-3


@pytest.mark.parametrize("group_size", [None, 2])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_moments_travel_in_one_collective(group_size, masked, fast):
  x = make_x()
  mask = make_mask() if masked else None
  module = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=group_size,
      ghost_batch_size=4, use_fast_variance=fast,
  )
  variables = init_vars(module, x[:B_LOCAL])
  xs = x.reshape(R, B_LOCAL, *x.shape[1:])
  ms = None if mask is None else mask.reshape(R, B_LOCAL, *mask.shape[1:])
  def fwd(x, m):
    return module.apply(variables, x, mask=m, mutable=["batch_stats"])[0]

  pm = jax.pmap(fwd, axis_name="batch")
  sm = jax.jit(jax.shard_map(
      fwd, mesh=mesh1d(), in_specs=P("batch"), out_specs=P("batch")
  ))
  pattern = r"stablehlo\.(all_reduce|all_gather|collective_permute|all_to_all)"
  want = 1 if fast else 2  # the two-pass variance needs the mean first
  assert len(re.findall(pattern, pm.lower(xs, ms).as_text())) == want
  assert len(re.findall(pattern, sm.lower(x, mask).as_text())) == want


def test_pmap_running_stats_use_group_statistics():
  x = make_x()
  module = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=4, momentum=MOMENTUM
  )
  _, stats = run_pmap(module, init_vars(module, x[:B_LOCAL]), x)
  # Replicas of one group agree, the two groups do not.
  np.testing.assert_allclose(stats["mean"][0], stats["mean"][3], rtol=1e-6)
  assert np.abs(np.asarray(stats["mean"][0] - stats["mean"][4])).max() > 1e-2


def test_eval_uses_running_averages_and_any_batch():
  x = make_x()
  module = dnn.GhostBatchNorm(axis_name="batch", group_size=2, ghost_batch_size=4)
  variables = init_vars(module, x[:B_LOCAL])
  variables["batch_stats"] = {
      "mean": jnp.array([1.0, -1.0, 0.5]), "var": jnp.array([4.0, 0.25, 1.0])
  }
  x5 = x[:5]  # not divisible by the ghost size: fine in eval
  y = module.apply(variables, x5, use_running_average=True)
  want = (x5 - np.array([1.0, -1.0, 0.5])) / np.sqrt(np.array([4.0, 0.25, 1.0]) + EPS)
  np.testing.assert_allclose(y, affine(want), rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_reduce_in_float32():
  x = make_x(batch=16) + 100.0  # large offset: bf16 sums would lose the mean
  xb = jnp.asarray(x, jnp.bfloat16)
  module = dnn.GhostBatchNorm(
      use_running_average=False, ghost_batch_size=8, dtype=jnp.bfloat16,
      momentum=MOMENTUM,
  )
  variables = init_vars(module, x)
  y, upd = module.apply(variables, xb, mutable=["batch_stats"])
  assert y.dtype == jnp.bfloat16
  assert upd["batch_stats"]["mean"].dtype == jnp.float32
  _, _, _, gm, _ = reference(np.asarray(xb, np.float32), num_replicas=1, group_size=1,
                             ghost=8)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], ema(gm, 0.0), rtol=1e-5)
  y_ref = reference(
      np.asarray(xb, np.float32), num_replicas=1, group_size=1, ghost=8
  )[0]
  np.testing.assert_allclose(np.asarray(y, np.float32), affine(y_ref), atol=0.05)


def test_negative_fast_variance_is_clipped_to_zero():
  x = make_x(batch=16)
  x[..., 0] = 1000.3  # constant feature: E[x^2] - E[x]^2 rounds below zero
  xj = jnp.asarray(x)
  raw = jnp.square(xj).mean((0, 1)) - jnp.square(xj.mean((0, 1)))
  assert raw[0] < 0  # the case the clip is for really occurs here
  module = dnn.GhostBatchNorm(use_running_average=False, momentum=MOMENTUM)
  y, upd = module.apply(init_vars(module, x), x, mutable=["batch_stats"])
  assert np.isfinite(np.asarray(y)).all()
  np.testing.assert_allclose(upd["batch_stats"]["var"][0], MOMENTUM, atol=1e-7)


def test_multiple_feature_axes():
  x = make_x(batch=8, spatial=(2,), c=3)
  module = dnn.GhostBatchNorm(use_running_average=False, axis=(1, 2),
                              ghost_batch_size=4, use_scale=False, use_bias=False)
  variables = module.init(jax.random.key(0), x)
  assert variables["batch_stats"]["mean"].shape == (2, 3)
  y, _ = module.apply(variables, x, mutable=["batch_stats"])
  xs = x.reshape(2, 4, 2, 3)
  want = (xs - xs.mean(1, keepdims=True)) / np.sqrt(xs.var(1, keepdims=True) + EPS)
  np.testing.assert_allclose(y, want.reshape(x.shape), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------
# linen and nnx agree.
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [dict(ghost_batch_size=4), dict(num_replicas=R, group_size=2, ghost_batch_size=2)],
)
def test_linen_and_nnx_agree(kw):
  x = make_x()
  mask = make_mask()
  lin = dnn.GhostBatchNorm(momentum=MOMENTUM, **kw)
  variables = init_vars(lin, x[:B_LOCAL])
  mod = dnnx.GhostBatchNorm(C, momentum=MOMENTUM, rngs=nnx.Rngs(0), **kw)
  mod.scale[...] = variables["params"]["scale"]
  mod.bias[...] = variables["params"]["bias"]

  @nnx.jit
  def nnx_step(m, x, mask):
    return m(x, mask=mask)

  for step in range(3):
    xs = x * (1 + step) - step
    m = mask if step == 1 else None
    y1, upd = lin.apply(
        variables, xs, False, mask=m, mutable=["batch_stats"]
    )
    variables = {"params": variables["params"], **upd}
    y2 = nnx_step(mod, xs, m)
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(variables["batch_stats"]["mean"], mod.mean[...], rtol=1e-5)
  np.testing.assert_allclose(variables["batch_stats"]["var"], mod.var[...], rtol=1e-5)
  mod.eval()
  np.testing.assert_allclose(
      lin.apply(variables, x, use_running_average=True), mod(x), rtol=1e-5, atol=1e-5
  )


def test_nnx_under_shard_map_groups():
  x = make_x()
  mod = dnnx.GhostBatchNorm(C, axis_name="batch", group_size=2, ghost_batch_size=4,
                            momentum=MOMENTUM, rngs=nnx.Rngs(0))
  mod.scale[...] = jnp.array([0.5, 1.5, 2.0])
  mod.bias[...] = jnp.array([0.1, -0.2, 0.3])
  graphdef, state = nnx.split(mod)

  def f(state, x):
    m = nnx.merge(graphdef, state)
    y = m(x)
    return y, jax.tree.map(lambda a: a[None], nnx.state(m, nnx.BatchStat))

  mesh = mesh1d()
  g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("batch")),
                            out_specs=(P("batch"), P("batch"))))
  y, stats = g(state, jax.device_put(x, NamedSharding(mesh, P("batch"))))
  check_against_reference(
      np.asarray(y), {"mean": stats["mean"][...], "var": stats["var"][...]}, x,
      k=2, g=4,
  )


# --------------------------------------------------------------------------
# Bad input.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ghost_batch_size", "group_size", "num_replicas"])
@given(value=st.integers(max_value=0))
def test_non_positive_sizes_raise(name, value):
  kw = {name: value}
  if name == "group_size":
    kw["axis_name"] = "batch"
  with pytest.raises(ValueError, match=name):
    dnn.GhostBatchNorm(**kw)
  with pytest.raises(ValueError, match=name):
    dnnx.GhostBatchNorm(C, rngs=nnx.Rngs(0), **kw)


@given(momentum=st.one_of(
    st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False),
    st.floats(min_value=1.000001, allow_nan=False),
    st.just(float("nan")),
))
def test_momentum_outside_unit_interval_raises(momentum):
  with pytest.raises(ValueError, match="momentum"):
    dnn.GhostBatchNorm(momentum=momentum)
  with pytest.raises(ValueError, match="momentum"):
    dnnx.GhostBatchNorm(C, momentum=momentum, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("momentum", [0.0, 1.0])
def test_momentum_bounds_are_allowed(momentum):
  x = make_x(batch=8)
  module = dnn.GhostBatchNorm(use_running_average=False, momentum=momentum)
  variables = init_vars(module, x)
  _, upd = module.apply(variables, x, mutable=["batch_stats"])
  want = 0.0 if momentum == 1.0 else x.reshape(-1, C).mean(0)
  np.testing.assert_allclose(upd["batch_stats"]["mean"], want, atol=1e-5)


@pytest.mark.parametrize("kw,name", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(axis=0), "axis"),
    (dict(group_size=2), "group_size"),  # no replicas to group
    (dict(num_replicas=8, group_size=3), "group_size"),
    (dict(num_replicas=8, axis_name="batch"), "num_replicas"),
])
def test_bad_construction_raises(kw, name):
  with pytest.raises(ValueError, match=name):
    dnn.GhostBatchNorm(**kw)
  with pytest.raises(ValueError, match=name):
    dnnx.GhostBatchNorm(C, rngs=nnx.Rngs(0), **kw)


def test_bad_types_raise():
  with pytest.raises(TypeError, match="ghost_batch_size"):
    dnn.GhostBatchNorm(ghost_batch_size=2.5)
  with pytest.raises(TypeError, match="group_size"):
    dnnx.GhostBatchNorm(C, group_size=True, axis_name="b", rngs=nnx.Rngs(0))


def test_batch_not_divisible_by_ghost_size_raises():
  x = make_x(batch=12)
  module = dnn.GhostBatchNorm(use_running_average=False, ghost_batch_size=8)
  variables = module.init(jax.random.key(0), x)  # init accepts any batch
  with pytest.raises(ValueError, match="ghost_batch_size"):
    module.apply(variables, x, mutable=["batch_stats"])
  mod = dnnx.GhostBatchNorm(C, ghost_batch_size=8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="ghost_batch_size"):
    mod(x)
  with pytest.raises(ValueError, match="num_replicas"):
    dnnx.GhostBatchNorm(C, num_replicas=8, rngs=nnx.Rngs(0))(x)


def test_group_size_not_dividing_replicas_raises():
  x = make_x()
  module = dnn.GhostBatchNorm(
      use_running_average=False, axis_name="batch", group_size=3
  )
  variables = init_vars(module, x[:B_LOCAL])
  with pytest.raises(ValueError, match="group_size"):
    run_pmap(module, variables, x)
  with pytest.raises(ValueError, match="group_size"):
    run_shard_map(module, variables, x)


def test_nnx_feature_count_mismatch_raises():
  with pytest.raises(ValueError, match="num_features"):
    dnnx.GhostBatchNorm(4, rngs=nnx.Rngs(0))(make_x(batch=8))


# --------------------------------------------------------------------------
# Layout helper.
# --------------------------------------------------------------------------


def test_layout_rule_of_thumb():
  # You et al. 2020 (The Limit of the Batch Size): 128 per core, effective BN
  # batch 64: two ghosts, no collective.
  lay = dnn.bn_group_layout(64, per_device_batch=128, num_replicas=256)
  assert (lay.ghost_batch_size, lay.group_size, lay.ghosts_per_device) == (64, 1, 2)
  lay = dnn.bn_group_layout(64, per_device_batch=32, num_replicas=8)
  assert (lay.ghost_batch_size, lay.group_size, lay.num_groups) == (32, 2, 4)
  assert lay.effective_batch == 64
  assert lay.module_kwargs == {"ghost_batch_size": 32, "group_size": 2}


def test_layout_kwargs_feed_the_module():
  lay = dnn.bn_group_layout(16, per_device_batch=B_LOCAL, num_replicas=R)
  x = make_x()
  module = dnn.GhostBatchNorm(use_running_average=False, axis_name="batch",
                              momentum=MOMENTUM, **lay.module_kwargs)
  y, stats = run_pmap(module, init_vars(module, x[:B_LOCAL]), x)
  check_against_reference(y, stats, x, k=2, g=B_LOCAL)


@given(
    per_device=st.integers(1, 96),
    replicas=st.integers(1, 64),
    effective=st.integers(1, 512),
)
def test_layout_properties(per_device, replicas, effective):
  try:
    lay = dnn.bn_group_layout(effective, per_device, replicas)
  except ValueError as e:
    assert "effective_batch" in str(e)
    valid = per_device % effective == 0 or (
        effective % per_device == 0 and replicas % (effective // per_device) == 0
    )
    assert not valid
    return
  assert lay.effective_batch == effective
  assert per_device % lay.ghost_batch_size == 0
  assert replicas % lay.group_size == 0
  assert lay.group_size == 1 or lay.ghost_batch_size == per_device


@pytest.mark.parametrize("args,name", [
    ((0, 8, 8), "effective_batch"),
    ((8, 0, 8), "per_device_batch"),
    ((8, 8, -1), "num_replicas"),
    ((48, 64, 8), "effective_batch"),
    ((64, 32, 3), "effective_batch"),
])
def test_layout_bad_input(args, name):
  with pytest.raises(ValueError, match=name):
    dnn.bn_group_layout(*args)


def test_layout_error_suggests_neighbours():
  with pytest.raises(ValueError, match="Nearest that work: 32, 64"):
    dnn.bn_group_layout(48, per_device_batch=64, num_replicas=8)


def test_init_normalises_with_the_whole_batch_and_keeps_the_initial_averages():
  # As flax's BatchNorm: `init` returns the initial running averages (zeros
  # and ones), whatever the batch, and normalises that batch with its own
  # whole-batch moments (no ghost groups, no collective at init).
  x = np.random.default_rng(0).normal(3.0, 2.0, (8, 5)).astype(np.float32)
  module = dnn.GhostBatchNorm(use_running_average=False, ghost_batch_size=4, axis_name=None)
  y, variables = module.init_with_output(jax.random.key(0), x)
  np.testing.assert_array_equal(variables["batch_stats"]["mean"], np.zeros(5, np.float32))
  np.testing.assert_array_equal(variables["batch_stats"]["var"], np.ones(5, np.float32))
  expected = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
