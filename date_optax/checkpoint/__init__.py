"""Exact, atomic checkpoint/resume of a whole train state (orbax-checkpoint)."""

from date_optax._src.checkpoint import CheckpointManager, CorruptCheckpointError

__all__ = [
    "CheckpointManager",
    "CorruptCheckpointError",
]
