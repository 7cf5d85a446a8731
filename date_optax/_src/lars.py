"""LARS and DATE's bounded LARS over any base solver."""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import trust_ratio as tr
from date_optax._src import validation
from date_optax._src.types import DType, LayerAxes, MaskOrFn, ScalarOrSchedule


class LarsState(NamedTuple):
  """State of :func:`lars`.

  Attributes:
    count: number of updates so far (int32); schedules are evaluated at it.
    momentum: the momentum buffer, a pytree like the parameters.
    ratios: the last step's per-layer trust ratios, one float32 vector
      (:class:`date_optax.LayerRatios`; :func:`date_optax.trust_ratios`
      unpacks it into a pytree shaped like the parameters).
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
  r"""Layer-wise Adaptive Rate Scaling.

  Built as :func:`optax.lars` is, a chain of three pieces: the package's one
  trust-ratio kernel (decay and ratio, :func:`scale_by_trust_ratio`'s), the
  learning rate and :func:`optax.trace`; its state is the pieces' arrays,
  kept as a :class:`LarsState`. The update is straight-line array code
  (float32 reductions of squares, no branch, no dot) that XLA fuses.

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

  Masks follow the package's one rule (docs/guide/optimizers.md, "Masks"): if only one of
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
    trust_coefficient: :math:`c > 0` and finite (LARS's :math:`\eta`, 0.001 in
      the paper; the rule of every transform of the package).
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
  validation.check_trust_coefficient(trust_coefficient)
  validation.check_nonnegative("eps", eps)
  validation.check_choice("denominator", denominator, ("sum_of_norms", "norm_of_sum"))
  validation.check_bounds(lower, upper)
  validation.check_layer_options(trust_ratio_mask, weight_decay_mask, layer_axes)
  validation.check_float_dtype("accumulator_dtype", accumulator_dtype)
  # optax.lars's pieces: (decay and) trust ratio, learning rate, momentum.
  pieces = (
      tr.trust_ratio_kernel(
          trust_coefficient, eps, lower=lower, upper=upper, weight_decay=weight_decay,
          denominator=denominator, inner=None, ratio_source="update",
          trust_mask=trust_ratio_mask, weight_decay_mask=weight_decay_mask,
          layer_axes=layer_axes, who="date_optax.lars",
      ),
      optax.scale_by_learning_rate(learning_rate),
      optax.trace(decay=momentum, nesterov=nesterov, accumulator_dtype=accumulator_dtype),
  )

  def pack(states, count):
    ratio, _, trace = states
    return LarsState(
        count=ratio.count, momentum=trace.trace, ratios=ratio.ratios,
        bounds=ratio.bounds,
        learning_rate=jnp.asarray(tr.value_at(learning_rate, count), jnp.float32),
    )

  def unpack(state):
    return (
        tr.TrustRatioState(state.count, state.ratios, optax.EmptyState(), state.bounds),
        tr.learning_rate_state(learning_rate, state.count),
        optax.TraceState(trace=state.momentum),
    )

  return tr.packed_chain(pieces, pack, unpack, learning_rate, who="date_optax.lars")


#: The base solvers that :func:`bounded_lars` builds by name, each with the
#: settings it accepts in ``base_options`` and their defaults. The one list of
#: solver keys: :func:`make_base`, :func:`bounded_lars` and
#: :class:`date_optax.Baseline` all read it.
BASE_OPTIONS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "sgd": {},
    "momentum": {"momentum": 0.9},
    "nesterov": {"momentum": 0.9},
    "adagrad": {"initial_accumulator_value": 0.1, "eps": 1e-7},
    "rmsprop": {"decay": 0.9, "eps": 1e-8, "initial_scale": 0.0},
    "adam": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
})

#: Base solvers by name.
BASES = tuple(BASE_OPTIONS)

#: Every key of :data:`BASE_OPTIONS`, for routing a flat mapping of settings.
BASE_OPTION_KEYS = frozenset(k for opts in BASE_OPTIONS.values() for k in opts)

# Base settings that were keywords of `bounded_lars` before `base_options`;
# `decay` is not among them: it named RMSProp's decay there and the
# learning-rate decay everywhere else.
_DEPRECATED_KEYWORDS = ("momentum", "b1", "b2", "eps", "initial_accumulator_value",
                        "initial_scale")


def base_options_for(
    base: str | optax.GradientTransformation, options: Mapping[str, Any] | None
) -> dict[str, Any]:
  """`options` checked against `base`'s keys in :data:`BASE_OPTIONS`, defaults filled."""
  options = {} if options is None else options
  if not isinstance(options, Mapping):
    raise TypeError(f"base_options must be a mapping or None, got {options!r}.")
  if isinstance(base, optax.GradientTransformation):
    if options:
      raise ValueError(
          "base_options apply to a base named by a string; an optax "
          f"GradientTransformation base takes none, got {sorted(options)}."
      )
    return {}
  if not isinstance(base, str):
    raise TypeError(
        f"base must be one of {BASES} or an optax.GradientTransformation, "
        f"got {base!r}."
    )
  validation.check_choice("base", base, BASES)
  allowed = BASE_OPTIONS[base]
  for key in options:
    if key not in allowed:
      raise ValueError(
          f"base_options has {key!r}, which base={base!r} does not take; "
          f"allowed: {sorted(allowed) or 'none'}."
      )
  return {**allowed, **options}


def split_base_options(
    base: str | optax.GradientTransformation, options: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
  """Splits flat solver settings into ``(base_options, other keywords)``.

  Keys of :data:`BASE_OPTIONS` (any base's) go to the first mapping, merged
  with an explicit ``options["base_options"]``; they are validated against
  `base` when the solver is built.
  """
  rest = dict(options)
  base_opts = dict(rest.pop("base_options", None) or {})
  for key in list(rest):
    if key in BASE_OPTION_KEYS:
      base_opts[key] = rest.pop(key)
  return base_opts, rest


def make_base(
    base: str | optax.GradientTransformation,
    base_options: Mapping[str, Any] | None = None,
) -> optax.GradientTransformation:
  """A base solver's preconditioned direction, without its learning rate.

  Args:
    base: a name in :data:`BASES` or an optax ``GradientTransformation``
      (returned as is).
    base_options: the named base's settings, keys of its entry in
      :data:`BASE_OPTIONS`; missing ones take the defaults listed there.

  Returns:
    An optax ``GradientTransformation``.
  """
  opts = base_options_for(base, base_options)
  if isinstance(base, optax.GradientTransformation):
    return base
  if "eps" in opts:
    validation.check_nonnegative("eps", opts["eps"])
  if base == "sgd":
    return optax.identity()
  if base in ("momentum", "nesterov"):
    validation.check_unit_interval("momentum", opts["momentum"])
    return optax.trace(decay=opts["momentum"], nesterov=base == "nesterov")
  if base == "adagrad":
    validation.check_nonnegative("initial_accumulator_value",
                                 opts["initial_accumulator_value"])
    return optax.scale_by_rss(**opts)
  if base == "rmsprop":
    validation.check_unit_interval("decay", opts["decay"])
    validation.check_nonnegative("initial_scale", opts["initial_scale"])
    return optax.scale_by_rms(**opts)
  validation.check_unit_interval("b1", opts["b1"])
  validation.check_unit_interval("b2", opts["b2"])
  return optax.scale_by_adam(**opts)


def _merge_deprecated(
    base: str | optax.GradientTransformation,
    base_options: Mapping[str, Any] | None,
    keywords: dict[str, Any],
) -> Mapping[str, Any] | None:
  """Folds `bounded_lars`'s pre-``base_options`` keywords into base_options."""
  if not keywords:
    return base_options
  if "decay" in keywords:
    raise TypeError(
        "bounded_lars(decay=...) is ambiguous and no longer accepted: for "
        "RMSProp's decay pass base_options={'decay': ...}; the learning-rate "
        "decay is a schedule given as learning_rate."
    )
  unknown = sorted(set(keywords) - set(_DEPRECATED_KEYWORDS))
  if unknown:
    raise TypeError(f"bounded_lars() got unexpected keyword arguments {unknown}.")
  warnings.warn(
      f"bounded_lars({', '.join(f'{k}=...' for k in keywords)}) is deprecated: "
      f"pass base_options={{{', '.join(repr(k) + ': ...' for k in keywords)}}}.",
      DeprecationWarning,
      stacklevel=3,
  )
  # As before, a keyword that the chosen base does not use is ignored.
  allowed = BASE_OPTIONS.get(base, {}) if isinstance(base, str) else {}
  merged = {k: v for k, v in keywords.items() if k in allowed}
  merged.update(base_options or {})
  return merged


def _mask_names(trust_ratio_mask: Any, weight_decay_mask: Any) -> tuple[str, str]:
  """The names of (trust, decay) masks after the rule's fill-in, for errors."""
  t = "weight_decay_mask" if trust_ratio_mask is None else "trust_ratio_mask"
  w = "trust_ratio_mask" if weight_decay_mask is None else "weight_decay_mask"
  return t, w


class BoundedLarsState(NamedTuple):
  """State of :func:`bounded_lars`.

  Attributes:
    count: number of updates so far (int32).
    ratios: the last step's per-layer trust ratios, one float32 vector
      (:class:`date_optax.LayerRatios`; :func:`date_optax.trust_ratios`
      unpacks it into a pytree shaped like the parameters).
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
    base_options: Mapping[str, Any] | None = None,
    trust_coefficient: float = 1.0,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: MaskOrFn = None,
    trust_ratio_mask: MaskOrFn = None,
    ratio_source: Literal["gradient", "update"] = "gradient",
    layer_axes: LayerAxes = None,
    **deprecated_base_keywords: Any,
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

  Masks follow the package's one rule (docs/guide/optimizers.md, "Masks"): if only one of
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
    base_options: the named base's settings; the keys each base takes and
      their defaults (one table in the code, ``BASE_OPTIONS``):

      - ``'momentum'``, ``'nesterov'``: ``momentum`` (:math:`\beta \in [0, 1)`,
        0.9);
      - ``'adagrad'``: ``initial_accumulator_value`` (:math:`\ge 0`, 0.1),
        ``eps`` (1e-7);
      - ``'rmsprop'``: ``decay`` (RMSProp's decay in [0, 1), 0.9), ``eps``
        (1e-8), ``initial_scale`` (the initial second moment, 0 as
        :func:`optax.scale_by_rms`; 1.0 as TF1's ``RMSPropOptimizer``, the
        papers' framework);
      - ``'adam'``: ``b1`` (0.9), ``b2`` (0.999), ``eps`` (1e-8);
      - ``'sgd'`` and a ``GradientTransformation`` base: none.

      Any other key raises a ``ValueError`` that lists the allowed ones.
    trust_coefficient: :math:`c > 0` and finite, multiplying the ratio before
      the bounds.
    weight_decay: :math:`\lambda \ge 0` (float or schedule); adds
      :math:`\lambda w` to the gradient fed to the base (L2 style) but not
      to the ratio's gradient norm.
    weight_decay_mask: layers that get weight decay; ``None`` = not given.
    trust_ratio_mask: layers that get the ratio; ``None`` = not given.
    ratio_source: ``'gradient'`` (raw gradient, the default) or
      ``'update'`` (the base's direction).
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).
    **deprecated_base_keywords: ``momentum``, ``b1``, ``b2``, ``eps``,
      ``initial_accumulator_value`` and ``initial_scale`` as keywords, the
      form before `base_options`: still accepted with a
      ``DeprecationWarning`` (same results; a keyword the base does not use
      is ignored, as it was). ``decay=`` is refused with a ``TypeError``: it
      meant RMSProp's decay here but the learning-rate decay in
      :class:`date_optax.Baseline` and :func:`date_optax.date`; pass
      ``base_options={'decay': ...}``.

  Returns:
    An :class:`optax.GradientTransformationExtraArgs`; the state is a
    :class:`BoundedLarsState`, whose ratios, bounds and learning rate are
    readable with :func:`date_optax.trust_ratios`,
    :func:`date_optax.trust_ratio_bounds` and
    :func:`date_optax.current_learning_rate`.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> params = {'w': jnp.array([3.0, 4.0])}          # ||w|| = 5
    >>> grads = {'w': jnp.array([0.06, 0.08])}         # ||g|| = 0.1
    >>> opt = date_optax.bounded_lars(0.5, base='sgd', lower=0.01, upper=10.0)
    >>> updates, _ = opt.update(grads, opt.init(params), params)
    >>> [f"{x:.2f}" for x in updates['w']]  # -0.5 * clip(50, 0.01, 10) * g
    ['-0.30', '-0.40']
    >>> rms = date_optax.bounded_lars(0.01, base='rmsprop',
    ...                               base_options={'decay': 0.99})
    >>> date_optax.bounded_lars(0.01, base='adam', base_options={'momentum': 0.9})
    Traceback (most recent call last):
    ...
    ValueError: base_options has 'momentum', which base='adam' does not take; ...

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
  validation.check_trust_coefficient(trust_coefficient)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_choice("ratio_source", ratio_source, ("gradient", "update"))
  # optax.inject_hyperparams binds the signature and passes this dict back
  # under its own name.
  nested = deprecated_base_keywords.pop("deprecated_base_keywords", None) or {}
  base_options = _merge_deprecated(base, base_options,
                                   {**nested, **deprecated_base_keywords})
  validation.check_layer_options(trust_ratio_mask, weight_decay_mask, layer_axes)
  direction = make_base(base, base_options)
  # The masks' one rule, resolved here: the kernel's decay goes to the base.
  trust_mask = weight_decay_mask if trust_ratio_mask is None else trust_ratio_mask
  wd_mask = trust_ratio_mask if weight_decay_mask is None else weight_decay_mask
  pieces = (
      tr.trust_ratio_kernel(
          trust_coefficient, 0.0, lower=lower, upper=upper, weight_decay=weight_decay,
          denominator="sum_of_norms", inner=direction, ratio_source=ratio_source,
          trust_mask=trust_mask, weight_decay_mask=wd_mask, layer_axes=layer_axes,
          decay="input", mask_names=_mask_names(trust_ratio_mask, weight_decay_mask),
          who="date_optax.bounded_lars",
      ),
      optax.scale_by_learning_rate(learning_rate),
  )

  def pack(states, count):
    ratio, _ = states
    return BoundedLarsState(
        count=ratio.count, ratios=ratio.ratios, bounds=ratio.bounds,
        learning_rate=jnp.asarray(tr.value_at(learning_rate, count), jnp.float32),
        base_state=ratio.inner_state,
    )

  def unpack(state):
    return (
        tr.TrustRatioState(state.count, state.ratios, state.base_state, state.bounds),
        tr.learning_rate_state(learning_rate, state.count),
    )

  return tr.packed_chain(pieces, pack, unpack, learning_rate,
                         who="date_optax.bounded_lars")
