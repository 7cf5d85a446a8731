"""LARS and DATE's bounded LARS over any base solver."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import masks as masks_lib
from date_optax._src import trust_ratio as tr
from date_optax._src import validation
from date_optax._src.types import DType, LayerAxes, MaskOrFn, ScalarOrSchedule


@tr.register_ratio_state
class LarsState(NamedTuple):
  """State of :func:`lars`.

  Attributes:
    count: number of updates so far (int32); schedules are evaluated at it.
    momentum: the momentum buffer, a pytree like the parameters.
    ratios: the last step's per-layer trust ratios (float32).
    bounds: ``(lower, upper)`` applied at the last step, float32 scalars;
      ``(0, +inf)`` when unbounded.
    learning_rate: the learning rate applied at the last step (float32; the
      value at step 0 before the first update).
  """

  count: jax.Array
  momentum: Any
  ratios: Any
  bounds: Any = None
  learning_rate: Any = None


def lars(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: ScalarOrSchedule = 0.0,
    momentum: float = 0.9,
    nesterov: bool = False,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    weight_decay_mask: MaskOrFn = None,
    trust_ratio_mask: MaskOrFn = None,
    denominator: Literal["sum_of_norms", "norm_of_sum"] = "sum_of_norms",
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    layer_axes: LayerAxes = None,
    accumulator_dtype: DType = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Layer-wise Adaptive Rate Scaling, in one fused pass per layer.

  For each layer with parameters :math:`w` and gradient :math:`g` at step
  :math:`t` (learning rate :math:`\eta_t`, weight decay :math:`\lambda`):

  .. math::

    r_t &= \frac{c\,\|w\|}{\|g\| + \lambda\|w\| + \epsilon}
      \quad(\text{or } \frac{c\,\|w\|}{\|g + \lambda w\| + \epsilon}) \\
    m_t &= \beta\, m_{t-1} + \eta_t\, r_t\, (g + \lambda w) \\
    w_t &= w_{t-1} - m_t

  Zero norms: with ``'sum_of_norms'`` the ratio is 1 when :math:`\|w\| = 0`
  or :math:`\|g\| = 0` (the MLPerf reference and timm; a zero gradient with
  weight decay on does not give :math:`c/\lambda`); with ``'norm_of_sum'``
  when :math:`\|w\| = 0` or :math:`\|g+\lambda w\| = 0` (optax). The ratio may
  be bounded. :math:`\|g+\lambda w\|` is computed without cancellation error
  (exact :math:`\lambda w`), so it stays accurate near the steady state
  :math:`g \approx -\lambda w`. Norms are :math:`\sum|x|^2` in float32
  (complex parameters supported); updates have dtype
  ``jnp.promote_types(param.dtype, grad.dtype)``, as optax.

  Masks follow the package's one rule (README, "Masks"): if only one of
  ``trust_ratio_mask``/``weight_decay_mask`` is given it is used for both
  (TF's ``skip_list``: an excluded layer gets neither ratio nor decay); if
  both are given they are independent; if neither, every layer gets both.
  A layer outside the trust mask gets plain momentum SGD (ratio 1), with
  :math:`\lambda w` iff the weight-decay mask includes it.

  Equality with :func:`optax.lars` (same learning rate, momentum, nesterov,
  coefficient, eps) holds when ``weight_decay=0`` or
  ``denominator='norm_of_sum'``, without bounds, and with the same masks in
  the sense of optax's independent masks: no masks on either side, or both
  masks given here exactly as passed to optax (optax's default for the one
  not given is ``True``). Near :math:`g \approx -\lambda w` this function is
  the more accurate of the two.

  Args:
    learning_rate: :math:`\eta \ge 0`, a float or an optax schedule.
    weight_decay: :math:`\lambda \ge 0`, float or schedule.
    momentum: :math:`\beta \in [0, 1)`.
    nesterov: use Nesterov momentum.
    trust_coefficient: :math:`c > 0` (LARS's :math:`\eta`, 0.001 in the paper).
    eps: :math:`\epsilon \ge 0` in the denominator.
    weight_decay_mask: layers that get weight decay (pytree, prefix or
      callable; ``True`` = apply); ``None`` = not given (see the rule above).
    trust_ratio_mask: layers that get the trust ratio; ``None`` = not given.
      Pass :func:`date_optax.exclude_bias_and_norm` for the usual skip list.
    denominator: ``'sum_of_norms'`` (:math:`\|g\|+\lambda\|w\|`: the paper,
      the MLPerf reference, tf.contrib, timm, apex LARC) or ``'norm_of_sum'``
      (:math:`\|g+\lambda w\|`: TF Model Garden, optax).
    lower: optional lower bound on the ratio (float or schedule).
    upper: optional upper bound on the ratio (float or schedule).
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).
    accumulator_dtype: dtype of the momentum buffer; ``None`` keeps the
      parameters' dtype (as :func:`optax.trace`).

  Returns:
    An :class:`optax.GradientTransformationExtraArgs` (``update`` requires
    ``params``); the state is a :class:`LarsState`.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> import date_optax
    >>> params = {'w': jnp.array([[1.0, 2.0], [3.0, 4.0]]), 'b': jnp.zeros(2)}
    >>> opt = date_optax.lars(0.1, weight_decay=1e-4, trust_coefficient=0.02,
    ...                       trust_ratio_mask=date_optax.exclude_bias_and_norm)
    >>> loss = lambda p: jnp.sum((p['w'] @ jnp.ones(2) + p['b'] - 1.0) ** 2)
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...   updates, state = opt.update(jax.grad(loss)(params), state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> print(f"{loss(params):.3f}")
    0.102

  References:
    You, Gitman and Ginsburg, `Large Batch Training of Convolutional Networks
    <https://arxiv.org/abs/1708.03888>`_, 2017; Mattson et al., `MLPerf
    Training Benchmark <https://arxiv.org/abs/1910.01500>`_, 2020 (the LARS
    reference implementation and its zero-norm rule).
  """
  validation.check_nonnegative("learning_rate", learning_rate, allow_schedule=True)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_unit_interval("momentum", momentum)
  validation.check_bool("nesterov", nesterov)
  validation.check_positive("trust_coefficient", trust_coefficient)
  validation.check_nonnegative("eps", eps)
  validation.check_mask("weight_decay_mask", weight_decay_mask)
  validation.check_mask("trust_ratio_mask", trust_ratio_mask)
  validation.check_choice("denominator", denominator, ("sum_of_norms", "norm_of_sum"))
  validation.check_bounds(lower, upper)
  use_wd = not tr.is_static_zero(weight_decay)

  def init_fn(params):
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    dtype = accumulator_dtype
    zero = jnp.zeros([], jnp.int32)
    return LarsState(
        count=zero,
        momentum=jax.tree.map(
            lambda p: jnp.zeros(p.shape, dtype or p.dtype), params
        ),
        ratios=tr.init_ratios(params, axes),
        bounds=tr.applied_bounds(tr.value_at(lower, zero), tr.value_at(upper, zero)),
        learning_rate=jnp.asarray(tr.value_at(learning_rate, zero), jnp.float32),
    )

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    if params is None:
      raise ValueError(tr.NO_PARAMS_MSG)
    lr = tr.value_at(learning_rate, state.count)
    wd = tr.value_at(weight_decay, state.count)
    lo = tr.value_at(lower, state.count)
    hi = tr.value_at(upper, state.count)

    tr.check_leaves(params)
    g_leaves, treedef = jax.tree.flatten(updates)
    w_leaves = treedef.flatten_up_to(params)
    m_leaves = treedef.flatten_up_to(state.momentum)
    trust_flags, wd_flags = masks_lib.resolve_masks(
        trust_ratio_mask, weight_decay_mask, params
    )
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)

    outs, moms, ratios = [], [], []
    for g, w, m, trust, decay, ax in zip(
        g_leaves, w_leaves, m_leaves, trust_flags, wd_flags, axes_list
    ):
      decay = decay and use_wd
      v = tr.add_decay(g, wd, w) if decay else g.astype(tr.compute_dtype(g, w))
      if trust:
        red = tr.reduce_axes(w.ndim, ax)
        r = tr.layer_ratio(
            w, g, red, weight_decay=wd if decay else None,
            denominator=denominator, trust_coefficient=trust_coefficient,
            eps=eps, lower=lo, upper=hi,
        )
        v = r * v
        ratios.append(tr.stored_ratio(r, w.shape, ax))
      else:
        ratios.append(tr.ones_ratio(w.shape, ax))
      step = -lr * v
      new_m = step + momentum * m.astype(tr.compute_dtype(m))
      out = step + momentum * new_m if nesterov else new_m
      moms.append(new_m.astype(m.dtype))
      outs.append(out.astype(tr.update_dtype(w, g)))

    new_state = LarsState(
        count=optax.safe_int32_increment(state.count),
        momentum=jax.tree.unflatten(treedef, moms),
        ratios=jax.tree.unflatten(treedef, ratios),
        bounds=tr.applied_bounds(lo, hi),
        learning_rate=jnp.asarray(lr, jnp.float32),
    )
    return jax.tree.unflatten(treedef, outs), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


BASES = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")


def make_base(
    base: str | optax.GradientTransformation,
    *,
    momentum: float = 0.9,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float | None = None,
    decay: float = 0.9,
    initial_accumulator_value: float = 0.1,
    initial_scale: float = 0.0,
) -> optax.GradientTransformation:
  """A base solver's preconditioned direction, without its learning rate."""
  if isinstance(base, optax.GradientTransformation):
    return base
  if not isinstance(base, str):
    raise TypeError(
        f"base must be one of {BASES} or an optax.GradientTransformation, "
        f"got {base!r}."
    )
  validation.check_choice("base", base, BASES)
  if eps is not None:
    validation.check_nonnegative("eps", eps)
  if base == "sgd":
    return optax.identity()
  if base in ("momentum", "nesterov"):
    validation.check_unit_interval("momentum", momentum)
    return optax.trace(decay=momentum, nesterov=base == "nesterov")
  if base == "adagrad":
    validation.check_nonnegative("initial_accumulator_value", initial_accumulator_value)
    return optax.scale_by_rss(
        initial_accumulator_value=initial_accumulator_value,
        eps=1e-7 if eps is None else eps,
    )
  if base == "rmsprop":
    validation.check_unit_interval("decay", decay)
    validation.check_nonnegative("initial_scale", initial_scale)
    return optax.scale_by_rms(
        decay=decay, eps=1e-8 if eps is None else eps, initial_scale=initial_scale
    )
  validation.check_unit_interval("b1", b1)
  validation.check_unit_interval("b2", b2)
  return optax.scale_by_adam(b1=b1, b2=b2, eps=1e-8 if eps is None else eps)


@tr.register_ratio_state
class BoundedLarsState(NamedTuple):
  """State of :func:`bounded_lars`.

  Attributes:
    count: number of updates so far (int32).
    ratios: the last step's per-layer trust ratios (float32).
    bounds: ``(lower, upper)`` applied at the last step (float32 scalars).
    learning_rate: the learning rate applied at the last step (float32; the
      value at step 0 before the first update).
    base_state: the base solver's state.
  """

  count: jax.Array
  ratios: Any
  bounds: Any
  learning_rate: Any
  base_state: Any


def bounded_lars(
    learning_rate: ScalarOrSchedule,
    *,
    base: str | optax.GradientTransformation = "momentum",
    lower: ScalarOrSchedule = 0.01,
    upper: ScalarOrSchedule = 10.0,
    momentum: float = 0.9,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float | None = None,
    decay: float = 0.9,
    initial_accumulator_value: float = 0.1,
    trust_coefficient: float = 1.0,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: Any = None,
    trust_ratio_mask: Any = None,
    ratio_source: Literal["gradient", "update"] = "gradient",
    layer_axes: Any = None,
    initial_scale: float = 0.0,
) -> optax.GradientTransformationExtraArgs:
  r"""Bounded per-layer ratios over any base solver (DATE, Algorithm 1).

  For each layer, with the base solver's direction :math:`b_t(g)` (its
  update without the learning rate):

  .. math::

    r_t &= \mathrm{clip}\big(c\,\|w\| / \|g\|,\ \text{lower}_t,
      \text{upper}_t\big) \quad (\text{clip}(1) \text{ if a norm is } 0) \\
    w_t &= w_{t-1} - \eta_t\, r_t\, b_t(g + \lambda w)

  The ratio uses the *raw* gradient (``ratio_source='gradient'``) with no
  weight decay in it, and scales the base's *output*: scaling the input
  would be cancelled by an adaptive base's second-moment normalisation. With
  ``ratio_source='update'`` the ratio is measured on :math:`b_t` instead
  (with ``base='adam'`` that is LAMB with bounds). With ``base='sgd'`` every
  layer's update is exactly ``-learning_rate * clip(‖w‖/‖g‖, lower, upper) * g``.
  ``base='momentum'`` accumulates :math:`a_t = \beta a_{t-1} + g_t` and the
  ratio scales the learning rate at apply time (TF style). Norms are
  :math:`\sum|x|^2` in float32 (complex parameters supported when the base
  supports them); updates have dtype ``jnp.promote_types(param, grad)``.

  Masks follow the package's one rule (README, "Masks"): if only one of
  ``trust_ratio_mask``/``weight_decay_mask`` is given it is used for both;
  if both are given they are independent; if neither, every layer gets both.
  A layer outside the trust mask gets the plain base update
  :math:`-\eta_t b_t` (ratio 1), with :math:`\lambda w` in the base's input
  iff the weight-decay mask includes it.

  Args:
    learning_rate: :math:`\eta \ge 0`, float or schedule.
    base: ``'sgd'``, ``'momentum'``, ``'nesterov'``, ``'adagrad'``,
      ``'rmsprop'``, ``'adam'``, or any :class:`optax.GradientTransformation`
      that returns a direction without the learning rate (for example
      ``optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(1e-4))``
      for decoupled weight decay).
    lower: lower bound on the ratio (float :math:`\ge 0` or schedule).
    upper: upper bound (float :math:`> 0` or schedule), ``lower <= upper``.
    momentum: :math:`\beta \in [0, 1)` for the momentum bases.
    b1: Adam's first-moment decay, in [0, 1).
    b2: Adam's second-moment decay, in [0, 1).
    eps: the adaptive bases' epsilon (``None``: 1e-8 for Adam and RMSProp,
      1e-7 for AdaGrad).
    decay: RMSProp's decay, in [0, 1).
    initial_accumulator_value: AdaGrad's initial accumulator (:math:`\ge 0`).
    trust_coefficient: :math:`c > 0` multiplying the ratio before the bounds.
    weight_decay: :math:`\lambda \ge 0` (float or schedule); adds
      :math:`\lambda w` to the gradient fed to the base (L2 style) but not
      to the ratio's gradient norm.
    weight_decay_mask: layers that get weight decay; ``None`` = not given.
    trust_ratio_mask: layers that get the ratio; ``None`` = not given.
    ratio_source: ``'gradient'`` (raw gradient, the default) or
      ``'update'`` (the base's direction).
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).
    initial_scale: RMSProp's initial second moment (:math:`\ge 0`); 0 as
      :func:`optax.scale_by_rms` (the default), 1.0 as TF1's
      ``RMSPropOptimizer``, the papers' framework.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; the state is a
    :class:`BoundedLarsState`, whose ratios, bounds and learning rate are
    readable with :func:`date_optax.trust_ratios`,
    :func:`date_optax.trust_ratio_bounds` and :func:`date_optax.learning_rate`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}          # ||w|| = 5
    >>> grads = {'w': jnp.array([0.06, 0.08])}         # ||g|| = 0.1
    >>> opt = date_optax.bounded_lars(0.5, base='sgd', lower=0.01, upper=10.0)
    >>> updates, _ = opt.update(grads, opt.init(params), params)
    >>> [f"{x:.2f}" for x in updates['w']]  # -0.5 * clip(50, 0.01, 10) * g
    ['-0.30', '-0.40']

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (DATE, Algorithm 1);
    You et al., `The Limit of the Batch Size
    <https://arxiv.org/abs/2006.08517>`_, 2020 (Table 3, layer-wise ratios
    with bounds for SGD, AdaGrad, RMSprop and Adam).
  """
  validation.check_nonnegative("learning_rate", learning_rate, allow_schedule=True)
  validation.check_bounds(lower, upper)
  if lower is None or upper is None:
    raise ValueError(
        "bounded_lars needs both bounds: lower >= 0 and upper > 0 "
        f"(got lower={lower!r}, upper={upper!r})."
    )
  validation.check_positive("trust_coefficient", trust_coefficient)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_mask("weight_decay_mask", weight_decay_mask)
  validation.check_mask("trust_ratio_mask", trust_ratio_mask)
  validation.check_choice("ratio_source", ratio_source, ("gradient", "update"))
  direction = optax.with_extra_args_support(make_base(
      base, momentum=momentum, b1=b1, b2=b2, eps=eps, decay=decay,
      initial_accumulator_value=initial_accumulator_value,
      initial_scale=initial_scale,
  ))
  use_wd = not tr.is_static_zero(weight_decay)

  def init_fn(params):
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    zero = jnp.zeros([], jnp.int32)
    return BoundedLarsState(
        count=zero,
        ratios=tr.init_ratios(params, axes),
        bounds=tr.applied_bounds(tr.value_at(lower, zero), tr.value_at(upper, zero)),
        learning_rate=jnp.asarray(tr.value_at(learning_rate, zero), jnp.float32),
        base_state=direction.init(params),
    )

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(tr.NO_PARAMS_MSG)
    lr = tr.value_at(learning_rate, state.count)
    wd = tr.value_at(weight_decay, state.count)
    lo = tr.value_at(lower, state.count)
    hi = tr.value_at(upper, state.count)
    g_leaves, treedef = jax.tree.flatten(updates)
    w_leaves = treedef.flatten_up_to(params)
    trust_flags, wd_flags = masks_lib.resolve_masks(
        trust_ratio_mask, weight_decay_mask, params
    )
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)
    tr.check_leaves(params)
    if use_wd:
      # L2 weight decay in the base's input, as optax.add_decayed_weights.
      fed = [g + wd * w if dec else g
             for g, w, dec in zip(g_leaves, w_leaves, wd_flags)]
      base_in = jax.tree.unflatten(treedef, fed)
    else:
      base_in = updates
    directions, base_state = direction.update(
        base_in, state.base_state, params, **extra_args
    )
    d_leaves = treedef.flatten_up_to(directions)

    outs, ratios = [], []
    for g, w, d, trust, ax in zip(g_leaves, w_leaves, d_leaves, trust_flags, axes_list):
      v = d.astype(tr.compute_dtype(d, w))
      if trust:
        red = tr.reduce_axes(w.ndim, ax)
        src = g if ratio_source == "gradient" else d
        r = tr.layer_ratio(
            w, src, red, trust_coefficient=trust_coefficient, lower=lo, upper=hi
        )
        v = r * v
        ratios.append(tr.stored_ratio(r, w.shape, ax))
      else:
        ratios.append(tr.ones_ratio(w.shape, ax))
      outs.append((-lr * v).astype(tr.update_dtype(w, g)))

    new_state = BoundedLarsState(
        count=optax.safe_int32_increment(state.count),
        ratios=jax.tree.unflatten(treedef, ratios),
        bounds=tr.applied_bounds(lo, hi),
        learning_rate=jnp.asarray(lr, jnp.float32),
        base_state=base_state,
    )
    return jax.tree.unflatten(treedef, outs), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
