"""LARS (SPEC §2) and DATE's bounded LARS over any base solver (SPEC §3)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import masks as masks_lib
from date_optax._src import trust_ratio as tr
from date_optax._src import validation

ScalarOrSchedule = optax.ScalarOrSchedule


@tr.register_ratio_state
class LarsState(NamedTuple):
  """State of :func:`lars`.

  Attributes:
    count: number of updates so far (int32); schedules are evaluated at it.
    momentum: the momentum buffer, a pytree like the parameters.
    ratios: the last step's per-layer trust ratios (float32).
  """

  count: jax.Array
  momentum: Any
  ratios: Any


def lars(
    learning_rate: ScalarOrSchedule,
    *,
    weight_decay: ScalarOrSchedule = 0.0,
    momentum: float = 0.9,
    nesterov: bool = False,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    weight_decay_mask: Any = None,
    trust_ratio_mask: Any = True,
    denominator: Literal["sum_of_norms", "norm_of_sum"] = "sum_of_norms",
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    layer_axes: Any = None,
    accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Layer-wise Adaptive Rate Scaling, in one fused pass per layer.

  For each layer with parameters :math:`w` and gradient :math:`g` at step
  :math:`t` (learning rate :math:`\eta_t`, weight decay :math:`\lambda`):

  .. math::

    r_t &= \frac{c\,\|w\|}{\|g\| + \lambda\|w\| + \epsilon}
      \quad(\text{or } \frac{c\,\|w\|}{\|g + \lambda w\| + \epsilon}) \\
    m_t &= \beta\, m_{t-1} + \eta_t\, r_t\, (g + \lambda w) \\
    w_t &= w_{t-1} - m_t

  The ratio is 1 when :math:`\|w\|` or the denominator is 0, and may be
  bounded. Layers that ``trust_ratio_mask`` excludes get plain momentum SGD:
  no ratio and, unless ``weight_decay_mask`` is given separately, no weight
  decay (TF ``skip_list`` semantics). With ``weight_decay=0`` the two
  denominators coincide and the result equals :func:`optax.lars`.

  Args:
    learning_rate: :math:`\eta \ge 0`, a float or an optax schedule.
    weight_decay: :math:`\lambda \ge 0`, float or schedule.
    momentum: :math:`\beta \in [0, 1)`.
    nesterov: use Nesterov momentum.
    trust_coefficient: :math:`c > 0` (LARS's :math:`\eta`, 0.001 in the paper).
    eps: :math:`\epsilon \ge 0` in the denominator.
    weight_decay_mask: mask of layers that get weight decay (pytree, prefix
      or callable; ``True`` = apply). ``None`` uses ``trust_ratio_mask``.
    trust_ratio_mask: mask of layers that get the trust ratio. Pass
      :func:`date_optax.exclude_bias_and_norm` for the usual skip list.
    denominator: ``'sum_of_norms'`` (:math:`\|g\|+\lambda\|w\|`, the paper,
      TF, MLPerf) or ``'norm_of_sum'`` (:math:`\|g+\lambda w\|`, optax).
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
    <https://arxiv.org/abs/1708.03888>`_, 2017.
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
  wd_mask = trust_ratio_mask if weight_decay_mask is None else weight_decay_mask

  def init_fn(params):
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    dtype = accumulator_dtype
    return LarsState(
        count=jnp.zeros([], jnp.int32),
        momentum=jax.tree.map(
            lambda p: jnp.zeros(p.shape, dtype or p.dtype), params
        ),
        ratios=tr.init_ratios(params, axes),
    )

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    if params is None:
      raise ValueError(tr.NO_PARAMS_MSG)
    lr = tr.value_at(learning_rate, state.count)
    wd = tr.value_at(weight_decay, state.count)
    lo = tr.value_at(lower, state.count)
    hi = tr.value_at(upper, state.count)

    g_leaves, treedef = jax.tree.flatten(updates)
    w_leaves = treedef.flatten_up_to(params)
    m_leaves = treedef.flatten_up_to(state.momentum)
    trust_flags = masks_lib.resolve_mask(trust_ratio_mask, params)
    wd_flags = masks_lib.resolve_mask(wd_mask, params)
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)

    outs, moms, ratios = [], [], []
    for g, w, m, trust, decay, ax in zip(
        g_leaves, w_leaves, m_leaves, trust_flags, wd_flags, axes_list
    ):
      decay = decay and use_wd
      g32 = g.astype(jnp.float32)
      w32 = w.astype(jnp.float32)
      v = g32 + wd * w32 if decay else g32
      if trust:
        # Every reduction reads only the inputs (w, g): a norm of a derived
        # tensor such as g + λw makes XLA materialise it, an extra pass over
        # memory. ‖g + λw‖² is expanded into ‖g‖² + 2λ⟨g, w⟩ + λ²‖w‖².
        red = tr.reduce_axes(w.ndim, ax)
        w_sq = tr.sum_squares(w, red)
        g_sq = tr.sum_squares(g, red)
        w_norm = jnp.sqrt(w_sq)
        if not decay:
          denom = jnp.sqrt(g_sq)
        elif denominator == "sum_of_norms":
          denom = jnp.sqrt(g_sq) + wd * w_norm
        else:
          gw = tr.sum_products(g, w, red)
          denom = jnp.sqrt(jnp.maximum(g_sq + 2.0 * wd * gw + wd * wd * w_sq, 0.0))
        r = tr.trust_ratio(
            w_norm, denom, trust_coefficient=trust_coefficient, eps=eps,
            lower=lo, upper=hi,
        )
        v = r * v
        ratios.append(tr.stored_ratio(r, w.shape, ax))
      else:
        ratios.append(tr.ones_ratio(w.shape, ax))
      step = -lr * v
      new_m = step + momentum * m.astype(jnp.float32)
      out = step + momentum * new_m if nesterov else new_m
      moms.append(new_m.astype(m.dtype))
      outs.append(out.astype(g.dtype))

    new_state = LarsState(
        count=optax.safe_int32_increment(state.count),
        momentum=jax.tree.unflatten(treedef, moms),
        ratios=jax.tree.unflatten(treedef, ratios),
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
    return optax.scale_by_rms(decay=decay, eps=1e-8 if eps is None else eps)
  validation.check_unit_interval("b1", b1)
  validation.check_unit_interval("b2", b2)
  return optax.scale_by_adam(b1=b1, b2=b2, eps=1e-8 if eps is None else eps)


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
) -> optax.GradientTransformationExtraArgs:
  r"""Bounded per-layer ratios over any base solver (DATE, Algorithm 1).

  For each layer, with the base solver's direction :math:`b_t(g)` (its
  update without the learning rate):

  .. math::

    r_t &= \mathrm{clip}\big(c\,\|w\| / \|g\|,\ \text{lower}_t,
      \text{upper}_t\big) \quad (\text{clip}(1) \text{ if a norm is } 0) \\
    w_t &= w_{t-1} - \eta_t\, r_t\, b_t(g)

  The ratio uses the *raw* gradient (``ratio_source='gradient'``) with no
  weight decay in it, and scales the base's *output*: scaling the input
  would be cancelled by an adaptive base's second-moment normalisation. With
  ``ratio_source='update'`` the ratio is measured on :math:`b_t(g)` instead
  (with ``base='adam'`` that is LAMB with bounds). With ``base='sgd'`` every
  layer's update is exactly ``-learning_rate * clip(‖w‖/‖g‖, lower, upper) * g``.
  ``base='momentum'`` accumulates :math:`a_t = \beta a_{t-1} + g_t` and the
  ratio scales the learning rate at apply time (TF style).

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
    weight_decay_mask: layers that get weight decay; ``None`` = all.
    trust_ratio_mask: layers that get the ratio; ``None`` = all. Excluded
      layers get the plain base update.
    ratio_source: ``'gradient'`` (raw gradient, the default) or
      ``'update'`` (the base's direction).
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; per-layer ratios are
    readable with :func:`date_optax.trust_ratios`.

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
  direction = make_base(
      base, momentum=momentum, b1=b1, b2=b2, eps=eps, decay=decay,
      initial_accumulator_value=initial_accumulator_value,
  )
  if not tr.is_static_zero(weight_decay):
    direction = optax.chain(
        optax.add_decayed_weights(weight_decay, mask=weight_decay_mask), direction
    )
  return optax.chain(
      tr.scale_by_trust_ratio(
          trust_coefficient=trust_coefficient,
          lower=lower,
          upper=upper,
          inner=direction,
          source=ratio_source,
          mask=trust_ratio_mask,
          layer_axes=layer_axes,
      ),
      optax.scale_by_learning_rate(learning_rate),
  )
