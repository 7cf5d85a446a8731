"""Parameter layouts over mesh axes (FSDP, tensor parallelism).

A layout is declared, the way MaxText and big_vision declare them: either a
pytree of `PartitionSpec` shaped like the parameters, or a list of
`(regex, PartitionSpec)` rules matched (`re.fullmatch`) against '/'-joined
parameter paths such as ``"encoder/layer_0/mlp/kernel"``; the first matching
rule wins and unmatched parameters are replicated. Specs name mesh axes that
carry no data replicas (tensor parallelism, or FSDP on its own axis), or,
with the compiler's float32 psum, data axes too: FSDP as ZeRO-3 runs it,
each parameter split over devices that also split the batch.

The optimizer state follows the parameters: a state leaf whose path ends
with a parameter's path and has that parameter's shape (momentum, Adam
moments) gets the parameter's spec; other leaves (counts, per-layer ratios)
are replicated. With weight-update sharding the data axes are added on one
more dimension of each such leaf.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from date_optax._src.layer_ratios import LayerRatios
from date_optax._src.parallel.comm import update_sharding as us


def path_name(path: Sequence[Any]) -> str:
  """'/'-joined names of a key path: dict keys, attribute names, indices."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _is_spec(x: Any) -> bool:
  return x is None or isinstance(x, P)


def spec_axes(spec: P) -> list[Hashable]:
  axes = []
  for entry in spec:
    if entry is None:
      continue
    axes.extend(entry if isinstance(entry, tuple) else (entry,))
  return axes


def _check_spec(where: str, spec: Any, mesh: jax.sharding.Mesh, data_axes,
                allow_data: bool = False) -> P:
  if spec is None:
    return P()
  if not isinstance(spec, P):
    raise TypeError(
        f"param_sharding: {where} must be a jax.sharding.PartitionSpec, got {spec!r}."
    )
  model_axes = [a for a in mesh.axis_names if a not in data_axes]
  seen = set()
  for a in spec_axes(spec):
    if a not in mesh.axis_names:
      raise ValueError(
          f"param_sharding: {where} is {spec}, which names {a!r}, not an axis of "
          f"the mesh {tuple(mesh.axis_names)}; parameters may be sharded over "
          f"{tuple(model_axes)}."
      )
    if a in data_axes and not allow_data:
      raise ValueError(
          f"param_sharding: {where} is {spec}, which names the data axis {a!r}; "
          f"parameters may be sharded only over the non-data axes "
          f"{tuple(model_axes)} with this grad_sync (use shard_update=True to split "
          "the update over the data axes)."
      )
    if a in seen:
      raise ValueError(f"param_sharding: {where} is {spec}, which names {a!r} twice.")
    seen.add(a)
  return spec


@dataclasses.dataclass(frozen=True, eq=False)
class RuleLayout:
  """A layout declared as `(compiled regex, PartitionSpec)` rules, first match wins."""

  rules: tuple[tuple[re.Pattern, P], ...]

  def declared_specs(self) -> list[P]:
    return [s for _, s in self.rules]

  def leaf_specs(self, flat: list[tuple[Any, Any]], treedef: Any, warn: bool) -> list[Any]:
    used = [False] * len(self.rules)
    specs = []
    for path, _ in flat:
      name = path_name(path)
      spec = P()
      for i, (regex, s) in enumerate(self.rules):
        if regex.fullmatch(name):
          spec, used[i] = s, True
          break
      specs.append(spec)
    if warn:
      for (regex, _), u in zip(self.rules, used, strict=True):
        if not u:
          names = ", ".join(path_name(p) for p, _ in flat[:6])
          warnings.warn(
              f"param_sharding: rule {regex.pattern!r} matches no parameter "
              f"(parameter paths look like: {names}, ...).",
              stacklevel=5,
          )
    return specs


@dataclasses.dataclass(frozen=True, eq=False)
class TreeLayout:
  """A layout declared as a pytree of `PartitionSpec` shaped like the parameters."""

  tree: Any

  def declared_specs(self) -> list[P]:
    return [s for s in jax.tree.leaves(self.tree, is_leaf=_is_spec) if isinstance(s, P)]

  def leaf_specs(self, flat: list[tuple[Any, Any]], treedef: Any, warn: bool) -> list[Any]:
    del flat, warn  # a tree names every parameter
    try:
      specs = treedef.flatten_up_to(self.tree)
    except (ValueError, TypeError) as e:
      raise ValueError(
          "param_sharding must be a pytree of PartitionSpec with the structure of "
          f"the parameters, or a list of (regex, PartitionSpec) rules: {e}"
      ) from e
    return [P() if s is None else s for s in specs]


Layout = RuleLayout | TreeLayout


def check_param_sharding(
    param_sharding: Any, mesh: jax.sharding.Mesh, data_axes: Sequence[Hashable],
    allow_data: bool = False,
) -> Layout:
  """Validates what can be checked before the parameters are known; with
  `allow_data` a spec may name data axes (FSDP: a parameter split over the
  devices that also split the batch)."""
  data_axes = tuple(data_axes)
  if isinstance(param_sharding, (list, tuple)) and all(
      isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], str)
      for r in param_sharding
  ) and not isinstance(param_sharding, P):
    rules = []
    for i, (pattern, spec) in enumerate(param_sharding):
      try:
        regex = re.compile(pattern)
      except re.error as e:
        raise ValueError(
            f"param_sharding: rule {i} pattern {pattern!r} is not a regex: {e}."
        ) from e
      rules.append((regex, _check_spec(f"rule {pattern!r}", spec, mesh, data_axes,
                                       allow_data)))
    return RuleLayout(tuple(rules))
  for path, spec in jax.tree_util.tree_flatten_with_path(
      param_sharding, is_leaf=_is_spec
  )[0]:
    _check_spec(f"the spec at {path_name(path) or '<root>'}", spec, mesh, data_axes,
                allow_data)
  return TreeLayout(param_sharding)


def resolve(
    layout: Layout,
    params: Any,
    mesh: jax.sharding.Mesh,
    *,
    warn: bool = False,
) -> Any:
  """The `PartitionSpec` of every parameter, as a pytree shaped like `params`."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  specs = layout.leaf_specs(flat, treedef, warn)
  for (path, x), spec in zip(flat, specs, strict=True):
    if not isinstance(spec, P):
      raise TypeError(
          f"param_sharding: the spec of {path_name(path)} must be a PartitionSpec, "
          f"got {spec!r}."
      )
    shape = np.shape(x)
    if len(spec) > len(shape):
      raise ValueError(
          f"param_sharding: {path_name(path)} has shape {shape} but its spec "
          f"{spec} has {len(spec)} entries."
      )
    for d, entry in enumerate(spec):
      ways = _ways(mesh, entry)
      if shape[d] % ways:
        raise ValueError(
            f"param_sharding: {path_name(path)} has shape {shape}; dimension {d} "
            f"({shape[d]}) does not divide over {entry!r} ({ways} devices) of the "
            f"spec {spec}."
        )
  return jax.tree.unflatten(treedef, specs)


def _ways(mesh: jax.sharding.Mesh, entry: Any) -> int:
  if entry is None:
    return 1
  n = 1
  for a in entry if isinstance(entry, tuple) else (entry,):
    n *= int(mesh.shape[a])
  return n


def with_data_axes(
    shape: Sequence[int],
    spec: P,
    mesh: jax.sharding.Mesh,
    data_axes: Sequence[Hashable],
    num_replicas: int,
) -> P:
  """`spec` with the data axes added on the largest dimension they divide.

  The per-device size of each dimension under `spec` is what the data axes
  must divide; an array with no such dimension keeps `spec`. Data axes the
  spec already names (FSDP) are not added again.
  """
  named = set(spec_axes(spec))
  if named & set(data_axes):
    data_axes = tuple(a for a in data_axes if a not in named)
    if not data_axes:
      return spec
    num_replicas = int(np.prod([mesh.shape[a] for a in data_axes]))
  entries = list(spec) + [None] * (len(shape) - len(spec))
  local = [s // _ways(mesh, e) for s, e in zip(shape, entries, strict=True)]
  d = us.update_shard_axis(local, num_replicas)
  if d is None:
    return P(*entries) if any(e is not None for e in entries) else P()
  e = entries[d]
  axes = (tuple(e) if isinstance(e, tuple) else (() if e is None else (e,)))
  axes = axes + tuple(data_axes)
  entries[d] = axes[0] if len(axes) == 1 else axes
  return P(*entries)


def state_specs(
    tree: Any, params: Any, param_specs: Any, default: Any
) -> Any:
  """Specs for an optimizer state: those of the parameters it mirrors.

  A leaf whose key path ends with a parameter's key path (the longest such)
  and that has the parameter's shape takes the parameter's spec; any other
  leaf gets `default(shape)`, except a trust-ratio record
  (`date_optax.LayerRatios`), which is replicated: every device's update
  reads its layers' ratios, and the record is a few bytes per layer.
  """
  by_path = {}
  for (path, p), spec in zip(
      jax.tree_util.tree_flatten_with_path(params)[0],
      jax.tree.leaves(param_specs, is_leaf=_is_spec),
      strict=True,
  ):
    by_path[tuple(path)] = (np.shape(p), spec)
  lengths = sorted({len(k) for k in by_path}, reverse=True)

  def spec_of(path, x):
    shape = np.shape(x)
    for n in lengths:
      if n <= len(path):
        hit = by_path.get(tuple(path[len(path) - n :]))
        if hit is not None and hit[0] == shape:
          return hit[1]
    return default(shape)

  def spec_or_record(path, x):
    if isinstance(x, LayerRatios):
      return jax.tree.map(lambda _: P(), x)
    return spec_of(path, x)

  return jax.tree_util.tree_map_with_path(
      spec_or_record, tree, is_leaf=lambda x: isinstance(x, LayerRatios))
