"""date_optax: large-batch training for JAX and Optax.

Layer-wise adaptive transforms (trust ratio, LARS, bounded LARS, LAMB), LEGW
learning-rate schedules and the DATE engine, data-parallel train steps for
device meshes and TPU pods, and ghost/distributed batch normalisation.
"""

__version__ = "0.1.0"

__all__ = []
