"""Exact, atomic checkpoint/resume of a whole train state (orbax-checkpoint),
and a guard that stops a loop cleanly on preemption."""

from date_optax._src.checkpoint import (
    CheckpointManager,
    CorruptCheckpointError,
    tree_checksum,
)
from date_optax._src.preemption import PreemptionGuard

__all__ = [
    "CheckpointManager",
    "CorruptCheckpointError",
    "PreemptionGuard",
    "tree_checksum",
]
