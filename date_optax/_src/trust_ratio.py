"""Per-layer trust-ratio scaling, the primitive under LARS and LAMB."""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import grouped_norms, validation
from date_optax._src import layer_ratios as layer_ratios_lib
from date_optax._src import masks as masks_lib
from date_optax._src.exact_norms import add_decay, compute_dtype
from date_optax._src.types import LayerAxes, MaskOrFn, ScalarOrSchedule

NO_PARAMS_MSG = (
    "You are using a transformation that requires the current value of "
    "parameters, but you are not passing `params` when calling `update`."
)


class TrustRatioState(NamedTuple):
  """State of :func:`scale_by_trust_ratio`.

  Attributes:
    count: number of updates applied so far (int32), drives bound schedules.
    ratios: the last step's per-layer trust ratios, one float32 vector
      (:class:`date_optax.LayerRatios`; :func:`date_optax.trust_ratios`
      unpacks it into a pytree shaped like the parameters, with leaves of
      shape ``()`` or the shape of the leaf's layer axes).
    inner_state: the state of the wrapped transformation.
    bounds: ``(lower, upper)``, the float32 bounds applied at the last step
      (at step 0 before the first one); ``(0, +inf)`` when unbounded.
  """

  count: jax.Array
  ratios: Any
  inner_state: Any
  bounds: Any = None


# ---------------------------------------------------------------------------
# Shared per-leaf numerics (the kernel under LARS, bounded LARS and LAMB).


def value_at(x: Any, count: jax.Array) -> Any:
  """A hyperparameter's value at `count` (schedules are called)."""
  return x(count) if callable(x) else x


def values_at(count: jax.Array, *hyperparams: Any) -> tuple[Any, ...]:
  """Each hyperparameter's value at `count`, in order."""
  return tuple(value_at(x, count) for x in hyperparams)


def is_static_zero(x: Any) -> bool:
  """True only for a Python/NumPy number equal to 0 (never for a tracer)."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def reduce_axes(ndim: int, layer_axes: tuple[int, ...] | None) -> tuple[int, ...]:
  if layer_axes is None:
    return tuple(range(ndim))
  return tuple(a for a in range(ndim) if a not in layer_axes)


def update_dtype(param: Any, grad: Any) -> Any:
  """`jnp.promote_types(param, grad)`: the dtype of an update, as optax."""
  return jnp.promote_types(jnp.asarray(param).dtype, jnp.asarray(grad).dtype)


def trust_ratio(
    param_norm: jax.Array,
    denom_norm: jax.Array,
    *,
    trust_coefficient: Any = 1.0,
    eps: Any = 0.0,
    lower: Any = None,
    upper: Any = None,
    zero: jax.Array | None = None,
) -> jax.Array:
  """`c·‖w‖/(‖d‖+eps)`, 1 where a norm is 0, then clipped to the bounds.

  ``zero`` overrides which layers count as having a zero norm (the default
  tests ``param_norm`` and ``denom_norm``); sum-of-norms LARS tests ``‖w‖``
  and ``‖g‖`` rather than the whole denominator.
  """
  if zero is None:
    zero = jnp.logical_or(param_norm == 0.0, denom_norm == 0.0)
  # The guarded denominator keeps the unused branch finite (no NaN in grads).
  safe = jnp.where(zero, 1.0, denom_norm + eps)
  safe = jnp.where(safe == 0.0, 1.0, safe)
  r = jnp.where(zero, 1.0, trust_coefficient * param_norm / safe)
  if lower is not None:
    r = jnp.maximum(r, lower)
  if upper is not None:
    r = jnp.minimum(r, upper)
  return r.astype(jnp.float32)


def ratio_from_sums(
    w_sq: jax.Array,
    d_sq: jax.Array,
    *,
    weight_decay: Any = None,
    denominator: str = "sum_of_norms",
    trust_coefficient: Any = 1.0,
    eps: Any = 0.0,
    lower: Any = None,
    upper: Any = None,
) -> jax.Array:
  """One layer's ratio ``c‖w‖/(den + eps)`` from its sums of squares.

  ``w_sq`` is ``‖w‖²``; ``d_sq`` is ``‖d‖²``, or ``‖d + λw‖²`` for
  ``'norm_of_sum'`` with weight decay (see :func:`grouped_norms.layer_ratios`). ``den`` is
  ``‖d‖`` without weight decay, ``‖d‖ + λ‖w‖`` for ``'sum_of_norms'`` (ratio
  1 when ``‖w‖ = 0`` or ``‖d‖ = 0``, as the MLPerf reference and timm) and
  ``‖d + λw‖`` for ``'norm_of_sum'`` (ratio 1 when ``‖w‖`` or ``‖d + λw‖``
  is 0, as optax).
  """
  w_norm = jnp.sqrt(w_sq)
  zero = None
  if weight_decay is not None and denominator == "sum_of_norms":
    d_norm = jnp.sqrt(d_sq)
    denom = d_norm + weight_decay * w_norm
    zero = jnp.logical_or(w_norm == 0.0, d_norm == 0.0)
  else:
    denom = jnp.sqrt(d_sq)
  return trust_ratio(
      w_norm, denom, trust_coefficient=trust_coefficient, eps=eps,
      lower=lower, upper=upper, zero=zero,
  )


# With a leafwise inner solver (LAMB's moments), a large layer's direction is
# made after the ratio of the large layer this many places before it. 1
# would hold one direction at a time but put every layer's norm collective
# (on a model-sharded layer) in series; 2 holds two, and each collective
# overlaps the next layer's work (tests/test_update_structure.py).
LAYER_LAG = 2


class LeafwiseInner(NamedTuple):
  """An inner solver the kernel can run one leaf at a time (LAMB's moments).

  ``split(state, g_leaves, treedef) -> (ctx, leaf_states)``: what every leaf
  shares and each leaf's slice of the state; ``leaf(ctx, g, leaf_state) ->
  (u, new_leaf_state)``; ``join(ctx, new_leaf_states, treedef) -> state``.
  Run this way, the direction of each large layer is computed after the
  ratio of the large layer :data:`LAYER_LAG` places before it (an
  optimisation barrier on its state), so a scheduler holds two layers'
  directions at a time, not the model's.
  """

  split: Any
  leaf: Any
  join: Any


def applied_bounds(lower: Any, upper: Any) -> tuple[jax.Array, jax.Array]:
  """The `(lower, upper)` a step applied as float32 scalars; (0, +inf) if unbounded."""
  lo = jnp.asarray(0.0 if lower is None else lower, jnp.float32)
  hi = jnp.asarray(jnp.inf if upper is None else upper, jnp.float32)
  return lo, hi


def ratio_shape(leaf_shape: tuple[int, ...], layer_axes) -> tuple[int, ...]:
  """A leaf's ratio shape: () for one layer, else the layer axes' sizes."""
  return () if layer_axes is None else tuple(leaf_shape[a] for a in layer_axes)


def init_ratios(params: Any, layer_axes_list: list) -> layer_ratios_lib.LayerRatios:
  """Ratio 1 for every layer, recorded as one vector."""
  leaves, treedef = jax.tree.flatten(params)
  return layer_ratios_lib.ones(treedef, tuple(
      ratio_shape(np.shape(leaf), ax) for leaf, ax in zip(leaves, layer_axes_list)))


def validate_common(trust_coefficient, eps, lower, upper) -> None:
  validation.check_trust_coefficient(trust_coefficient)
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
    ratio_source: Literal["update", "gradient"] = "update",
    layer_axes: LayerAxes = None,
    trust_ratio_mask: MaskOrFn = None,
    weight_decay_mask: MaskOrFn = None,
    source: Literal["update", "gradient"] | None = None,
    mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Scales each layer's update by a (bounded) trust ratio.

  For every layer (by default one leaf of the parameter tree; see
  ``layer_axes``) with parameters :math:`w`, the incoming update :math:`g`
  and :math:`u = \mathrm{inner}(g)` (:math:`u = g` without ``inner``):

  .. math::

    d &= g \text{ if ratio_source = 'gradient' else } u \\
    r &= \mathrm{clip}\Big(\frac{c\,\|w\|}{\|d\| + \lambda\|w\| + \epsilon},
        \text{lower}, \text{upper}\Big) \\
    \text{out} &= r\,(u + \lambda w)

  with :math:`\|d + \lambda w\|` in the denominator when
  ``denominator='norm_of_sum'`` (computed without cancellation error, even
  when :math:`d \approx -\lambda w`). Zero norms: with ``'sum_of_norms'`` the
  ratio is 1 when :math:`\|w\| = 0` or :math:`\|d\| = 0` (the MLPerf
  reference and timm); with ``'norm_of_sum'`` when :math:`\|w\| = 0` or
  :math:`\|d+\lambda w\| = 0` (optax), both before bounds, so
  zero-initialised layers and zero gradients never produce NaN. Norms are
  :math:`\sum |x|^2` accumulated in float32 whatever the parameter dtype
  (complex leaves included); the output has dtype
  ``jnp.promote_types(param.dtype, update.dtype)``, as optax.

  Small leaves (up to 16,384 elements) of one shape, dtype and sharding are
  reduced together: one stacked reduction and one vectorised ratio per
  group, as multi-tensor apply does, so the number of kernels beyond the
  per-leaf update grows with the number of distinct small shapes, not with
  the number of leaves (``lars``, ``lamb``, ``bounded_lars`` and ``date``
  share this kernel). Larger leaves are reduced one by one, where a stacked
  copy would cost more memory traffic than a launch; with
  ``'norm_of_sum'`` and no ``inner``, such a layer's reduction forms its own
  :math:`g + \lambda w` from :math:`g` and :math:`w`, so the sum is never
  written to memory for the norm and the update to share.

  Masks follow the package's one rule (docs/guide/optimizers.md, "Masks"):
  ``trust_ratio_mask`` selects the layers that get the ratio,
  ``weight_decay_mask`` those that get :math:`\lambda w`; if only one is
  given it is used for both, if neither every layer gets both. A layer
  outside the trust mask gets ratio 1 (``u``, plus :math:`\lambda w` iff the
  weight-decay mask includes it) and records a ratio of 1.

  The last step's ratios and the bounds it applied are kept in
  :class:`TrustRatioState` (read them with :func:`date_optax.trust_ratios`
  and :func:`date_optax.trust_ratio_bounds`).

  Args:
    trust_coefficient: :math:`c > 0` and finite (the rule of every transform
      of the package), multiplies the ratio.
    eps: :math:`\epsilon \ge 0`, added to the denominator.
    lower: optional lower bound on the ratio, a float :math:`\ge 0` or a
      schedule of the step (dynamic bounds).
    upper: optional upper bound, a float :math:`> 0` or a schedule; with both
      floats, ``lower <= upper`` is required.
    weight_decay: :math:`\lambda \ge 0` (float or schedule), added to the
      update as :math:`\lambda w` after the ratio is measured and included in
      its denominator.
    denominator: ``'sum_of_norms'`` (:math:`\|d\| + \lambda\|w\|`, the LARS
      paper, the MLPerf reference, tf.contrib, timm and apex LARC) or
      ``'norm_of_sum'`` (:math:`\|d+\lambda w\|`, TF Model Garden and
      ``optax.lars``).
    inner: optional transformation whose output is scaled (a base solver's
      preconditioned direction, without its learning rate).
    ratio_source: ``'update'`` (the default) measures the ratio on
      ``inner``'s output; ``'gradient'`` on the raw incoming update (as
      :func:`date_optax.bounded_lars`, whose default it is).
    layer_axes: which axes of a leaf index separate layers, so a stacked leaf
      of shape ``(L, ...)`` from ``nn.scan`` gets ``L`` ratios: ``None`` (each
      leaf is one layer), an int or tuple of ints for every leaf, a prefix
      pytree of those, or a callable ``params -> such a pytree``. Pass it as a
      tuple (or in ``static_args``) under ``optax.inject_hyperparams``.
    trust_ratio_mask: ``None`` (not given), a bool pytree or prefix, or a
      callable ``params -> bool pytree``; ``True`` = apply the ratio.
    weight_decay_mask: layers that get :math:`\lambda w`, same forms.
    source: deprecated name of ``ratio_source`` (``DeprecationWarning``;
      removed in the next release).
    mask: deprecated name of ``trust_ratio_mask`` (``DeprecationWarning``;
      removed in the next release).

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
  if source is not None:
    validation.check_choice("source", source, ("update", "gradient"))
  validation.check_choice("ratio_source", ratio_source, ("update", "gradient"))
  ratio_source = validation.deprecated_keyword(
      "scale_by_trust_ratio", "ratio_source", ratio_source, "source", source,
      default="update")
  validation.check_layer_options(trust_ratio_mask, weight_decay_mask, layer_axes, mask=mask)
  trust_mask = validation.deprecated_keyword(
      "scale_by_trust_ratio", "trust_ratio_mask", trust_ratio_mask, "mask", mask)
  if inner is not None and not isinstance(inner, optax.GradientTransformation):
    raise TypeError(
        f"inner must be an optax.GradientTransformation or None, got {inner!r}."
    )
  return trust_ratio_kernel(
      trust_coefficient, eps, lower=lower, upper=upper, weight_decay=weight_decay,
      denominator=denominator, inner=inner, ratio_source=ratio_source,
      trust_mask=trust_mask,
      weight_decay_mask=weight_decay_mask, layer_axes=layer_axes,
      mask_names=("mask" if mask is not None else "trust_ratio_mask",
                  "weight_decay_mask"),
  )


def trust_ratio_kernel(
    trust_coefficient: Any,
    eps: Any,
    *,
    lower: Any,
    upper: Any,
    weight_decay: Any,
    denominator: str,
    inner: optax.GradientTransformation | None,
    ratio_source: str,
    trust_mask: MaskOrFn,
    weight_decay_mask: MaskOrFn,
    layer_axes: LayerAxes,
    decay: Literal["update", "decoupled", "input"] = "update",
    mask_names: tuple[str, str] = ("trust_ratio_mask", "weight_decay_mask"),
    leafwise: LeafwiseInner | None = None,
    who: str = "date_optax.scale_by_trust_ratio",
) -> optax.GradientTransformationExtraArgs:
  r"""The one per-layer trust-ratio kernel under every transform of the package.

  Arguments are validated by the public callers. ``decay`` says where
  :math:`\lambda w` goes: ``'update'`` adds it to the scaled update and to
  the ratio's denominator (LARS, LAMB, :func:`scale_by_trust_ratio`);
  ``'decoupled'`` adds it after the ratio, outside it (decoupled LAMB);
  ``'input'`` adds it to ``inner``'s input (L2 into a base solver, bounded
  LARS). The update is straight-line array code: per layer, float32
  reductions of squares and elementwise ops, no branch and no dot.
  ``mask_names`` name the two masks in error messages. ``leafwise``, given
  with ``inner`` (same arithmetic and state), runs the inner solver one leaf
  at a time so each large layer's direction is made after the ratio of the
  large layer two places before it (:class:`LeafwiseInner`). ``who`` is
  the public function named when a leaf is refused
  (:func:`validation.float_leaves`).
  """
  inner_tx = optax.with_extra_args_support(inner) if inner is not None else None
  use_wd = not is_static_zero(weight_decay)
  validation.check_mask_leaves(mask_names[0], trust_mask)
  validation.check_mask_leaves(mask_names[1], weight_decay_mask)

  def flags(params):
    # Static structure, checked (and callables evaluated) at trace time.
    t = validation.check_mask_against(mask_names[0], trust_mask, params)
    w = validation.check_mask_against(mask_names[1], weight_decay_mask, params)
    return masks_lib.resolve_masks(t, w, params)

  def init_fn(params):
    params = validation.float_leaves(params, who)
    flags(params)
    validation.check_schedules_at_init(
        weight_decay=weight_decay, lower=lower, upper=upper)
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    zero = jnp.zeros([], jnp.int32)
    return TrustRatioState(
        count=zero,
        ratios=init_ratios(params, axes),
        inner_state=optax.EmptyState() if inner_tx is None else inner_tx.init(params),
        bounds=applied_bounds(*values_at(zero, lower, upper)),
    )

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(NO_PARAMS_MSG)
    lo, hi, wd = values_at(state.count, lower, upper, weight_decay)
    params = validation.float_leaves(params, who)
    updates = validation.number_leaves(updates, who)
    validation.check_updates_like_params(updates, params)
    g_leaves, treedef = jax.tree.flatten(updates)
    w_leaves = treedef.flatten_up_to(params)
    trust_flags, wd_flags = flags(params)
    wd_flags = [f and use_wd for f in wd_flags]
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)

    def ratio_fn(w_sq, d_sq, coupled):
      return ratio_from_sums(
          w_sq, d_sq, weight_decay=wd if coupled else None,
          denominator=denominator, trust_coefficient=trust_coefficient,
          eps=eps, lower=lo, upper=hi)

    by_leaf = leafwise is not None and not (decay == "input" and use_wd)
    if inner_tx is None:
      u_leaves, inner_state = g_leaves, state.inner_state
    elif by_leaf:
      ctx, leaf_states = leafwise.split(state.inner_state, g_leaves, treedef)
      new_leaf_states = []
    else:
      inner_in = updates
      if decay == "input" and use_wd:
        # L2 weight decay in the inner solver's input, as optax.add_decayed_weights.
        inner_in = jax.tree.unflatten(treedef, [
            g + wd * w if f else g for g, w, f in zip(g_leaves, w_leaves, wd_flags)])
      inner_updates, inner_state = inner_tx.update(
          inner_in, state.inner_state, params, **extra_args
      )
      u_leaves = treedef.flatten_up_to(inner_updates)

    # The update of every layer, and the reductions its ratio needs. Small
    # layers' reductions are made together (grouped_norms.layer_ratios)
    # after the loop; with a leafwise inner solver each large layer's ratio
    # is made in the loop, and the state of the large layer LAYER_LAG places
    # on waits for it.
    vs, requests, request_leaf, ratio_of, pieces = [], [], [], {}, []
    made = []  # the large layers' ratios, in order
    for i, (g, w, trust, dec, ax) in enumerate(zip(
        g_leaves, w_leaves, trust_flags, wd_flags, axes_list)):
      axes = reduce_axes(w.ndim, ax)
      chained = by_leaf and trust and grouped_norms.is_large(w, axes)
      if by_leaf:
        leaf_state = leaf_states[i]
        if chained and len(made) >= LAYER_LAG:
          # The state only: it is the step's input, in its own layout, so the
          # barrier moves nothing (a gradient made by a transposed product
          # would be copied into the barrier's layout first).
          leaf_state, _ = jax.lax.optimization_barrier((leaf_state, made[-LAYER_LAG]))
        u, leaf_state = leafwise.leaf(ctx, g, leaf_state)
        new_leaf_states.append(leaf_state)
      else:
        u = u_leaves[i]
      coupled = dec and decay == "update"
      v = u.astype(compute_dtype(u, w))
      if coupled:
        v = add_decay(v, wd, w)
      vs.append(v)
      if trust:
        sum_form = coupled and denominator == "norm_of_sum"
        req = grouped_norms.SumRequest(
            w, g if ratio_source == "gradient" else u, axes,
            decay=sum_form,
            # An inner solver's u + λw (the update) is formed once and its
            # norm read from it; a d that is the kernel's input is reduced
            # from the input itself (norm_of_sum_sq).
            decayed=(v if sum_form and ratio_source == "update"
                     and inner_tx is not None else None),
            coupled=coupled)
        if chained:
          (r,), _ = grouped_norms.layer_ratios([req], ratio_fn, wd)
          made.append(r)
          ratio_of[i] = r
          pieces.append(([i], r))
        else:
          requests.append(req)
          request_leaf.append(i)
    if by_leaf:
      inner_state = leafwise.join(ctx, new_leaf_states, treedef)

    layer_rs, batched = grouped_norms.layer_ratios(requests, ratio_fn, wd)
    ratio_of.update(zip(request_leaf, layer_rs))

    # The record: the groups' and leaves' ratio arrays (request indices
    # mapped to leaf indices), and 1 for every leaf outside the trust mask.
    pieces += [([request_leaf[j] for j in idx], r) for idx, r in batched]
    shapes = tuple(ratio_shape(w.shape, ax) for w, ax in zip(w_leaves, axes_list))
    untrusted = [i for i, trust in enumerate(trust_flags) if not trust]
    if untrusted:
      pieces.append((untrusted, jnp.ones(
          (sum(math.prod(shapes[i]) for i in untrusted),), jnp.float32)))

    outs = []
    for i, (v, g, w, dec) in enumerate(zip(vs, g_leaves, w_leaves, wd_flags)):
      if i in ratio_of:
        v = ratio_of[i] * v
      if dec and decay == "decoupled":
        v = v + wd * w.astype(v.dtype)
      # The dtype of the incoming update and the parameter, as optax.
      outs.append(v.astype(update_dtype(w, g)))

    new_state = TrustRatioState(
        count=optax.safe_int32_increment(state.count),
        ratios=layer_ratios_lib.pack(pieces, treedef, shapes),
        inner_state=inner_state,
        bounds=applied_bounds(lo, hi),
    )
    return jax.tree.unflatten(treedef, outs), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def packed_chain(
    transforms: tuple[optax.GradientTransformation, ...],
    pack: Any,
    unpack: Any,
    learning_rate: Any = None,
    who: str = "the optimizer",
) -> optax.GradientTransformationExtraArgs:
  """``optax.chain(*transforms)`` whose state is kept as one named state.

  ``pack(states, count)`` turns the chain's tuple of states after a step
  taken at ``count`` into the optimizer's public state (LarsState, ...);
  ``unpack(state)`` rebuilds the tuple. Only the state's layout changes: the
  arrays are the pieces' own, so the state is as large as the chain's.
  A ``learning_rate`` schedule is checked at step 0 when the state is made.
  Every piece gets the leaves as JAX arrays, or ``who`` is named with the
  first leaf it cannot take (:func:`validation.float_leaves`).
  """
  chain = optax.chain(*transforms)

  def init_fn(params):
    params = validation.float_leaves(params, who)
    validation.check_schedules_at_init(learning_rate=learning_rate)
    return pack(chain.init(params), jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    if params is not None:
      params = validation.float_leaves(params, who)
    updates = validation.number_leaves(updates, who)
    out, states = chain.update(updates, unpack(state), params, **extra_args)
    return out, pack(states, state.count)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def learning_rate_state(learning_rate: Any, count: jax.Array) -> Any:
  """The state of ``optax.scale_by_learning_rate(learning_rate)`` at ``count``."""
  if callable(learning_rate):
    return optax.ScaleByScheduleState(count=count)
  return optax.EmptyState()
