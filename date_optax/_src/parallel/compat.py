"""Small shims over JAX APIs that moved between releases.

The library supports the JAX that pip resolves on Python 3.11 (0.10.x) and on
Python 3.12 (0.12.x) as well as older releases that still had
`jax.experimental.shard_map` with its `check_rep` keyword. Every version
difference the parallel code depends on is confined to this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
from jax import lax

try:  # JAX >= 0.6 exports shard_map at the top level.
  _shard_map = jax.shard_map
except AttributeError:  # pragma: no cover - older JAX
  from jax.experimental.shard_map import shard_map as _shard_map

_CHECK_KEYWORD = (
    "check_vma"
    if "check_vma" in inspect.signature(_shard_map).parameters
    else "check_rep"
)

AxisNames = Hashable | tuple[Hashable, ...]


def shard_map(
    f: Callable[..., Any],
    *,
    mesh: jax.sharding.Mesh,
    in_specs: Any,
    out_specs: Any,
    check: bool = False,
) -> Callable[..., Any]:
  """`shard_map` with the replication check spelled the same on every JAX.

  `check` maps to `check_vma` (new JAX) or `check_rep` (old JAX). The train
  steps pass `check=False`: their explicit ring/torus collectives end with
  values that are equal on every device but typed as varying, which the
  checker would reject for replicated outputs.
  """
  return _shard_map(
      f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **{_CHECK_KEYWORD: check}
  )


def as_tuple(axes: AxisNames) -> tuple[Hashable, ...]:
  return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def axis_size(axes: AxisNames) -> int:
  """Static number of devices along one named axis or a tuple of axes."""
  axes = as_tuple(axes)
  if hasattr(lax, "axis_size"):
    n = 1
    for a in axes:
      n *= int(lax.axis_size(a))
    return n
  return int(lax.psum(1, axes))  # pragma: no cover - older JAX: static under psum


def varying_axes(x: Any) -> set[Hashable] | None:
  """The axes `x` is typed as varying over (`shard_map(check_vma=True)`);
  empty when it is not typed so, None on a JAX without the typing."""
  typeof = getattr(jax, "typeof", None)
  if typeof is None:  # pragma: no cover - older JAX
    return None
  aval = typeof(x)
  typed = getattr(aval, "manual_axis_type", None)  # JAX >= 0.12
  if typed is not None:
    return set(typed.varying) | set(typed.unreduced)
  vma = getattr(aval, "vma", None)  # JAX 0.7-0.11
  return None if vma is None else set(vma)


def untyped_replication(tree: Any, axes: AxisNames) -> bool:
  """Whether no leaf of `tree` is typed as varying along `axes`.

  Under `shard_map(check_vma=True)` a collective is what turns a
  device-varying value into a replicated one, so it cannot be left out even
  over one device; without the check (the train steps) values carry no such
  type. False on a JAX without the typing (`check_rep`), to be safe.
  """
  names = set(as_tuple(axes))
  for x in jax.tree.leaves(tree):
    axes_typed = varying_axes(x)
    if axes_typed is None:  # pragma: no cover - older JAX
      return False
    if names & axes_typed:
      return False
  return True


def to_varying(tree: Any, axes: AxisNames) -> Any:
  """Marks replicated values as device-varying along `axes`.

  Under `shard_map(check_vma=True)` the gradient of a function of a replicated
  (invariant) input is summed over the mesh by the transpose of the implicit
  broadcast. Differentiating with respect to a varying copy instead gives each
  device its *local* gradient, which the explicit reductions then combine
  exactly once. Where the VMA system does not exist this is the identity.
  """
  axes = as_tuple(axes)
  if hasattr(lax, "pcast"):
    return jax.tree.map(lambda x: lax.pcast(x, axes, to="varying"), tree)
  if hasattr(lax, "pvary"):  # pragma: no cover - JAX 0.6-0.7
    return jax.tree.map(lambda x: lax.pvary(x, axes), tree)
  return tree  # pragma: no cover


def mesh_axis_sizes(mesh: jax.sharding.Mesh, axes: Sequence[Hashable]) -> int:
  n = 1
  for a in axes:
    n *= int(mesh.shape[a])
  return n


def hlo_text_cost(hlo_text: str) -> dict[str, float] | None:
  """XLA's cost analysis (``flops``, ``bytes accessed``) of an HLO module's
  text, run by the host CPU client; None where this jaxlib does not expose
  the parser and the analysis (both are jaxlib internals) or the text does
  not parse."""
  try:
    from jax._src.lib import _jax  # noqa: PLC0415
    from jaxlib import _hlo  # noqa: PLC0415
    module = _hlo.hlo_module_from_text(hlo_text)
    cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  except Exception:  # noqa: BLE001 - an internal API that may move or refuse the text
    return None
  return {k: float(cost[k]) for k in ("flops", "bytes accessed") if k in cost}
