"""LEGW recipes and the DATE engine: a tuned baseline scaled to any batch size.

A :class:`Baseline` records what was tuned at one batch size;
:func:`scale_recipe` turns it into a :class:`Recipe` for another batch size
(sqrt learning-rate scaling, warmup epochs growing linearly with the batch,
durations converted to iterations with the dataset size); :func:`date` builds
the DATE optimizer: that recipe with roller-coaster decay driving bounded
LARS over the baseline's own solver.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import critical_batch as critical_lib
from date_optax._src import gain as gain_lib
from date_optax._src import lars as lars_lib
from date_optax._src import masks as masks_lib
from date_optax._src import schedules as sched_lib
from date_optax._src import validation
from date_optax._src.types import ScalarOrSchedule

#: Fixed ratio bounds, :func:`date`'s ``bounds="fixed"`` rule. The upper
#: bound 1 never raises a layer's learning rate above the recipe's; the lower
#: bound 0.01 lets layers whose gradient is large relative to their weights
#: slow down by up to 100x.
DEFAULT_BOUNDS = (0.01, 1.0)

#: Bound rules of :func:`date` (see :func:`layer_lr_bounds`).
BOUND_RULES = ("baseline_to_recipe", "baseline_to_linear", "fixed")

#: Base solvers :func:`date` accepts by name (those of `bounded_lars`).
BASES = lars_lib.BASES

#: The power of the AdaScale gain that ``date(..., lr_scaling="gain")``
#: applies per base solver: the gain itself for the SGD family (AdaScale),
#: its square root for adaptive solvers (AdaptDL/Pollux's ``AdamScale``). A
#: custom `GradientTransformation` base gets the square root.
GAIN_POWERS = types.MappingProxyType({
    "sgd": 1.0, "momentum": 1.0, "nesterov": 1.0,
    "adagrad": 0.5, "rmsprop": 0.5, "adam": 0.5,
})


def gain_power(baseline: Baseline) -> float:
  """The power of the gain `date(baseline, B, lr_scaling="gain")` applies."""
  if isinstance(baseline.optimizer, str):
    return GAIN_POWERS.get(baseline.optimizer, 0.5)
  return 0.5


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
  decay: sched_lib.Decay | str = "roller_coaster"
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
    validation.check_choice("warmup", self.warmup, sched_lib.WARMUPS)
    validation.check_real(
        "warmup_factor", self.warmup_factor, low=0.0, high=1.0,
        low_inclusive=False,
    )
    object.__setattr__(self, "decay", sched_lib.decay_from_name(self.decay))
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


def _check_baseline(baseline: Any) -> None:
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
  decay: sched_lib.Decay
  warmup: str
  baseline: Baseline = dataclasses.field(repr=False)

  def learning_rates(self) -> np.ndarray:
    """The learning rate of every iteration ``1..T`` (float32 numpy array)."""
    return np.asarray(self.schedule(jnp.arange(self.total_steps, dtype=jnp.int32)))

  def epoch_of(self, step: Any) -> np.ndarray:
    """Epochs completed at the end of iteration ``step + 1`` (counts from 0)."""
    return (np.asarray(step) + 1) / self.steps_per_epoch


def _base_warmup(baseline: Baseline) -> Fraction:
  if baseline.warmup_epochs is not None:
    return sched_lib.exact(baseline.warmup_epochs)
  if baseline.warmup_ratio is not None:
    return sched_lib.exact(baseline.warmup_ratio) * sched_lib.exact(baseline.epochs)
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
  epochs = sched_lib.exact(baseline.epochs)
  w = _base_warmup(baseline) * _warmup_factor_exact(warmup_scaling, k)
  # For linear scaling w·n/B == w0·n/B0 exactly: the warmup iterations do not
  # depend on the batch size.
  warmup_steps = sched_lib.round_half_up(w * n / batch_size)
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
    return _fits(w, ws, sched_lib.exact(baseline.epochs), ts)

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
    decay: sched_lib.Decay | str | None = None,
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
      ``"none"``.
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
  _check_baseline(baseline)
  validation.check_int("batch_size", batch_size, low=1)
  validation.check_choice("lr_scaling", lr_scaling, sched_lib.SCALING_RULES)
  validation.check_choice("warmup_scaling", warmup_scaling, sched_lib.SCALING_RULES)
  decay = baseline.decay if decay is None else sched_lib.decay_from_name(decay)
  warmup = baseline.warmup if warmup is None else warmup
  warmup_factor = baseline.warmup_factor if warmup_factor is None else warmup_factor
  validation.check_choice("warmup", warmup, sched_lib.WARMUPS)
  critical_lib.warn_if_far(batch_size, critical_batch, "scale_recipe")

  w, warmup_steps, total_steps = _iteration_counts(
      baseline, batch_size, warmup_scaling, check=True
  )
  peak = sched_lib.scale_by_rule(
      lr_scaling, baseline.learning_rate, batch_size, baseline.batch_size
  )
  spe = Fraction(baseline.num_examples, batch_size)
  try:
    schedule = sched_lib.warmup_decay_schedule(
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
        sched_lib.exact(baseline.warmup_ratio)
        * _warmup_factor_exact(warmup_scaling, k)
    )
  else:
    ratio = float(w / sched_lib.exact(baseline.epochs))
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
  )


# ---------------------------------------------------------------------------
# Multi-stage training.


@dataclasses.dataclass(frozen=True)
class MultiStageRecipe:
  """Several recipes run one after the other (BERT's two-stage training).

  Build it with :func:`multi_stage`.

  Args:
    stages: the :class:`Recipe` of each stage, in order.
    boundaries: the iteration count at which each stage starts (0 first).
    total_steps: the iterations of all stages together.
    schedule: the joined optax schedule; it re-warms from 0 at each boundary.

  Examples:
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=64, learning_rate=0.1,
    ...     warmup_epochs=1, epochs=4, num_examples=256)
    >>> ms = date_optax.multi_stage([base.recipe(), base.recipe()])
    >>> ms.total_steps, ms.stage_of(15), ms.stage_of(16)
    (32, 0, 1)

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020.
  """

  stages: tuple[Recipe, ...]
  boundaries: tuple[int, ...]
  total_steps: int
  schedule: optax.Schedule = dataclasses.field(repr=False, compare=False)

  def stage_of(self, step: int) -> int:
    """The index of the stage that update `step` (zero-based) belongs to."""
    return int(np.searchsorted(np.asarray(self.boundaries), step, side="right") - 1)


def multi_stage(stages: Sequence[Recipe]) -> MultiStageRecipe:
  """Chains recipes into one schedule that re-warms at every stage boundary.

  Each stage has its own batch size (and may come from its own baseline,
  e.g. BERT's sequence-length-128 and -512 phases). Stage ``s`` runs for
  ``stages[s].total_steps`` iterations and its schedule restarts from count
  0, so the learning rate climbs again from 0 instead of continuing the
  previous stage's decay. Every stage must therefore have a warmup of at
  least one iteration (``recipe.warmup_steps >= 1``); a stage without one is
  refused rather than started at its peak.

  Args:
    stages: the recipes, in training order.

  Returns:
    A :class:`MultiStageRecipe`; pass its ``schedule`` as the learning rate
    (e.g. ``date(baseline, B, learning_rate=ms.schedule)``).

  Examples:
    >>> import date_optax
    >>> p1 = date_optax.Baseline(batch_size=512, learning_rate=1e-3,
    ...     warmup_ratio=0.1, epochs=1, num_examples=5120)
    >>> p2 = date_optax.Baseline(batch_size=512, learning_rate=1e-3,
    ...     warmup_ratio=0.2, epochs=1, num_examples=2048)
    >>> ms = date_optax.multi_stage([date_optax.scale_recipe(p1, 1024),
    ...                              date_optax.scale_recipe(p2, 512)])
    >>> ms.boundaries, ms.total_steps, [s.warmup_steps for s in ms.stages]
    ((0, 5), 9, [1, 1])

  Raises:
    ValueError: when a stage has no warmup iteration (its learning rate
      would jump to its peak at the boundary instead of re-warming).

  References:
    You et al., `Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes <https://arxiv.org/abs/1904.00962>`_, ICLR 2020.
  """
  if isinstance(stages, (str, bytes, Recipe)) or not isinstance(stages, Sequence):
    raise TypeError(f"stages must be a sequence of Recipes, got {stages!r}.")
  stages = tuple(stages)
  if not stages:
    raise ValueError("stages must hold at least one Recipe, got ().")
  for s in stages:
    if not isinstance(s, Recipe):
      raise TypeError(f"stages must be Recipes (see scale_recipe), got {s!r}.")
  for i, s in enumerate(stages):
    if s.warmup_steps < 1:
      raise ValueError(
          f"stage {i} (batch_size={s.batch_size}) has warmup_steps=0, so its "
          "learning rate would not re-warm from 0 at the stage boundary. Give "
          "its Baseline a warmup_epochs or warmup_ratio that lasts at least "
          "one iteration at that batch size."
      )
  steps = [s.total_steps for s in stages]
  schedule = sched_lib.multi_stage_schedule([s.schedule for s in stages], steps)
  boundaries = (0,) + tuple(int(b) for b in np.cumsum(steps)[:-1])
  return MultiStageRecipe(
      stages=stages,
      boundaries=boundaries,
      total_steps=int(sum(steps)),
      schedule=schedule,
  )


# ---------------------------------------------------------------------------
# DATE.


def date_recipe(
    baseline: Baseline,
    batch_size: int,
    *,
    lr_scaling: str = "sqrt",
    warmup_scaling: str = "linear",
    decay: sched_lib.Decay | str | None = None,
    critical_batch: float | None = None,
) -> Recipe:
  """The recipe behind ``date(baseline, batch_size, ...)``.

  It is :func:`scale_recipe` with DATE's choices: sqrt learning-rate scaling,
  linear warmup-epoch scaling and roller-coaster decay (the baseline's own
  roller coaster if it has one, so its `power` and `floor` are kept).

  Args:
    baseline: the tuned :class:`Baseline`.
    batch_size: the target batch size.
    lr_scaling: as in :func:`scale_recipe`.
    warmup_scaling: as in :func:`scale_recipe`.
    decay: ``None`` for DATE's roller coaster, ``"baseline"`` for the
      baseline's own decay, or another decay.
    critical_batch: as in :func:`scale_recipe` (warns far beyond it).

  ``lr_scaling="gain"`` gives the recipe behind ``date(...,
  lr_scaling="gain")``: peak ``η0`` (``"none"``), which the measured gain
  multiplies at run time.

  Returns:
    The :class:`Recipe` whose ``schedule`` :func:`date` uses.

  Examples:
    DATE's worked example (§3.6 of the paper): MNIST, 30 epochs, ``B0 = 1024``.

    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904)
    >>> r = date_optax.date_recipe(base, 8192)
    >>> r.warmup_steps, r.total_steps, r.peak_learning_rate == 1.25e-3 * 8 ** 0.5
    (117, 220, True)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1).
  """
  _check_baseline(baseline)
  if isinstance(decay, str) and decay == "baseline":
    decay = baseline.decay
  elif decay is None:
    decay = (
        baseline.decay
        if isinstance(baseline.decay, sched_lib.RollerCoaster)
        else sched_lib.RollerCoaster()
    )
  return scale_recipe(
      baseline,
      batch_size,
      lr_scaling="none" if lr_scaling == "gain" else lr_scaling,
      warmup_scaling=warmup_scaling,
      decay=decay,
      critical_batch=critical_batch,
  )


def _every_leaf(params: Any) -> Any:
  """The mask that selects every leaf (a callable, as optax masks accept)."""
  return jax.tree.map(lambda _: True, params)


def layer_lr_bounds(
    recipe: Recipe, bounds: str = "baseline_to_recipe"
) -> tuple[float, float]:
  r"""The ratio bounds of a DATE bound rule at one batch size (dynamic bounds).

  DATE bounds each layer's trust ratio at run time with limits that depend on
  the run (dynamic bounds). Here they depend on the scale ``k = B / B0``
  through the recipe's learning-rate multiplier ``m = peak / η0``
  (``sqrt(k)`` for DATE's sqrt scaling), so that each layer's effective peak
  learning rate ``peak · r`` stays in a range fixed by two learning rates
  that are both meaningful for the baseline:

  ``"baseline_to_recipe"``
    :math:`r \in [\min(1, m)/m,\ \max(1, m)/m]`: a layer moves at least as
    fast as the baseline's tuned ``η0`` and at most at the recipe's peak
    ``η0·m``. At ``k = 1`` both bounds are 1: every layer follows the
    baseline exactly.
  ``"baseline_to_linear"``
    :math:`r \in [\min(1, k)/m,\ \max(1, k)/m]`: between ``η0`` and the
    linear-scaling rule's ``η0·k`` (Goyal et al.), so layers whose weights
    are large relative to their gradient may go beyond the sqrt rule.
  ``"fixed"``
    :data:`DEFAULT_BOUNDS` = ``(0.01, 1)`` at every ``k`` (the engine's
    bounds before the rule existed; at ``k = 1`` layers with
    ``‖w‖ < ‖g‖`` are slowed down, so it is not the baseline there).

  Args:
    recipe: the :class:`Recipe` (from :func:`date_recipe`).
    bounds: one of :data:`BOUND_RULES`.

  Returns:
    ``(lower, upper)`` as floats.

  Examples:
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=16, learning_rate=0.05,
    ...     warmup_epochs=0.1, epochs=30, num_examples=32768)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 1024))
    (0.125, 1.0)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 1024),
    ...                            "baseline_to_linear")
    (0.125, 8.0)
    >>> date_optax.layer_lr_bounds(date_optax.date_recipe(base, 16))
    (1.0, 1.0)

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (§3.5, dynamic upper and
    lower limits of the LARS ratio); Goyal et al., `Accurate, Large
    Minibatch SGD <https://arxiv.org/abs/1706.02677>`_, 2017 (linear rule).
  """
  if not isinstance(recipe, Recipe):
    raise TypeError(
        f"recipe must be a date_optax.Recipe (see date_recipe), got {recipe!r}."
    )
  validation.check_choice("bounds", bounds, BOUND_RULES)
  if bounds == "fixed":
    return DEFAULT_BOUNDS
  m = recipe.peak_learning_rate / recipe.baseline.learning_rate
  target = m if bounds == "baseline_to_recipe" else recipe.scale
  lower, upper = min(1.0, target) / m, max(1.0, target) / m
  if math.isclose(lower, 1.0, rel_tol=1e-12):
    lower = 1.0
  if math.isclose(upper, 1.0, rel_tol=1e-12):
    upper = 1.0
  return (lower, upper)


def date(
    baseline: Baseline,
    batch_size: int,
    *,
    lower: ScalarOrSchedule | None = None,
    upper: ScalarOrSchedule | None = None,
    ratio_source: str = "gradient",
    lr_scaling: str = "sqrt",
    warmup_scaling: str = "linear",
    decay: sched_lib.Decay | str | None = None,
    learning_rate: ScalarOrSchedule | None = None,
    bounds: str = "baseline_to_recipe",
    critical_batch: float | None = None,
    gain_clock: str = "steps",
    **solver_options: Any,
) -> optax.GradientTransformation:
  r"""DATE: the baseline's solver, scaled to `batch_size` with no retuning.

  The learning rate follows :func:`date_recipe` (sqrt scaling, LEGW warmup,
  roller-coaster decay) and drives :func:`date_optax.bounded_lars` over the
  baseline's solver, so each layer's step is

  .. math::

    w \leftarrow w - \eta_i \cdot \mathrm{clip}(\|w\| / \|g\|, l, u)
      \cdot \mathrm{base}(g).

  **Bounds.** The baseline's ``η0`` was tuned for the plain solver, whose
  per-layer ratio is 1. Raw ratios ``‖w‖/‖g‖`` are usually 10–1000, so a
  fixed upper bound well above 1 multiplies most layers' learning rate
  (docs/RESULTS.md: bounds [0.01, 10] cost 29 points at ``k = 1`` on an
  MLP). The bounds therefore follow the scale (:func:`layer_lr_bounds`); the
  default ``bounds="baseline_to_recipe"`` keeps each layer's effective peak
  learning rate between the baseline's ``η0`` and the recipe's ``η0·sqrt(k)``,
  i.e. ratio bounds ``[1/sqrt(k), 1]``, which are ``[1, 1]`` at ``k = 1``.
  A baseline tuned with bounded ratios (``Baseline.ratio_bounds``) keeps its
  own bounds; `lower`/`upper` override either.

  **Biases and normalisation parameters** keep the baseline's learning rate
  (ratio 1) by default: a zero-initialised bias has ``‖b‖/‖g_b‖ ≪ 1`` for its
  first steps and would learn up to 100× slower than the tuned learning rate
  says. The trust-ratio mask is :func:`date_optax.exclude_bias_and_norm`
  (leaves with at most one dimension, or named ``bias``, ``scale``, ...) and
  the weight-decay mask is the baseline's own, both passed explicitly to
  `bounded_lars`; ``trust_ratio_mask=None`` in `solver_options` puts every
  leaf under the ratio again.

  **At the baseline's batch size** (``k = 1``), with the defaults and a
  baseline whose decay is a roller coaster, ``date(baseline, B0)`` is
  ``baseline.solver()``: the same schedule, ratio exactly 1 on the kernels
  (bounds [1, 1]) and on the masked leaves, the same weight decay. It
  differs from a baseline with another decay, which DATE replaces by its
  roller coaster (pass ``decay="baseline"`` to keep it), and from one tuned
  with `ratio_bounds`, whose bounded ratios it keeps.

  The recipe is available as ``date_recipe(baseline, batch_size, ...)``
  with the same scaling and decay arguments.

  **Measured gain** (``lr_scaling="gain"``). The peak learning rate is the
  baseline's ``η0`` times a gain measured every step from the gradient
  noise, instead of the fixed ``sqrt(k)``: the step passes its statistics
  as ``update(..., grad_stats=...)`` (build it with
  ``make_train_step(..., grad_stats=True)``; without them the update raises
  a ValueError naming ``grad_stats``). For the SGD family (``"sgd"``,
  ``"momentum"``, ``"nesterov"``) the multiplier is AdaScale's gain
  ``r = (1 + B_simple/B0)/(1 + B_simple/B)`` in ``[1, k]``
  (:func:`date_optax.adascale_gain`); for adaptive solvers (``"adam"``,
  ``"rmsprop"``, ``"adagrad"``, or a custom transformation) it is ``sqrt(r)``
  in ``[1, sqrt(k)]``, the rule of AdaptDL/Pollux's ``AdamScale`` (Adam's
  update is normalised by the gradient's second moment, so its noise
  reduction per step grows more slowly with the batch). LEGW warmup and the
  roller coaster are kept: by default (``gain_clock="steps"``) as the LEGW
  recipe at ``B``, one iteration per step (warmup ``W0`` steps), or with
  ``gain_clock="gain"`` as the baseline's own schedule at ``B0`` run on
  AdaScale's scale-invariant clock
  ``τ += r`` (its warmup lasts ``W0`` baseline iterations, about ``W0/r``
  steps or ``w0·k/r`` epochs: LEGW's ``w0·k`` when the gradient is noise
  free, ``r = 1``, and the baseline's ``w0`` when it is all noise,
  ``r = k``; the run stops at its epoch budget, where ``τ <= T0``).
  The ratio bounds follow the rule with
  the largest multiplier ``k**p`` (``p = 1`` or ``1/2``) in place of
  ``sqrt(k)``: ``[1/k**p, 1]`` by default. At ``k = 1`` the gain is exactly 1, so
  ``date(baseline, B0, lr_scaling="gain")`` is ``baseline.solver()`` step
  by step, as with the defaults. Needs ``batch_size >= B0``.

  Args:
    baseline: the tuned :class:`Baseline`.
    batch_size: the target batch size ``B``.
    lower: lower ratio bound, a float ``>= 0`` or a schedule; ``None``: the
      rule's (`bounds`), or ``baseline.ratio_bounds[0]`` if set.
    upper: upper ratio bound, a float ``> 0`` or a schedule; ``None``: the
      rule's, or ``baseline.ratio_bounds[1]`` if set.
    ratio_source: ``"gradient"`` (DATE) or ``"update"`` (the base's output;
      with Adam this is LAMB with bounds), see `bounded_lars`.
    lr_scaling: as in :func:`scale_recipe`, or ``"gain"``: the measured
      AdaScale gain ``r`` in place of ``sqrt(k)`` (see *Measured gain*).
    warmup_scaling: as in :func:`scale_recipe`.
    decay: the *learning-rate* decay after the warmup: ``None`` for the
      roller coaster, ``"baseline"`` for the baseline's own decay, or another
      decay (a name or a :class:`~date_optax.schedules.Decay`). A number is
      refused: RMSProp's decay is ``base_options={"decay": ...}``.
    learning_rate: replaces the recipe's schedule, e.g. a
      :class:`MultiStageRecipe`'s ``schedule``.
    bounds: the bound rule, one of :data:`BOUND_RULES` (see
      :func:`layer_lr_bounds`).
    critical_batch: the critical batch measured at ``B0``
      (:func:`date_optax.diagnostics.critical_batch`); a `batch_size` more
      than 8 times it warns (see :func:`scale_recipe`).
    gain_clock: with ``lr_scaling="gain"``, how the schedule advances:
      ``"steps"`` (default) runs the LEGW recipe at ``B`` one iteration
      per step; ``"gain"`` runs the baseline's own DATE recipe (that at
      ``B0``: its warmup and roller coaster in ``B0`` iterations) on
      AdaScale's scale-invariant clock, which advances by the gain ``r``
      per step, cut wherever the run's epochs end. The default is the
      more robust one measured (docs/RESULTS.md, "Measured gain"): the
      gain clock was better at 64·B0 but diverged on 2 of 3 seeds of
      real-digit MNIST at 16·B0.
    **solver_options: override ``baseline.optimizer_options``: the base's
      settings (``momentum``, ``b1``, ..., or a ``base_options`` mapping) and
      keywords of `bounded_lars` (``weight_decay``, ``weight_decay_mask``,
      ``trust_ratio_mask``, ``layer_axes``).

  Returns:
    An optax ``GradientTransformation``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax
    >>> base = date_optax.Baseline(batch_size=1024, learning_rate=1.25e-3,
    ...     warmup_epochs=2, epochs=30, num_examples=59904,
    ...     optimizer="momentum", optimizer_options={"momentum": 0.9})
    >>> tx = date_optax.date(base, 8192)
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    >>> updates, state = tx.update(grads, state, params)
    >>> {k: float(v) for k, v in date_optax.trust_ratios(state).items()}
    {'b': 1.0, 'w': 1.0}
    >>> date_optax.date_recipe(base, 8192).total_steps  # what tx follows
    220

  References:
    You et al., `Large-batch training for LSTM and beyond
    <https://arxiv.org/abs/1901.08256>`_, SC 2019 (Algorithm 1, §3.5–3.6);
    Goyal et al., `Accurate, Large Minibatch SGD
    <https://arxiv.org/abs/1706.02677>`_, 2017 (no weight decay or special
    treatment of biases and batch-norm parameters); Johnson et al.,
    `AdaScale SGD <https://arxiv.org/abs/2007.05105>`_, ICML 2020 (the
    gain); Qiao et al., `Pollux: Co-adaptive Cluster Scheduling for
    Goodput-Optimized Deep Learning <https://arxiv.org/abs/2008.12260>`_,
    OSDI 2021 (the square-root gain for adaptive solvers, AdaptDL's
    ``AdamScale``).
  """
  _check_baseline(baseline)
  check_solver_options(
      baseline.optimizer, solver_options, "solver_options", unknown=TypeError
  )
  gain = lr_scaling == "gain"
  if gain and batch_size < baseline.batch_size:
    raise ValueError(
        f'lr_scaling="gain" needs batch_size >= the baseline\'s '
        f"{baseline.batch_size} (the gain lies in [1, B/B0]), got {batch_size}."
    )
  recipe = date_recipe(
      baseline,
      batch_size,
      lr_scaling=lr_scaling,
      warmup_scaling=warmup_scaling,
      decay=decay,
      critical_batch=critical_batch,
  )
  validation.check_choice("bounds", bounds, BOUND_RULES)
  power = gain_power(baseline)
  if baseline.ratio_bounds is not None:
    default_lower, default_upper = baseline.ratio_bounds
  elif gain and bounds != "fixed":
    # The bound rules with the largest multiplier the gain can reach, k**p,
    # in place of the recipe's sqrt(k): [1/k**p, 1] (recipe) or
    # [1/k**p, k/k**p] (linear); [1, 1] at k = 1.
    m = recipe.scale**power
    target = m if bounds == "baseline_to_recipe" else recipe.scale
    default_lower, default_upper = min(1.0, target) / m, max(1.0, target) / m
  else:
    default_lower, default_upper = layer_lr_bounds(recipe, bounds)
  lower = default_lower if lower is None else lower
  upper = default_upper if upper is None else upper
  validation.check_bounds(lower, upper)
  validation.check_choice("gain_clock", gain_clock, ("steps", "gain"))
  clock_schedule = None
  if gain and gain_clock == "gain" and recipe.scale != 1:
    clock_schedule = (
        date_recipe(baseline, baseline.batch_size, decay=decay).schedule
        if learning_rate is None else learning_rate
    )
    learning_rate = 1.0
  if learning_rate is None:
    learning_rate = recipe.schedule
  base_options, options = lars_lib.split_base_options(
      baseline.optimizer, {**baseline.optimizer_options, **solver_options}
  )
  if "trust_ratio_mask" not in options and baseline.ratio_bounds is None:
    options["trust_ratio_mask"] = masks_lib.exclude_bias_and_norm
  # Explicit, so that the decayed leaves are the baseline's whatever rule
  # bounded_lars applies to a missing mask (None there may follow the trust
  # mask): ``True`` = every leaf, as ``optax.add_decayed_weights(mask=None)``.
  if options.get("weight_decay_mask") is None:
    options["weight_decay_mask"] = _every_leaf
  tx = lars_lib.bounded_lars(
      learning_rate,
      base=baseline.optimizer,
      lower=lower,
      upper=upper,
      ratio_source=ratio_source,
      base_options=base_options,
      **options,
  )
  if not gain:
    return tx
  return gain_lib.scale_by_gain(
      tx, recipe.scale, power=power, learning_rate=clock_schedule,
      name='date(..., lr_scaling="gain")',
  )
