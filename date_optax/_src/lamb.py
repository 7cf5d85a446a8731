"""LAMB: Adam's direction, the trust-ratio kernel and the learning rate, chained."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import exact_norms, validation
from date_optax._src import trust_ratio as tr
from date_optax._src.types import DType, LayerAxes, MaskOrFn, ScalarOrSchedule


class LambState(NamedTuple):
  """State of :func:`lamb`.

  Attributes:
    count: number of updates so far (int32).
    mu: first moment, a pytree like the parameters.
    nu: second moment, a pytree like the parameters.
    ratios: the last step's per-layer trust ratios, one float32 vector
      (:class:`date_optax.LayerRatios`; :func:`date_optax.trust_ratios`
      unpacks it into a pytree shaped like the parameters).
    bounds: ``(lower, upper)`` applied at the last step, float32 scalars;
      ``(0, +inf)`` when unbounded.
    learning_rate: the learning rate applied at the last step (float32; the
      value at step 0 before the first update).
  """

  count: jax.Array
  mu: Any
  nu: Any
  ratios: Any
  bounds: Any = None
  learning_rate: Any = None


def lamb(
    learning_rate: ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: ScalarOrSchedule = 0.0,
    weight_decay_mask: MaskOrFn = None,
    trust_ratio_mask: MaskOrFn = None,
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    bias_correction: bool = True,
    normalize_grads: bool = False,
    state_dtype: DType = None,
    layer_axes: LayerAxes = None,
    decoupled_weight_decay: bool = False,
    mask: MaskOrFn = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Layer-wise Adaptive Moments for Batch training.

  Built as :func:`optax.lamb` is, a chain of Adam's direction, the package's
  one trust-ratio kernel (with the decay) and the learning rate; its state is
  the pieces' arrays, kept as a :class:`LambState`.

  .. math::

    m_t &= \beta_1 m_{t-1} + (1-\beta_1) g, \qquad
    v_t = \beta_2 v_{t-1} + (1-\beta_2) g^2 \\
    \hat m &= m_t / (1-\beta_1^t), \qquad \hat v = v_t / (1-\beta_2^t) \\
    u &= \hat m / (\sqrt{\hat v + \epsilon_{root}} + \epsilon) + \lambda w \\
    r &= \mathrm{clip}(\|w\| / \|u\|,\ \text{lower}, \text{upper})
      \quad (1 \text{ if a norm is } 0) \\
    w_t &= w_{t-1} - \eta_t\, r\, u

  With ``decoupled_weight_decay=True`` the decay leaves :math:`u` (and so the
  ratio) and is applied beside it, :math:`w_t = w_{t-1} - \eta_t r\,u -
  \eta_t \lambda w_{t-1}` (keras 3 ``Lamb(weight_decay=)``, timm
  ``decoupled_decay``). Norms are :math:`\sum|x|^2` in float32 whatever the
  parameter dtype (complex parameters supported, as ``optax.lamb``); updates
  have dtype ``jnp.promote_types(param.dtype, grad.dtype)``, as optax.

  Masks follow the package's one rule (docs/guide/optimizers.md, "Masks"):
  ``weight_decay_mask`` and ``trust_ratio_mask``; if only one is given it is
  used for both (the ALBERT reference: the ratio follows the weight-decay
  exclusions); if both are given they are independent; if neither, every
  layer gets both. A layer
  outside the trust mask takes the plain Adam step :math:`-\eta u` (ratio
  1), with :math:`\lambda w` iff the weight-decay mask includes it.

  Equality with :func:`optax.lamb` (same hyperparameters, bias correction on,
  no bounds, no NVLAMB, coupled decay) holds without masks, and with a mask
  ``m`` when called as ``lamb(weight_decay_mask=m, trust_ratio_mask=True)``:
  ``optax.lamb(mask=m)`` masks only the decay and ratios every layer, while
  ``lamb(weight_decay_mask=m)`` alone also leaves the masked layers out of
  the ratio.

  Memory: each large layer's direction :math:`u` is needed whole before its
  update can start (its norm comes first), so it is written once. Adam's
  direction is made one large layer at a time, each after the ratio of the
  large layer two places before it (an optimisation barrier on the layer's
  two moments), so the step holds two layers' directions, not the model's,
  whatever the backend's scheduler (on the CPU, 13.6 MB instead of 103 MB
  of temporaries for ResNet-50), and on a model-sharded layer the norm's
  collective overlaps the next layer's work (docs/RESULTS.md).

  Args:
    learning_rate: :math:`\eta \ge 0`, float or schedule.
    b1: first-moment decay, in [0, 1).
    b2: second-moment decay, in [0, 1).
    eps: :math:`\epsilon \ge 0` outside the square root.
    eps_root: :math:`\epsilon_{root} \ge 0` inside the square root.
    weight_decay: :math:`\lambda \ge 0` (float or schedule).
    weight_decay_mask: layers that get weight decay (pytree, prefix or
      callable; ``True`` = apply; ``None`` = not given), :func:`optax.lamb`'s
      ``mask``.
    trust_ratio_mask: layers that get the trust ratio; ``None`` = not given
      (see the rule above).
    lower: optional lower bound on the ratio (float or schedule).
    upper: optional upper bound on the ratio (float or schedule).
    bias_correction: divide the moments by :math:`1-\beta^t` (the ALBERT
      reference does not).
    normalize_grads: NVLAMB pre-normalisation: divide all gradients by their
      global norm when it exceeds 1.
    state_dtype: dtype of both moments; ``None`` keeps the parameters' dtype.
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).
    decoupled_weight_decay: apply :math:`\eta\lambda w` outside the ratio
      instead of adding :math:`\lambda w` to :math:`u`.
    mask: deprecated name of ``weight_decay_mask`` (the name
      :func:`optax.lamb` uses; ``DeprecationWarning``, removed in the next
      release).

  Returns:
    An :class:`optax.GradientTransformationExtraArgs` (``update`` requires
    ``params``); the state is a :class:`LambState`.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> import date_optax
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> params = jnp.array([1.0, 2.0, 3.0])
    >>> opt = date_optax.lamb(learning_rate=0.003)
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...   updates, state = opt.update(jax.grad(f)(params), state, params)
    ...   params = optax.apply_updates(params, updates)
    >>> print(f"{f(params):.2f}")
    13.62

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020;
    Loshchilov and Hutter, `Decoupled Weight Decay Regularization
    <https://arxiv.org/abs/1711.05101>`_, ICLR 2019 (decoupled decay).
  """
  validation.check_nonnegative("learning_rate", learning_rate, allow_schedule=True)
  validation.check_unit_interval("b1", b1)
  validation.check_unit_interval("b2", b2)
  validation.check_nonnegative("eps", eps)
  validation.check_nonnegative("eps_root", eps_root)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_bounds(lower, upper)
  validation.check_bool("bias_correction", bias_correction)
  validation.check_bool("normalize_grads", normalize_grads)
  validation.check_bool("decoupled_weight_decay", decoupled_weight_decay)
  validation.check_layer_options(trust_ratio_mask, weight_decay_mask, layer_axes, mask=mask)
  validation.check_float_dtype("state_dtype", state_dtype)
  wd_mask = validation.deprecated_keyword(
      "lamb", "weight_decay_mask", weight_decay_mask, "mask", mask)
  wd_given, wd_name = wd_mask, "mask" if mask is not None else "weight_decay_mask"
  # The masks' one rule, resolved here (the decay may leave the ratio).
  trust_mask = wd_mask if trust_ratio_mask is None else trust_ratio_mask
  wd_mask = trust_ratio_mask if wd_mask is None else wd_mask
  # optax.lamb's pieces: Adam's direction, decay and trust ratio, learning rate.
  leafwise = lamb_moments_leafwise(b1, b2, eps, eps_root, bias_correction,
                                   normalize_grads)
  moments = scale_by_lamb_moments(leafwise, state_dtype)
  pieces = (
      tr.trust_ratio_kernel(
          1.0, 0.0, lower=lower, upper=upper, weight_decay=weight_decay,
          denominator="norm_of_sum", inner=moments, leafwise=leafwise,
          ratio_source="update",
          trust_mask=trust_mask, weight_decay_mask=wd_mask, layer_axes=layer_axes,
          decay="decoupled" if decoupled_weight_decay else "update",
          mask_names=(wd_name if trust_ratio_mask is None else "trust_ratio_mask",
                      "trust_ratio_mask" if wd_given is None else wd_name),
          who="date_optax.lamb",
      ),
      optax.scale_by_learning_rate(learning_rate),
  )

  def pack(states, count):
    ratio, _ = states
    return LambState(
        count=ratio.count, mu=ratio.inner_state.mu, nu=ratio.inner_state.nu,
        ratios=ratio.ratios, bounds=ratio.bounds,
        learning_rate=jnp.asarray(tr.value_at(learning_rate, count), jnp.float32),
    )

  def unpack(state):
    inner = optax.ScaleByAdamState(count=state.count, mu=state.mu, nu=state.nu)
    return (
        tr.TrustRatioState(state.count, state.ratios, inner, state.bounds),
        tr.learning_rate_state(learning_rate, state.count),
    )

  return tr.packed_chain(pieces, pack, unpack, learning_rate, who="date_optax.lamb")


def lamb_moments_leafwise(
    b1: float, b2: float, eps: float, eps_root: float, bias_correction: bool,
    normalize_grads: bool,
) -> tr.LeafwiseInner:
  """LAMB's direction one leaf at a time (see :class:`trust_ratio.LeafwiseInner`).

  ``split`` computes what all leaves share (the step, the bias corrections,
  NVLAMB's global gradient norm); ``leaf`` maps one gradient and its two
  moments to the direction ``m̂/(√(v̂ + eps_root) + eps)`` and the new
  moments; ``join`` rebuilds the :class:`optax.ScaleByAdamState`.
  """

  def split(state, g_leaves, treedef):
    count = optax.safe_int32_increment(state.count)
    t = count.astype(jnp.float32)
    c1 = 1.0 - b1**t if bias_correction else 1.0
    c2 = 1.0 - b2**t if bias_correction else 1.0
    gscale = None
    if normalize_grads:
      # One global norm for the whole model; dividing only when it exceeds 1
      # keeps small gradients untouched (NVLAMB).
      gnorm = jnp.sqrt(sum(jnp.sum(exact_norms.sum_squares(g, tuple(range(g.ndim))))
                           for g in g_leaves))
      gscale = 1.0 / jnp.maximum(gnorm, 1.0)
    leaf_states = list(zip(treedef.flatten_up_to(state.mu),
                           treedef.flatten_up_to(state.nu)))
    return (count, c1, c2, gscale), leaf_states

  def leaf(ctx, g, leaf_state):
    _, c1, c2, gscale = ctx
    mu, nu = leaf_state
    g32 = g.astype(exact_norms.compute_dtype(g))
    if gscale is not None:
      g32 = g32 * gscale
    g_sq = jnp.square(g32) if not jnp.iscomplexobj(g32) else (
        jnp.square(jnp.real(g32)) + jnp.square(jnp.imag(g32)))
    m = b1 * mu.astype(g32.dtype) + (1.0 - b1) * g32
    v = b2 * jnp.real(nu).astype(jnp.float32) + (1.0 - b2) * g_sq
    u = (m / c1) / (jnp.sqrt(v / c2 + eps_root) + eps)
    return u, (m.astype(mu.dtype), v.astype(nu.dtype))

  def join(ctx, new_leaf_states, treedef):
    mus = [m for m, _ in new_leaf_states]
    nus = [v for _, v in new_leaf_states]
    return optax.ScaleByAdamState(count=ctx[0], mu=jax.tree.unflatten(treedef, mus),
                                  nu=jax.tree.unflatten(treedef, nus))

  return tr.LeafwiseInner(split, leaf, join)


def scale_by_lamb_moments(
    leafwise: tr.LeafwiseInner, state_dtype: DType,
) -> optax.GradientTransformation:
  """LAMB's direction ``m̂/(√(v̂ + eps_root) + eps)`` (Adam's, with options).

  Unlike :func:`optax.scale_by_adam` it can skip bias correction (the ALBERT
  reference), pre-normalise by the global gradient norm (NVLAMB) and keep
  both moments in ``state_dtype``; complex gradients get ``|g|²`` as optax.
  The state is an :class:`optax.ScaleByAdamState`. Arguments are validated
  by :func:`lamb`; the arithmetic is ``leafwise``'s
  (:func:`lamb_moments_leafwise`), applied to every leaf.
  """

  def init_fn(params):
    zeros = lambda p: jnp.zeros(p.shape, state_dtype or p.dtype)
    return optax.ScaleByAdamState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(zeros, params),
        nu=jax.tree.map(zeros, params),
    )

  def update_fn(updates, state, params=None):
    del params
    g_leaves, treedef = jax.tree.flatten(updates)
    ctx, leaf_states = leafwise.split(state, g_leaves, treedef)
    outs = [leafwise.leaf(ctx, g, ls) for g, ls in zip(g_leaves, leaf_states)]
    return (jax.tree.unflatten(treedef, [u for u, _ in outs]),
            leafwise.join(ctx, [ls for _, ls in outs], treedef))

  return optax.GradientTransformation(init_fn, update_fn)
