"""Every transform on parameters sharded over explicit- and auto-axis meshes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax

jax.config.update("jax_default_matmul_precision", "highest")

BASELINE = date_optax.Baseline(optimizer="adam", batch_size=32, learning_rate=1e-2,
                               warmup_epochs=1.0, epochs=10, num_examples=1024)
OPTS = {
    "trust_ratio": lambda: optax.chain(
        date_optax.scale_by_trust_ratio(0.5, weight_decay=1e-2,
                                        denominator="norm_of_sum", upper=20.0),
        optax.sgd(0.1)),
    "lars": lambda: date_optax.lars(0.1, weight_decay=1e-2, trust_coefficient=0.02),
    "lars_norm_of_sum": lambda: date_optax.lars(
        0.1, weight_decay=1e-2, denominator="norm_of_sum", layer_axes={
            "w": None, "stacked": 0, "b": None, "b_model": None,
            "b_replicated": None}),
    "lamb": lambda: date_optax.lamb(1e-2, weight_decay=1e-2, layer_axes={
        "w": None, "stacked": 0, "b": None, "b_model": None,
        "b_replicated": None}),
    "bounded_lars": lambda: date_optax.bounded_lars(0.1, base="adam",
                                                    weight_decay=1e-3),
    "date": lambda: date_optax.date(BASELINE, 64),
}
# Three small leaves of one shape, sharded three ways: reduced together.
SPECS = {"w": P("data", "model"), "stacked": P("model", "data", None),
         "b": P("data"), "b_model": P("model"), "b_replicated": P()}


def spec_of(x):
  spec = tuple(x.sharding.spec)
  while spec and spec[-1] is None:
    spec = spec[:-1]
  return spec


def make():
  k = jax.random.split(jax.random.key(0), 5)
  return {"w": jax.random.normal(k[0], (8, 6)),
          "stacked": jax.random.normal(k[1], (4, 8, 3)),
          "b": 0.1 * jax.random.normal(k[2], (8,)),
          "b_model": 0.1 * jax.random.normal(k[3], (8,)),
          "b_replicated": 0.1 * jax.random.normal(k[4], (8,))}


def grads_of(p):
  return jax.tree.map(lambda x: jnp.sin(3.0 * x) + 0.1, p)


def steps(opt, params, n, jit):
  state = opt.init(params)

  def step(p, s):
    u, s = opt.update(grads_of(p), s, p)
    return optax.apply_updates(p, u), s, u

  f = jax.jit(step) if jit else step
  for _ in range(n):
    params, state, upd = f(params, state)
  return params, state, upd


@functools.cache
def unsharded(name):
  """Three jitted steps of OPTS[name] on one device: the parameters and the
  trust ratios (numpy), computed once for the four sharded cases."""
  want_p, want_s, _ = steps(OPTS[name](), make(), 3, jit=True)
  return (jax.tree.map(np.asarray, want_p),
          np.asarray(jax.tree.leaves(date_optax.trust_ratios(want_s))[0]))


# Eager under an Auto mesh is in `make test-all`: its library code is the Auto
# case's ([name-auto-jit]) run op by op, as [name-explicit-eager] runs it.
@pytest.mark.parametrize("name,axis_type,jit", [
    pytest.param(name, axis_type, jit, id=f"{name}-{axis_id}-{'jit' if jit else 'eager'}",
                 marks=[pytest.mark.slow] if (axis_id, jit) == ("auto", False) else [])
    for name in OPTS
    for axis_type, axis_id in ((AxisType.Explicit, "explicit"), (AxisType.Auto, "auto"))
    for jit in (True, False)])
def test_sharded_equals_unsharded(name, axis_type, jit):
  devices = jax.devices()[:8]
  assert len(devices) == 8, "tests expect 8 emulated CPU devices"
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2,
                       devices=devices)
  want_p, want_ratios = unsharded(name)
  with jax.sharding.set_mesh(mesh):
    params = {k: jax.device_put(v, NamedSharding(mesh, SPECS[k]))
              for k, v in make().items()}
    got_p, got_s, upd = steps(OPTS[name](), params, 3, jit=jit)
  for k in params:
    np.testing.assert_allclose(np.asarray(got_p[k]), np.asarray(want_p[k]),
                               rtol=1e-6, atol=1e-6, err_msg=k)
    assert spec_of(got_p[k]) == spec_of(params[k]), k
    assert spec_of(upd[k]) == spec_of(params[k]), k
  np.testing.assert_allclose(
      np.asarray(jax.tree.leaves(date_optax.trust_ratios(got_s))[0]), want_ratios, rtol=1e-6)
  # Per-parameter state buffers keep the parameter's sharding.
  for leaf in jax.tree.leaves(got_s):
    for _k, v in params.items():
      if leaf.shape == v.shape and leaf.ndim >= 2:
        assert spec_of(leaf) == spec_of(v)
