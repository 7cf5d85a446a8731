"""Batch-size-aware learning-rate schedules (LEGW, DATE roller coaster).

Every schedule is an optax ``Schedule`` of the zero-based update count, with
iterations counted from 1 (docs/algorithms.md, "Learning-rate scaling and
LEGW").
"""

from date_optax._src.decays import (
    DECAYS,
    WARMUPS,
    Constant,
    Cosine,
    Decay,
    Exponential,
    MultiStep,
    Poly,
    RollerCoaster,
    decay_from_name,
    warmup_decay_schedule,
)
from date_optax._src.schedules import (
    SCALING_RULES,
    constant,
    constant_warmup,
    cosine,
    exponential,
    gradual_warmup,
    linear_scaling,
    multi_stage_schedule,
    multistep,
    poly,
    roller_coaster,
    scale_by_rule,
    sqrt_scaling,
)

__all__ = [
    "DECAYS",
    "SCALING_RULES",
    "WARMUPS",
    "Constant",
    "Cosine",
    "Decay",
    "Exponential",
    "MultiStep",
    "Poly",
    "RollerCoaster",
    "constant",
    "constant_warmup",
    "cosine",
    "decay_from_name",
    "exponential",
    "gradual_warmup",
    "linear_scaling",
    "multi_stage_schedule",
    "multistep",
    "poly",
    "roller_coaster",
    "scale_by_rule",
    "sqrt_scaling",
    "warmup_decay_schedule",
]
