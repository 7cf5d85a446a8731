"""Per-layer trust-ratio scaling (SPEC §1), the primitive under LARS and LAMB."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import masks as masks_lib
from date_optax._src import validation

ScalarOrSchedule = optax.ScalarOrSchedule
NO_PARAMS_MSG = (
    "You are using a transformation that requires the current value of "
    "parameters, but you are not passing `params` when calling `update`."
)
MaskOrFn = Any
LayerAxes = Any  # None | int | tuple[int, ...] | pytree of those | callable


class TrustRatioState(NamedTuple):
  """State of :func:`scale_by_trust_ratio`.

  Attributes:
    count: number of updates applied so far (int32), drives bound schedules.
    ratios: the last step's per-layer trust ratios, a pytree with the
      structure of the parameters whose leaves are float32 arrays of shape
      ``()`` (one layer per leaf) or the shape of the leaf's layer axes.
    inner_state: the state of the wrapped transformation.
  """

  count: jax.Array
  ratios: Any
  inner_state: Any


# ---------------------------------------------------------------------------
# Shared per-leaf numerics (used by the fused LARS/LAMB too).


def value_at(x: Any, count: jax.Array) -> Any:
  """A hyperparameter's value at `count` (schedules are called)."""
  return x(count) if callable(x) else x


def is_static_zero(x: Any) -> bool:
  """True only for a Python/NumPy number equal to 0 (never for a tracer)."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def reduce_axes(ndim: int, layer_axes: tuple[int, ...] | None) -> tuple[int, ...]:
  if layer_axes is None:
    return tuple(range(ndim))
  return tuple(a for a in range(ndim) if a not in layer_axes)


def sum_products(x: jax.Array, y: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """Per-layer ⟨x, y⟩ accumulated in float32, keeping dims for broadcasting.

  Written as a (batched) dot product rather than `sum(x * y)`: XLA lowers a
  dot to a multi-threaded kernel on CPU, where a reduction runs on one core,
  and on every backend it accumulates in float32 without a float32 copy of
  bf16 inputs.
  """
  x = jnp.asarray(x)
  y = jnp.asarray(y)
  keep = tuple(a for a in range(x.ndim) if a not in axes)
  out_shape = tuple(1 if a in axes else x.shape[a] for a in range(x.ndim))
  if x.size == 0:
    return jnp.zeros(out_shape, jnp.float32)
  if x.dtype != y.dtype:
    x, y = x.astype(jnp.float32), y.astype(jnp.float32)
  # Contract the layer's axes in place (no reshape or transpose), so sharded
  # operands keep their sharding and the compiler only all-reduces partial sums.
  red = tuple(axes)
  out = jax.lax.dot_general(
      x, y, ((red, red), (keep, keep)),
      precision=jax.lax.Precision.HIGHEST,
      preferred_element_type=jnp.float32,
  )
  return out.reshape(out_shape)


def sum_squares(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """Per-layer sum of squares in float32, keeping dims for broadcasting."""
  return sum_products(x, x, axes)


def trust_ratio(
    param_norm: jax.Array,
    denom_norm: jax.Array,
    *,
    trust_coefficient: Any = 1.0,
    eps: Any = 0.0,
    lower: Any = None,
    upper: Any = None,
) -> jax.Array:
  """`c·‖w‖/(‖d‖+eps)`, 1 where a norm is 0, then clipped to the bounds."""
  zero = jnp.logical_or(param_norm == 0.0, denom_norm == 0.0)
  # The guarded denominator keeps the unused branch finite (no NaN in grads).
  safe = jnp.where(zero, 1.0, denom_norm + eps)
  r = jnp.where(zero, 1.0, trust_coefficient * param_norm / safe)
  if lower is not None:
    r = jnp.maximum(r, lower)
  if upper is not None:
    r = jnp.minimum(r, upper)
  return r.astype(jnp.float32)


def stored_ratio(r: jax.Array, leaf_shape: tuple[int, ...], layer_axes) -> jax.Array:
  """Drops the reduced axes: shape () per leaf or the layer axes' shape."""
  if layer_axes is None:
    return jnp.reshape(r, ())
  return jnp.reshape(r, tuple(leaf_shape[a] for a in layer_axes))


def ones_ratio(leaf_shape: tuple[int, ...], layer_axes) -> jax.Array:
  """Ratio 1 for every layer of a leaf (init, and layers a mask excludes)."""
  shape = () if layer_axes is None else tuple(leaf_shape[a] for a in layer_axes)
  return jnp.ones(shape, jnp.float32)


def init_ratios(params: Any, layer_axes_list: list) -> Any:
  leaves, treedef = jax.tree.flatten(params)
  out = [ones_ratio(leaf.shape, ax) for leaf, ax in zip(leaves, layer_axes_list)]
  return jax.tree.unflatten(treedef, out)


def validate_common(trust_coefficient, eps, lower, upper) -> None:
  validation.check_nonnegative("trust_coefficient", trust_coefficient)
  validation.check_nonnegative("eps", eps)
  validation.check_bounds(lower, upper)


# ---------------------------------------------------------------------------


def scale_by_trust_ratio(
    trust_coefficient: float = 1.0,
    eps: float = 0.0,
    *,
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    weight_decay: ScalarOrSchedule = 0.0,
    denominator: Literal["sum_of_norms", "norm_of_sum"] = "sum_of_norms",
    inner: optax.GradientTransformation | None = None,
    source: Literal["update", "gradient"] = "update",
    mask: MaskOrFn = None,
    layer_axes: LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Scales each layer's update by a (bounded) trust ratio.

  For every layer (by default one leaf of the parameter tree; see
  ``layer_axes``) with parameters :math:`w`, the incoming update :math:`g`
  and :math:`u = \mathrm{inner}(g)` (:math:`u = g` without ``inner``):

  .. math::

    d &= g \text{ if source = 'gradient' else } u \\
    r &= \mathrm{clip}\Big(\frac{c\,\|w\|}{\|d\| + \lambda\|w\| + \epsilon},
        \text{lower}, \text{upper}\Big) \\
    \text{out} &= r\,(u + \lambda w)

  with :math:`\|d + \lambda w\|` in the denominator when
  ``denominator='norm_of_sum'``. When :math:`\|w\| = 0` or the
  denominator is 0 the ratio is 1 before bounds, so zero-initialised layers
  and zero gradients never produce NaN. Norms are accumulated in float32
  whatever the parameter dtype; the output keeps the update's dtype. Layers
  that ``mask`` excludes pass ``u`` through unchanged (no ratio and no weight
  decay, TF ``skip_list`` semantics) and record a ratio of 1.

  The last step's ratios are kept in :class:`TrustRatioState` (read them with
  :func:`date_optax.trust_ratios`).

  Args:
    trust_coefficient: :math:`c \ge 0`, multiplies the ratio.
    eps: :math:`\epsilon \ge 0`, added to the denominator.
    lower: optional lower bound on the ratio, a float :math:`\ge 0` or a
      schedule of the step (dynamic bounds).
    upper: optional upper bound, a float :math:`> 0` or a schedule; with both
      floats, ``lower <= upper`` is required.
    weight_decay: :math:`\lambda \ge 0` (float or schedule), added to the
      update as :math:`\lambda w` after the ratio is measured and included in
      its denominator.
    denominator: ``'sum_of_norms'`` (:math:`\|d\| + \lambda\|w\|`, the
      LARS paper, TF and MLPerf) or ``'norm_of_sum'`` (:math:`\|d+\lambda w\|`,
      as ``optax.lars``).
    inner: optional transformation whose output is scaled (a base solver's
      preconditioned direction, without its learning rate).
    source: ``'update'`` measures the ratio on ``inner``'s output;
      ``'gradient'`` on the raw incoming update (DATE's bounded LARS).
    mask: ``None`` (all layers), a bool pytree or prefix, or a callable
      ``params -> bool pytree``; ``True`` = apply the ratio.
    layer_axes: which axes of a leaf index separate layers, so a stacked leaf
      of shape ``(L, ...)`` from ``nn.scan`` gets ``L`` ratios: ``None`` (each
      leaf is one layer), an int or tuple of ints for every leaf, a prefix
      pytree of those, or a callable ``params -> such a pytree``. Pass it as a
      tuple (or in ``static_args``) under ``optax.inject_hyperparams``.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; ``update`` requires
    ``params``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}        # ||w|| = 5
    >>> grads = {'w': jnp.array([0.0, 0.5])}         # ||g|| = 0.5
    >>> tx = date_optax.scale_by_trust_ratio(lower=0.01, upper=2.0)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> updates['w']                                 # ratio 10, clipped to 2
    Array([0., 1.], dtype=float32)
    >>> date_optax.trust_ratios(state)['w']
    Array(2., dtype=float32)

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; You et al., `Large-Batch
    Training for LSTM and Beyond <https://arxiv.org/abs/1901.08256>`_, 2019
    (bounded ratios, Algorithm 1).
  """
  validate_common(trust_coefficient, eps, lower, upper)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_choice(
      "denominator", denominator, ("sum_of_norms", "norm_of_sum")
  )
  validation.check_choice("source", source, ("update", "gradient"))
  validation.check_mask("mask", mask)
  if inner is not None and not isinstance(inner, optax.GradientTransformation):
    raise TypeError(
        f"inner must be an optax.GradientTransformation or None, got {inner!r}."
    )
  inner_tx = optax.with_extra_args_support(inner) if inner is not None else None

  def init_fn(params):
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    return TrustRatioState(
        count=jnp.zeros([], jnp.int32),
        ratios=init_ratios(params, axes),
        inner_state=optax.EmptyState() if inner_tx is None else inner_tx.init(params),
    )

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(NO_PARAMS_MSG)
    if inner_tx is None:
      inner_updates, inner_state = updates, state.inner_state
    else:
      inner_updates, inner_state = inner_tx.update(
          updates, state.inner_state, params, **extra_args
      )
    lo = value_at(lower, state.count)
    hi = value_at(upper, state.count)
    wd = value_at(weight_decay, state.count)
    use_wd = not is_static_zero(weight_decay)

    u_leaves, treedef = jax.tree.flatten(inner_updates)
    g_leaves = treedef.flatten_up_to(updates)
    w_leaves = treedef.flatten_up_to(params)
    flags = masks_lib.resolve_mask(mask, params)
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)

    outs, ratios = [], []
    for u, g, w, on, ax in zip(u_leaves, g_leaves, w_leaves, flags, axes_list):
      if not on:
        outs.append(u)
        ratios.append(ones_ratio(w.shape, ax))
        continue
      red = reduce_axes(w.ndim, ax)
      d = g if source == "gradient" else u
      w_sq = sum_squares(w, red)
      w_norm = jnp.sqrt(w_sq)
      if not use_wd:
        denom = jnp.sqrt(sum_squares(d, red))
      elif denominator == "sum_of_norms":
        denom = jnp.sqrt(sum_squares(d, red)) + wd * w_norm
      else:
        denom = jnp.sqrt(
            sum_squares(d.astype(jnp.float32) + wd * w.astype(jnp.float32), red)
        )
      r = trust_ratio(
          w_norm, denom, trust_coefficient=trust_coefficient, eps=eps,
          lower=lo, upper=hi,
      )
      v = u.astype(jnp.float32)
      if use_wd:
        v = v + wd * w.astype(jnp.float32)
      outs.append((r * v).astype(u.dtype))
      ratios.append(stored_ratio(r, w.shape, ax))

    new_state = TrustRatioState(
        count=optax.safe_int32_increment(state.count),
        ratios=jax.tree.unflatten(treedef, ratios),
        inner_state=inner_state,
    )
    return jax.tree.unflatten(treedef, outs), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# States of this package that keep per-layer ratios; filled by the optimizer
# modules, which define their own fused states.
RATIO_STATES: tuple[type, ...] = (TrustRatioState,)


def register_ratio_state(cls: type) -> type:
  global RATIO_STATES
  RATIO_STATES = RATIO_STATES + (cls,)
  return cls


def trust_ratios(opt_state: Any) -> Any | None:
  """The last step's per-layer trust ratios kept in an optimizer state.

  Searches the state of any composition (``optax.chain``,
  ``optax.inject_hyperparams``, ``optax.MultiSteps``, ``optax.masked``, ...)
  for the first date_optax state that keeps ratios.

  Args:
    opt_state: an optimizer state.

  Returns:
    A pytree with the parameters' structure and float32 ratio leaves (shape
    ``()`` per leaf, or the shape of the leaf's layer axes), or ``None`` when
    the optimizer keeps no ratios.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}
    >>> opt = date_optax.lamb(1e-3)
    >>> state = opt.init(params)
    >>> _, state = opt.update({'w': jnp.array([1.0, 0.0])}, state, params)
    >>> print(f"{date_optax.trust_ratios(state)['w']:.4f}")  # ||w|| / ||u||
    5.0000

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, 2020.
  """
  found = []

  def visit(x):
    if isinstance(x, RATIO_STATES) and not found:
      found.append(x.ratios)
    return x

  jax.tree.map(visit, opt_state, is_leaf=lambda x: isinstance(x, RATIO_STATES))
  return found[0] if found else None
