"""Fresh error-feedback residuals, and the steps' re-creation of missing ones.

A step built with `error_feedback=True` given a `TrainState` whose
`grad_residual` is None (`state.replace(grad_residual=None)`, e.g. to
resume on another replica count without a checkpoint's help) gives it
zeros before its jit call, on the host side, once: the state the step
returns holds them from then on. They are what the step's `init` builds,
laid out as the step's own (a leading replica axis split over the data
axes; the `pmap` step's device axis). The residual dropped costs one
step's rounding.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding

from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.step.train_state import TrainState


def _missing(step: Any, state: Any) -> bool:
  return (getattr(step, "error_feedback", False) and isinstance(state, TrainState)
          and state.grad_residual is None)


def filled(step: Any, state: Any) -> Any:
  """`state`, with zero residuals laid out as `step`'s where it has none.

  For the steps over a mesh (`TrainStep`): one program builds them from the
  parameters with the step's residual shardings as its out_shardings, so a
  multi-host state gets each process's shards where they live.
  """
  if not _missing(step, state):
    return state
  make = step.zero_residuals  # the step's own layout (two_shot's chunks, model shards)
  named = lambda s: NamedSharding(step.mesh, s)  # noqa: E731
  shardings = step._residual_shardings(jax.eval_shape(make, state.params), state.params,
                                       named)
  return state.replace(grad_residual=jax.jit(make, out_shardings=shardings)(state.params))


def filled_pmap(step: Any, state: Any) -> Any:
  """`filled` for the `pmap` step: each device's zeros beside its parameters."""
  if not _missing(step, state):
    return state
  zeros = jax.pmap(lambda p: ErrorFeedbackState.zeros(p, step.grad_sync,
                                                      chunks=step.num_replicas),
                   devices=step.devices)
  return state.replace(grad_residual=zeros(state.params))
