"""Ways of scaling a baseline tuned at ``B0`` to a batch ``B = k·B0``.

The method table of the studies: the demo (`benchmarks/demo.py`) and the
studies in `benchmarks/` build their optimizers here, from a
`date_optax.Baseline` (the run tuned at ``B0``). The MNIST-1D example
(`examples/mnist1d_lstm/train.py`) runs three of them (date, baseline, linear).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import optax

import date_optax

#: The scaling methods, in the order tables list them.
METHODS = ("baseline", "linear", "adam", "legw", "date")

METHOD_LABELS = {
    "baseline": "baseline solver, sqrt LR + LEGW warmup, no ratio",
    "linear": "linear LR scaling + 5-epoch warmup (Goyal)",
    "adam": "Adam, constant LR tuned at B0, sqrt-scaled",
    "legw": "LEGW (sqrt LR, warmup x k, poly-2 decay)",
    "date": "DATE (date_optax.date)",
}


def make_baseline(
    solver: str,
    *,
    batch_size: int,
    learning_rate: float,
    warmup_epochs: float,
    epochs: int,
    num_examples: int,
) -> date_optax.Baseline:
  """The tuned run: `solver` ("momentum": heavy ball 0.9, or "adam") at ``B0``.

  Its decay is the baseline's default roller coaster (linear decay after the
  warmup), the schedule the MNIST-1D grids were tuned on.
  """
  return date_optax.Baseline(
      batch_size=batch_size, learning_rate=learning_rate,
      warmup_epochs=warmup_epochs, epochs=epochs, num_examples=num_examples,
      optimizer=solver,
      optimizer_options={"momentum": 0.9} if solver == "momentum" else {},
  )


def scaled_run(
    method: str,
    baseline: date_optax.Baseline,
    batch_size: int,
    **date_options: Any,
) -> tuple[optax.GradientTransformation, Callable[[Any], Any]]:
  """The optimizer and its learning-rate schedule for `method` at `batch_size`.

  With ``k = B / B0`` (every duration from `date_optax.scale_recipe`):

  - ``"baseline"``: the plain solver (``Baseline.solver``) on DATE's schedule
    (sqrt LR, LEGW warmup, the baseline's decay); at ``k = 1`` this is the
    tuned baseline itself.
  - ``"linear"``: the plain solver, peak ``η0·k``, 5-epoch gradual warmup and
    the baseline's decay (Goyal et al. 2017, "Accurate, large minibatch SGD",
    https://arxiv.org/abs/1706.02677; only the scaling rule differs).
  - ``"adam"``: Adam at the constant learning rate ``η0·sqrt(k)``.
  - ``"legw"``: the plain solver, peak ``η0·sqrt(k)``, warmup ``w0·k``
    epochs, poly decay of power 2 (You et al. 2019, LEGW; see
    docs/algorithms.md).
  - ``"date"``: `date_optax.date` of the baseline; `date_options` (for
    example ``lower=``, ``upper=``, ``bounds=``) go to it.

  Args:
    method: one of `METHODS`.
    baseline: the run tuned at ``B0``.
    batch_size: the target batch ``B``.
    **date_options: keywords for `date_optax.date` (``"date"`` only).

  Returns:
    ``(optimizer, schedule)``: the transformation and the learning-rate
    schedule inside it (of the step count, from 0).
  """
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
  if date_options and method != "date":
    raise ValueError(f"date_options apply to method='date' only, got {method!r}.")
  if method == "adam":
    k = batch_size / baseline.batch_size
    sched = optax.constant_schedule(baseline.learning_rate * math.sqrt(k))
    return optax.adam(sched), sched
  recipe = scaled_recipe(method, baseline, batch_size)
  if method == "date":
    return date_optax.date(baseline, batch_size, **date_options), recipe.schedule
  return baseline.solver(recipe.schedule), recipe.schedule


def scaled_recipe(
    method: str, baseline: date_optax.Baseline, batch_size: int
) -> date_optax.Recipe:
  """The `date_optax.Recipe` (schedule, peak, warmup) of `method` at `batch_size`.

  Args:
    method: one of `METHODS` except "adam" (a constant learning rate).
    baseline: the run tuned at ``B0``.
    batch_size: the target batch ``B``.

  Returns:
    The recipe; `scaled_run` explains each method.
  """
  if method in ("baseline", "date"):
    return date_optax.date_recipe(baseline, batch_size)
  if method == "linear":
    return date_optax.scale_recipe(
        dataclasses.replace(baseline, warmup_epochs=5.0), batch_size,
        lr_scaling="linear", warmup_scaling="none",
    )
  if method == "legw":
    return date_optax.scale_recipe(
        baseline, batch_size, decay=date_optax.schedules.Poly(power=2)
    )
  raise ValueError(
      f"method must be one of {tuple(m for m in METHODS if m != 'adam')}, got {method!r}."
  )
