"""Per-layer sums of squares, the small leaves of one shape reduced together.

The reductions under the trust ratio (:mod:`date_optax._src.trust_ratio`):
each layer's ``‖w‖²`` and ``‖d‖²`` (or ``‖d + λw‖²``), small whole leaves
of one shape, dtypes and sharding stacked into one reduction, as
multi-tensor apply does (docs/RESULTS.md, benchmarks/optimizer_step.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src.exact_norms import add_decay, norm_of_sum_sq, sum_squares

# Leaves of at most this many elements have their sums of squares computed
# together with the other leaves of the same shape and dtypes: one stacked
# reduction per group instead of two per leaf. Below it a step is bound by
# kernel launches (a bias, a norm scale, a small head), above it by memory
# traffic, where stacking would add a copy (benchmarks/optimizer_step.py,
# docs/RESULTS.md).
GROUP_MAX_ELEMENTS = 1 << 14


class SumRequest(NamedTuple):
  """One layer-wise reduction :func:`layer_ratios` is asked for.

  ``d`` is the vector whose norm is the denominator's; with ``decay`` set
  the norm is ``‖d + λw‖`` (:func:`norm_of_sum_sq`), and ``decayed`` is
  ``d + λw`` already formed by :func:`add_decay` when the caller's ``d`` is
  computed in the step (or ``None``, to have the reduction form its own from
  ``d`` and ``w``). ``coupled`` says
  whether weight decay enters the layer's denominator (passed on to the
  ratio function).
  """

  w: jax.Array
  d: jax.Array
  axes: tuple[int, ...]
  decay: bool = False
  decayed: jax.Array | None = None
  coupled: bool = False


def is_large(w: Any, axes: tuple[int, ...]) -> bool:
  """Whether a layer is reduced on its own (not stacked with its shape's)."""
  return (len(axes) != np.ndim(w) or np.size(w) > GROUP_MAX_ELEMENTS
          or jnp.iscomplexobj(w))


def _sharding_key(x: jax.Array) -> Any:
  """The array's sharding as its type carries it (explicit mesh axes), or None.

  Leaves of one shape stack only with the same sharding: under explicit
  axes a stack of differently sharded operands is an error, and under auto
  axes it would make XLA move the small leaves between devices.
  """
  sharding = getattr(jax.typeof(x), "sharding", None)
  try:
    hash(sharding)
  except TypeError:
    return repr(sharding)
  return sharding


def _groupable(req: SumRequest) -> bool:
  return (not is_large(req.w, req.axes) and np.shape(req.d) == np.shape(req.w)
          and not jnp.iscomplexobj(req.d))


def layer_ratios(
    requests: list[SumRequest], ratio_fn: Any, weight_decay: Any = None,
) -> tuple[list[jax.Array], list[tuple[list[int], jax.Array]]]:
  """``ratio_fn(‖w‖², ‖d‖²)`` per request, small leaves reduced together.

  Requests for whole small real leaves (at most :data:`GROUP_MAX_ELEMENTS`
  elements, no layer axes) of one shape and pair of dtypes are stacked and
  reduced at once, as multi-tensor apply does, so the number of reductions
  grows with the number of distinct small shapes, not of leaves; on a mesh
  same-shaped leaves stack along a new axis and their partial sums are
  combined in one collective. The others are reduced leaf by leaf. Each
  result keeps the reduced dims (size 1) for broadcasting against its leaf;
  with ``decay`` the second sum is ``‖d + λw‖²`` with ``λ = weight_decay``,
  formed without cancellation (:func:`norm_of_sum_sq`). ``ratio_fn(w_sq,
  d_sq, coupled)`` maps the two sums to the layer's ratio elementwise; a
  group's ratios are made by one call on its stacked sums.

  Returns ``(ratios, pieces)``: the ratio of each request, and the same
  values as ``(request indices, array)`` pieces, one per group or leaf, for
  :func:`date_optax._src.layer_ratios.pack` to record without a slice per leaf.
  """
  out: list = [None] * len(requests)
  pieces: list = []
  groups: dict = {}
  for i, req in enumerate(requests):
    if _groupable(req):
      w, d = req.w, req.d
      key = (w.shape, w.dtype, d.dtype, req.decay, req.coupled,
             _sharding_key(w), _sharding_key(d))
      groups.setdefault(key, []).append(i)
    else:
      groups[("leaf", i)] = [i]
  for key, idx in groups.items():
    if key[0] == "leaf" or len(idx) == 1:
      for i in idx:
        req = requests[i]
        w_sq = sum_squares(req.w, req.axes)
        if req.decay:
          d_sq = norm_of_sum_sq(req.d, req.w, weight_decay, req.axes, v=req.decayed)
        else:
          d_sq = sum_squares(req.d, req.axes)
        out[i] = ratio_fn(w_sq, d_sq, req.coupled)
        pieces.append(([i], out[i]))
      continue
    first = requests[idx[0]]  # the group shares its flags (they are in the key)
    w = jnp.stack([requests[i].w for i in idx])
    d = jnp.stack([requests[i].d for i in idx])
    axes = tuple(range(1, w.ndim))
    if first.decay:
      # The stacks are copies no update reads: their exact sum is reduced as
      # is (norm_of_sum_sq's barrier is for the step's own inputs).
      d_sq = sum_squares(add_decay(d, weight_decay, w), axes)
    else:
      d_sq = sum_squares(d, axes)
    r = ratio_fn(sum_squares(w, axes), d_sq, first.coupled)
    for j, i in enumerate(idx):
      out[i] = r[j]
    pieces.append((list(idx), r))
  return out, pieces
