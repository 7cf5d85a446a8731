"""Warmup and decay: the learning rate after the warmup, one frozen object per shape.

A :class:`Decay` maps the iteration (counted from 1) after the warmup to a
multiplier of the peak learning rate: constant, LEGW's poly, DATE's roller
coaster, cosine, multi-step at epoch boundaries and per-epoch exponential.
:func:`warmup_decay_schedule` combines a warmup with one of them into an
optax schedule; `schedules.py` adds the scaling rules and ready schedules.
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

from date_optax._src import validation
from date_optax._src.types import Schedule

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
