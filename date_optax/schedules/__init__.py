"""Batch-size-aware learning-rate schedules (LEGW, DATE roller coaster).

Every schedule is an optax ``Schedule`` of the zero-based update count, with
iterations counted from 1 (SPEC §5).
"""

from date_optax._src.schedules import DECAYS
from date_optax._src.schedules import SCALING_RULES
from date_optax._src.schedules import WARMUPS
from date_optax._src.schedules import Constant
from date_optax._src.schedules import Cosine
from date_optax._src.schedules import Decay
from date_optax._src.schedules import Exponential
from date_optax._src.schedules import MultiStep
from date_optax._src.schedules import Poly
from date_optax._src.schedules import RollerCoaster
from date_optax._src.schedules import constant
from date_optax._src.schedules import constant_warmup
from date_optax._src.schedules import cosine
from date_optax._src.schedules import decay_from_name
from date_optax._src.schedules import exponential
from date_optax._src.schedules import gradual_warmup
from date_optax._src.schedules import linear_scaling
from date_optax._src.schedules import multi_stage_schedule
from date_optax._src.schedules import multistep
from date_optax._src.schedules import poly
from date_optax._src.schedules import roller_coaster
from date_optax._src.schedules import scale_by_rule
from date_optax._src.schedules import sqrt_scaling
from date_optax._src.schedules import warmup_decay_schedule

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
