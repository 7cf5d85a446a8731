"""Per-leaf fingerprints of a checkpointed state: every bit, never gathered.

Two position-weighted sums of each leaf's bits (mod 2**32), computed where
the array lives, so a sharded or multi-host array is never gathered; a
checkpoint's metadata keeps them to verify a restore bit for bit, and
`date_optax.checkpoint.tree_checksum` hashes them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _as_u32(x: jax.Array) -> jax.Array:
  """The bits of `x` as uint32 words (trailing axis for wide dtypes)."""
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    return jnp.stack([_as_u32(jnp.real(x)), _as_u32(jnp.imag(x))], axis=-1)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  width = x.dtype.itemsize
  if width >= 4:
    return lax.bitcast_convert_type(x, jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16}[width]
  return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
  """Two position-weighted sums of a leaf's bits, mod 2**32.

  Any changed, lost or moved word changes them (a bit-exact comparison is
  what an exact resume needs); computed where the array lives, so a sharded
  or multi-host array is never gathered.
  """
  w = _as_u32(jnp.asarray(x))
  pos = jnp.zeros(w.shape, jnp.uint32)
  for axis in range(w.ndim):
    stride = int(np.prod(w.shape[axis + 1 :], dtype=np.int64)) & 0xFFFFFFFF
    pos = pos + lax.broadcasted_iota(jnp.uint32, w.shape, axis) * jnp.uint32(stride)
  mix = pos * jnp.uint32(2654435761) + jnp.uint32(1)
  return jnp.stack([jnp.sum(w * mix, dtype=jnp.uint32),
                    jnp.sum(w ^ (pos * jnp.uint32(40503)), dtype=jnp.uint32)])


@jax.jit
def _fingerprints_jit(leaves: list[jax.Array]) -> jax.Array:
  if not leaves:
    return jnp.zeros((0, 2), jnp.uint32)
  return jnp.stack([_leaf_fingerprint(x) for x in leaves])


def fingerprints(tree: Any) -> list[list[int]]:
  """Per-leaf fingerprints of an encoded (raw-key) state, as JSON ints.

  One program per set of devices the leaves live on (usually one): leaves
  committed to different devices (a restore onto the shardings they were
  saved with) cannot be arguments of one program.
  """
  leaves = [x if isinstance(x, jax.Array) else np.asarray(x) for x in jax.tree.leaves(tree)]
  groups: dict[Any, list[int]] = {}
  for i, x in enumerate(leaves):
    devices = frozenset(x.sharding.device_set) if isinstance(x, jax.Array) else None
    groups.setdefault(devices, []).append(i)
  out = np.zeros((len(leaves), 2), np.int64)
  for idx in groups.values():
    sums = _fingerprints_jit([leaves[i] for i in idx])
    # The result is replicated: any local copy holds all of it (multi-host too).
    out[idx] = np.asarray(sums.addressable_shards[0].data)
  return out.tolist()
