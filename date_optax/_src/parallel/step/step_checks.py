"""What every train-step builder checks before it builds anything.

`check_step_args` validates the arguments both mesh builders take
(`make_replicated_train_step`, `make_sharded_train_step`: the mesh, the data
axes, the step's options) and returns the step's configuration;
`check_state` checks a `TrainState` against the step it is passed to, on
the host and from its structure alone; `check_fn_and_optimizer` the loss
function and the optax transformation (the `pmap` builder uses it too).
"""

from collections.abc import Hashable
from typing import Any

import jax

from date_optax._src import validation
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.layout.mesh import auto_axes_mesh
from date_optax._src.parallel.step import local_grads as lg
from date_optax._src.parallel.step.step_config import StepConfig, step_config_from
from date_optax._src.parallel.step.train_state import TrainState


def check_state(state: Any, *, error_feedback: bool, grad_stats: bool) -> None:
  """A `TrainState` whose optional parts fit the step (host-side, structure only).

  A state with error-feedback residuals fed to a step built without error
  feedback would run and never deliver them; the other way round, and a
  step measuring statistics without `state.grad_stats`, could not run.
  """
  if not isinstance(state, TrainState):
    raise TypeError(
        "state must be the date_optax.parallel.TrainState of step.init(params) "
        f"(or a checkpoint restored onto it), got {type(state).__name__}."
    )
  if state.grad_residual is not None and not error_feedback:
    raise ValueError(
        "state.grad_residual holds error-feedback residuals, but this step was "
        "built without error_feedback: it would ignore them and never deliver "
        "what they hold. Build the step with error_feedback=True (and the "
        "comm_dtype that made them), or drop them, one step's rounding: "
        "state.replace(grad_residual=None)."
    )
  if error_feedback and state.grad_residual is None:
    raise ValueError(
        "this step was built with error_feedback=True: lower and compile need "
        "state.grad_residual, the residuals (a call, step(state, batch), gives a "
        "state without them zeros); pass the state of this step's init or "
        "abstract_state.")
  if error_feedback and not isinstance(state.grad_residual, ErrorFeedbackState):
    raise TypeError(
        "state.grad_residual must be an ErrorFeedbackState (worker and hop "
        f"residuals), got {type(state.grad_residual).__name__}: build the state "
        "with this step's init; a bare pytree of worker residuals (the layout "
        "before two-stage error feedback) goes in as "
        "ErrorFeedbackState.zeros(params, grad_sync, replicas)._replace(worker=old)."
    )
  if grad_stats and state.grad_stats is None:
    raise ValueError(
        "this step was built with grad_stats=True: it needs state.grad_stats, "
        "the smoothed statistics; build the state with this step's init "
        "(TrainState.create leaves it None)."
    )


def check_fn_and_optimizer(loss_fn: Any, optimizer: Any) -> None:
  """`loss_fn` is callable and `optimizer` looks like an optax transformation."""
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable, got {loss_fn!r}.")
  if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise TypeError(
        f"optimizer must be an optax.GradientTransformation, got {optimizer!r}."
    )


def check_step_args(
    loss_fn: Any,
    optimizer: Any,
    mesh: Any,
    step_config: Any,
    shard_update: Any,
    data_axes: Any,
    named: set[Hashable],
) -> tuple[jax.sharding.Mesh, StepConfig, tuple[Hashable, ...]]:
  """Checks what both builders take; the mesh, the config and the data axes."""
  config = step_config_from(step_config)
  check_fn_and_optimizer(loss_fn, optimizer)
  if not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
  mesh = auto_axes_mesh(mesh)
  validation.check_bool("shard_update", shard_update)
  if data_axes is None:
    axes = tuple(a for a in mesh.axis_names if a not in named)
  else:
    axes = lg.check_axes("data_axes", data_axes)
  unknown = [a for a in axes if a not in mesh.axis_names]
  if not axes or unknown or len(set(axes)) != len(axes):
    raise ValueError(
        f"data_axes must be a non-empty subset of the mesh axes {mesh.axis_names}, "
        f"got {data_axes!r}."
    )
  return mesh, config, axes
