"""The critical batch size from a short measurement of the gradient noise.

McCandlish et al. (2018) model the cost of reaching a given loss with batch
``B``: ``S = S_min·(1 + B_noise/B)`` steps and ``E = E_min·(1 + B/B_noise)``
examples. Below the noise scale a larger batch cuts the steps almost
proportionally; above it the steps barely fall while the examples grow
linearly. The *critical batch* ``B_crit = B_noise`` is where both costs are
twice their minimum, and the simple noise scale ``B_simple = tr Σ / |G|²``
measured by the train step (``grad_stats=True``) estimates it.
:func:`propose_batch_schedule` turns that measurement into a batch that grows
from it (a :class:`~date_optax.BatchSchedule`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.batch_schedule import BatchSchedule
from date_optax._src.gain import GradStats, noise_scale

#: A batch more than this many times the critical batch is "far beyond" it:
#: there the model gives ``S/S_min = 1 + 1/8`` (the steps fall by at most 11 %
#: more however large the batch) at ``E/E_min = 9`` times the examples of the
#: most data-efficient run, 4.5x the cost at the critical batch.
FAR_FACTOR = 8.0

#: The kinds of schedule :func:`propose_batch_schedule` proposes.
PROPOSALS = ("adaptive", "ramp")

#: The fraction of the run's examples a proposed ramp takes to reach its
#: largest batch. On MNIST-1D momentum (B0 = 16 to 64·B0, docs/RESULTS.md)
#: the ramp over 25 % of the examples matched B0 (−0.05 points), over 10 % it
#: lost 2.15 points.
RAMP_FRACTION = 0.25

#: The most increments of a proposed ramp (the measured ramps took 7); each
#: batch size is one compiled program.
RAMP_INCREMENTS = 7


def critical_batch(measurements: Any, *, discard: float = 0.5) -> float:
  """Estimates the largest batch that still pays, from measured noise scales.

  Run a few hundred steps at the baseline's batch ``B0`` through a train step
  built with ``grad_stats=True`` and pass what it measured: the state's
  smoothed statistics (``state.grad_stats``, or a
  :class:`date_optax.GradStats`), or the per-step metric
  ``grad_noise_scale`` (a sequence of floats, or of metrics dicts). For a
  sequence, the first `discard` fraction (the moving average's start and the
  first, fastest-changing steps) is dropped and the median of the rest is
  returned; ``inf`` values (steps where the estimate of ``|G|²`` was not
  positive) count as large, NaN values are ignored.

  The noise scale grows as the loss falls (the gradient shrinks faster than
  its noise), so a measurement early in training *underestimates* the
  critical batch of the whole run: read it as a floor.

  Args:
    measurements: a ``GradStatsState`` (``state.grad_stats``), a
      :class:`date_optax.GradStats`, or a sequence of ``grad_noise_scale``
      values or metrics dicts holding that key (a list, or a
      one-dimensional NumPy or JAX array).
    discard: the fraction of a sequence dropped from its start, in [0, 1).

  Returns:
    ``B_crit`` as a float (``inf`` when no signal was measured).

  Raises:
    TypeError: for another kind of `measurements`, or an element that is not
      a number (a string, a bool, a list) or a metrics dict; the message
      names the element (``measurements[3]``).
    ValueError: for an empty sequence or one with no finite-or-inf value, a
      negative value (noise scales are >= 0), a metrics dict without
      ``grad_noise_scale``, an array of more than one dimension, or
      statistics with a non-finite ``sq_norm`` or ``trace_cov``.

  Examples:
    >>> from date_optax.diagnostics import critical_batch
    >>> critical_batch([10.0, 900.0, 300.0, 310.0, 320.0, float("inf")])
    320.0
    >>> import date_optax
    >>> critical_batch(date_optax.GradStats(sq_norm=0.5, trace_cov=100.0,
    ...                                     batch_size=64.0))
    200.0

  References:
    McCandlish, Kaplan, Amodei et al., `An Empirical Model of Large-Batch
    Training <https://arxiv.org/abs/1812.06162>`_, 2018 (§2.2, §3, appendix
    A).
  """
  validation.check_real("discard", discard, low=0.0, high=1.0, high_inclusive=False)
  if isinstance(measurements, GradStats):
    return float(noise_scale(GradStats(
        _stat("measurements.sq_norm", measurements.sq_norm),
        _stat("measurements.trace_cov", measurements.trace_cov), 1.0)))
  if hasattr(measurements, "sq_norm") and hasattr(measurements, "weight"):
    w = _stat("measurements.weight", measurements.weight)
    w = w if w > 0 else 1.0
    return float(noise_scale(GradStats(
        _stat("measurements.sq_norm", measurements.sq_norm) / w,
        _stat("measurements.trace_cov", measurements.trace_cov) / w, 1.0)))
  if isinstance(measurements, jax.Array):
    measurements = np.asarray(measurements)
  if not isinstance(measurements, (Sequence, np.ndarray)) or isinstance(
      measurements, (str, bytes)):
    raise TypeError(
        "measurements must be state.grad_stats, a GradStats, or a sequence of "
        f"grad_noise_scale values or metrics dicts; got {type(measurements).__name__}."
    )
  if isinstance(measurements, np.ndarray) and measurements.ndim != 1:
    raise ValueError(
        "measurements must be one-dimensional (one grad_noise_scale value per "
        f"step), got an array of shape {measurements.shape}."
    )
  values = [_value(i, m) for i, m in enumerate(measurements)]
  values = values[int(math.floor(discard * len(values))):]
  values = [v for v in values if not math.isnan(v)]
  if not values:
    raise ValueError(
        "measurements holds no grad_noise_scale value to estimate the critical "
        "batch from (empty, or all NaN after the discarded start)."
    )
  return float(np.median(np.asarray(values, np.float64)))


def _real(name: str, value: Any) -> float:
  """A real scalar (Python, NumPy or JAX) as a float; anything else names `name`."""
  if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
    raise TypeError(f"{name} must be a real number, got {value!r}.")
  if isinstance(value, numbers.Real):
    return float(value)
  try:
    arr = np.asarray(value)
  except Exception as e:  # noqa: BLE001 - an object NumPy cannot read
    raise TypeError(f"{name} must be a real number, got {value!r}.") from e
  if arr.shape != () or arr.dtype.kind not in "fiu":
    raise TypeError(
        f"{name} must be a real number (a scalar), got {type(value).__name__} "
        f"{value!r}."[:300]
    )
  return float(arr)


def _stat(name: str, value: Any) -> float:
  """One field of the smoothed statistics: a finite real."""
  x = _real(name, value)
  if not math.isfinite(x):
    raise ValueError(f"{name} must be finite, got {value!r}.")
  return x


def _value(index: int, item: Any) -> float:
  """One step's ``grad_noise_scale``: a number >= 0, inf or NaN."""
  name = f"measurements[{index}]"
  if isinstance(item, Mapping):
    if "grad_noise_scale" not in item:
      raise ValueError(
          f"{name} is a metrics dict without 'grad_noise_scale' (keys "
          f"{sorted(map(str, item))[:8]}); build the train step with "
          "grad_stats=True, whose metrics hold it."
      )
    name, item = f"{name}['grad_noise_scale']", item["grad_noise_scale"]
  x = _real(name, item)
  if x < 0:
    raise ValueError(
        f"{name} must be a noise scale >= 0 (tr Σ / |G|² of clipped "
        f"estimates), got {item!r}."
    )
  return x


def warn_if_far(batch_size: int, critical: float | None, who: str) -> None:
  """Warns when `batch_size` exceeds FAR_FACTOR times the critical batch."""
  if critical is None or (isinstance(critical, float) and math.isinf(critical)):
    return
  validation.check_real("critical_batch", critical, low=0.0, low_inclusive=False)
  if batch_size > FAR_FACTOR * critical:
    warnings.warn(
        f"{who}: batch_size={batch_size} is {batch_size / critical:.0f}x the "
        f"critical batch {critical:g} (more than {FAR_FACTOR:g}x): beyond "
        "8x the steps to a given loss fall by at most 11% more while the "
        "examples keep growing linearly; expect wasted compute or a loss of "
        "accuracy (McCandlish et al. 2018), or grow the batch to it from the "
        "critical batch (diagnostics.propose_batch_schedule).",
        UserWarning,
        stacklevel=3,
    )


def propose_batch_schedule(
    measurements: Any,
    *,
    base_batch_size: int,
    max_batch: int,
    total_examples: int | None = None,
    kind: str = "adaptive",
    ramp_fraction: float = RAMP_FRACTION,
    unit: int = 1,
    calibration: float = 1.0,
) -> BatchSchedule:
  r"""Proposes a growing batch from a short noise measurement at ``B0``.

  The critical batch measured at ``B0`` (:func:`critical_batch` of
  `measurements`, times `calibration`) is where steps and examples trade
  off evenly early in training: up to it a larger batch costs few extra
  examples. The schedule starts at the largest batch of the doubling
  ``B0·2^j`` that does not exceed it,

  .. math::

    \mathrm{start} = B_0 \cdot 2^{\max(0,\ \lfloor \log_2
      (B_\mathrm{crit} / B_0) \rfloor)},

  and grows to `max_batch`. The critical batch grows as the loss falls, and
  a short measurement cannot tell how fast, so the default proposal lets
  the run measure it: :meth:`~date_optax.BatchSchedule.adaptive` from ``start``
  (doubling when the measured critical batch reaches twice the batch). With
  ``kind="ramp"`` it is Megatron-LM's linear ramp from ``start`` to
  `max_batch` over ``ramp_fraction · total_examples`` examples, in equal
  increments: the smallest multiple of `unit` that divides ``max_batch −
  start`` into at most 7 (``RAMP_INCREMENTS``) of them. When the critical
  batch reaches `max_batch` (or is ``inf``: no noise measured) nothing needs
  to grow and the proposal is :meth:`~date_optax.BatchSchedule.fixed` at
  `max_batch`.

  Run it with ``date(baseline, max_batch, batch_schedule=...)`` and
  ``make_train_step(..., batch_schedule=...)`` (and ``grad_stats=True`` for
  an adaptive schedule), with ``microbatches = start // unit``.

  Args:
    measurements: what a short run at ``B0`` with ``grad_stats=True``
      measured, anything :func:`critical_batch` reads (``state.grad_stats``,
      a :class:`~date_optax.GradStats`, a sequence of ``grad_noise_scale``
      values or metrics dicts, read with its default `discard`); or the
      critical batch itself, a number > 0 (``inf`` when no noise was
      measured).
    base_batch_size: ``B0``, the batch of the measurement, >= 1.
    max_batch: the largest batch, >= `base_batch_size`; for
      ``kind="adaptive"``, ``base_batch_size · 2**m``.
    total_examples: the examples of the whole run (``epochs ·
      num_examples``), >= 1; needed for ``kind="ramp"``.
    kind: ``"adaptive"`` (default) or ``"ramp"``.
    ramp_fraction: the fraction of `total_examples` the ramp takes to reach
      `max_batch`, in (0, 1] (default 0.25).
    unit: every batch is a multiple of it (``replicas × microbatch rows``),
      >= 1; `base_batch_size` and `max_batch` must be multiples of it.
    calibration: the multiple of the measurement taken as the critical
      batch, > 0 (Merrill et al. found ``B_simple`` below Adam's critical
      batch); an adaptive proposal keeps it.

  Returns:
    A :class:`~date_optax.BatchSchedule` (adaptive, ramp, or fixed at
    `max_batch`) whose ``max_batch`` is `max_batch`.

  Raises:
    ValueError: an argument out of range (the message names it and its
      allowed range), a `max_batch` that is not ``B0`` times a power of 2
      for ``kind="adaptive"``, or ``kind="ramp"`` without `total_examples`;
      as :func:`critical_batch` for bad `measurements`.
    TypeError: an argument of the wrong type.

  Examples:
    >>> from date_optax.diagnostics import propose_batch_schedule
    >>> s = propose_batch_schedule([70.0, 100.0, 130.0], base_batch_size=16,
    ...                            max_batch=1024, total_examples=327680)
    >>> s.kind, s.batch_sizes
    ('adaptive', (64, 128, 256, 512, 1024))
    >>> r = propose_batch_schedule(100.0, base_batch_size=16, max_batch=1024,
    ...                            total_examples=327680, kind="ramp")
    >>> r.batch_sizes, r.ramp_examples
    ((64, 224, 384, 544, 704, 864, 1024), 81920)

  References:
    McCandlish, Kaplan, Amodei et al., `An Empirical Model of Large-Batch
    Training <https://arxiv.org/abs/1812.06162>`_, 2018 (the critical
    batch); Merrill et al., `Critical Batch Size Revisited
    <https://arxiv.org/abs/2505.23971>`_, 2025 (batch-size warmup from a
    measured critical batch); Shoeybi et al., `Megatron-LM
    <https://arxiv.org/abs/1909.08053>`_, 2019 (``--rampup-batch-size``).
  """
  validation.check_choice("kind", kind, PROPOSALS)
  b0 = validation.check_int("base_batch_size", base_batch_size, low=1)
  top = validation.check_int("max_batch", max_batch, low=b0)
  unit = validation.check_int("unit", unit, low=1)
  for name, value in (("base_batch_size", b0), ("max_batch", top)):
    if value % unit:
      raise ValueError(
          f"{name}={value} must be a multiple of unit={unit} (replicas x "
          "microbatch rows: every batch is made of whole microbatches)."
      )
  calibration = _real("calibration", calibration)
  if not calibration > 0 or math.isinf(calibration):
    raise ValueError(f"calibration must be a finite number > 0, got {calibration!r}.")
  if kind == "adaptive" and (top % b0 or not _power_of_two(top // b0)):
    low = b0 * 2 ** int(math.floor(math.log2(top / b0)))
    raise ValueError(
        f"max_batch={top} must be base_batch_size={b0} times a power of 2 "
        f'for kind="adaptive" (the batch doubles from B0·2^j), e.g. {low} or '
        f'{2 * low}; or pass kind="ramp".'
    )
  if kind == "ramp":
    if total_examples is None:
      raise ValueError(
          'kind="ramp" needs total_examples (the examples of the whole run, '
          "epochs x num_examples, >= 1): the ramp's length is a fraction of it."
      )
    ramp_fraction = _real("ramp_fraction", ramp_fraction)
    if not 0 < ramp_fraction <= 1:
      raise ValueError(f"ramp_fraction must be in (0, 1], got {ramp_fraction!r}.")
  if total_examples is not None:
    total_examples = validation.check_int("total_examples", total_examples, low=1)
  crit = calibration * _critical_of(measurements)
  if crit >= top or top == b0:
    return BatchSchedule.fixed(top)
  start = b0
  while 2 * start <= crit:
    start *= 2
  if kind == "adaptive":
    return BatchSchedule.adaptive(start, max_batch=top, calibration=calibration)
  q = (top - start) // unit
  n = next(n for n in range(min(RAMP_INCREMENTS, q), 0, -1) if q % n == 0)
  ramp_examples = max(1, int(math.floor(ramp_fraction * total_examples)))
  return BatchSchedule.ramp(start, q // n * unit, ramp_examples, max_batch=top)


def propose_for_recipe(recipe: Any, **options: Any) -> BatchSchedule:
  """:func:`propose_batch_schedule` for a ``Recipe`` (its method)."""
  if recipe.critical_batch is None:
    raise ValueError(
        "this recipe has no critical batch to grow from: build it with "
        "scale_recipe(..., critical_batch=B_crit) (or date_recipe), B_crit "
        "measured at B0 by date_optax.diagnostics.critical_batch."
    )
  for name in ("base_batch_size", "max_batch", "total_examples"):
    if name in options:
      raise TypeError(f"propose_batch_schedule() of a recipe takes {name} from "
                      "the recipe; pass it to diagnostics.propose_batch_schedule.")
  base = recipe.baseline
  return propose_batch_schedule(
      recipe.critical_batch, base_batch_size=base.batch_size,
      max_batch=recipe.batch_size,
      total_examples=int(math.ceil(base.epochs * base.num_examples)), **options)


def _power_of_two(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


def _critical_of(measurements: Any) -> float:
  """A critical batch given as a number, or read from measurements."""
  scalar = isinstance(measurements, (numbers.Real, np.number)) or (
      isinstance(measurements, (np.ndarray, jax.Array)) and measurements.ndim == 0)
  if not scalar:
    return critical_batch(measurements)
  x = _real("measurements", measurements)
  if not x > 0:
    raise ValueError(
        "measurements, given as a number, is the critical batch: it must be "
        f"> 0 (or inf, when no gradient noise was measured), got {measurements!r}."
    )
  return x


def ramp_changes(schedule: BatchSchedule) -> list[tuple[int, int]]:
  """``(examples, batch)`` at each change of a ramp: the batch from then on.

  The batch is ``start + increment·i`` once ``E·m >= i·ramp_examples``
  (``m`` increments), i.e. from ``E = ceil(i·ramp_examples/m)`` examples;
  when several increments fall on one count (a ramp shorter than ``m``
  examples) the largest is kept.
  """
  if schedule.kind != "ramp":
    return []
  m = (schedule.max_batch - schedule.start) // schedule.increment
  changes = {-(-i * schedule.ramp_examples // m): schedule.start + i * schedule.increment
             for i in range(1, m + 1)}
  return sorted(changes.items())
