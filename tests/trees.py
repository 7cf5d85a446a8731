"""The transform tests' small parameter tree and gradient field, and runs on them.

`run` takes a few steps of an optimizer, `run_ref` of its NumPy reference
(tests/reference.py, float64), and `assert_close` compares the two by path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import reference as ref


def make_params(seed=0, dtype=jnp.float32):
  """A dense layer, a conv kernel and a BN-like scale of ones."""
  k = jax.random.split(jax.random.key(seed), 4)
  return {
      "dense": {
          "kernel": jax.random.normal(k[0], (6, 5), dtype),
          "bias": 0.1 * jax.random.normal(k[1], (5,), dtype),
      },
      "conv": jax.random.normal(k[2], (3, 3, 2, 4), dtype) * 0.3,
      "scale": jnp.ones((4,), dtype),
  }


def grads_at(params, step):
  """A smooth, step-dependent gradient field: deterministic and non-trivial."""
  return jax.tree.map(
      lambda p: (jnp.sin(3.0 * p + step) + 0.05 * step).astype(p.dtype), params
  )


def keyed(tree):
  """The leaves by path (`jax.tree_util.keystr`)."""
  return {jax.tree_util.keystr(k): v
          for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run(opt, params, steps=4, grads=grads_at, jit=True):
  """`steps` updates of `opt` on the gradients `grads(params, t)`; (params, state)."""
  state = opt.init(params)
  update = jax.jit(opt.update) if jit else opt.update
  for t in range(steps):
    updates, state = update(grads(params, t), state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def run_ref(ref_opt, params, steps=4, grads=grads_at):
  """The same steps of the reference `ref_opt` in float64: its params by path.

  The gradients are `grads` at the reference's iterate, cast to the params' dtypes.
  """
  p = {k: ref.arr(v) for k, v in keyed(params).items()}
  treedef = jax.tree.structure(params)
  dtypes = [x.dtype for x in jax.tree.leaves(params)]
  for t in range(steps):
    cur = jax.tree.unflatten(treedef, [jnp.asarray(p[k], d)
                                       for k, d in zip(p, dtypes)])
    g = {k: ref.arr(v) for k, v in keyed(grads(cur, t)).items()}
    p = ref_opt.step(p, g)
  return p


def assert_close(tree, want, rtol=2e-5, atol=1e-6):
  """`tree`'s leaves equal `want`'s (by path) to the tolerances."""
  got = keyed(tree)
  assert got.keys() == want.keys()
  for k in got:
    np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=rtol,
                               atol=atol, err_msg=k)
