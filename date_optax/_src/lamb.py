"""LAMB (SPEC §4) in one fused pass per layer."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from date_optax._src import masks as masks_lib
from date_optax._src import trust_ratio as tr
from date_optax._src import validation

ScalarOrSchedule = optax.ScalarOrSchedule


@tr.register_ratio_state
class LambState(NamedTuple):
  """State of :func:`lamb`.

  Attributes:
    count: number of updates so far (int32).
    mu: first moment, a pytree like the parameters.
    nu: second moment, a pytree like the parameters.
    ratios: the last step's per-layer trust ratios (float32).
  """

  count: jax.Array
  mu: Any
  nu: Any
  ratios: Any


def lamb(
    learning_rate: ScalarOrSchedule,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: ScalarOrSchedule = 0.0,
    mask: Any = None,
    trust_ratio_mask: Any = None,
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    bias_correction: bool = True,
    normalize_grads: bool = False,
    state_dtype: Any = None,
    layer_axes: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Layer-wise Adaptive Moments for Batch training, fused per layer.

  .. math::

    m_t &= \beta_1 m_{t-1} + (1-\beta_1) g, \qquad
    v_t = \beta_2 v_{t-1} + (1-\beta_2) g^2 \\
    \hat m &= m_t / (1-\beta_1^t), \qquad \hat v = v_t / (1-\beta_2^t) \\
    u &= \hat m / (\sqrt{\hat v + \epsilon_{root}} + \epsilon) + \lambda w \\
    r &= \mathrm{clip}(\|w\| / \|u\|,\ \text{lower}, \text{upper})
      \quad (1 \text{ if a norm is } 0) \\
    w_t &= w_{t-1} - \eta_t\, r\, u

  With default arguments the result equals :func:`optax.lamb`. Norms are
  float32 whatever the parameter dtype.

  Args:
    learning_rate: :math:`\eta \ge 0`, float or schedule.
    b1: first-moment decay, in [0, 1).
    b2: second-moment decay, in [0, 1).
    eps: :math:`\epsilon \ge 0` outside the square root.
    eps_root: :math:`\epsilon_{root} \ge 0` inside the square root.
    weight_decay: :math:`\lambda \ge 0` (float or schedule).
    mask: layers that get weight decay (pytree, prefix or callable; ``None``
      = all), as in :func:`optax.lamb`.
    trust_ratio_mask: layers that get the trust ratio; ``None`` uses
      ``mask`` (as the ALBERT reference does). Excluded layers take the
      plain Adam step :math:`-\eta u`.
    lower: optional lower bound on the ratio (float or schedule).
    upper: optional upper bound on the ratio (float or schedule).
    bias_correction: divide the moments by :math:`1-\beta^t` (the ALBERT
      reference does not).
    normalize_grads: NVLAMB pre-normalisation: divide all gradients by their
      global norm when it exceeds 1.
    state_dtype: dtype of both moments; ``None`` keeps the parameters' dtype.
    layer_axes: axes of a leaf that index separate layers (see
      :func:`date_optax.scale_by_trust_ratio`).

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
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020.
  """
  validation.check_nonnegative("learning_rate", learning_rate, allow_schedule=True)
  validation.check_unit_interval("b1", b1)
  validation.check_unit_interval("b2", b2)
  validation.check_nonnegative("eps", eps)
  validation.check_nonnegative("eps_root", eps_root)
  validation.check_nonnegative("weight_decay", weight_decay, allow_schedule=True)
  validation.check_mask("mask", mask)
  validation.check_mask("trust_ratio_mask", trust_ratio_mask)
  validation.check_bounds(lower, upper)
  validation.check_bool("bias_correction", bias_correction)
  validation.check_bool("normalize_grads", normalize_grads)
  use_wd = not tr.is_static_zero(weight_decay)
  ratio_mask = mask if trust_ratio_mask is None else trust_ratio_mask

  def init_fn(params):
    axes = masks_lib.resolve_layer_axes(layer_axes, params)
    zeros = lambda p: jnp.zeros(p.shape, state_dtype or p.dtype)
    return LambState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(zeros, params),
        nu=jax.tree.map(zeros, params),
        ratios=tr.init_ratios(params, axes),
    )

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    if params is None:
      raise ValueError(tr.NO_PARAMS_MSG)
    count = optax.safe_int32_increment(state.count)
    lr = tr.value_at(learning_rate, state.count)
    wd = tr.value_at(weight_decay, state.count)
    lo = tr.value_at(lower, state.count)
    hi = tr.value_at(upper, state.count)
    t = count.astype(jnp.float32)
    c1 = 1.0 - b1**t if bias_correction else 1.0
    c2 = 1.0 - b2**t if bias_correction else 1.0

    g_leaves, treedef = jax.tree.flatten(updates)
    if normalize_grads:
      # One global norm for the whole model; dividing only when it exceeds 1
      # keeps small gradients untouched (NVLAMB).
      gnorm = jnp.sqrt(sum(jnp.sum(tr.sum_squares(g, tuple(range(g.ndim))))
                           for g in g_leaves))
      gscale = 1.0 / jnp.maximum(gnorm, 1.0)
    w_leaves = treedef.flatten_up_to(params)
    mu_leaves = treedef.flatten_up_to(state.mu)
    nu_leaves = treedef.flatten_up_to(state.nu)
    trust_flags = masks_lib.resolve_mask(ratio_mask, params)
    wd_flags = masks_lib.resolve_mask(mask, params)
    axes_list = masks_lib.resolve_layer_axes(layer_axes, params)

    outs, mus, nus, ratios = [], [], [], []
    for g, w, mu, nu, trust, decay, ax in zip(
        g_leaves, w_leaves, mu_leaves, nu_leaves, trust_flags, wd_flags, axes_list
    ):
      g32 = g.astype(jnp.float32)
      if normalize_grads:
        g32 = g32 * gscale
      m = b1 * mu.astype(jnp.float32) + (1.0 - b1) * g32
      v = b2 * nu.astype(jnp.float32) + (1.0 - b2) * jnp.square(g32)
      u = (m / c1) / (jnp.sqrt(v / c2 + eps_root) + eps)
      if decay and use_wd:
        u = u + wd * w.astype(jnp.float32)
      if trust:
        red = tr.reduce_axes(w.ndim, ax)
        r = tr.trust_ratio(
            jnp.sqrt(tr.sum_squares(w, red)),
            # A reduction (not a dot) lets XLA fuse the direction into it.
            jnp.sqrt(jnp.sum(jnp.square(u), axis=red, keepdims=True)),
            lower=lo,
            upper=hi,
        )
        u = r * u
        ratios.append(tr.stored_ratio(r, w.shape, ax))
      else:
        ratios.append(tr.ones_ratio(w.shape, ax))
      outs.append((-lr * u).astype(g.dtype))
      mus.append(m.astype(mu.dtype))
      nus.append(v.astype(nu.dtype))

    new_state = LambState(
        count=count,
        mu=jax.tree.unflatten(treedef, mus),
        nu=jax.tree.unflatten(treedef, nus),
        ratios=jax.tree.unflatten(treedef, ratios),
    )
    return jax.tree.unflatten(treedef, outs), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
