"""date_optax: large-batch training for JAX and Optax.

Layer-wise adaptive transforms (trust ratio, LARS, bounded LARS, LAMB), LEGW
learning-rate schedules and the DATE engine, data-parallel train steps for
device meshes and TPU pods, and ghost/distributed batch normalisation.
"""

from date_optax._src.lamb import LambState, lamb
from date_optax._src.lars import LarsState, bounded_lars, lars
from date_optax._src.masks import exclude_bias_and_norm
from date_optax._src.trust_ratio import TrustRatioState, scale_by_trust_ratio, trust_ratios

__version__ = "0.1.0"

__all__ = [
    "LambState",
    "LarsState",
    "TrustRatioState",
    "bounded_lars",
    "exclude_bias_and_norm",
    "lamb",
    "lars",
    "scale_by_trust_ratio",
    "trust_ratios",
]
