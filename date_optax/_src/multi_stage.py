"""Several recipes run one after the other: BERT's two sequence lengths.

:func:`multi_stage` chains :class:`~date_optax.Recipe` objects (each a
baseline scaled to its batch, `recipe.scale_recipe`) into one schedule whose
iteration count restarts nowhere: stage k starts where stage k - 1 ended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import optax

from date_optax._src import schedules as sched_lib
from date_optax._src.recipe import Recipe


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
