"""Masks and per-leaf options: the ready bias/norm predicate and prefix trees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

# Parameter names that hold biases or normalisation scales/offsets across
# flax (bias, scale), haiku (b, offset, scale) and Keras (beta, gamma).
_EXCLUDED_NAMES = frozenset({"bias", "b", "scale", "offset", "beta", "gamma"})
# Attribute names of variable wrappers (nnx.Variable.value) that are not
# parameter names and must be skipped when looking for the leaf's name.
_WRAPPER_ATTRS = frozenset({"value", "raw_value", "unbox"})


def _key_name(key: Any) -> str | None:
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return None
  if isinstance(key, jax.tree_util.SequenceKey):
    return None
  return None


def _leaf_name(path: tuple[Any, ...]) -> str | None:
  for key in reversed(path):
    name = _key_name(key)
    if name is not None and name not in _WRAPPER_ATTRS:
      return name
  return None


def exclude_bias_and_norm(params: Any) -> Any:
  """Mask that is `False` for biases and normalisation parameters.

  A leaf is excluded when it has at most one dimension, or when its name (the
  last dict key or attribute on its path, skipping ``nnx.Variable.value``) is
  one of ``bias``, ``b``, ``scale``, ``offset``, ``gamma``, ``beta``. The name
  rule also catches stacked biases and norm scales of ``nn.scan``/``nnx.scan``
  models, which are 2-D. Works on dicts, ``FrozenDict`` and ``nnx.State``; the
  returned tree has the structure of ``params`` with bool leaves (``True`` =
  apply the transformation), as :func:`optax.masked` expects.

  Args:
    params: a parameter pytree (or any tree of arrays with the same
      structure, such as gradients or ``jax.ShapeDtypeStruct`` leaves).

  Returns:
    A pytree of Python bools with the structure of ``params``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'dense': {'kernel': jnp.ones((3, 4)), 'bias': jnp.zeros(4)},
    ...           'norm': {'scale': jnp.ones(4)}}
    >>> date_optax.exclude_bias_and_norm(params)
    {'dense': {'bias': False, 'kernel': True}, 'norm': {'scale': False}}

  References:
    Goyal et al., `Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour
    <https://arxiv.org/abs/1706.02677>`_, 2017 (no weight decay on biases and
    BN parameters); You et al., `Large Batch Training of Convolutional
    Networks <https://arxiv.org/abs/1708.03888>`_, 2017 (LARS skip list).
  """

  def keep(path, leaf):
    ndim = len(np.shape(leaf)) if not hasattr(leaf, "ndim") else leaf.ndim
    if ndim <= 1:
      return False
    return _leaf_name(path) not in _EXCLUDED_NAMES

  return jax.tree_util.tree_map_with_path(keep, params)


def _is_axes_leaf(x: Any) -> bool:
  if x is None or isinstance(x, (int, np.integer)):
    return True
  return isinstance(x, tuple) and all(isinstance(i, (int, np.integer)) for i in x)


def _is_mask_leaf(x: Any) -> bool:
  return x is None or isinstance(x, (bool, np.bool_))


def broadcast_prefix(
    prefix: Any, tree: Any, is_leaf: Callable[[Any], bool]
) -> list[Any]:
  """Expands a prefix tree to one value per leaf of `tree` (flattened order)."""
  out: list[Any] = []

  def expand(p, sub):
    n = len(jax.tree.leaves(sub))
    out.extend([p] * n)

  jax.tree.map(expand, prefix, tree, is_leaf=is_leaf)
  return out


def resolve_mask(mask: Any, params: Any) -> list[bool]:
  """Returns one bool per leaf of `params`: `True` where the mask applies.

  `mask` may be None (everything), a bool, a bool pytree or prefix, or a
  callable `params -> bool pytree`, as in :func:`optax.masked`.
  """
  n = len(jax.tree.leaves(params))
  if mask is None:
    return [True] * n
  if callable(mask):
    mask = mask(params)
  if _is_mask_leaf(mask):
    return [bool(mask)] * n
  flags = broadcast_prefix(mask, params, is_leaf=_is_mask_leaf)
  return [True if f is None else bool(f) for f in flags]


def resolve_layer_axes(layer_axes: Any, params: Any) -> list[tuple[int, ...] | None]:
  """Returns, per leaf, the axes that index layers (None: the leaf is one layer).

  `layer_axes` may be None, an int or tuple of ints (for every leaf), a prefix
  pytree of those, or a callable `params -> such a pytree`.
  """
  leaves = jax.tree.leaves(params)
  if layer_axes is None:
    return [None] * len(leaves)
  if callable(layer_axes):
    layer_axes = layer_axes(params)
  if _is_axes_leaf(layer_axes):
    specs = [layer_axes] * len(leaves)
  else:
    specs = broadcast_prefix(layer_axes, params, is_leaf=_is_axes_leaf)
  out = []
  for spec, leaf in zip(specs, leaves):
    if spec is None:
      out.append(None)
      continue
    axes = (spec,) if isinstance(spec, (int, np.integer)) else tuple(spec)
    ndim = len(np.shape(leaf))
    norm_axes = []
    for a in axes:
      if not -ndim <= int(a) < ndim:
        raise ValueError(
            f"layer_axes: axis {a} is out of range for a leaf of shape "
            f"{np.shape(leaf)} (allowed: [{-ndim}, {ndim - 1}])."
        )
      norm_axes.append(int(a) % ndim)
    out.append(tuple(sorted(set(norm_axes))))
  return out
