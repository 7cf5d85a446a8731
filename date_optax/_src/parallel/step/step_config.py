"""The options of a train step that do not depend on how it is parallelised."""

from __future__ import annotations

import dataclasses
from typing import Any

from date_optax._src import validation
from date_optax._src.parallel.step import local_grads as lg


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Step-level options shared by every train step builder.

  A frozen config validated when it is built; the builders
  (`make_train_step`, `make_replicated_train_step`,
  `make_sharded_train_step`, `make_pmap_train_step`) take it as
  `step_config=`, and their flat keywords of the same names build it.

  Args:
    microbatches: k >= 1 microbatches per replica (gradient accumulation
      under `lax.scan`, float32 accumulation, one optimizer step per global
      batch); the global batch must divide by replicas × k.
    compute_dtype: e.g. `jnp.bfloat16` to run `loss_fn` on copies of the
      float parameters and batch leaves in that dtype; parameters, optimizer
      state, model state, loss and reductions stay float32. None computes as
      stored.
    donate: donate the input state's buffers to the output.
    has_aux: `loss_fn` returns `(loss, aux)`; `metrics["aux"]` holds aux
      with float leaves averaged and integer leaves summed.
    max_consecutive_skips: when set, each call reads
      `metrics["consecutive_skips"]` on the host (waiting for the step) and
      raises `NonFiniteError` once it exceeds this number.

  Returns:
    The config (a frozen dataclass; `dataclasses.replace` gives variants).

  Raises:
    ValueError: `microbatches` < 1 or `max_consecutive_skips` < 0.
    TypeError: a non-integer count, a non-bool flag, or a `compute_dtype`
      that is not a floating dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> import date_optax.parallel as dp
    >>> config = dp.StepConfig(microbatches=4, compute_dtype=jnp.bfloat16)
    >>> config.microbatches, config.donate
    (4, True)

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017 (one optimizer step
    per global batch); Micikevicius et al., "Mixed Precision Training", 2018.
  """

  microbatches: int = 1
  compute_dtype: Any = None
  donate: bool = True
  has_aux: bool = False
  max_consecutive_skips: int | None = None

  def __post_init__(self) -> None:
    lg.check_float_dtype("compute_dtype", self.compute_dtype)
    if self.max_consecutive_skips is not None:
      validation.check_int("max_consecutive_skips", self.max_consecutive_skips, low=0)
    set_ = lambda name, value: object.__setattr__(self, name, value)
    set_("microbatches", validation.check_int("microbatches", self.microbatches, low=1))
    set_("donate", validation.check_bool("donate", self.donate))
    set_("has_aux", validation.check_bool("has_aux", self.has_aux))


def step_config_from(
    step_config: StepConfig | None,
    *,
    microbatches: Any = 1,
    compute_dtype: Any = None,
    donate: Any = True,
    has_aux: Any = False,
    max_consecutive_skips: Any = None,
) -> StepConfig:
  """The builders' `step_config=`, or the config their flat keywords spell."""
  return validation.config_from(step_config, StepConfig, {
      "microbatches": ("microbatches", microbatches, 1),
      "compute_dtype": ("compute_dtype", compute_dtype, None),
      "donate": ("donate", donate, True),
      "has_aux": ("has_aux", has_aux, False),
      "max_consecutive_skips": ("max_consecutive_skips", max_consecutive_skips, None),
  })
