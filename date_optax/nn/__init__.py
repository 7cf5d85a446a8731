"""Flax layers for large-batch training: ghost and distributed batch norm.

``date_optax.nn.GhostBatchNorm`` is the flax.linen module and
``date_optax.nn.nnx.GhostBatchNorm`` the flax.nnx one; ``bn_group_layout``
picks the ghost size and replicas per group for a desired effective BN batch.
"""

from date_optax._src.batch_norm import GhostBatchNorm as GhostBatchNorm
from date_optax._src.batch_norm_layout import BNGroupLayout as BNGroupLayout
from date_optax._src.batch_norm_layout import bn_group_layout as bn_group_layout
from date_optax.nn import nnx as nnx

__all__ = [
    "BNGroupLayout",
    "GhostBatchNorm",
    "bn_group_layout",
    "nnx",
]
