"""Where a ghost/distributed batch norm's groups lie: ghosts and replica groups.

:func:`bn_group_layout` turns a desired effective BN batch (Ying et al.,
2018, "Image Classification at Supercomputer Scale",
https://arxiv.org/abs/1811.06992) into a :class:`BNGroupLayout`: the ghost
size within one replica's batch and the number of replicas whose statistics
are summed. The modules that use it are in `batch_norm.py` and
`batch_norm_nnx.py`.
"""

from __future__ import annotations

import dataclasses

from date_optax._src import validation

# --------------------------------------------------------------------------
# Group layout helper.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BNGroupLayout:
  """How an effective BN batch maps onto ghosts and replica groups.

  Built by :func:`bn_group_layout`; ``module_kwargs`` feeds
  :class:`GhostBatchNorm`.

  Args:
    ghost_batch_size: examples per ghost sub-batch inside one replica.
    group_size: consecutive replicas whose statistics are reduced together.
    per_device_batch: examples per replica.
    num_replicas: number of replicas.

  Examples:
    >>> from date_optax.nn import BNGroupLayout
    >>> layout = BNGroupLayout(ghost_batch_size=32, group_size=4,
    ...                        per_device_batch=32, num_replicas=64)
    >>> layout.effective_batch, layout.num_groups, layout.ghosts_per_device
    (128, 16, 1)

  References:
    You et al., 2020, "The limit of the batch size", §4.1.
  """

  ghost_batch_size: int
  group_size: int
  per_device_batch: int
  num_replicas: int

  @property
  def effective_batch(self) -> int:
    """Examples behind each statistic: ``ghost_batch_size * group_size``."""
    return self.ghost_batch_size * self.group_size

  @property
  def ghosts_per_device(self) -> int:
    """Ghost sub-batches per replica."""
    return self.per_device_batch // self.ghost_batch_size

  @property
  def num_groups(self) -> int:
    """Independent replica groups (no communication between them)."""
    return self.num_replicas // self.group_size

  @property
  def module_kwargs(self) -> dict[str, int]:
    """``ghost_batch_size`` and ``group_size`` for :class:`GhostBatchNorm`."""
    return {"ghost_batch_size": self.ghost_batch_size, "group_size": self.group_size}


def _valid_effective_batches(per_device_batch: int, num_replicas: int) -> list[int]:
  within = [d for d in range(1, per_device_batch + 1) if per_device_batch % d == 0]
  across = [
      per_device_batch * k
      for k in range(2, num_replicas + 1)
      if num_replicas % k == 0
  ]
  return within + across


def bn_group_layout(
    effective_batch: int, per_device_batch: int, num_replicas: int
) -> BNGroupLayout:
  """Chooses ghost size and replicas per group for a desired effective BN batch.

  If the effective batch fits in one replica's batch, statistics are taken per
  ghost sub-batch of that size and no collective is needed (``group_size=1``).
  Otherwise every replica's whole batch is one ghost and ``effective_batch /
  per_device_batch`` consecutive replicas reduce their statistics together.

  Rule of thumb (You et al., 2020, §4.1, after Ying et al., 2018): an effective
  BN batch of about 64 gave the best ImageNet/ResNet-50 accuracy, and 128
  examples per TPU core was the best batch-per-core ratio at batch 32K on 256
  cores. With 128 per core that is two ghosts of 64 per core and no BN
  communication at all; at 32 per core it is groups of two cores.

  Args:
    effective_batch: examples behind each mean/variance estimate (e.g. 64).
    per_device_batch: examples per replica (e.g. 128).
    num_replicas: number of data-parallel replicas.

  Returns:
    A :class:`BNGroupLayout`; ``layout.module_kwargs`` can be passed to
    :class:`GhostBatchNorm`.

  Raises:
    ValueError: when a size is not a positive integer, or when no layout gives
      exactly ``effective_batch`` (the message lists the nearest that do).

  Examples:
    >>> from date_optax.nn import bn_group_layout
    >>> layout = bn_group_layout(64, per_device_batch=128, num_replicas=256)
    >>> layout.ghost_batch_size, layout.group_size, layout.ghosts_per_device
    (64, 1, 2)
    >>> layout = bn_group_layout(64, per_device_batch=32, num_replicas=8)
    >>> layout.group_size, layout.num_groups, layout.module_kwargs
    (2, 4, {'ghost_batch_size': 32, 'group_size': 2})

  References:
    Hoffer, Hubara, Soudry, 2017, "Train longer, generalize better: closing
    the generalization gap in large batch training of neural networks".
    Ying, Kumar, Chen, Wang, Cheng, 2018, "Image classification at
    supercomputer scale". You et al., 2020, "The limit of the batch size".
  """
  effective_batch = validation.check_int("effective_batch", effective_batch, low=1)
  per_device_batch = validation.check_int("per_device_batch", per_device_batch, low=1)
  num_replicas = validation.check_int("num_replicas", num_replicas, low=1)
  if effective_batch <= per_device_batch and per_device_batch % effective_batch == 0:
    return BNGroupLayout(effective_batch, 1, per_device_batch, num_replicas)
  if effective_batch > per_device_batch and effective_batch % per_device_batch == 0:
    k = effective_batch // per_device_batch
    if num_replicas % k == 0:
      return BNGroupLayout(per_device_batch, k, per_device_batch, num_replicas)
  valid = _valid_effective_batches(per_device_batch, num_replicas)
  below = max((v for v in valid if v < effective_batch), default=None)
  above = min((v for v in valid if v > effective_batch), default=None)
  near = ", ".join(str(v) for v in (below, above) if v is not None)
  raise ValueError(
      f"effective_batch={effective_batch} cannot be laid out with "
      f"per_device_batch={per_device_batch} and num_replicas={num_replicas}: it "
      "must divide the per-device batch, or be the per-device batch times a "
      f"divisor of num_replicas. Nearest that work: {near}."
  )
