"""Masks and per-leaf options: the ready bias/norm predicate and prefix trees."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from date_optax._src.types import LayerAxes, MaskOrFn, PyTree

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


def exclude_bias_and_norm(params: PyTree) -> PyTree:
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


def resolve_mask(mask: MaskOrFn, params: PyTree) -> list[bool]:
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


def resolve_layer_axes(layer_axes: LayerAxes, params: PyTree) -> list[tuple[int, ...] | None]:
  """Returns, per leaf, the axes that index layers (None: the leaf is one layer).

  `layer_axes` may be None, an int or tuple of ints (for every leaf), a prefix
  pytree of those, or a callable `params -> such a pytree`.
  """
  leaves = jax.tree.leaves(params)
  if layer_axes is None:
    return [None] * len(leaves)
  if callable(layer_axes):
    from date_optax._src import validation

    try:
      layer_axes = validation.check_layer_axes("layer_axes", layer_axes(params))
    except (TypeError, ValueError) as e:
      raise type(e)(f"layer_axes: the callable must take params and return None, an "
                    f"int, a tuple of ints or a pytree of those ({e}).") from e
    if callable(layer_axes):
      raise TypeError(f"layer_axes: the callable returned another callable, {layer_axes!r}.")
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


def resolve_masks(
    trust_ratio_mask: MaskOrFn, weight_decay_mask: MaskOrFn, params: PyTree
) -> tuple[list[bool], list[bool]]:
  """Per-leaf (trust, weight decay) flags under the package's one masking rule.

  If only one of the two masks is given (not ``None``) it is used for both;
  if both are given they are independent; if neither is, every leaf gets the
  ratio and the weight decay.
  """
  if trust_ratio_mask is None:
    trust_ratio_mask = weight_decay_mask
  elif weight_decay_mask is None:
    weight_decay_mask = trust_ratio_mask
  return resolve_mask(trust_ratio_mask, params), resolve_mask(weight_decay_mask, params)


def path_string(path: tuple[Any, ...]) -> str:
  """A leaf's path as '/'-joined keys, attributes and indices (nnx's `value` skipped)."""
  parts = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      parts.append(str(key.key))
    elif isinstance(key, jax.tree_util.GetAttrKey):
      if key.name in _WRAPPER_ATTRS:
        continue
      parts.append(key.name)
    elif isinstance(key, jax.tree_util.SequenceKey):
      parts.append(str(key.idx))
    elif isinstance(key, jax.tree_util.FlattenedIndexKey):
      parts.append(str(key.key))
    else:
      parts.append(str(key))
  return "/".join(parts)


def path_mask(
    include: str | tuple[str, ...] | list[str] = (),
    exclude: str | tuple[str, ...] | list[str] = (),
) -> Callable[[PyTree], PyTree]:
  r"""A mask from regular expressions on '/'-joined parameter paths.

  A leaf's path joins its dict keys, attribute names and sequence indices
  with ``'/'`` (``'encoder/layers/0/mlp/kernel'``; the ``value`` attribute of
  ``nnx`` variables is skipped). The leaf is ``True`` (the transformation
  applies) when ``include`` is empty or one of its patterns matches, and no
  pattern of ``exclude`` matches. Patterns are matched with :func:`re.search`
  (anywhere in the path; anchor with ``^``/``$`` to match whole names). A
  stacked leaf of an ``nn.scan`` model is one leaf: its mask covers all its
  layers. The result is a callable ``params -> bool pytree`` accepted by
  every ``mask``/``trust_ratio_mask``/``weight_decay_mask`` argument of this
  package and by :func:`optax.masked`; it works on dicts, ``FrozenDict`` and
  ``nnx.State``. A pattern that matches no parameter path of the tree the
  mask is applied to warns (``UserWarning``) naming the pattern: a typo would
  otherwise select every leaf or none without a word.

  Args:
    include: a pattern or a sequence of patterns; empty = every leaf.
    exclude: a pattern or a sequence of patterns removed from the mask.

  Returns:
    A callable mapping a parameter pytree to a pytree of Python bools with the
    same structure.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'encoder': {'kernel': jnp.ones((2, 2)), 'bias': jnp.zeros(2)},
    ...           'layer_norm': {'weight': jnp.ones((3, 2))}}
    >>> mask = date_optax.path_mask(exclude=(r'bias$', r'norm'))
    >>> mask(params)
    {'encoder': {'bias': False, 'kernel': True}, 'layer_norm': {'weight': False}}

  References:
    Beyer, Zhai and Kolesnikov, `Big Vision
    <https://github.com/google-research/big_vision>`_, 2022 (regex lists
    over parameter paths for weight decay); You et al., `Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes
    <https://arxiv.org/abs/1904.00962>`_, 2020 (``exclude_from_weight_decay``
    name patterns).
  """

  def compile_all(name, pats):
    if isinstance(pats, str):
      pats = (pats,)
    if not isinstance(pats, (tuple, list)):
      raise TypeError(
          f"{name} must be a regular expression or a tuple of them, got {pats!r}."
      )
    out = []
    for p in pats:
      if not isinstance(p, str):
        raise TypeError(f"{name} patterns must be strings, got {p!r}.")
      try:
        out.append(re.compile(p))
      except re.error as e:
        raise ValueError(f"{name}: invalid regular expression {p!r}: {e}.") from e
    return tuple(out)

  inc = compile_all("include", include)
  exc = compile_all("exclude", exclude)

  def mask_fn(params: PyTree) -> PyTree:
    paths = [path_string(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    if paths:
      # A pattern that matches nothing is most likely a typo, which would
      # silently change what the mask selects (all or nothing).
      for name, pats in (("include", inc), ("exclude", exc)):
        for p in pats:
          if not any(p.search(s) for s in paths):
            warnings.warn(
                f"path_mask: {name} pattern {p.pattern!r} matches no parameter "
                f"(parameter paths look like: {', '.join(paths[:6])}, ...).",
                stacklevel=2,
            )

    def keep(path, _):
      s = path_string(path)
      if inc and not any(p.search(s) for p in inc):
        return False
      return not any(p.search(s) for p in exc)

    return jax.tree_util.tree_map_with_path(keep, params)

  return mask_fn
