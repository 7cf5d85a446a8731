"""ResNet v1.5 for ImageNet with ghost batch norm (flax.linen).

Every batch norm is `date_optax.nn.GhostBatchNorm`: statistics over ghost
sub-batches of `ghost_batch_size` examples inside each replica's share of
the batch (You et al., "The Limit of the Batch Size", 2020, §4.1: an
effective BN batch of about 64 works best at 32K). train.py applies the model
inside `date_optax.parallel.make_train_step`, where it sees one replica's
slice of the batch. (Under plain `jax.jit` on a batch sharded over
`num_replicas` devices the layer would see the global batch; `num_replicas`
then makes it read the batch as that many consecutive blocks, so that no
statistics cross devices.)

Convolutions and matmuls run in `dtype` (bfloat16 on TPU); parameters, BN
statistics and the logits returned are float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from date_optax.nn import GhostBatchNorm

ModuleDef = Any


class _Block(nn.Module):
  """A residual block's fields and its shortcut, shared by the two kinds."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
  strides: tuple[int, int] = (1, 1)

  def shortcut(self, residual, y):
    """relu(residual + y), the residual projected (1x1, strided) where shapes differ."""
    if residual.shape != y.shape:
      residual = self.conv(y.shape[-1], (1, 1), self.strides, name="proj")(residual)
      residual = self.norm(name="proj_bn")(residual)
    return nn.relu(residual + y)


class BottleneckBlock(_Block):
  """1x1 -> 3x3 (stride here, v1.5) -> 1x1, projection shortcut when needed."""

  @nn.compact
  def __call__(self, x):
    y = self.conv(self.filters, (1, 1))(x)
    y = nn.relu(self.norm()(y))
    y = self.conv(self.filters, (3, 3), self.strides)(y)
    y = nn.relu(self.norm()(y))
    y = self.conv(self.filters * 4, (1, 1))(y)
    # Zero-init the last BN scale of each block (Goyal et al.): every block
    # starts as the identity, which large-batch warmup relies on.
    y = self.norm(scale_init=nn.initializers.zeros)(y)
    return self.shortcut(x, y)


class BasicBlock(_Block):
  """Two 3x3 convolutions (ResNet-18/34 and the test-sized model)."""

  @nn.compact
  def __call__(self, x):
    y = self.conv(self.filters, (3, 3), self.strides)(x)
    y = nn.relu(self.norm()(y))
    y = self.conv(self.filters, (3, 3))(y)
    y = self.norm(scale_init=nn.initializers.zeros)(y)
    return self.shortcut(x, y)


class ResNet(nn.Module):
  """ResNet v1.5 with ghost batch norm.

  Attributes:
    stage_sizes: blocks per stage.
    block_cls: `BottleneckBlock` or `BasicBlock`.
    num_classes: output classes.
    num_filters: filters of the first stage.
    dtype: compute dtype of convolutions and matmuls.
    ghost_batch_size: examples per BN ghost batch in one replica's share.
    num_replicas: devices the batch is split over (plain-jit layout).
    bn_momentum: running-average decay of the BN statistics.
    small_inputs: a 3x3 stem without max-pooling (32x32 test images).
  """

  stage_sizes: Sequence[int]
  block_cls: ModuleDef
  num_classes: int = 1000
  num_filters: int = 64
  dtype: Any = jnp.float32
  ghost_batch_size: int | None = None
  num_replicas: int | None = None
  bn_momentum: float = 0.9
  small_inputs: bool = False

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype,
                             kernel_init=nn.initializers.variance_scaling(
                                 2.0, "fan_out", "normal"))
    norm = functools.partial(
        GhostBatchNorm,
        use_running_average=not train,
        momentum=self.bn_momentum,
        epsilon=1e-5,
        dtype=self.dtype,
        ghost_batch_size=self.ghost_batch_size,
        num_replicas=self.num_replicas if (self.num_replicas or 1) > 1 else None,
        group_size=1 if (self.num_replicas or 1) > 1 else None,
    )
    x = x.astype(self.dtype)
    if self.small_inputs:
      x = conv(self.num_filters, (3, 3), name="stem")(x)
      x = nn.relu(norm(name="stem_bn")(x))
    else:
      x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
               name="stem")(x)
      x = nn.relu(norm(name="stem_bn")(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for i, blocks in enumerate(self.stage_sizes):
      for j in range(blocks):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = self.block_cls(self.num_filters * 2**i, conv=conv, norm=norm,
                           strides=strides)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x)
    return x.astype(jnp.float32)


ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3), block_cls=BottleneckBlock)
ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2), block_cls=BasicBlock)
# A few-thousand-parameter ResNet for smoke tests on the CPU.
ResNetTiny = functools.partial(ResNet, stage_sizes=(1, 1), block_cls=BasicBlock,
                               num_filters=8, small_inputs=True)

MODELS: dict[str, Callable[..., ResNet]] = {
    "ResNet50": ResNet50, "ResNet18": ResNet18, "ResNetTiny": ResNetTiny,
}
