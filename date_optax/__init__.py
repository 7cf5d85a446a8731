"""date_optax: large-batch training for JAX and Optax.

Layer-wise adaptive transforms (trust ratio, LARS, bounded LARS, LAMB), LEGW
learning-rate schedules and the DATE engine, data-parallel train steps for
device meshes and TPU pods, and ghost/distributed batch normalisation.
"""

from date_optax import schedules
from date_optax._src.batch_schedule import (
    BatchProgress,
    BatchSchedule,
    BatchScheduleState,
)
from date_optax._src.date_optimizer import date, date_recipe, layer_lr_bounds
from date_optax._src.gain import (
    AdaScaleState,
    GradStats,
    adascale,
    adascale_gain,
    noise_scale,
)
from date_optax._src.lamb import LambState, lamb
from date_optax._src.lars import BoundedLarsState, LarsState, bounded_lars, lars
from date_optax._src.layer_ratios import LayerRatios
from date_optax._src.masks import exclude_bias_and_norm, path_mask
from date_optax._src.multi_stage import MultiStageRecipe, multi_stage
from date_optax._src.recipe import Baseline, Recipe, scale_recipe
from date_optax._src.schedules import (
    linear_scaling,
    roller_coaster,
    sqrt_scaling,
    warmup_decay_schedule,
)
from date_optax._src.state_readers import (
    current_learning_rate,
    trust_ratio_bounds,
    trust_ratios,
)
from date_optax._src.trust_ratio import TrustRatioState, scale_by_trust_ratio

__version__ = "0.2.0"

__all__ = [
    "BoundedLarsState",
    "LambState",
    "LarsState",
    "LayerRatios",
    "TrustRatioState",
    "bounded_lars",
    "current_learning_rate",
    "exclude_bias_and_norm",
    "lamb",
    "lars",
    "path_mask",
    "scale_by_trust_ratio",
    "trust_ratio_bounds",
    "trust_ratios",
    # LEGW schedules and the DATE engine.
    "Baseline",
    "MultiStageRecipe",
    "Recipe",
    "date",
    "date_recipe",
    "layer_lr_bounds",
    "linear_scaling",
    "multi_stage",
    "roller_coaster",
    "scale_recipe",
    "schedules",
    "sqrt_scaling",
    "warmup_decay_schedule",
    # Gradient-noise statistics and the gain.
    "AdaScaleState",
    "GradStats",
    "adascale",
    "adascale_gain",
    "noise_scale",
    # A global batch that grows during training.
    "BatchProgress",
    "BatchSchedule",
    "BatchScheduleState",
]


_SUBPACKAGES = ("checkpoint", "diagnostics", "nn", "parallel", "schedules")

# Former public names, kept for one release: name -> (new name, object).
_DEPRECATED = {
    "learning_rate": ("current_learning_rate", current_learning_rate),
}


def __getattr__(name: str):
  # Subpackages with heavier dependencies (flax modules, orbax, collectives)
  # are imported on first use, so `import date_optax` stays light while
  # `date_optax.nn.GhostBatchNorm` works right after it.
  if name in _SUBPACKAGES:
    import importlib

    return importlib.import_module(f"date_optax.{name}")
  if name in _DEPRECATED:
    import warnings

    new, obj = _DEPRECATED[name]
    # `learning_rate` also names the hyperparameter of every optimizer.
    warnings.warn(
        f"date_optax.{name} is deprecated and will be removed in the next "
        f"release: use date_optax.{new} (same function).",
        DeprecationWarning,
        stacklevel=2,
    )
    return obj
  raise AttributeError(f"module 'date_optax' has no attribute {name!r}")
