"""The critical batch size from a short measurement of the gradient noise.

McCandlish et al. (2018) model the cost of reaching a given loss with batch
``B``: ``S = S_min·(1 + B_noise/B)`` steps and ``E = E_min·(1 + B/B_noise)``
examples. Below the noise scale a larger batch cuts the steps almost
proportionally; above it the steps barely fall while the examples grow
linearly. The *critical batch* ``B_crit = B_noise`` is where both costs are
twice their minimum, and the simple noise scale ``B_simple = tr Σ / |G|²``
measured by the train step (``grad_stats=True``) estimates it.
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
from date_optax._src.gain import GradStats, noise_scale

#: A batch more than this many times the critical batch is "far beyond" it:
#: there the model gives ``S/S_min = 1 + 1/8`` (the steps fall by at most 11 %
#: more however large the batch) at ``E/E_min = 9`` times the examples of the
#: most data-efficient run, 4.5x the cost at the critical batch.
FAR_FACTOR = 8.0


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
        "accuracy (McCandlish et al. 2018).",
        UserWarning,
        stacklevel=3,
    )
