"""Data-parallel training on device meshes (implementation of `date_optax.parallel`)."""
