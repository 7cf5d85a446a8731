"""flax.nnx layers of date_optax: ghost and distributed batch norm."""

from date_optax._src.batch_norm_nnx import GhostBatchNorm as GhostBatchNorm

__all__ = ["GhostBatchNorm"]
