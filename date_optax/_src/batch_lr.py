"""The learning rate of a growing batch: a schedule in examples times a batch rule.

``date(baseline, max_batch, batch_schedule=...)`` runs LEGW's schedule
for the schedule's first batch ``S`` (the baseline's own at ``B0`` when
``S <= B0``) on a clock of examples, ``τ = ⌊E/S⌋`` iterations of ``S``
after ``E`` examples, so the schedule stays aligned however the batch
grows, and multiplies it at every step by a function of the step's batch:
``sqrt(B/S)``, ``B/S``, or the measured AdaScale gain at ``k = B/B0``
(``r`` for the SGD family, ``sqrt(r)`` for adaptive solvers). The train
step passes the batch and the examples (an exact two-word count) as
``update(..., batch_progress=BatchProgress(...))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from date_optax._src import batch_schedule as bs_lib
from date_optax._src import validation
from date_optax._src.gain import AdaScaleState
from date_optax._src.types import PyTree

#: Rules of the learning-rate multiplier as the batch grows.
BATCH_LR_RULES = ("sqrt", "linear", "gain")


def batch_multiplier(
    rule: str, scale: jax.Array, grad_stats: Any = None, power: float = 1.0
) -> jax.Array:
  """The multiplier of the learning rate at batch scale ``k`` (float32).

  ``"sqrt"``: ``sqrt(k)``; ``"linear"``: ``k``; ``"gain"``: AdaScale's
  ``r = (σ²·k + |G|²)/(σ² + |G|²)`` of the smoothed statistics at the
  step's batch (``σ²`` the gradient variance at B), clipped to ``[1, k]``,
  to the power `power`; 1 when ``k <= 1``.
  """
  k = jnp.asarray(scale, jnp.float32)
  if rule == "sqrt":
    return jnp.sqrt(k)
  if rule == "linear":
    return k
  sqr = jnp.maximum(jnp.asarray(grad_stats.sq_norm, jnp.float32), 0.0)
  var_b = jnp.maximum(jnp.asarray(grad_stats.trace_cov, jnp.float32), 0.0) / jnp.asarray(
      grad_stats.batch_size, jnp.float32)
  den = var_b + sqr
  r = jnp.where(den > 0, (var_b * k + sqr) / jnp.where(den > 0, den, 1.0), 1.0)
  r = jnp.clip(r, 1.0, jnp.maximum(k, 1.0))
  return r if power == 1.0 else r**power


#: The largest clock the schedule is evaluated at: its iteration
#: ``i = τ + 1`` must be an int32 (a schedule casts the count to int32).
MAX_CLOCK = 2**31 - 2


def clock_at(examples: Any, clock_batch_size: int) -> jax.Array:
  """``⌊E/clock_batch_size⌋`` as int32, exact for a two-word count ``E``.

  Saturates at :data:`MAX_CLOCK` (a run that long is refused when the
  optimizer is built, so only a run past its end gets there).
  """
  q_high, q_low, _ = bs_lib.divmod_examples(examples, clock_batch_size)
  return jnp.where(q_high > 0, jnp.int32(MAX_CLOCK), jnp.minimum(q_low, MAX_CLOCK))


def scale_by_batch(
    optimizer: optax.GradientTransformation,
    learning_rate: Callable[[jax.Array], jax.Array],
    base_batch_size: int,
    *,
    rule: str = "sqrt",
    power: float = 1.0,
    clock_batch_size: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  """Multiplies `optimizer`'s updates by ``η(⌊E/C⌋) · rule(B/C)``.

  `optimizer` should have learning rate 1; `learning_rate` is a schedule in
  iterations of ``C`` examples (`clock_batch_size`, by default ``B0``),
  whose peak already holds the scaling from ``B0`` to ``C``. The ``"sqrt"``
  and ``"linear"`` rules scale it on from ``C`` to the step's batch ``B``
  (``sqrt(B/C)``, ``B/C``); ``"gain"`` multiplies by the measured gain at
  ``k = B/B0``. The examples ``E`` are an exact two-word count
  (:class:`BatchProgress`), so the clock never wraps. The state is an
  :class:`AdaScaleState` whose ``clock`` is ``E/B0`` (float32), ``gain``
  the rule's multiplier and ``lr_factor`` the learning rate applied (what
  the step reports as "learning_rate").

  Args:
    optimizer: the transformation to scale (extra arguments pass through).
    learning_rate: ``τ -> η`` in iterations of `clock_batch_size` examples.
    base_batch_size: ``B0``.
    rule: one of :data:`BATCH_LR_RULES`.
    power: the power of the gain (``"gain"`` only).
    clock_batch_size: ``C``, the examples per iteration of `learning_rate`,
      >= 1; ``None`` for ``B0``.

  Returns:
    An optax ``GradientTransformationExtraArgs``; its update raises a
    ValueError naming ``batch_progress`` when called without it.
  """
  b0 = validation.check_int("base_batch_size", base_batch_size, low=1,
                            high=bs_lib.MAX_BATCH)
  c = b0 if clock_batch_size is None else validation.check_int(
      "clock_batch_size", clock_batch_size, low=1, high=bs_lib.MAX_BATCH)
  validation.check_choice("rule", rule, BATCH_LR_RULES)
  inner = optax.with_extra_args_support(optimizer)

  def init_fn(params: PyTree) -> AdaScaleState:
    one = jnp.ones((), jnp.float32)
    return AdaScaleState(clock=jnp.zeros((), jnp.float32), gain=one, lr_factor=one,
                         inner_state=inner.init(params))

  def update_fn(updates, state, params=None, *, batch_progress=None, **extra_args):
    if batch_progress is None:
      raise ValueError(
          "date(..., batch_schedule=...) counts its schedule in examples: call it "
          "as update(..., batch_progress=...), which the train step does when it "
          "is built with make_train_step(..., batch_schedule=...); batch_progress "
          "was not given."
      )
    grad_stats = extra_args.get("grad_stats")
    if rule == "gain" and grad_stats is None:
      raise ValueError(
          'lr_scaling="gain" with a batch schedule needs the step\'s grad_stats: '
          "build make_train_step(..., grad_stats=True)."
      )
    examples = bs_lib.as_examples_words(batch_progress.examples)
    batch = jnp.asarray(batch_progress.batch_size, jnp.float32)
    if rule == "gain":
      m = batch_multiplier(rule, batch / jnp.float32(b0), grad_stats, power)
    else:
      m = batch_multiplier(rule, batch / jnp.float32(c), grad_stats, power)
    lr = jnp.asarray(learning_rate(clock_at(examples, c)), jnp.float32) * m
    updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
    updates = jax.tree.map(lambda u: (u * lr).astype(u.dtype), updates)
    q_high, q_low, r = bs_lib.divmod_examples(examples, b0)
    clock = (q_high.astype(jnp.float32) * jnp.float32(2.0**31) + q_low.astype(jnp.float32)
             + r.astype(jnp.float32) / jnp.float32(b0))
    return updates, AdaScaleState(clock=clock, gain=m, lr_factor=lr,
                                  inner_state=inner_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
