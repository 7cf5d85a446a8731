"""The data-parallel train state and host-side checks on non-finite steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src import validation


class TrainState(flax.struct.PyTreeNode):
  """Everything a data-parallel step updates, as one pytree.

  The optimizer itself is not part of the state (it is a pair of functions
  held by the step), so the state can be checkpointed, sharded and donated as
  plain arrays.

  Attributes:
    step: number of steps taken, skipped ones included (int32).
    params: the parameters (float32 master copy under mixed precision).
    opt_state: the optimizer state.
    consecutive_skips: steps skipped in a row because a gradient (or the loss
      or the update) was NaN/Inf; 0 after every applied step (int32).
    total_skips: steps skipped since the start (int32).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import date_optax.parallel as dp
    >>> state = dp.TrainState.create({"w": jnp.ones(3)}, optax.sgd(0.1))
    >>> int(state.step), int(state.total_skips)
    (0, 0)

  References:
    Micikevicius et al., "Mixed Precision Training", 2018 (skipping steps
    whose gradients overflow).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  consecutive_skips: jax.Array
  total_skips: jax.Array

  @classmethod
  def create(cls, params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """A fresh state: `optimizer.init(params)` and zero counters."""
    zero = jnp.zeros((), jnp.int32)
    return cls(
        step=zero,
        params=params,
        opt_state=optimizer.init(params),
        consecutive_skips=zero,
        total_skips=zero,
    )

  @property
  def applied_steps(self) -> jax.Array:
    """Number of steps whose update was applied (`step - total_skips`)."""
    return self.step - self.total_skips


class NonFiniteError(FloatingPointError):
  """Raised on the host when too many consecutive steps had NaN/Inf gradients.

  Args:
    message: what happened and what to try.

  Examples:
    >>> import date_optax.parallel as dp
    >>> issubclass(dp.NonFiniteError, FloatingPointError)
    True

  References:
    Micikevicius et al., "Mixed Precision Training", 2018.
  """

  def __init__(self, message: str):
    super().__init__(message)


def _fetch(x: Any) -> np.ndarray:
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def check_metrics(metrics: Mapping[str, Any], max_consecutive_skips: int) -> None:
  """Raises `NonFiniteError` when a run keeps producing non-finite gradients.

  A step cannot raise from inside `jit`; it skips the update and counts the
  skip instead. Call this on the host after a step (or every few steps: the
  counter is cumulative, so nothing is missed) to stop a run that is stuck.
  Reading the counter waits for the step to finish.

  Args:
    metrics: the metrics returned by a train step; uses
      `metrics["consecutive_skips"]` and `metrics["total_skips"]`.
    max_consecutive_skips: the largest number of skipped steps in a row that
      is tolerated, >= 0.

  Returns:
    None.

  Raises:
    NonFiniteError: if `consecutive_skips > max_consecutive_skips`.

  Examples:
    >>> import date_optax.parallel as dp
    >>> dp.check_metrics({"consecutive_skips": 2, "total_skips": 5}, 3)
    >>> dp.check_metrics({"consecutive_skips": 4, "total_skips": 5}, 3)
    Traceback (most recent call last):
      ...
    date_optax._src.parallel.train_state.NonFiniteError: 4 consecutive steps ...

  References:
    Micikevicius et al., "Mixed Precision Training", 2018.
  """
  limit = validation.check_int("max_consecutive_skips", max_consecutive_skips, low=0)
  # addressable_data(0): the counters are replicated, possibly over processes.
  consecutive = int(_fetch(metrics["consecutive_skips"]))
  if consecutive > limit:
    total = int(_fetch(metrics["total_skips"]))
    raise NonFiniteError(
        f"{consecutive} consecutive steps had non-finite gradients, loss or "
        f"updates and were skipped (max_consecutive_skips={limit}; "
        f"{total} skipped in all). Lower the learning rate, check the data, "
        "or use loss scaling."
    )
