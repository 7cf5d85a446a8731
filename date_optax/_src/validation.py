"""Argument checks shared by every public constructor.

Each check raises at construction time, names the argument and states the
allowed range, and never clips. Schedules (callables) are accepted where a
hyperparameter may vary with the step; they are validated by the schedule
constructors themselves.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np


def _is_schedule(value: Any) -> bool:
  return callable(value)


def _is_tracer(value: Any) -> bool:
  import jax  # local: validation is imported before anything touches JAX

  return isinstance(value, jax.core.Tracer)


def _as_float(name: str, value: Any) -> float | None:
  """The value as a float; None for a traced value (checked when concrete)."""
  if _is_tracer(value):
    # optax.inject_hyperparams rebuilds the optimizer from traced
    # hyperparameters inside jit; they were validated when first built.
    return None
  if isinstance(value, bool) or value is None:
    raise TypeError(f"{name} must be a real number, got {value!r}.")
  if isinstance(value, numbers.Real):
    return float(value)
  # 0-d numpy / jax arrays that are concrete.
  try:
    arr = np.asarray(value)
  except Exception as e:  # noqa: BLE001 - tracer or exotic object
    raise TypeError(
        f"{name} must be a concrete real number, got {type(value).__name__}."
    ) from e
  if arr.shape != () or arr.dtype.kind not in "fiu":
    raise TypeError(f"{name} must be a real scalar, got {value!r}.")
  return float(arr)


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    allow_schedule: bool = False,
) -> Any:
  """Checks that `value` is a finite real in the given interval.

  Returns `value` unchanged (a schedule is returned as is when allowed).
  """
  if allow_schedule and _is_schedule(value):
    return value
  if _is_schedule(value):
    raise TypeError(f"{name} must be a number, not a schedule (got {value!r}).")
  x = _as_float(name, value)
  if x is None:
    return value
  lo = "[" if low_inclusive else "("
  hi = "]" if high_inclusive else ")"
  rng = f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"
  if not math.isfinite(x):
    raise ValueError(f"{name} must be finite and in {rng}, got {value!r}.")
  bad = (
      (low is not None and (x < low or (x == low and not low_inclusive)))
      or (high is not None and (x > high or (x == high and not high_inclusive)))
  )
  if bad:
    raise ValueError(f"{name} must be in {rng}, got {value!r}.")
  return value


def check_nonnegative(name: str, value: Any, *, allow_schedule: bool = False) -> Any:
  """`value >= 0` (finite)."""
  return check_real(name, value, low=0.0, allow_schedule=allow_schedule)


def check_positive(name: str, value: Any, *, allow_schedule: bool = False) -> Any:
  """`value > 0` (finite)."""
  return check_real(
      name, value, low=0.0, low_inclusive=False, allow_schedule=allow_schedule
  )


def check_unit_interval(
    name: str, value: Any, *, include_one: bool = False, allow_schedule: bool = False
) -> Any:
  """`0 <= value < 1` (or `<= 1` with `include_one`)."""
  return check_real(
      name,
      value,
      low=0.0,
      high=1.0,
      high_inclusive=include_one,
      allow_schedule=allow_schedule,
  )


def check_int(
    name: str, value: Any, *, low: int | None = None, high: int | None = None
) -> int:
  """An integer (not bool) in `[low, high]`."""
  if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
    raise TypeError(f"{name} must be an integer, got {value!r}.")
  v = int(value)
  if (low is not None and v < low) or (high is not None and v > high):
    rng = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    raise ValueError(f"{name} must be an integer in {rng}, got {value!r}.")
  return v


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
  """One of a fixed set of strings."""
  choices = tuple(choices)
  if not isinstance(value, str):
    raise TypeError(f"{name} must be one of {choices}, got {value!r}.")
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
  return value


def check_bool(name: str, value: Any) -> bool:
  if _is_tracer(value):
    return value
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r}.")
  return bool(value)


def check_bounds(lower: Any, upper: Any) -> None:
  """Validates optional ratio bounds: non-negative, and `lower <= upper`."""
  if lower is not None:
    check_nonnegative("lower", lower, allow_schedule=True)
  if upper is not None:
    check_positive("upper", upper, allow_schedule=True)
  if (
      lower is not None
      and upper is not None
      and not _is_schedule(lower)
      and not _is_schedule(upper)
      and not _is_tracer(lower)
      and not _is_tracer(upper)
      and float(lower) > float(upper)
  ):
    raise ValueError(
        f"lower must be <= upper, got lower={lower!r} > upper={upper!r}."
    )


def resolve_alias(name: str, value: Any, alias: str, alias_value: Any) -> Any:
  """The value of a keyword that also has an older alias; both is an error."""
  if value is not None and alias_value is not None:
    raise ValueError(f"{alias} is an alias of {name}: give one of them, not both.")
  return value if alias_value is None else alias_value


def check_mask(name: str, value: Any) -> Any:
  """A mask is None, a bool, a pytree of bools, or a callable on params."""
  if value is None or isinstance(value, (bool, np.bool_)) or callable(value):
    return value
  if isinstance(value, (numbers.Number, str)):
    raise TypeError(
        f"{name} must be a bool pytree or a callable params -> bool pytree, "
        f"got {value!r}."
    )
  return value
