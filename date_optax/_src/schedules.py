"""Batch-size-aware learning-rate schedules: scaling rules, warmup, decays.

Defined in docs/algorithms.md, "Learning-rate scaling and LEGW". Every
schedule is an optax ``Schedule``: a pure, jit-able function of optax's
zero-based update ``count``. Iterations are counted from 1
(``i = count + 1``) so that the very first update already has a non-zero
learning rate. A schedule is a warmup over ``warmup_steps`` iterations
followed by a *decay* (constant, poly, roller coaster, multistep, exponential
or cosine). Decays are small frozen dataclasses (:class:`Poly`,
:class:`RollerCoaster`, ...) so that a :class:`~date_optax.Baseline` can name
one before the batch size, and hence the number of iterations, is known; the
lowercase factories (:func:`poly`, :func:`roller_coaster`, ...) build a ready
schedule in one call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import optax

from date_optax._src import validation
from date_optax._src.decays import (
    Constant,
    Cosine,
    Exponential,
    MultiStep,
    Poly,
    RollerCoaster,
    warmup_decay_schedule,
)
from date_optax._src.types import Schedule

SCALING_RULES = ("linear", "sqrt", "none")


# ---------------------------------------------------------------------------
# Scaling rules.


def linear_scaling(value: float, batch_size: float, base_batch_size: float) -> float:
  """Linear scaling rule: ``value · B / B0``.

  Used for the peak learning rate by Goyal et al. (2017), and by LEGW for the
  number of warmup *epochs* (which keeps the warmup *iterations* constant).

  Args:
    value: the quantity tuned at the baseline batch size.
    batch_size: the target batch size ``B``.
    base_batch_size: the baseline batch size ``B0``.

  Returns:
    ``value * batch_size / base_batch_size`` as a float.

  Examples:
    >>> from date_optax import schedules
    >>> schedules.linear_scaling(0.3125, 8192, 1024)
    2.5

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (LEGW, §3.1).
  """
  _check_scaling_args(value, batch_size, base_batch_size)
  return _finite_result(float(value) * float(batch_size) / float(base_batch_size),
                        value, batch_size, base_batch_size)


def sqrt_scaling(value: float, batch_size: float, base_batch_size: float) -> float:
  """Square-root scaling rule: ``value · sqrt(B / B0)``.

  Keeps the variance of the update constant when the batch grows (Krizhevsky,
  2014); LEGW and DATE use it for the peak learning rate.

  Args:
    value: the quantity tuned at the baseline batch size.
    batch_size: the target batch size ``B``.
    base_batch_size: the baseline batch size ``B0``.

  Returns:
    ``value * sqrt(batch_size / base_batch_size)`` as a float.

  Examples:
    >>> from date_optax import schedules
    >>> schedules.sqrt_scaling(2 ** 2.5, 4096, 1024)  # LEGW Table 1
    11.313708498984761

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (§3.3, Sqrt Scaling).
  """
  _check_scaling_args(value, batch_size, base_batch_size)
  return _finite_result(
      float(value) * math.sqrt(float(batch_size) / float(base_batch_size)),
      value, batch_size, base_batch_size,
  )


def scale_by_rule(
    rule: str, value: float, batch_size: float, base_batch_size: float
) -> float:
  """Applies the scaling rule named `rule` (``"linear"``, ``"sqrt"``, ``"none"``).

  Args:
    rule: one of :data:`SCALING_RULES`; ``"none"`` returns `value` unchanged.
    value: the quantity tuned at the baseline batch size.
    batch_size: the target batch size ``B``.
    base_batch_size: the baseline batch size ``B0``.

  Returns:
    The scaled value as a float.

  Examples:
    >>> from date_optax import schedules
    >>> schedules.scale_by_rule("linear", 2.0, 8192, 1024)
    16.0

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (§3).
  """
  validation.check_choice("rule", rule, SCALING_RULES)
  if rule == "linear":
    return linear_scaling(value, batch_size, base_batch_size)
  if rule == "sqrt":
    return sqrt_scaling(value, batch_size, base_batch_size)
  _check_scaling_args(value, batch_size, base_batch_size)
  return float(value)


def _finite_result(result, value, batch_size, base_batch_size) -> float:
  if not math.isfinite(result):
    raise ValueError(
        f"value={value!r} scaled from base_batch_size={base_batch_size!r} to "
        f"batch_size={batch_size!r} overflows to {result}."
    )
  return result


def _check_scaling_args(value, batch_size, base_batch_size) -> None:
  validation.check_real("value", value)
  validation.check_positive("batch_size", batch_size)
  validation.check_positive("base_batch_size", base_batch_size)


# ---------------------------------------------------------------------------
# Ready schedules: a warmup and one decay.


def constant(
    peak_value: float,
    warmup_steps: int = 0,
    *,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  """Warmup, then the peak learning rate for ever.

  Args:
    peak_value: the learning rate after the warmup.
    warmup_steps: warmup iterations (0: none).
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.constant(0.4, 4)
    >>> [round(float(sched(c)), 4) for c in range(6)]
    [0.1, 0.2, 0.3, 0.4, 0.4, 0.4]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017 (gradual warmup).
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, None, decay=Constant(), warmup=warmup,
      warmup_factor=warmup_factor,
  )


def gradual_warmup(peak_value: float, warmup_steps: int) -> Schedule:
  """Linear warmup ``peak · i / W`` for ``i <= W``, then constant at the peak.

  Args:
    peak_value: the learning rate reached at iteration ``W``.
    warmup_steps: ``W``, the number of warmup iterations.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.gradual_warmup(1.0, 4)
    >>> [float(sched(c)) for c in range(5)]
    [0.25, 0.5, 0.75, 1.0, 1.0]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017 (§2.2, gradual warmup).
  """
  return constant(peak_value, warmup_steps, warmup="gradual")


def constant_warmup(
    peak_value: float, warmup_steps: int, factor: float = 0.1
) -> Schedule:
  """``peak · factor`` for the first ``W`` iterations, then the peak.

  Args:
    peak_value: the learning rate after the warmup.
    warmup_steps: ``W``, the number of warmup iterations.
    factor: the multiplier of the peak during the warmup, in ``(0, 1]``.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.constant_warmup(1.0, 2, factor=0.1)
    >>> [round(float(sched(c)), 4) for c in range(3)]
    [0.1, 0.1, 1.0]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017 (§2.2, constant warmup).
  """
  return constant(peak_value, warmup_steps, warmup="constant", warmup_factor=factor)


def poly(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    *,
    power: float = 2.0,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  """Warmup, then LEGW's unshifted poly decay ``peak · (1 − i/T)^power``.

  Args:
    peak_value: the learning rate at the end of the warmup.
    warmup_steps: ``W`` warmup iterations.
    total_steps: ``T > W`` iterations in all.
    power: the exponent, ``>= 0``.
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.poly(1.0, 2, 4, power=2)
    >>> [float(sched(c)) for c in range(4)]
    [0.5, 1.0, 0.0625, 0.0]

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (§2, poly decay with LEGW).
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, total_steps, decay=Poly(power), warmup=warmup,
      warmup_factor=warmup_factor,
  )


def roller_coaster(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    *,
    power: float = 1.0,
    floor: float = 1e-6,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  r"""Warmup, then DATE's roller-coaster decay.

  .. math::

    \eta_i = \max\left(\text{peak}\left(1 - \frac{i - W}{T - W}\right)^p,
    \text{floor}\right), \quad i > W

  Args:
    peak_value: the learning rate at the end of the warmup.
    warmup_steps: ``W`` warmup iterations.
    total_steps: ``T > W`` iterations in all.
    power: the exponent ``p >= 0``.
    floor: the lowest learning rate, ``0 <= floor <= peak_value``.
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.roller_coaster(1.0, 2, 6, floor=0.1)
    >>> [round(float(sched(c)), 4) for c in range(6)]
    [0.5, 1.0, 0.75, 0.5, 0.25, 0.1]

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.4).
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, total_steps, decay=RollerCoaster(power, floor),
      warmup=warmup, warmup_factor=warmup_factor,
  )


def cosine(
    peak_value: float,
    warmup_steps: int,
    total_steps: int,
    *,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  """Warmup, then cosine decay from the peak to 0 at iteration ``T``.

  Args:
    peak_value: the learning rate at the end of the warmup.
    warmup_steps: ``W`` warmup iterations.
    total_steps: ``T > W`` iterations in all.
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.cosine(1.0, 1, 3)
    >>> [round(float(sched(c)), 4) for c in range(3)]
    [1.0, 0.5, 0.0]

  References:
    Loshchilov & Hutter, `SGDR <https://arxiv.org/abs/1608.03983>`_, 2017.
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, total_steps, decay=Cosine(), warmup=warmup,
      warmup_factor=warmup_factor,
  )


def multistep(
    peak_value: float,
    warmup_steps: int,
    steps_per_epoch: float | Fraction,
    *,
    epochs: Sequence[float],
    factors: float | Sequence[float] = 0.1,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  """Warmup, then the peak multiplied by `factors` at the boundary `epochs`.

  Args:
    peak_value: the learning rate at the end of the warmup.
    warmup_steps: ``W`` warmup iterations.
    steps_per_epoch: iterations per epoch (float or ``Fraction``).
    epochs: boundary epochs, strictly increasing.
    factors: a multiplier per boundary (cumulative) or one for all.
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.multistep(1.0, 0, 2, epochs=[1, 2], factors=0.1)
    >>> [round(float(sched(c)), 4) for c in range(6)]
    [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017.
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, None, decay=MultiStep(epochs, factors),
      steps_per_epoch=steps_per_epoch, warmup=warmup, warmup_factor=warmup_factor,
  )


def exponential(
    peak_value: float,
    warmup_steps: int,
    steps_per_epoch: float | Fraction,
    *,
    start_epoch: float,
    factor: float,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  """Warmup, the peak until `start_epoch`, then × `factor` per epoch.

  Args:
    peak_value: the learning rate at the end of the warmup.
    warmup_steps: ``W`` warmup iterations.
    steps_per_epoch: iterations per epoch (float or ``Fraction``).
    start_epoch: the last epoch at the peak.
    factor: the per-epoch multiplier after it.
    warmup: ``"gradual"`` or ``"constant"``.
    warmup_factor: peak multiplier during a constant warmup.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.exponential(1.0, 0, 1, start_epoch=2, factor=0.5)
    >>> [float(sched(c)) for c in range(5)]
    [1.0, 1.0, 0.5, 0.25, 0.125]

  References:
    Zaremba et al., `Recurrent Neural Network Regularization
    <https://arxiv.org/abs/1409.2329>`_, 2014 (the PTB schedule).
  """
  return warmup_decay_schedule(
      peak_value, warmup_steps, None, decay=Exponential(start_epoch, factor),
      steps_per_epoch=steps_per_epoch, warmup=warmup, warmup_factor=warmup_factor,
  )


def multi_stage_schedule(
    schedules: Sequence[Schedule], stage_steps: Sequence[int]
) -> Schedule:
  """Runs `schedules` one after the other, each restarting its own count.

  Stage ``s`` covers `stage_steps[s]` iterations and sees counts from 0, so a
  warmup in it re-warms from 0 at the boundary instead of continuing the
  previous stage's decay (BERT's two-stage, "mixed batch" training). After
  the last stage the last schedule keeps going.

  Args:
    schedules: one optax schedule per stage.
    stage_steps: the number of iterations in each stage (positive ints), one
      per schedule.

  Returns:
    An optax schedule.

  Examples:
    >>> from date_optax import schedules
    >>> a = schedules.gradual_warmup(1.0, 2)
    >>> b = schedules.gradual_warmup(0.5, 2)
    >>> sched = schedules.multi_stage_schedule([a, b], [3, 3])
    >>> [float(sched(c)) for c in range(6)]
    [0.5, 1.0, 1.0, 0.25, 0.5, 0.5]

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020 (mixed-batch
    training).
  """
  for name, value in (("schedules", schedules), ("stage_steps", stage_steps)):
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
      raise TypeError(f"{name} must be a sequence (one entry per stage), got {value!r}.")
  schedules = list(schedules)
  stage_steps = list(stage_steps)
  if not schedules:
    raise ValueError("schedules must hold at least one schedule, got [].")
  for s in schedules:
    if not callable(s):
      raise TypeError(f"schedules must be callables count -> value, got {s!r}.")
  if len(stage_steps) != len(schedules):
    raise ValueError(
        f"stage_steps must have one entry per schedule ({len(schedules)} "
        f"schedules), got {len(stage_steps)}."
    )
  for n in stage_steps:
    validation.check_int("stage_steps", n, low=1)
  boundaries = np.cumsum(stage_steps)[:-1].tolist()
  return optax.join_schedules(schedules, boundaries)
