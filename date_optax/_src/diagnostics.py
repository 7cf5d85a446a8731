"""Curvature probe: the local Lipschitz estimate L(x, g) of the LEGW paper.

The LEGW paper (You et al. 2019, §4) explains warmup with the curvature of the
loss along the update direction,

  L(x, g) = g^T ∇²f(x) g / ‖g‖²,

whose inverse is the step size that minimises the local quadratic model along
`-g`. It peaks in the first iterations and the peak moves to later iterations
as the batch grows, so a longer warmup (in epochs) is needed to cover it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from date_optax._src import validation

_F32 = jnp.float32


def _to_f32(tree: Any) -> Any:
  return jax.tree.map(lambda x: jnp.asarray(x, _F32), tree)


def _vdot(a: Any, b: Any) -> jax.Array:
  parts = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.vdot(x, y), a, b))
  return sum(parts, jnp.zeros((), _F32))


def lipschitz_estimate(
    loss_fn: Callable[..., Any],
    params: Any,
    batch: Any,
    direction: Any | None = None,
    h: float = 1e-3,
    *,
    has_aux: bool = False,
    method: str = "jvp",
) -> jax.Array:
  r"""Estimates the curvature of the loss along a direction (LEGW's L(x, g)).

  .. math::

    L(x, g) = \frac{g^\top \nabla^2 f(x)\, g}{\|g\|^2} = u^\top \nabla^2 f(x)\, u,
    \qquad u = g / \|g\|,

  By default (``method='jvp'``) the Hessian-vector product is exact:
  forward-over-reverse differentiation, ``jax.jvp`` of the gradient along
  `u`, at the cost of about two gradient evaluations. For a loss whose
  operations lack JVP rules, ``method='finite_difference'`` uses a central
  difference of gradients instead,

  .. math::

    \nabla^2 f(x)\, u \approx \frac{\nabla f(x + h u) - \nabla f(x - h u)}{2h},

  with a step of length `h` along the *unit* direction `u` (an absolute
  distance in parameter space, independent of the size of `g`); its error is
  O(h²) plus float32 cancellation of order ``2⁻²⁴/h``, and zero truncation
  error for a quadratic loss. Everything is computed in float32: parameters of
  lower precision are upcast first (a step of 1e-3 is below bfloat16
  resolution for weights of order one).

  The signed value is returned, so negative curvature stays visible; the LEGW
  paper plots the absolute value (take `jnp.abs` to match it). If the
  direction is zero the quantity is undefined and NaN is returned. The
  function is pure and jit-able when `loss_fn` and `h` are static, e.g.
  `jax.jit(functools.partial(lipschitz_estimate, loss_fn))`.

  Args:
    loss_fn: `loss_fn(params, batch)` returning a scalar loss (or
      `(loss, aux)` with `has_aux=True`).
    params: a pytree of floating-point parameters.
    batch: the data passed to `loss_fn` (the paper uses a small batch, since
      the full-data Hessian is out of reach).
    direction: the direction `g`, a pytree with the structure of `params`;
      defaults to the gradient of `loss_fn` at `params`.
    h: the finite-difference step length along the unit direction, > 0
      (used by ``method='finite_difference'`` only).
    has_aux: whether `loss_fn` returns `(loss, aux)`.
    method: ``'jvp'`` (exact, forward-over-reverse) or
      ``'finite_difference'`` (central difference of gradients).

  Returns:
    A float32 scalar, `gᵀ∇²f g / ‖g‖²` (NaN when `g` is zero).

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import lipschitz_estimate
    >>> loss = lambda p, b: 0.5 * (3.0 * p['x'] ** 2 + p['y'] ** 2)
    >>> params = {'x': jnp.array(1.0), 'y': jnp.array(0.0)}
    >>> round(float(lipschitz_estimate(loss, params, None)), 3)  # along x only
    3.0

  References:
    You, Hseu, Ying, Demmel, Keutzer, Hsieh, "Large-Batch Training for LSTM
    and Beyond", SC 2019 (LEGW), §4 and Figure 3; Pearlmutter, `Fast Exact
    Multiplication by the Hessian
    <https://doi.org/10.1162/neco.1994.6.1.147>`_, 1994.
  """
  if not callable(loss_fn):
    raise TypeError(
        f"loss_fn must be a callable loss_fn(params, batch), got {loss_fn!r}."
    )
  validation.check_positive("h", h)
  validation.check_bool("has_aux", has_aux)
  validation.check_choice("method", method, ("jvp", "finite_difference"))

  x = _to_f32(params)

  def grad_at(p):
    g = jax.grad(lambda q: loss_fn(q, batch), has_aux=has_aux)(p)
    return _to_f32(g[0] if has_aux else g)

  if direction is None:
    g = grad_at(x)
  else:
    if jax.tree.structure(direction) != jax.tree.structure(params):
      raise ValueError(
          "direction must have the tree structure of params, got "
          f"{jax.tree.structure(direction)} vs {jax.tree.structure(params)}."
      )
    g = _to_f32(direction)

  norm = jnp.sqrt(_vdot(g, g))
  nonzero = norm > 0
  # Divide by 1 for a zero direction so no NaN enters the gradient evaluations;
  # the result is replaced by NaN below, explicitly.
  u = jax.tree.map(lambda v: v / jnp.where(nonzero, norm, 1.0), g)
  if method == "jvp":
    _, hvp = jax.jvp(grad_at, (x,), (u,))
    curvature = _vdot(u, hvp)
  else:
    step = jnp.asarray(h, _F32)
    g_plus = grad_at(jax.tree.map(lambda p, v: p + step * v, x, u))
    g_minus = grad_at(jax.tree.map(lambda p, v: p - step * v, x, u))
    curvature = (_vdot(u, g_plus) - _vdot(u, g_minus)) / (2.0 * step)
  return jnp.where(nonzero, curvature, jnp.nan).astype(_F32)
