"""Exact, atomic checkpoint/resume of a whole train state (orbax-checkpoint),
and a guard that stops a loop cleanly on preemption."""

from date_optax._src.checkpoint import (
    CheckpointManager,
    CheckpointMismatchError,
    CorruptCheckpointError,
    tree_checksum,
)
from date_optax._src.checkpoint_residuals import CheckpointInfo
from date_optax._src.preemption import PreemptionGuard

__all__ = [
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CorruptCheckpointError",
    "PreemptionGuard",
    "tree_checksum",
]
