"""The small parameter tree and gradient field the transform tests share."""

import jax
import jax.numpy as jnp


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
