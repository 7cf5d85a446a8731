"""The per-layer trust ratios an optimizer state records, kept in one vector.

A state with one ratio array per parameter leaf makes a compiled step take
and return one buffer per leaf for a record the update never reads, and
write each leaf's ratio with a kernel of its own. On a model of many small
leaves those buffers, not the arithmetic, set the step's time (each costs
the runtime a few microseconds per call, on every backend). The record is
therefore one float32 vector for all layers, in the parameters' leaf order,
with the tree structure kept as static data beside it, so that
:func:`date_optax.trust_ratios` still returns a pytree shaped like the
parameters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization


@dataclasses.dataclass(frozen=True)
class LayerRatios:
  """The per-layer trust ratios of one step, as one float32 vector.

  The ``ratios`` field of the package's optimizer states
  (:class:`date_optax.LarsState`, :class:`date_optax.LambState`,
  :class:`date_optax.BoundedLarsState`, :class:`date_optax.TrustRatioState`)
  holds one of these. It is a pytree with a single array leaf, ``values``;
  the parameters' tree structure and each leaf's ratio shape are static data,
  so states of one model compare, map and checkpoint as before with one
  leaf where there were as many as the parameters. Read the ratios as a
  pytree shaped like the parameters with :meth:`unpack` or
  :func:`date_optax.trust_ratios`.

  The optimizers build it; construct one directly only to restore or
  convert a record.

  Args:
    values: float32 vector of every layer's ratio, in the parameters' leaf
      order; a leaf with layer axes contributes its layers in row-major
      order.
    treedef: the parameters' tree structure (static).
    shapes: each leaf's ratio shape (static): ``()`` for a leaf that is one
      layer, the sizes of its layer axes otherwise.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'b': jnp.zeros(3), 'w': jnp.ones((4, 2, 2))}
    >>> state = date_optax.lamb(1e-3, layer_axes={'b': None, 'w': (0,)}).init(params)
    >>> state.ratios.values.shape                   # 1 + 4 layers
    (5,)
    >>> {k: v.shape for k, v in state.ratios.unpack().items()}
    {'b': (), 'w': (4,)}

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017 (per-layer ratios); NVIDIA
    Apex's multi-tensor LAMB keeps its per-tensor norms in one buffer
    likewise.
  """

  values: Any
  treedef: Any
  shapes: tuple[tuple[int, ...], ...]

  def unpack(self) -> Any:
    """The ratios as a pytree shaped like the parameters.

    Returns:
      A pytree with ``treedef``'s structure whose leaves are float32 arrays
      of shape ``()`` or of the leaf's layer axes (NumPy arrays if
      ``values`` is one, e.g. after ``jax.device_get``).
    """
    values = self.values
    leaves, offset = [], 0
    for shape in self.shapes:
      n = math.prod(shape)
      if isinstance(values, jax.ShapeDtypeStruct):  # eval_shape, restore targets
        leaves.append(jax.ShapeDtypeStruct(shape, values.dtype,
                                           sharding=getattr(values, "sharding", None)))
      else:
        leaves.append(values[offset:offset + n].reshape(shape))
      offset += n
    return jax.tree.unflatten(self.treedef, leaves)

  @property
  def num_layers(self) -> int:
    """How many layers (ratios) the record holds."""
    return _num_layers(self.shapes)


def _num_layers(shapes: tuple[tuple[int, ...], ...]) -> int:
  return sum(math.prod(s) for s in shapes)


def _flat_values(tree: Any) -> jax.Array:
  """A per-leaf ratio tree's values, raveled and concatenated in leaf order."""
  leaves = [jnp.ravel(jnp.asarray(x, jnp.float32)) for x in jax.tree.leaves(tree)]
  return jnp.concatenate(leaves) if leaves else jnp.zeros((0,), jnp.float32)


jax.tree_util.register_dataclass(
    LayerRatios, data_fields=["values"], meta_fields=["treedef", "shapes"])


def _to_state_dict(record: LayerRatios) -> dict:
  return {"values": serialization.to_state_dict(record.values)}


def _from_state_dict(target: LayerRatios, state: dict) -> LayerRatios:
  """The record from flax's state dict; one saved per leaf (before) is packed."""
  if "values" in state:
    values = serialization.from_state_dict(target.values, state["values"])
  else:
    values = _flat_values(serialization.from_state_dict(target.unpack(), state))
  return LayerRatios(values, target.treedef, target.shapes)


# flax.serialization (msgpack checkpoints of an optimizer state) reads and
# writes the record as {"values": ...}.
serialization.register_serialization_state(LayerRatios, _to_state_dict, _from_state_dict)


def as_tree(ratios: Any) -> Any:
  """`ratios` as a pytree shaped like the parameters (unpacked if packed)."""
  return ratios.unpack() if isinstance(ratios, LayerRatios) else ratios


def ones(treedef: Any, shapes: tuple[tuple[int, ...], ...]) -> LayerRatios:
  """A record of ratio 1 for every layer (the state before the first step)."""
  return LayerRatios(jnp.ones((_num_layers(shapes),), jnp.float32), treedef, tuple(shapes))


def _replicated(x: jax.Array) -> jax.Array:
  """`x` made replicated where its type carries mesh axes (explicit sharding).

  A stacked leaf's ratios are split like its layer axis; the record holds
  every layer's ratio on every device. Under auto axes XLA places the
  concatenation itself.
  """
  spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
  if spec is not None and any(e is not None for e in spec):
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec())
  return x


def pack(
    pieces: list[tuple[list[int], jax.Array]],
    treedef: Any,
    shapes: tuple[tuple[int, ...], ...],
) -> LayerRatios:
  """One record from pieces that each hold some leaves' ratios.

  Each piece is ``(leaf indices, values)``: ``values`` (any shape, read in
  row-major order) holds the ratios of those leaves one after another, as a
  group's stacked ratios do. The pieces are concatenated once and, where
  their order is not the leaves' order, put in leaf order by one gather with
  constant indices: a fixed number of kernels however many leaves there are.
  """
  sizes = [math.prod(s) for s in shapes]
  starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  flat, perm_src, at = [], np.empty(int(starts[-1]), np.int64), 0
  for idx, values in pieces:
    values = _replicated(jnp.ravel(jnp.asarray(values, jnp.float32)))
    if values.size != sum(sizes[i] for i in idx):
      raise ValueError("a piece's values do not match its leaves' ratio shapes.")
    flat.append(values)
    for i in idx:
      perm_src[starts[i]:starts[i] + sizes[i]] = np.arange(at, at + sizes[i])
      at += sizes[i]
  if at != starts[-1]:
    raise ValueError(f"the pieces hold {at} ratios; the leaves have {starts[-1]}.")
  if not flat:  # no parameters
    return LayerRatios(jnp.zeros((0,), jnp.float32), treedef, tuple(shapes))
  vec = flat[0] if len(flat) == 1 else jnp.concatenate(flat)
  if not np.array_equal(perm_src, np.arange(at)):
    # perm_src[k] is where layer k (in leaf order) sits in the concatenation.
    vec = vec[perm_src]
  return LayerRatios(vec, treedef, tuple(shapes))


def _is_record(x: Any) -> bool:
  return isinstance(x, LayerRatios)


def unpacked_records(abstract: Any) -> Any:
  """`abstract` (shapes, dtypes, shardings) with each record as a per-leaf tree.

  Checkpoints written before the ratios were packed hold one array per
  parameter leaf where a record now holds one vector; this is the target
  that reads them.
  """

  return jax.tree.map(lambda x: x.unpack() if _is_record(x) else x, abstract,
                      is_leaf=_is_record)


def repacked_records(restored: Any, abstract: Any) -> Any:
  """`restored` (read with :func:`unpacked_records`'s target) packed again."""

  def repack(a, r):
    if not _is_record(a):
      return r
    # Under jit: the restored arrays may span hosts.
    values = jax.jit(_flat_values, out_shardings=getattr(a.values, "sharding", None))(r)
    return LayerRatios(values, a.treedef, a.shapes)

  return jax.tree.map(repack, abstract, restored, is_leaf=_is_record)
