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

import abc
import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import validation
from date_optax._src.types import Schedule

SCALING_RULES = ("linear", "sqrt", "none")
WARMUPS = ("gradual", "constant")


# ---------------------------------------------------------------------------
# Exact arithmetic for iteration counts.


def exact(x: Any) -> Fraction:
  """`x` as a Fraction, reading a float as the decimal it prints as.

  Iteration counts such as ``ceil(epochs * n / B)`` must not be off by one
  because ``0.3`` is stored as ``0.29999…``; reading floats through ``repr``
  makes ``epochs=0.3`` mean exactly 3/10.
  """
  if isinstance(x, Fraction):
    return x
  if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
    return Fraction(int(x))
  return Fraction(repr(float(x)))


def round_half_up(x: Fraction) -> int:
  """Nearest integer, halves rounded up (Python's `round` rounds to even)."""
  return math.floor(x + Fraction(1, 2))


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
# Decays.


@dataclasses.dataclass(frozen=True)
class Decay(abc.ABC):
  """How the learning rate falls after the warmup (base class).

  A decay only describes a shape; :meth:`schedule` binds it to a peak value
  and the run's iteration counts. Subclasses implement :meth:`value`.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.RollerCoaster(floor=0.0).schedule(1.0, 1, 3)
    >>> [float(sched(c)) for c in range(3)]
    [1.0, 0.5, 0.0]

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.4).
  """

  name: ClassVar[str] = ""
  #: Whether the decay is defined in epochs (needs `steps_per_epoch`).
  needs_steps_per_epoch: ClassVar[bool] = False
  #: Whether the decay is defined relative to the end of training.
  needs_total_steps: ClassVar[bool] = False

  @abc.abstractmethod
  def value(
      self,
      i: jax.Array,
      peak_value: float,
      warmup_steps: int,
      total_steps: int | None,
      steps_per_epoch: Fraction | None,
  ) -> jax.Array:
    """The post-warmup learning rate at 1-based iterations `i` (int32)."""

  def schedule(
      self,
      peak_value: float,
      warmup_steps: int,
      total_steps: int | None = None,
      *,
      steps_per_epoch: float | Fraction | None = None,
      warmup: str = "gradual",
      warmup_factor: float = 0.1,
  ) -> Schedule:
    """This decay after a warmup, as an optax schedule.

    See :func:`warmup_decay_schedule` for the arguments.
    """
    return warmup_decay_schedule(
        peak_value,
        warmup_steps,
        total_steps,
        decay=self,
        steps_per_epoch=steps_per_epoch,
        warmup=warmup,
        warmup_factor=warmup_factor,
    )


def _remaining(i, start, total_steps):
  """``(T − i) / (T − start)`` clipped to [0, 1].

  The difference is taken in integers so the end of the decay, where the
  value is small, keeps full float32 relative precision.
  """
  span = float(total_steps - start)
  r = (total_steps - i).astype(jnp.float32) / span
  return jnp.clip(r, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Constant(Decay):
  """No decay: the peak learning rate until the end of training.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.Constant().schedule(2.0, 2)
    >>> [float(sched(c)) for c in range(4)]
    [1.0, 2.0, 2.0, 2.0]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017.
  """

  name: ClassVar[str] = "constant"

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del warmup_steps, total_steps, steps_per_epoch
    return jnp.full(i.shape, peak_value, jnp.float32)


@dataclasses.dataclass(frozen=True)
class Poly(Decay):
  """LEGW's polynomial decay ``peak · (1 − i/T)^power``, unshifted.

  See docs/algorithms.md, "Learning-rate scaling and LEGW".

  "Unshifted" means the decay is measured from iteration 0, not from the end
  of the warmup, so the rate drops to ``peak·(1 − W/T)^power`` right after a
  warmup of ``W`` iterations, as in the LEGW paper.

  Args:
    power: the exponent ``p >= 0`` (LEGW Table 1 uses 2).

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.Poly(power=1).schedule(1.0, 1, 4)
    >>> [float(sched(c)) for c in range(4)]
    [1.0, 0.5, 0.25, 0.0]

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (§2, Table 1).
  """

  power: float = 2.0
  name: ClassVar[str] = "poly"
  needs_total_steps: ClassVar[bool] = True

  def __post_init__(self):
    validation.check_nonnegative("power", self.power)

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del warmup_steps, steps_per_epoch
    frac = _remaining(i, 0, total_steps)
    return (peak_value * frac**self.power).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class RollerCoaster(Decay):
  """DATE's roller-coaster decay ``max(peak·(1 − (i−W)/(T−W))^power, floor)``.

  Starts at the peak right after the warmup (continuous there), reaches
  `floor` at the last iteration ``T`` and stays there.

  Args:
    power: the exponent ``p >= 0`` (DATE uses 1).
    floor: the lowest learning rate, ``>= 0`` (DATE uses 1e-6).

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.RollerCoaster(power=2, floor=0.01).schedule(1.0, 1, 3)
    >>> [round(float(sched(c)), 4) for c in range(4)]
    [1.0, 0.25, 0.01, 0.01]

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.4).
  """

  power: float = 1.0
  floor: float = 1e-6
  name: ClassVar[str] = "roller_coaster"
  needs_total_steps: ClassVar[bool] = True

  def __post_init__(self):
    validation.check_nonnegative("power", self.power)
    validation.check_nonnegative("floor", self.floor)

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del steps_per_epoch
    lr = peak_value * _remaining(i, warmup_steps, total_steps) ** self.power
    return jnp.maximum(lr, self.floor).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Cosine(Decay):
  """Cosine decay ``peak · ½(1 + cos(π (i−W)/(T−W)))`` from the peak to 0.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.Cosine().schedule(1.0, 0, 2)
    >>> [round(float(sched(c)), 4) for c in range(2)]
    [0.5, 0.0]

  References:
    Loshchilov & Hutter, `SGDR <https://arxiv.org/abs/1608.03983>`_, 2017.
  """

  name: ClassVar[str] = "cosine"
  needs_total_steps: ClassVar[bool] = True

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del steps_per_epoch
    # ½(1 + cos(π p)) = sin²(π r / 2) with r = 1 − p the part left: no
    # cancellation near the end, where the value is small.
    r = _remaining(i, warmup_steps, total_steps)
    return (peak_value * jnp.sin(0.5 * jnp.pi * r) ** 2).astype(jnp.float32)


def _epoch_threshold(epoch: Fraction, steps_per_epoch: Fraction) -> int:
  """Last iteration that still lies in the first `epoch` epochs.

  Iteration ``i`` covers epochs ``((i−1)/s, i/s]``; it is past the boundary
  when ``i/s > epoch``. A boundary within 1e-9 of an iteration count is taken
  to be on it, so that float noise in `steps_per_epoch` cannot move a step.
  """
  x = epoch * steps_per_epoch
  nearest = round(x)
  if abs(x - nearest) <= Fraction(1, 10**9) * max(1, abs(x)):
    t = int(nearest)
  else:
    t = math.floor(x)
  return min(t, _INT32_MAX)  # iterations are int32; beyond is never reached


_INT32_MAX = 2**31 - 1


def _count_passed(i: jax.Array, thresholds: Sequence[int]) -> jax.Array:
  """How many of the sorted `thresholds` lie strictly below `i` (exactly)."""
  if not thresholds:
    return jnp.zeros(i.shape, jnp.int32)
  table = jnp.asarray(thresholds, jnp.int32)
  return jnp.searchsorted(table, i, side="left").astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class MultiStep(Decay):
  """Piecewise-constant decay: ``peak · Π factor_j`` over the boundaries passed.

  An iteration ``i`` belongs to epochs ``((i−1)/s, i/s]`` (``s`` steps per
  epoch); factor ``j`` applies once ``i/s > epochs[j]``, so "×0.1 at epoch
  30" starts with the first iteration of the 31st epoch.

  Args:
    epochs: the boundary epochs, strictly increasing and positive.
    factors: one multiplier per boundary (cumulative), each in ``(0, 1]``,
      or a single one used at every boundary (``0.1`` for Goyal et al.'s
      ResNet-50 schedule).

  Examples:
    >>> from date_optax import schedules
    >>> decay = schedules.MultiStep(epochs=(1, 2), factors=(0.5, 0.1))
    >>> sched = decay.schedule(1.0, 0, steps_per_epoch=1)
    >>> [round(float(sched(c)), 4) for c in range(3)]
    [1.0, 0.5, 0.05]

  References:
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017.
  """

  epochs: tuple[float, ...] = ()
  factors: float | tuple[float, ...] = 0.1
  name: ClassVar[str] = "multistep"
  needs_steps_per_epoch: ClassVar[bool] = True

  def __post_init__(self):
    epochs = _as_tuple("epochs", self.epochs)
    if not epochs:
      raise ValueError("epochs must list at least one boundary epoch, got ().")
    for e in epochs:
      validation.check_positive("epochs", e)
    if any(b <= a for a, b in zip(epochs, epochs[1:], strict=False)):
      raise ValueError(f"epochs must be strictly increasing, got {epochs!r}.")
    if isinstance(self.factors, (list, tuple, np.ndarray)):
      factors = _as_tuple("factors", self.factors)
      if len(factors) != len(epochs):
        raise ValueError(
            f"factors must have one entry per boundary epoch ({len(epochs)}), "
            f"got {len(factors)}."
        )
      for f in factors:
        validation.check_real("factors", f, low=0.0, high=1.0, low_inclusive=False)
    else:
      validation.check_real("factors", self.factors, low=0.0, high=1.0,
                            low_inclusive=False)
      factors = float(self.factors)
    object.__setattr__(self, "epochs", epochs)
    object.__setattr__(self, "factors", factors)

  @property
  def factor_list(self) -> tuple[float, ...]:
    if isinstance(self.factors, tuple):
      return self.factors
    return (self.factors,) * len(self.epochs)

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del warmup_steps, total_steps
    thresholds = [_epoch_threshold(exact(e), steps_per_epoch) for e in self.epochs]
    levels = np.cumprod((1.0,) + self.factor_list) * peak_value
    return jnp.asarray(levels, jnp.float32)[_count_passed(i, thresholds)]


@dataclasses.dataclass(frozen=True)
class Exponential(Decay):
  """Constant until `start_epoch`, then multiplied by `factor` every epoch.

  The PTB LSTM baseline (Zaremba et al., 2014): with ``start_epoch=4`` and
  ``factor=0.5`` epochs 1–4 use the peak, epoch 5 half of it, epoch 6 a
  quarter, ... Equivalent to :class:`MultiStep` with boundaries
  ``start_epoch, start_epoch + 1, ...`` and the same factor at each.

  Args:
    start_epoch: the last epoch at the peak, ``>= 0``.
    factor: the per-epoch multiplier, in ``(0, 1]``.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.Exponential(start_epoch=1, factor=0.5).schedule(
    ...     1.0, 0, steps_per_epoch=2)
    >>> [float(sched(c)) for c in range(6)]
    [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]

  References:
    Zaremba et al., `Recurrent Neural Network Regularization
    <https://arxiv.org/abs/1409.2329>`_, 2014.
  """

  start_epoch: float = 0.0
  factor: float = 0.5
  name: ClassVar[str] = "exponential"
  needs_steps_per_epoch: ClassVar[bool] = True

  def __post_init__(self):
    validation.check_nonnegative("start_epoch", self.start_epoch)
    validation.check_real(
        "factor", self.factor, low=0.0, high=1.0, low_inclusive=False
    )

  def value(self, i, peak_value, warmup_steps, total_steps, steps_per_epoch):
    del warmup_steps
    e0 = exact(self.start_epoch)
    # Boundaries e0, e0+1, ... as exact iteration thresholds (float32 epoch
    # arithmetic misplaces steps at epoch ends), as many as can matter: up
    # to the end of training, or until the rate underflows float32.
    if total_steps is not None:
      n_max = max(0, math.ceil(Fraction(total_steps) / steps_per_epoch - e0)) + 1
    elif self.factor == 1.0:
      n_max = 0
    else:
      n_max = math.ceil(
          (max(math.log2(peak_value), 0.0) + 160.0) / -math.log2(self.factor)
      )
    thresholds = []
    for j in range(n_max):
      t = _epoch_threshold(e0 + j, steps_per_epoch)
      if t >= _INT32_MAX:
        break
      thresholds.append(t)
    levels = peak_value * float(self.factor) ** np.arange(len(thresholds) + 1)
    return jnp.asarray(levels, jnp.float32)[_count_passed(i, thresholds)]


def _as_tuple(name: str, value: Any) -> tuple[float, ...]:
  if isinstance(value, (int, float, np.number)):
    value = (value,)
  try:
    out = tuple(float(validation.check_real(name, v)) for v in value)
  except TypeError as e:
    raise TypeError(f"{name} must be a sequence of numbers, got {value!r}.") from e
  return out


DECAYS: dict[str, type[Decay]] = {
    cls.name: cls
    for cls in (Constant, Poly, RollerCoaster, MultiStep, Exponential, Cosine)
}


def decay_from_name(name: str | Decay, **options: Any) -> Decay:
  """The decay called `name`, built with `options`.

  Args:
    name: one of ``"constant"``, ``"poly"``, ``"roller_coaster"``,
      ``"multistep"``, ``"exponential"``, ``"cosine"``; a :class:`Decay` is
      returned unchanged (then `options` must be empty).
    **options: the decay's fields, e.g. ``power=2`` for ``"poly"``.

  Returns:
    A :class:`Decay`.

  Examples:
    >>> from date_optax import schedules
    >>> schedules.decay_from_name("poly", power=2)
    Poly(power=2)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.4, roller coaster).
  """
  if isinstance(name, Decay):
    if options:
      raise TypeError(f"options {sorted(options)} given with a Decay instance.")
    return name
  if isinstance(name, (int, float)):
    # A number here is most likely RMSProp's decay given in the wrong place.
    raise TypeError(
        f"decay={name!r}: decay is the learning-rate decay after the warmup, "
        f"a Decay or one of {sorted(DECAYS)}; RMSProp's decay is a base "
        "option: base_options={'decay': ...} (or optimizer_options of a Baseline)."
    )
  validation.check_choice("decay", name, DECAYS)
  cls = DECAYS[name]
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(options) - fields)
  if unknown:
    raise TypeError(
        f"decay {name!r} has no option(s) {unknown}; its options are "
        f"{sorted(fields) or 'none'}."
    )
  return cls(**options)


# ---------------------------------------------------------------------------
# Warmup + decay.


def warmup_decay_schedule(
    peak_value: float,
    warmup_steps: int,
    total_steps: int | None = None,
    *,
    decay: Decay | str = "roller_coaster",
    steps_per_epoch: float | Fraction | None = None,
    warmup: str = "gradual",
    warmup_factor: float = 0.1,
) -> Schedule:
  r"""A warmup of `warmup_steps` iterations followed by `decay` (docs/algorithms.md, LEGW).

  With ``i = count + 1`` and ``W = warmup_steps``:

  .. math::

    \eta_i = \begin{cases}
      \text{peak} \cdot i / W & i \le W \text{ (gradual)} \\
      \text{peak} \cdot \text{warmup\_factor} & i \le W \text{ (constant)} \\
      \text{decay}(i) & i > W
    \end{cases}

  Args:
    peak_value: the learning rate at the end of the warmup, ``> 0``.
    warmup_steps: ``W >= 0`` warmup iterations (0: no warmup).
    total_steps: ``T``, the number of iterations of the run; required by the
      decays defined relative to the end (poly, roller coaster, cosine) and
      then ``> W``.
    decay: a :class:`Decay` or its name (built with default options).
    steps_per_epoch: iterations per epoch (a float, or an exact
      ``fractions.Fraction``); required by the epoch-based decays (multistep,
      exponential).
    warmup: ``"gradual"`` (linear from ``peak/W`` to peak) or ``"constant"``.
    warmup_factor: the multiplier of the peak during a constant warmup, in
      ``(0, 1]``.

  Returns:
    An optax schedule ``count -> learning rate`` (float32), jit-able.

  Examples:
    >>> from date_optax import schedules
    >>> sched = schedules.warmup_decay_schedule(
    ...     1.0, 4, 8, decay=schedules.RollerCoaster(floor=0.0))
    >>> [round(float(sched(c)), 4) for c in range(8)]
    [0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0.0]

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1).
  """
  decay = decay_from_name(decay)
  # The schedule computes in float32: a larger peak would be inf.
  validation.check_real("peak_value", peak_value, low=0.0, low_inclusive=False,
                        high=float(np.finfo(np.float32).max))
  warmup_steps = validation.check_int("warmup_steps", warmup_steps, low=0)
  validation.check_choice("warmup", warmup, WARMUPS)
  validation.check_real(
      "warmup_factor", warmup_factor, low=0.0, high=1.0, low_inclusive=False
  )
  if total_steps is not None:
    total_steps = validation.check_int("total_steps", total_steps, low=1)
    if total_steps <= warmup_steps:
      raise ValueError(
          f"total_steps must be > warmup_steps={warmup_steps} (the warmup must "
          f"end before training does), got total_steps={total_steps}."
      )
  elif decay.needs_total_steps:
    raise ValueError(f"total_steps is required by the {decay.name!r} decay.")
  if steps_per_epoch is not None:
    validation.check_positive("steps_per_epoch", steps_per_epoch)
    steps_per_epoch = exact(steps_per_epoch)
  elif decay.needs_steps_per_epoch:
    raise ValueError(f"steps_per_epoch is required by the {decay.name!r} decay.")
  if isinstance(decay, RollerCoaster) and decay.floor > peak_value:
    raise ValueError(
        f"floor must be <= peak_value={peak_value!r}, got floor={decay.floor!r}."
    )
  peak_value = float(peak_value)
  warm_const = peak_value * float(warmup_factor)

  def schedule(count: jax.typing.ArrayLike) -> jax.Array:
    i = jnp.asarray(count).astype(jnp.int32) + 1
    after = decay.value(i, peak_value, warmup_steps, total_steps, steps_per_epoch)
    if warmup_steps == 0:
      return after
    if warmup == "gradual":
      warm = peak_value * (i.astype(jnp.float32) / float(warmup_steps))
    else:
      warm = jnp.full(i.shape, warm_const, jnp.float32)
    return jnp.where(i <= warmup_steps, warm.astype(jnp.float32), after)

  return schedule


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
