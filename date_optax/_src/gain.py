"""The AdaScale gain: a learning-rate multiplier measured from gradient noise.

A data-parallel step built with ``make_train_step(..., grad_stats=True)``
measures, every step, smoothed unbiased estimates of the squared norm of the
true gradient ``|G|²`` and of the per-example covariance trace ``tr Σ``
(:class:`GradStats`) and passes them to the optimizer through optax's
extra-args convention: ``opt.update(grads, state, params, grad_stats=...)``.
The transforms here turn them into a learning-rate gain.

With the batch ``B = S·B0``, the variance of a gradient at ``B0`` is
``σ² = tr Σ / B0`` and AdaScale's gain is

    r = (σ² + |G|²) / (σ²/S + |G|²) = (1 + B_simple/B0) / (1 + B_simple/B),

with ``B_simple = tr Σ / |G|²`` (McCandlish et al.'s simple noise scale).
``r`` lies in ``[1, S]``: ``S`` when the gradient is all noise, 1 when it is
noise free; it is exactly 1 at ``S = 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import validation
from date_optax._src.types import PyTree


class GradStats(NamedTuple):
  """Smoothed gradient-noise statistics of the current step.

  Built by the train step (``make_train_step(..., grad_stats=True)``) and
  passed to the optimizer as ``opt.update(..., grad_stats=stats)``.

  Attributes:
    sq_norm: the smoothed unbiased estimate of ``|G|²``, the squared norm of
      the true (full-data) gradient (float32; may be negative early on).
    trace_cov: the smoothed unbiased estimate of ``tr Σ``, the trace of the
      covariance of a *single example's* gradient (float32).
    batch_size: ``B``, the global batch the step averaged (float32).

  Examples:
    >>> import date_optax
    >>> stats = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)
    >>> float(date_optax.noise_scale(stats))
    64.0

  References:
    McCandlish, Kaplan, Amodei et al., `An Empirical Model of Large-Batch
    Training <https://arxiv.org/abs/1812.06162>`_, 2018 (appendix A).
  """

  sq_norm: Any
  trace_cov: Any
  batch_size: Any


def noise_scale(grad_stats: GradStats) -> jax.Array:
  """The simple noise scale ``B_simple = tr Σ / |G|²`` of smoothed statistics.

  Both estimates are clipped at 0 first; a zero (or negative) ``|G|²`` with
  a positive trace gives ``inf``, and two zeros give 0, never NaN.

  Args:
    grad_stats: a :class:`GradStats`.

  Returns:
    A float32 scalar: the batch size at which noise and signal in the
    gradient are equal (the critical batch, to within a small factor).

  Examples:
    >>> import date_optax
    >>> float(date_optax.noise_scale(date_optax.GradStats(2.0, 100.0, 64.0)))
    50.0

  References:
    McCandlish, Kaplan, Amodei et al., `An Empirical Model of Large-Batch
    Training <https://arxiv.org/abs/1812.06162>`_, 2018 (§2.2, appendix A).
  """
  sqr = jnp.maximum(jnp.asarray(grad_stats.sq_norm, jnp.float32), 0.0)
  var = jnp.maximum(jnp.asarray(grad_stats.trace_cov, jnp.float32), 0.0)
  safe = jnp.where(sqr > 0, sqr, 1.0)
  return jnp.where(sqr > 0, var / safe, jnp.where(var > 0, jnp.inf, 0.0))


def check_grad_stats(grad_stats: Any, name: str = "grad_stats") -> None:
  """`grad_stats` is a :class:`GradStats` (or has its three fields) of real
  scalars, with a finite `batch_size > 0`; concrete values only (traced ones,
  inside the jitted step, are the step's own and not checked)."""
  if not all(hasattr(grad_stats, f) for f in GradStats._fields):
    raise TypeError(
        f"{name} must be a date_optax.GradStats(sq_norm, trace_cov, batch_size) "
        f"(what a train step built with grad_stats=True passes), got "
        f"{type(grad_stats).__name__} {grad_stats!r}."[:400]
    )
  for field in GradStats._fields:
    value = getattr(grad_stats, field)
    if isinstance(value, jax.core.Tracer):
      continue
    try:
      arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - an object NumPy cannot read
      arr = np.asarray(None)
    if arr.shape != () or arr.dtype.kind not in "fiu" or isinstance(value, bool):
      raise TypeError(
          f"{name}.{field} must be a real scalar, got {value!r}."[:300]
      )
    if field == "batch_size" and not (np.isfinite(arr) and arr > 0):
      raise ValueError(
          f"{name}.batch_size must be finite and > 0 (the global batch the "
          f"statistics were measured on), got {value!r}."
      )
    if field == "trace_cov" and np.isinf(arr):
      raise ValueError(f"{name}.trace_cov must be finite, got {value!r}.")


def adascale_gain(grad_stats: GradStats, scale: float) -> jax.Array:
  """AdaScale's gain ``r = (σ² + |G|²)/(σ²/S + |G|²)`` at batch scale `scale`.

  ``σ² = tr Σ · S / B`` is the gradient variance at the baseline batch
  ``B0 = B/S``. Both estimates are clipped at 0 before the ratio (they are
  smoothed, unbiased and may be slightly negative), the result is clipped to
  ``[1, S]``; with no signal and no noise it is 1. At ``S = 1`` it is exactly
  1.

  Args:
    grad_stats: a :class:`GradStats`.
    scale: ``S = B / B0 >= 1``.

  Returns:
    A float32 scalar in ``[1, scale]``.

  Raises:
    TypeError: `grad_stats` is not a :class:`GradStats` (a plain tuple is
      refused), or a field is not a real scalar.
    ValueError: a concrete ``batch_size`` that is not finite and > 0, or an
      infinite ``trace_cov`` (both would make the gain NaN).

  Examples:
    >>> import date_optax
    >>> stats = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)
    >>> round(float(date_optax.adascale_gain(stats, 4.0)), 4)  # B0 = 64 = B_simple
    1.6

  References:
    Johnson, Agrawal, Gu and Guestrin, `AdaScale SGD: A User-Friendly
    Algorithm for Distributed Training <https://arxiv.org/abs/2007.05105>`_,
    ICML 2020 (eq. 5).
  """
  check_grad_stats(grad_stats)
  scale = float(validation.check_real("scale", scale, low=1.0))
  if scale == 1.0:
    return jnp.ones((), jnp.float32)
  sqr = jnp.maximum(jnp.asarray(grad_stats.sq_norm, jnp.float32), 0.0)
  batch = jnp.asarray(grad_stats.batch_size, jnp.float32)
  # Variance of the gradient at B. A traced batch_size <= 0 (a concrete one
  # is refused above) carries no noise: gain 1, never inf/inf = NaN.
  var_b = jnp.where(
      batch > 0,
      jnp.maximum(jnp.asarray(grad_stats.trace_cov, jnp.float32), 0.0)
      / jnp.where(batch > 0, batch, 1.0),
      0.0,
  )
  num = var_b * scale + sqr
  den = var_b + sqr
  r = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 1.0)
  return jnp.clip(r, 1.0, scale)


class AdaScaleState(NamedTuple):
  """State of :func:`adascale` (and of ``date(..., lr_scaling="gain")``).

  Attributes:
    clock: the scale-invariant iterations ``τ`` taken (float32): the sum of
      the gains of all steps so far.
    gain: the gain ``r`` applied at the last step (1 before the first).
    lr_factor: the factor the inner optimizer's updates were multiplied by
      at the last step (``r·η(τ)`` with a `learning_rate`, else ``r`` or
      ``sqrt(r)``).
    inner_state: the wrapped optimizer's state.
  """

  clock: jax.Array
  gain: jax.Array
  lr_factor: jax.Array
  inner_state: Any


def _missing_stats_error(who: str) -> ValueError:
  return ValueError(
      f"{who} needs gradient-noise statistics: call it as opt.update(grads, "
      "state, params, grad_stats=...), which the train step does when it is "
      "built with date_optax.parallel.make_train_step(..., grad_stats=True) "
      "(or make_pmap_train_step(..., grad_stats=True)); grad_stats was not "
      "given."
  )


def scale_by_gain(
    optimizer: optax.GradientTransformation,
    scale: float,
    *,
    power: float = 1.0,
    learning_rate: Callable[[jax.Array], jax.Array] | None = None,
    name: str = "adascale",
) -> optax.GradientTransformationExtraArgs:
  """Multiplies `optimizer`'s updates by the gain ``r**power`` (and a schedule).

  The shared engine of :func:`adascale` and ``date(..., lr_scaling="gain")``;
  see :func:`adascale` for the arguments.
  """
  scale = float(validation.check_real("scale", scale, low=1.0))
  power = float(validation.check_real("power", power, low=0.0, low_inclusive=False))
  if not isinstance(optimizer, optax.GradientTransformation):
    raise TypeError(
        f"optimizer must be an optax GradientTransformation, got {optimizer!r}."
    )
  if learning_rate is not None and not callable(learning_rate):
    raise TypeError(
        "learning_rate must be a schedule (count -> learning rate) in "
        f"baseline iterations, or None; got {learning_rate!r}."
    )
  inner = optax.with_extra_args_support(optimizer)
  # Any numeric leaf goes on to `optimizer`, which takes it or not; anything
  # else (a string, an object) is named here.
  who = f"date_optax.{name}"

  def init_fn(params: PyTree) -> AdaScaleState:
    one = jnp.ones((), jnp.float32)
    return AdaScaleState(
        clock=jnp.zeros((), jnp.float32), gain=one, lr_factor=one,
        inner_state=inner.init(validation.number_leaves(params, who, "params")),
    )

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    updates = validation.number_leaves(updates, who)
    if params is not None:
      params = validation.number_leaves(params, who, "params")
    if grad_stats is None:
      raise _missing_stats_error(name)
    check_grad_stats(grad_stats, f"{name}: grad_stats")
    r = adascale_gain(grad_stats, scale)
    factor = r if power == 1.0 else r**power
    if learning_rate is not None:
      factor = factor * jnp.asarray(learning_rate(state.clock), jnp.float32)
    updates, inner_state = inner.update(
        updates, state.inner_state, params, grad_stats=grad_stats, **extra_args
    )
    updates = jax.tree.map(lambda u: (u * factor).astype(u.dtype), updates)
    return updates, AdaScaleState(
        clock=state.clock + r, gain=r, lr_factor=factor, inner_state=inner_state
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def adascale(
    optimizer: optax.GradientTransformation,
    scale: float,
    *,
    learning_rate: Callable[[jax.Array], jax.Array] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""AdaScale: scales an optimizer's learning rate by the measured gain.

  Each step reads the smoothed statistics passed as
  ``update(..., grad_stats=stats)`` (by a train step built with
  ``grad_stats=True``), computes the gain ``r_t`` (:func:`adascale_gain`)
  and multiplies `optimizer`'s updates by it. That is the learning rate
  scaled by ``r_t`` for every optimizer whose update is linear in its
  learning rate: optax's ``sgd`` (with or without momentum, which optax and
  PyTorch both accumulate before the learning rate), ``adam``, ``lamb``,
  date_optax's ``lars``/``bounded_lars`` and ``Baseline.solver()``.

  **The schedule clock.** AdaScale runs the baseline's schedule on a clock
  of scale-invariant iterations ``τ``, which advances by ``r_t`` per step:
  ``w ← w − r_t·η(τ_t)·update``, ``τ_{t+1} = τ_t + r_t``. To get that, pass
  the baseline's schedule (in baseline iterations) as `learning_rate` and an
  `optimizer` with learning rate 1 (``baseline.solver(learning_rate=1.0)``,
  ``optax.sgd(1.0, momentum=0.9)``); the update is then multiplied by
  ``r_t·η(τ_t)``, and the run reaches the baseline's schedule's end after
  ``T0/mean(r)`` steps, between ``T0/S`` (all noise) and ``T0`` steps.
  Without `learning_rate`, `optimizer` keeps its own schedule, which
  advances one per step, and only the gain is applied. The state's
  ``clock`` holds ``τ`` either way.

  Args:
    optimizer: an optax ``GradientTransformation`` (extra arguments are
      passed on to it).
    scale: ``S = B / B0 >= 1``, the batch the step averages over the batch
      the baseline was tuned at. At ``S = 1`` the gain is exactly 1.
    learning_rate: optional schedule ``τ -> η`` in baseline iterations,
      called with a float ``τ``.

  Returns:
    An optax ``GradientTransformationExtraArgs`` whose state is an
    :class:`AdaScaleState`. Its ``update`` raises a ValueError naming
    ``grad_stats`` when called without them.

  Raises:
    ValueError: for ``scale < 1``.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import date_optax
    >>> tx = date_optax.adascale(optax.sgd(0.1), scale=4)
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> stats = date_optax.GradStats(sq_norm=1.0, trace_cov=64.0, batch_size=256.0)
    >>> updates, state = tx.update({"w": jnp.ones(2)}, state, params,
    ...                            grad_stats=stats)
    >>> round(float(state.gain), 4), [round(float(u), 2) for u in updates["w"]]
    (1.6, [-0.16, -0.16])

  References:
    Johnson, Agrawal, Gu and Guestrin, `AdaScale SGD: A User-Friendly
    Algorithm for Distributed Training <https://arxiv.org/abs/2007.05105>`_,
    ICML 2020 (Algorithm 1); fairscale's ``fairscale.optim.AdaScale``
    (https://github.com/facebookresearch/fairscale).
  """
  return scale_by_gain(optimizer, scale, learning_rate=learning_rate, name="adascale")


def find_gain_state(opt_state: PyTree) -> AdaScaleState | None:
  """The first :class:`AdaScaleState` inside an optimizer state, or None."""
  is_gain = lambda x: isinstance(x, AdaScaleState)
  for x in jax.tree.leaves(opt_state, is_leaf=is_gain):
    if is_gain(x):
      return x
  return None
