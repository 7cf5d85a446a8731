"""LEGW recipes: a tuned small-batch baseline scaled to any batch size.

A :class:`Baseline` records what was tuned at one batch size;
:func:`scale_recipe` turns it into a :class:`Recipe` for another batch size
(sqrt learning-rate scaling, warmup epochs growing linearly with the batch,
durations converted to iterations with the dataset size), and
:func:`date_optax.multi_stage` (`multi_stage.py`) chains recipes into one
schedule (BERT's two sequence lengths). The DATE optimizer built on these
recipes is in `date_optimizer.py`.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import critical_batch as critical_lib
from date_optax._src import decays as decays_lib
from date_optax._src import lars as lars_lib
from date_optax._src import schedules as sched_lib
from date_optax._src import validation
from date_optax._src.types import ScalarOrSchedule

#: Base solvers :func:`date` accepts by name (those of `bounded_lars`).
BASES = lars_lib.BASES

@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline:
  """A training run tuned at one batch size: the input of LEGW and DATE.

  Durations are in epochs (or, for the warmup, a fraction of the run) and are
  turned into iterations with `num_examples`: ``steps_per_epoch = n/B``,
  ``total_steps = ceil(epochs·n/B)``, ``warmup_steps = round(w·n/B)``
  (halves rounded up). Floats are read as the decimals they print as, so
  ``epochs=0.3`` is exactly 3/10 in these counts. All fields are keywords.

  Args:
    batch_size: ``B0``, the batch size the baseline was tuned at.
    learning_rate: ``η0``, the peak learning rate at ``B0``.
    warmup_epochs: ``w0``, warmup length in epochs (``0 <= w0 < epochs``).
    epochs: ``E``, the length of the run in epochs.
    num_examples: ``n``, training examples per epoch.
    warmup_ratio: alternatively, the warmup as a fraction of all iterations
      (BERT's convention), in ``[0, 1)``; give at most one of `warmup_epochs`
      and `warmup_ratio` (neither: no warmup).
    warmup: ``"gradual"`` (linear from 0) or ``"constant"`` warmup.
    warmup_factor: the peak multiplier during a constant warmup, in (0, 1].
    decay: the baseline's decay, a :class:`~date_optax.schedules.Decay` or
      its name (``"roller_coaster"``, ``"poly"``, ...; default options).
    optimizer: the base solver, a name in :data:`BASES` or an optax
      ``GradientTransformation`` that returns the solver's direction without
      its learning rate (``optax.scale_by_adam()``, ...).
    optimizer_options: the solver's settings: the solver's `base_options` keys
      (see :func:`date_optax.bounded_lars`: ``momentum``, ``b1``, ..., RMSProp's
      ``decay``), which go to `bounded_lars`'s ``base_options``, and other
      keywords of :func:`date_optax.bounded_lars` (``weight_decay``,
      ``weight_decay_mask``, ...).
    ratio_bounds: ``(lower, upper)`` if the baseline itself was tuned with
      bounded trust ratios; :func:`date` then keeps them.

  Examples:
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904)
    >>> base.total_steps, base.warmup_steps, base.steps_per_epoch
    (1755, 117, 58.5)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1, inputs).
  """

  batch_size: int
  learning_rate: float
  warmup_epochs: float | None = None
  epochs: float
  num_examples: int
  warmup_ratio: float | None = None
  warmup: str = "gradual"
  warmup_factor: float = 0.1
  decay: decays_lib.Decay | str = "roller_coaster"
  optimizer: str | optax.GradientTransformation = "momentum"
  optimizer_options: Mapping[str, Any] = dataclasses.field(
      default_factory=dict, hash=False
  )
  ratio_bounds: tuple[Any, Any] | None = None

  def __post_init__(self):
    validation.check_int("batch_size", self.batch_size, low=1)
    validation.check_positive("learning_rate", self.learning_rate)
    validation.check_positive("epochs", self.epochs)
    validation.check_int("num_examples", self.num_examples, low=1)
    if self.warmup_epochs is not None and self.warmup_ratio is not None:
      raise ValueError(
          "give warmup_epochs or warmup_ratio, not both (got "
          f"warmup_epochs={self.warmup_epochs!r}, "
          f"warmup_ratio={self.warmup_ratio!r})."
      )
    if self.warmup_epochs is not None:
      validation.check_real(
          "warmup_epochs", self.warmup_epochs, low=0.0, high=float(self.epochs),
          high_inclusive=False,
      )
    if self.warmup_ratio is not None:
      validation.check_unit_interval("warmup_ratio", self.warmup_ratio)
    validation.check_choice("warmup", self.warmup, decays_lib.WARMUPS)
    validation.check_real(
        "warmup_factor", self.warmup_factor, low=0.0, high=1.0,
        low_inclusive=False,
    )
    object.__setattr__(self, "decay", decays_lib.decay_from_name(self.decay))
    if isinstance(self.optimizer, str):
      validation.check_choice("optimizer", self.optimizer, BASES)
    elif not isinstance(self.optimizer, optax.GradientTransformation):
      raise TypeError(
          f"optimizer must be one of {BASES} or an optax GradientTransformation, "
          f"got {self.optimizer!r}."
      )
    if not isinstance(self.optimizer_options, Mapping):
      raise TypeError(
          f"optimizer_options must be a mapping, got {self.optimizer_options!r}."
      )
    object.__setattr__(
        self, "optimizer_options", types.MappingProxyType(dict(self.optimizer_options))
    )
    if self.ratio_bounds is not None:
      if isinstance(self.ratio_bounds, (str, bytes)) or not isinstance(
          self.ratio_bounds, Sequence
      ):
        raise TypeError(
            f"ratio_bounds must be a pair (lower, upper), got {self.ratio_bounds!r}."
        )
      if len(self.ratio_bounds) != 2:
        raise ValueError(
            f"ratio_bounds must be a pair (lower, upper), got {self.ratio_bounds!r}."
        )
      lower, upper = self.ratio_bounds
      validation.check_bounds(lower, upper)
      object.__setattr__(self, "ratio_bounds", (lower, upper))
    check_solver_options(self.optimizer, self.optimizer_options, "optimizer_options")
    # The baseline must itself leave iterations after its warmup, and its own
    # schedule must build (a roller-coaster floor above the learning rate...).
    _iteration_counts(self, self.batch_size, "none", check=True)
    scale_recipe(self, self.batch_size)

  @property
  def base_warmup_epochs(self) -> float:
    """The warmup in epochs, whichever way it was given."""
    return float(_base_warmup(self))

  @property
  def steps_per_epoch(self) -> float:
    """``n / B0`` (a float)."""
    return self.num_examples / self.batch_size

  @property
  def total_steps(self) -> int:
    """``ceil(E · n / B0)``."""
    return _iteration_counts(self, self.batch_size, "none")[2]

  @property
  def warmup_steps(self) -> int:
    """``round(w0 · n / B0)``."""
    return _iteration_counts(self, self.batch_size, "none")[1]

  def recipe(self) -> Recipe:
    """The baseline's own schedule: :func:`scale_recipe` at ``B0``."""
    return scale_recipe(self, self.batch_size)

  def solver(
      self, learning_rate: ScalarOrSchedule | None = None
  ) -> optax.GradientTransformation:
    """The baseline's own optimizer: its solver with its own schedule.

    That is the plain base solver (no trust ratio) with weight decay as in
    `bounded_lars`, or `bounded_lars` with `ratio_bounds` when the baseline
    was tuned with bounded ratios. The reference :func:`date` is measured
    against at ``k = 1``.

    Args:
      learning_rate: replaces the baseline's schedule (``self.recipe()``).

    Returns:
      An optax ``GradientTransformation``.
    """
    lr = self.recipe().schedule if learning_rate is None else learning_rate
    base_options, options = lars_lib.split_base_options(
        self.optimizer, self.optimizer_options
    )
    if self.ratio_bounds is not None:
      lower, upper = self.ratio_bounds
      return lars_lib.bounded_lars(
          lr, base=self.optimizer, lower=lower, upper=upper,
          base_options=base_options, **options
      )
    weight_decay = options.pop("weight_decay", 0.0)
    weight_decay_mask = options.pop("weight_decay_mask", None)
    direction = lars_lib.make_base(self.optimizer, base_options)
    parts = [direction, optax.scale_by_learning_rate(lr)]
    if weight_decay != 0.0:
      parts.insert(0, optax.add_decayed_weights(weight_decay, weight_decay_mask))
    return optax.chain(*parts)


#: Keywords of :func:`date_optax.bounded_lars` that a solver's options may
#: hold besides the base's own settings (:data:`date_optax._src.lars.BASE_OPTIONS`);
#: the learning rate, base, bounds and ratio source come from the baseline and
#: :func:`date`'s own arguments.
SOLVER_KEYWORDS = ("base_options", "trust_coefficient", "weight_decay",
                   "weight_decay_mask", "trust_ratio_mask", "layer_axes")


def check_solver_options(
    optimizer: str | optax.GradientTransformation,
    options: Mapping[str, Any],
    name: str,
    unknown: type[Exception] = ValueError,
) -> None:
  """Refuses a key or value of `options` that the solver would not take.

  Keys are checked against the base's entry of the table `bounded_lars`
  uses (``lars.BASE_OPTIONS``) and :data:`SOLVER_KEYWORDS`; values by
  building the solver once, with any error re-raised naming `name`. An
  unknown key raises `unknown` (TypeError for keyword arguments).
  """
  base_allowed = (
      sorted(lars_lib.BASE_OPTIONS[optimizer]) if isinstance(optimizer, str) else []
  )
  for key in options:
    if not isinstance(key, str):
      raise TypeError(f"{name} keys must be strings, got {key!r}.")
    if key in SOLVER_KEYWORDS or key in base_allowed:
      continue
    where = (
        f"the settings of optimizer={optimizer!r}"
        if isinstance(optimizer, str)
        else "an optax GradientTransformation optimizer's settings (none)"
    )
    raise unknown(
        f"{name} has {key!r}, which the solver does not take; allowed: "
        f"{base_allowed} ({where}) and {list(SOLVER_KEYWORDS)} (keywords of "
        "bounded_lars)."
    )
  inner = options.get("base_options")
  if inner is not None and not isinstance(inner, Mapping):
    raise TypeError(f"{name}['base_options'] must be a mapping or None, got {inner!r}.")
  base_options, rest = lars_lib.split_base_options(optimizer, options)
  try:
    lars_lib.make_base(optimizer, lars_lib.base_options_for(optimizer, base_options))
    lars_lib.bounded_lars(
        1.0, base=optimizer, lower=1.0, upper=1.0, base_options=base_options, **rest
    )
  except (TypeError, ValueError) as e:
    raise type(e)(f"{name}: {e}") from e


def check_baseline(baseline: Any) -> None:
  if not isinstance(baseline, Baseline):
    raise TypeError(
        f"baseline must be a date_optax.Baseline (the run tuned at one batch "
        f"size), got {baseline!r}."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  """A baseline scaled to one batch size (the output of :func:`scale_recipe`).

  Build it with :func:`scale_recipe` or :func:`date_recipe`, not by hand.

  Args:
    batch_size: the target batch size ``B``.
    peak_learning_rate: the learning rate at the end of the warmup.
    warmup_epochs: the warmup length in epochs.
    warmup_steps: the warmup length in iterations ``W``.
    total_steps: iterations in the whole run, ``T = ceil(E·n/B)``.
    steps_per_epoch: ``n / B`` (a float).
    schedule: the optax schedule ``count -> learning rate``.
    scale: ``k = B / B0``.
    epochs: ``E``, unchanged from the baseline.
    warmup_ratio: ``warmup_epochs / epochs``.
    decay: the decay after the warmup.
    warmup: ``"gradual"`` or ``"constant"``.
    baseline: the :class:`Baseline` it was scaled from.
    critical_batch: the critical batch given to :func:`scale_recipe` (or
      ``None``); :meth:`propose_batch_schedule` grows the batch from it.

  Examples:
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904)
    >>> r = date_optax.scale_recipe(base, 8192)
    >>> r.warmup_epochs, r.warmup_steps, r.total_steps
    (16.0, 117, 220)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.6).
  """

  batch_size: int
  peak_learning_rate: float
  warmup_epochs: float
  warmup_steps: int
  total_steps: int
  steps_per_epoch: float
  schedule: optax.Schedule = dataclasses.field(repr=False, compare=False)
  scale: float
  epochs: float
  warmup_ratio: float
  decay: decays_lib.Decay
  warmup: str
  baseline: Baseline = dataclasses.field(repr=False)
  critical_batch: float | None = None

  def propose_batch_schedule(self, **options: Any) -> critical_lib.BatchSchedule:
    """:func:`~date_optax.diagnostics.propose_batch_schedule` up to `batch_size`.

    From the recipe's critical batch, ``B0`` and ``epochs · num_examples``;
    `options`: ``kind``, ``ramp_fraction``, ``unit``, ``calibration``.

    Examples:
      >>> import date_optax
      >>> base = date_optax.Baseline(batch_size=16, learning_rate=0.1,
      ...     warmup_epochs=0.25, epochs=20, num_examples=16384)
      >>> r = date_optax.scale_recipe(base, 1024, critical_batch=200.0)
      >>> r.propose_batch_schedule().batch_sizes
      (128, 256, 512, 1024)
    """
    return critical_lib.propose_for_recipe(self, **options)

  def learning_rates(self) -> np.ndarray:
    """The learning rate of every iteration ``1..T`` (float32 numpy array)."""
    return np.asarray(self.schedule(jnp.arange(self.total_steps, dtype=jnp.int32)))

  def epoch_of(self, step: Any) -> np.ndarray:
    """Epochs completed at the end of iteration ``step + 1`` (counts from 0)."""
    return (np.asarray(step) + 1) / self.steps_per_epoch


def _base_warmup(baseline: Baseline) -> Fraction:
  if baseline.warmup_epochs is not None:
    return decays_lib.exact(baseline.warmup_epochs)
  if baseline.warmup_ratio is not None:
    return decays_lib.exact(baseline.warmup_ratio) * decays_lib.exact(baseline.epochs)
  return Fraction(0)


def _warmup_factor_exact(rule: str, k: Fraction) -> Fraction:
  """The warmup multiplier as an exact fraction where it is rational."""
  if rule == "linear":
    return k
  if rule == "none":
    return Fraction(1)
  return Fraction(math.sqrt(k))


def _iteration_counts(
    baseline: Baseline, batch_size: int, warmup_scaling: str, *, check: bool = False
) -> tuple[Fraction, int, int]:
  """Scaled warmup epochs (exact), warmup steps and total steps at `batch_size`.

  With `check`, raises a ValueError when the warmup would reach the end of
  training, or when a non-zero warmup rounds to 0 iterations.
  """
  n = baseline.num_examples
  k = Fraction(batch_size, baseline.batch_size)
  epochs = decays_lib.exact(baseline.epochs)
  w = _base_warmup(baseline) * _warmup_factor_exact(warmup_scaling, k)
  # For linear scaling w·n/B == w0·n/B0 exactly: the warmup iterations do not
  # depend on the batch size.
  warmup_steps = decays_lib.round_half_up(w * n / batch_size)
  total_steps = math.ceil(epochs * n / batch_size)
  if check and w > 0 and warmup_steps == 0:
    raise ValueError(_vanished_warmup_message(baseline, batch_size, warmup_scaling))
  if check and not _fits(w, warmup_steps, epochs, total_steps):
    largest = _largest_supported_batch(baseline, warmup_scaling, batch_size)
    hint = (
        f" The largest batch size this baseline supports with "
        f"warmup_scaling={warmup_scaling!r} is {largest}."
        if largest is not None
        else ""
    )
    raise ValueError(
        f"batch_size={batch_size} scales the warmup to {float(w):g} epochs "
        f"({warmup_steps} iterations), which reaches the end of training "
        f"({float(epochs):g} epochs, {total_steps} iterations): no iteration "
        f"would be left to decay.{hint} Shorten the baseline's warmup or train "
        "longer."
    )
  return w, warmup_steps, total_steps


def _round_up_sig(x: float, digits: int = 4) -> float:
  """`x` rounded *up* to `digits` significant digits (so it still suffices)."""
  if x <= 0:
    return x
  scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
  return math.ceil(x * scale * (1 - 1e-12)) / scale


def _vanished_warmup_message(
    baseline: Baseline, batch_size: int, warmup_scaling: str
) -> str:
  """Says which warmup value is the smallest that gives one iteration."""
  k = Fraction(batch_size, baseline.batch_size)
  factor = float(_warmup_factor_exact(warmup_scaling, k))
  # round_half_up(w0·factor·n/B) >= 1  <=>  w0 >= B / (2·factor·n).
  min_epochs = batch_size / (2 * factor * baseline.num_examples)
  if baseline.warmup_ratio is not None:
    name, value = "warmup_ratio", baseline.warmup_ratio
    smallest = _round_up_sig(min_epochs / float(baseline.epochs))
  else:
    name, value = "warmup_epochs", baseline.warmup_epochs
    smallest = _round_up_sig(min_epochs)
  where = (
      f"at batch_size={batch_size} (warmup_scaling={warmup_scaling!r})"
      if batch_size != baseline.batch_size
      else f"at the baseline's batch_size={batch_size}"
  ) + f" with num_examples={baseline.num_examples}"
  return (
      f"{name}={value!r} rounds to 0 warmup iterations {where}: the warmup "
      f"would silently disappear. The smallest {name} that gives one "
      f"iteration there is {smallest:g}; give at least that, or 0 for no "
      "warmup."
  )


def _fits(w: Fraction, warmup_steps: int, epochs: Fraction, total_steps: int) -> bool:
  return w < epochs and (warmup_steps == 0 or warmup_steps < total_steps)


def _largest_supported_batch(
    baseline: Baseline, warmup_scaling: str, batch_size: int
) -> int | None:
  """Largest batch below `batch_size` whose warmup still fits (bisection)."""

  def ok(b: int) -> bool:
    w, ws, ts = _iteration_counts(baseline, b, warmup_scaling)
    return _fits(w, ws, decays_lib.exact(baseline.epochs), ts)

  lo, hi = 1, batch_size  # invariant: ok(lo) (checked below), not ok(hi)
  if not ok(lo):
    return None
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if ok(mid):
      lo = mid
    else:
      hi = mid
  return lo


def scale_recipe(
    baseline: Baseline,
    batch_size: int,
    *,
    lr_scaling: str = "sqrt",
    warmup_scaling: str = "linear",
    decay: decays_lib.Decay | str | None = None,
    warmup: str | None = None,
    warmup_factor: float | None = None,
    critical_batch: float | None = None,
) -> Recipe:
  r"""Scales a tuned baseline to `batch_size` without retuning (LEGW).

  With ``k = B / B0``: the peak learning rate is ``η0·sqrt(k)`` (or
  ``η0·k``, or ``η0``), the warmup lasts ``w0·k`` epochs (or ``w0·sqrt(k)``
  or ``w0``), which with linear scaling keeps the warmup *iterations*
  ``round(w0·n/B0)`` constant; the run keeps its epochs, so it has
  ``ceil(E·n/B)`` iterations. Works in both directions (``k < 1`` too).

  Args:
    baseline: the tuned :class:`Baseline`.
    batch_size: the target batch size ``B`` (a positive int, any multiple or
      fraction of ``B0``).
    lr_scaling: ``"sqrt"`` (LEGW, DATE), ``"linear"`` (Goyal et al.) or
      ``"none"``. ``"gain"`` is refused here: the measured gain is known
      only at run time, so it has no fixed peak learning rate to put in a
      :class:`Recipe`; :func:`date_recipe` accepts it and returns the recipe
      ``date(..., lr_scaling="gain")`` runs (peak ``η0``, which the gain
      multiplies).
    warmup_scaling: ``"linear"`` (LEGW), ``"sqrt"`` or ``"none"``.
    decay: the decay after the warmup; ``None`` keeps the baseline's.
    warmup: ``"gradual"`` or ``"constant"``; ``None`` keeps the baseline's.
    warmup_factor: the constant-warmup multiplier; ``None`` keeps the
      baseline's.
    critical_batch: the critical batch measured at ``B0``
      (:func:`date_optax.diagnostics.critical_batch`), or ``None``. A
      `batch_size` more than
      :data:`~date_optax.diagnostics.FAR_FACTOR` (8) times it warns: beyond
      that the steps barely fall while the examples grow linearly.

  Returns:
    A :class:`Recipe`; ``recipe.schedule`` is the optax schedule.

  Raises:
    ValueError: for a bad argument, or when the scaled warmup reaches the end
      of training; the message names the largest batch size the baseline
      supports.

  Examples:
    LEGW Table 1 (ResNet-50 on ImageNet, poly decay of power 2):

    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=2 ** 2.5,
    ...     warmup_epochs=0.3125, epochs=90, num_examples=1281167,
    ...     decay=date_optax.schedules.Poly(power=2))
    >>> r = date_optax.scale_recipe(base, 32768)
    >>> f"{r.peak_learning_rate:.6f}", r.warmup_epochs, r.warmup_steps
    ('32.000000', 10.0, 391)

  References:
    You et al., `Large-Batch Training for LSTM and Beyond
    <https://arxiv.org/abs/1901.08256>`_, 2019 (§3, Table 1).
  """
  check_baseline(baseline)
  validation.check_int("batch_size", batch_size, low=1)
  if isinstance(lr_scaling, str) and lr_scaling == "gain":
    raise ValueError(
        f'lr_scaling="gain" is a rule of date() and date_recipe(), not of '
        f"scale_recipe: the gain is measured by the train step at run time, so "
        f"no fixed schedule holds it. scale_recipe takes one of "
        f"{sched_lib.SCALING_RULES}; the recipe behind date(..., "
        f'lr_scaling="gain") is date_recipe(baseline, batch_size, '
        f'lr_scaling="gain") (peak learning rate η0, which the measured gain '
        f"multiplies)."
    )
  validation.check_choice("lr_scaling", lr_scaling, sched_lib.SCALING_RULES)
  validation.check_choice("warmup_scaling", warmup_scaling, sched_lib.SCALING_RULES)
  decay = baseline.decay if decay is None else decays_lib.decay_from_name(decay)
  warmup = baseline.warmup if warmup is None else warmup
  warmup_factor = baseline.warmup_factor if warmup_factor is None else warmup_factor
  validation.check_choice("warmup", warmup, decays_lib.WARMUPS)
  critical_lib.warn_if_far(batch_size, critical_batch, "scale_recipe")

  w, warmup_steps, total_steps = _iteration_counts(
      baseline, batch_size, warmup_scaling, check=True
  )
  peak = sched_lib.scale_by_rule(
      lr_scaling, baseline.learning_rate, batch_size, baseline.batch_size
  )
  spe = Fraction(baseline.num_examples, batch_size)
  try:
    schedule = decays_lib.warmup_decay_schedule(
        peak,
        warmup_steps,
        total_steps,
        decay=decay,
        steps_per_epoch=spe,
        warmup=warmup,
        warmup_factor=warmup_factor,
    )
  except (TypeError, ValueError) as e:
    if "peak_value" not in str(e):
      # An error about an argument of this call (warmup_factor, decay, ...)
      # already names it.
      raise
    # The schedule's peak_value is no argument of this call: say where it
    # comes from.
    raise type(e)(
        f"{e} (peak_value is the baseline's learning_rate="
        f"{baseline.learning_rate!r} scaled by lr_scaling={lr_scaling!r} to "
        f"batch_size={batch_size})"
    ) from e
  if baseline.warmup_ratio is not None and warmup_scaling != "sqrt":
    # Exact, so that BERT's 1/320 · 2^j prints as given.
    k = Fraction(batch_size, baseline.batch_size)
    ratio = float(
        decays_lib.exact(baseline.warmup_ratio)
        * _warmup_factor_exact(warmup_scaling, k)
    )
  else:
    ratio = float(w / decays_lib.exact(baseline.epochs))
  return Recipe(
      batch_size=int(batch_size),
      peak_learning_rate=peak,
      warmup_epochs=float(w),
      warmup_steps=warmup_steps,
      total_steps=total_steps,
      steps_per_epoch=baseline.num_examples / batch_size,
      schedule=schedule,
      scale=batch_size / baseline.batch_size,
      epochs=float(baseline.epochs),
      warmup_ratio=ratio,
      decay=decay,
      warmup=warmup,
      baseline=baseline,
      critical_batch=critical_batch,
  )
